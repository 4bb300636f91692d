//! One alloc+free of 4 KiB on the simulated device, side by side: the pool called from Rust
//! (the peer: no C ABI), the C entry points called from Rust, from a C program, and from
//! Python through ctypes. The C and Python loops run in child processes that time their own
//! loop (criterion's `iter_custom`), so process start-up is not counted.
//!
//! `cargo bench -p gpumem-capi --bench alloc_free` (needs `cc` and `python3`; either missing is
//! skipped with a message).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{Pool, PoolConfig};

const SIZE: usize = 4096;

/// Where cargo put the shared library for this build: beside this executable (deps/, where
/// `cargo test` and `cargo bench` build it) or one folder up (where `cargo build` copies it).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let up = deps.parent().unwrap().to_path_buf();
    [deps.clone(), up]
        .into_iter()
        .find(|dir| {
            dir.join("libgpumem_capi.so").exists() || dir.join("libgpumem_capi.dylib").exists()
        })
        .unwrap_or(deps)
}

/// The C loop compiled against the header and the shared library, or why not.
fn c_loop() -> Result<PathBuf, String> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    let exe = std::env::temp_dir().join(format!("gpumem-bench-loop-{}", std::process::id()));
    let status = Command::new("cc")
        .arg(crate_dir.join("benches/loop.c"))
        .arg("-O2")
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lgpumem_capi", "-o"])
        .arg(&exe)
        .status()
        .map_err(|e| format!("cc: {e}"))?;
    status
        .success()
        .then_some(exe)
        .ok_or_else(|| "cc failed".to_string())
}

/// Runs a child loop of `iters` pairs and returns the time it reports.
fn child_loop(command: &mut Command, iters: u64) -> Duration {
    let out = command
        .arg(iters.to_string())
        .env("GPUMEM_DEVICE", "sim")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nanos: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    Duration::from_nanos(nanos)
}

fn alloc_free(c: &mut Criterion) {
    // SAFETY (of the environment change): set before any thread of this process reads it.
    std::env::set_var("GPUMEM_DEVICE", "sim");
    let mut group = c.benchmark_group("alloc_free_4KiB");
    let device = Arc::new(SimDevice::new(SimConfig::address_only(16 << 30)).unwrap());
    let pool = Pool::new(device, PoolConfig::default()).unwrap();
    group.bench_function("rust_pool", |b| {
        b.iter(|| {
            let a = pool.allocate(SIZE as u64, StreamId::DEFAULT).unwrap();
            pool.free(a.ptr).unwrap();
        })
    });
    group.bench_function("c_abi_from_rust", |b| {
        let mut out = std::ptr::null_mut();
        b.iter(|| {
            // SAFETY: `out` is a live local.
            unsafe { gpumem_capi::gpumem_alloc(SIZE, 0, std::ptr::null_mut(), &mut out) };
            gpumem_capi::gpumem_free(out, SIZE, 0);
        })
    });
    match c_loop() {
        Ok(exe) => {
            group.bench_function("c_abi_from_c", |b| {
                b.iter_custom(|iters| child_loop(&mut Command::new(&exe), iters))
            });
        }
        Err(why) => eprintln!("c_abi_from_c skipped: {why}"),
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/loop.py");
    let lib = library_dir().join("libgpumem_capi.so");
    if Command::new("python3").arg("--version").output().is_ok() {
        group.bench_function("c_abi_from_python_ctypes", |b| {
            b.iter_custom(|iters| child_loop(Command::new("python3").arg(&script).arg(&lib), iters))
        });
    } else {
        eprintln!("c_abi_from_python_ctypes skipped: no python3");
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = alloc_free
}
criterion_main!(benches);
