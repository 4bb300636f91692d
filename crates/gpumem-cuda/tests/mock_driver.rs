//! The backend end to end on a mock CUDA driver, on any Linux machine: `tests/mock/libcuda.c`
//! is compiled with the system C compiler and the GPU scenarios of `common/mod.rs` run in a
//! child process that loads it (the dynamic loader reads `LD_LIBRARY_PATH` at start-up, and the
//! driver library is loaded once per process). The mock models what the backend relies on,
//! not CUDA (see its header): this checks the backend's own logic (context binding on every
//! call, handle tables, range checks, page-locked buffers and staging, VMM bookkeeping, a pool
//! over it per policy, and the conformance suite every backend runs), not the behaviour of a
//! real GPU, which `gpu.rs` checks.
#![cfg(target_os = "linux")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use gpumem_cuda::{CudaDevice, CUDA_ERROR_NO_DEVICE};
use gpumem_device::{Device, DeviceError};
use gpumem_testkit::deps;

/// Set in the child process that loads the mock.
const IN_CHILD: &str = "GPUMEM_CUDA_MOCK_CHILD";

/// Compiles the mock into `libcuda.so` and `libcuda.so.1` in a directory of its own. Without
/// a C compiler the test fails with what to install, or, when the user opted out of missing
/// test dependencies, this is `None` after a `SKIPPED:` line (`gpumem_testkit::deps`).
fn build_mock() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mock-libcuda");
    std::fs::create_dir_all(&dir).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mock/libcuda.c");
    let lib = dir.join("libcuda.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let compiled = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg("-lpthread")
        .output()
        .map_err(|e| format!("{cc}: {e}"));
    let out = deps::require(deps::C_COMPILER, compiled)?;
    assert!(
        out.status.success(),
        "compiling the mock driver failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::copy(&lib, dir.join("libcuda.so")).unwrap();
    Some(dir)
}

/// Runs the ignored test `name` of this binary in a child that loads the mock from `dir`.
fn run_child(dir: &Path, name: &str, env: &[(&str, &str)]) {
    let library_path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    };
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            name,
            "--test-threads=1",
            "--nocapture",
        ])
        .env("LD_LIBRARY_PATH", library_path)
        .env(IN_CHILD, "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} {env:?} on the mock driver failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{name} {env:?}: passed on the mock driver");
}

#[test]
fn the_backend_runs_on_a_mock_driver() {
    if std::env::var_os(IN_CHILD).is_some() {
        return;
    }
    let Some(dir) = build_mock() else { return };
    let mem = ("MOCK_CUDA_MEM", "536870912");
    run_child(&dir, "mock_scenarios", &[mem]);
    run_child(&dir, "mock_scenarios", &[mem, ("MOCK_CUDA_NO_VMM", "1")]);
    run_child(&dir, "mock_without_a_device", &[("MOCK_CUDA_INIT", "100")]);
}

/// True in the child; elsewhere (e.g. `--include-ignored` on a GPU machine) says why the
/// test does nothing.
fn in_child() -> bool {
    let inside = std::env::var_os(IN_CHILD).is_some();
    if !inside {
        eprintln!("runs only inside the_backend_runs_on_a_mock_driver, with the mock loaded");
    }
    inside
}

#[test]
#[ignore = "run by the_backend_runs_on_a_mock_driver, in a process that loads the mock driver"]
fn mock_scenarios() {
    if !in_child() {
        return;
    }
    let dev = Arc::new(CudaDevice::open(0).unwrap());
    assert_eq!(dev.name(), "cuda:0 (gpumem mock GPU)", "the mock is loaded");
    assert_eq!(
        dev.info().vmm_supported(),
        std::env::var_os("MOCK_CUDA_NO_VMM").is_none()
    );
    common::malloc_free_and_mem_info(&dev);
    common::copies_round_trip_sync_and_async(&dev);
    common::streams_and_events_order_the_work(&dev, false);
    common::a_foreign_stream_is_used_once_adopted_and_left_to_its_owner(&dev);
    common::vmm_chunks_show_the_same_bytes_through_two_mappings(&dev);
    common::a_pool_over_the_gpu_runs_every_policy(&dev);
    common::device_out_of_memory_makes_the_pool_reclaim_and_retry(&dev);
    common::every_device_opens_and_describes_itself();
    common::the_conformance_suite_passes(&dev);
    // Page-locked memory is zeroed here (the mock hands it out filled with 0xAB) and
    // outlives the device that allocated it.
    let buf = dev.alloc_pinned(4096).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    drop(dev);
    assert_eq!(buf.len(), 4096);
}

#[test]
#[ignore = "run by the_backend_runs_on_a_mock_driver, in a process that loads the mock driver"]
fn mock_without_a_device() {
    if !in_child() {
        return;
    }
    let err = CudaDevice::open(0).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Driver(code) if code.code == CUDA_ERROR_NO_DEVICE
        && code.name == "CUDA_ERROR_NO_DEVICE"),
        "{err}"
    );
    assert_eq!(CudaDevice::count().unwrap_err(), err);
}
