//! A process using the C library with `GPUMEM_PUBLISH=1` is found by the watching side
//! (gpumem-watch's `PoolEndpoints`, what `gpumem top`/`diagnose`/`exporter` read) with its
//! pools' real figures; a bad `GPUMEM_PUBLISH` is the C call's error, not a panic. One test in
//! its own process: it sets the environment.

use std::ffi::{c_void, CStr, CString};

use gpumem_capi::{
    gpumem_alloc, gpumem_free, gpumem_last_error, gpumem_memory_stats, gpumem_publish,
    GpumemStatus, GPUMEM_ANY_SIZE,
};
use gpumem_watch::PoolEndpoints;

const MIB: usize = 1 << 20;

fn last_error() -> String {
    // SAFETY: never NULL, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(gpumem_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn alloc(size: usize, device: i32) -> Result<*mut c_void, (GpumemStatus, String)> {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: `ptr` is writable storage for one pointer.
    match unsafe { gpumem_alloc(size, device, std::ptr::null_mut(), &mut ptr) } {
        GpumemStatus::GpumemOk => Ok(ptr),
        status => Err((status, last_error())),
    }
}

fn allocated_bytes(device: i32) -> u64 {
    let mut text = vec![0u8; 1 << 16];
    // SAFETY: the buffer holds `text.len()` bytes.
    let needed = unsafe { gpumem_memory_stats(device, text.as_mut_ptr().cast(), text.len()) };
    assert!(needed <= text.len());
    let stats: serde_json::Value =
        serde_json::from_slice(&text[..needed.saturating_sub(1)]).unwrap();
    stats["allocated_bytes.all.current"].as_u64().unwrap()
}

#[test]
fn a_c_abi_process_is_found_with_its_figures() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("GPUMEM_DEVICE", "sim");
    std::env::set_var("GPUMEM_PUBLISH_DIR", dir.path());

    std::env::set_var("GPUMEM_PUBLISH", "yes please");
    let (status, error) = alloc(MIB, 0).unwrap_err();
    assert_eq!(status, GpumemStatus::GpumemConfig);
    assert!(
        error.contains("GPUMEM_PUBLISH=\"yes please\" is not accepted"),
        "{error}"
    );
    let endpoints = PoolEndpoints::new(dir.path());
    assert!(endpoints.pools().unwrap().is_empty(), "nothing published");

    std::env::set_var("GPUMEM_PUBLISH", "1");
    let a = alloc(3 * MIB, 0).unwrap();
    let b = alloc(5 * MIB, 1).unwrap();
    let pools = endpoints.pools().unwrap();
    assert_eq!(pools.len(), 2, "{pools:?}");
    for (pool, device) in pools.iter().zip([0, 1]) {
        assert_eq!(pool.pid, std::process::id());
        assert_eq!(pool.device, device as u32);
        assert_eq!(pool.allocated, allocated_bytes(device));
        assert!(pool.reserved >= pool.allocated);
    }
    assert_eq!(pools[1].allocated, 5 * MIB as u64);

    assert_eq!(gpumem_free(a, GPUMEM_ANY_SIZE, 0), GpumemStatus::GpumemOk);
    assert_eq!(
        endpoints.pools().unwrap()[0].allocated,
        0,
        "figures are live"
    );
    // Publishing again keeps the running endpoint.
    let other = CString::new(dir.path().join("elsewhere").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated string.
    assert_eq!(
        unsafe { gpumem_publish(other.as_ptr()) },
        GpumemStatus::GpumemOk
    );
    assert!(!dir.path().join("elsewhere").exists());
    assert_eq!(gpumem_free(b, GPUMEM_ANY_SIZE, 1), GpumemStatus::GpumemOk);
}
