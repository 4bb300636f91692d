//! No entry point lets a panic out (feature `fault-injection`): a panic armed with
//! `gpumem_test_inject_panic` in each entry point of the header becomes that call's failure
//! (status, NULL or 0) with `gpumem_last_error` naming the entry point and the panic; the
//! process goes on; a panic at a call's start leaves the pool working, one inside the pool's
//! locked state leaves that device's pool refusing every later call with the reason (the
//! Python binding's path, `api`, included) while the other pools work. `gpumem_torch_alloc`
//! throws a C++ exception instead: tests/c/torch_panic.cpp covers it (c_program.rs).
//!
//! The armed panic is process-wide, so the tests take turns ([`serial`]).

use std::ffi::{c_void, CStr, CString};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use gpumem_capi::*;

const MIB: usize = 1 << 20;

/// One test at a time: a panic armed by one must not strike another's call.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    std::env::set_var("GPUMEM_DEVICE", "sim");
    for name in [
        "GPUMEM_POOL",
        "GPUMEM_HARD_LIMIT",
        "GPUMEM_SOFT_LIMIT",
        "GPUMEM_PUBLISH",
    ] {
        std::env::remove_var(name);
    }
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn last_error() -> String {
    // SAFETY: never NULL, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr(gpumem_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn inject(entry: &str, while_pool_locked: bool) -> GpumemStatus {
    let name = CString::new(entry).unwrap();
    // SAFETY: a NUL-terminated string.
    unsafe { gpumem_test_inject_panic(name.as_ptr(), while_pool_locked.into()) }
}

fn alloc(size: usize, device: i32) -> Result<*mut c_void, (GpumemStatus, String)> {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: `ptr` is writable storage for one pointer.
    match unsafe { gpumem_alloc(size, device, std::ptr::null_mut(), &mut ptr) } {
        GpumemStatus::GpumemOk => Ok(ptr),
        status => Err((status, last_error())),
    }
}

/// The pool of `device` allocates and frees.
fn assert_works(device: i32) {
    let ptr = alloc(MIB, device).unwrap_or_else(|e| panic!("device {device}: {e:?}"));
    assert_eq!(gpumem_free(ptr, MIB, device), GpumemStatus::GpumemOk);
}

/// What a call returned.
#[derive(Debug, PartialEq)]
enum Returned {
    Status(GpumemStatus),
    Pointer(bool),
    Size(usize),
    Nothing,
}

impl Returned {
    /// Whether this is the failure of the call's return type.
    fn failed(&self) -> bool {
        match self {
            Returned::Status(status) => *status != GpumemStatus::GpumemOk,
            Returned::Pointer(null) => *null,
            Returned::Size(size) => *size == 0,
            Returned::Nothing => true,
        }
    }
}

/// Calls the entry point `name` with valid arguments on `device`; `ptr` is a live allocation
/// of `MIB` bytes there for the frees.
fn call(name: &str, device: i32, ptr: *mut c_void, dir: &Path) -> Returned {
    let mut buffer = [0 as std::ffi::c_char; 64];
    let (buf, cap) = (buffer.as_mut_ptr(), buffer.len());
    let null = std::ptr::null_mut();
    let path = CString::new(dir.join("snapshot.pickle").to_str().unwrap()).unwrap();
    let publish_dir = CString::new(dir.join("published").to_str().unwrap()).unwrap();
    let limit = CString::new("1GiB").unwrap();
    let mut out = null;
    // SAFETY: every pointer is NULL, a live allocation of the pool, writable storage of the
    // size given, or a NUL-terminated string, as each entry point asks.
    unsafe {
        match name {
            "gpumem_torch_pool_alloc" => {
                Returned::Pointer(gpumem_torch_pool_alloc(MIB, device, null).is_null())
            }
            "gpumem_torch_free" => {
                Returned::Nothing.also(|| gpumem_torch_free(ptr, MIB, device, null))
            }
            "gpumem_cupy_malloc" => {
                Returned::Pointer(gpumem_cupy_malloc(null, MIB, device).is_null())
            }
            "gpumem_cupy_free" => Returned::Nothing.also(|| gpumem_cupy_free(null, ptr, device)),
            "gpumem_alloc" => Returned::Status(gpumem_alloc(MIB, device, null, &mut out)),
            "gpumem_free" => Returned::Status(gpumem_free(ptr, MIB, device)),
            "gpumem_last_error" => {
                Returned::Size(CStr::from_ptr(gpumem_last_error()).to_bytes().len())
            }
            "gpumem_memory_stats" => Returned::Size(gpumem_memory_stats(device, buf, cap)),
            "gpumem_pool_status" => Returned::Size(gpumem_pool_status(device, buf, cap)),
            "gpumem_last_oom" => Returned::Size(gpumem_last_oom(device, buf, cap)),
            "gpumem_policy" => Returned::Size(gpumem_policy(device, buf, cap)),
            "gpumem_empty_cache" => {
                Returned::Status(gpumem_empty_cache(device, std::ptr::null_mut()))
            }
            "gpumem_reset_peak_stats" => Returned::Status(gpumem_reset_peak_stats(device)),
            "gpumem_set_history" => Returned::Status(gpumem_set_history(device, 100)),
            "gpumem_configure" => Returned::Status(gpumem_configure(
                std::ptr::null(),
                std::ptr::null(),
                limit.as_ptr(),
                -1,
            )),
            "gpumem_set_limits" => {
                Returned::Status(gpumem_set_limits(device, std::ptr::null(), limit.as_ptr()))
            }
            "gpumem_snapshot" => Returned::Status(gpumem_snapshot(device, path.as_ptr())),
            "gpumem_publish" => Returned::Status(gpumem_publish(publish_dir.as_ptr())),
            other => panic!("no call for {other}: add it here"),
        }
    }
}

impl Returned {
    fn also(self, f: impl FnOnce()) -> Returned {
        f();
        self
    }
}

/// The functions the committed header declares, but the injector.
fn header_functions() -> Vec<String> {
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/gpumem.h"))
            .unwrap();
    let mut names: Vec<String> = header
        .lines()
        .filter(|line| !line.starts_with("//") && !line.starts_with('#'))
        .filter_map(|line| {
            let start = line.find("gpumem_")?;
            let name = &line[start..line[start..].find('(')? + start];
            Some(name.to_string())
        })
        .filter(|name| name != "gpumem_test_inject_panic")
        .collect();
    names.dedup();
    names
}

#[test]
fn every_entry_point_turns_a_panic_at_its_start_into_an_error_and_the_pool_stays_usable() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let device = 3;
    let names = header_functions();
    assert_eq!(names.len(), 19, "{names:?}");
    for name in names.iter().filter(|n| *n != "gpumem_torch_alloc") {
        let ptr = alloc(MIB, device).unwrap();
        assert_eq!(
            inject(name, false),
            GpumemStatus::GpumemOk,
            "{}",
            last_error()
        );
        let returned = call(name, device, ptr, dir.path());
        assert!(returned.failed(), "{name} returned {returned:?}");
        if let Returned::Status(status) = returned {
            assert_eq!(status, GpumemStatus::GpumemInternal, "{name}");
        }
        let error = last_error();
        assert!(
            error.starts_with(&format!(
                "internal error in {name}: panicked: injected panic at the start of {name}; "
            )),
            "{name}: {error}"
        );
        assert!(error.contains("the pools stay usable"), "{error}");
        // The call did nothing: the allocation is still live, and the next call works.
        assert_eq!(
            gpumem_free(ptr, MIB, device),
            GpumemStatus::GpumemOk,
            "{name}"
        );
        assert_works(device);
    }
    assert!(!dir.path().join("snapshot.pickle").exists());
    assert!(!dir.path().join("published").exists());
}

#[test]
fn a_panic_inside_a_pool_leaves_that_pool_unusable_and_the_others_working() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let changing = [
        "gpumem_torch_pool_alloc",
        "gpumem_torch_free",
        "gpumem_cupy_malloc",
        "gpumem_cupy_free",
        "gpumem_alloc",
        "gpumem_free",
    ];
    for (name, device) in changing.into_iter().zip(10..) {
        let ptr = alloc(MIB, device).unwrap();
        assert_eq!(
            inject(name, true),
            GpumemStatus::GpumemOk,
            "{}",
            last_error()
        );
        let returned = call(name, device, ptr, dir.path());
        assert!(returned.failed(), "{name} returned {returned:?}");
        if let Returned::Status(status) = returned {
            assert_eq!(status, GpumemStatus::GpumemInternal, "{name}");
        }
        let error = last_error();
        assert!(
            error.starts_with(&format!(
                "internal error in {name}: panicked: injected panic inside the pool's locked \
                 state in {name}; it struck while the pool of device {device} was changing its \
                 state, so that pool is unusable from now on (restart the process)"
            )),
            "{name}: {error}"
        );

        // Every later call on the device is refused with the reason, without a panic.
        let unusable = format!(
            "the gpumem pool of device {device} is unusable after an internal error in {name}: \
             injected panic inside the pool's locked state in {name}; restart the process"
        );
        let (status, error) = alloc(MIB, device).unwrap_err();
        assert_eq!(status, GpumemStatus::GpumemUnusable);
        assert!(error.starts_with(&unusable), "{error}");
        assert_eq!(gpumem_free(ptr, MIB, device), GpumemStatus::GpumemUnusable);
        let mut buffer = [0 as std::ffi::c_char; 16];
        // SAFETY: the buffer holds 16 bytes.
        let needed = unsafe { gpumem_memory_stats(device, buffer.as_mut_ptr(), 16) };
        assert_eq!(needed, 0);
        assert!(last_error().starts_with(&unusable), "{}", last_error());
        // The Python binding's path says the same.
        let error = api::memory_stats(device.into()).unwrap_err();
        assert!(error.to_string().starts_with(&unusable), "{error}");
        assert_eq!(error.status(), GpumemStatus::GpumemUnusable);

        // The other pools work.
        assert_works(2);
    }
    // Configuring every pool leaves the unusable ones alone: they still refuse.
    let limit = CString::new("1GiB").unwrap();
    // SAFETY: NULL or NUL-terminated strings.
    let status =
        unsafe { gpumem_configure(std::ptr::null(), std::ptr::null(), limit.as_ptr(), -1) };
    assert_eq!(status, GpumemStatus::GpumemOk, "{}", last_error());
    // SAFETY: as above.
    let status = unsafe { gpumem_set_limits(10, std::ptr::null(), limit.as_ptr()) };
    assert_eq!(status, GpumemStatus::GpumemUnusable, "{}", last_error());
    assert_works(2);
}

#[test]
fn arming_names_what_it_accepts() {
    let _serial = serial();
    assert_eq!(
        inject("gpumem_alocate", false),
        GpumemStatus::GpumemInvalidArgument
    );
    let error = last_error();
    assert!(
        error.starts_with("entry_point \"gpumem_alocate\" is not valid: not an entry point here; accepted (while_pool_locked = false): gpumem_torch_alloc, "),
        "{error}"
    );
    assert!(error.contains("gpumem_publish"), "{error}");
    // Only the calls that always change a pool can be armed inside it.
    assert_eq!(
        inject("gpumem_memory_stats", true),
        GpumemStatus::GpumemInvalidArgument
    );
    let error = last_error();
    assert!(
        error.contains("accepted (while_pool_locked = true): gpumem_torch_alloc"),
        "{error}"
    );
    assert!(!error.contains("gpumem_publish"), "{error}");
    // SAFETY: NULL is accepted.
    let status = unsafe { gpumem_test_inject_panic(std::ptr::null(), 0) };
    assert_eq!(status, GpumemStatus::GpumemInvalidArgument);
    assert!(last_error().contains("\"NULL\""), "{}", last_error());
    // Nothing was armed by the refusals.
    assert_works(4);
}
