//! What the CUDA backend does on any machine, GPU or not: with no driver it fails with a typed
//! error that names the missing library, never a panic; with a driver it opens the device (or
//! reports the driver's own reason it cannot). Which case applies is decided here
//! independently of the crate, by looking for `libcuda` where the dynamic loader would.

use std::path::Path;
use std::process::Command;

use gpumem_cuda::{devices, driver_version, CudaDevice, CUDA_ERROR_NO_DEVICE};
use gpumem_device::{Device, DeviceError};

/// Whether a CUDA driver library is installed where `dlopen` looks: `LD_LIBRARY_PATH`, the
/// loader cache (`ldconfig -p`) and the usual library directories.
fn libcuda_installed() -> bool {
    let mut dirs: Vec<String> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(String::from)
        .collect();
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/lib",
            "/usr/lib/wsl/lib",
        ]
        .map(String::from),
    );
    let in_dirs = dirs.iter().any(|d| {
        ["libcuda.so", "libcuda.so.1"]
            .iter()
            .any(|f| Path::new(d).join(f).exists())
    });
    let in_cache = Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
        .unwrap_or(false);
    in_dirs || in_cache
}

fn is_missing_library(e: &DeviceError) -> bool {
    matches!(e, DeviceError::Unsupported { backend, what }
        if backend == "cuda" && what.contains("no NVIDIA driver") && what.contains("libcuda.so"))
}

#[test]
fn opening_a_device_says_whether_a_driver_is_there() {
    let opened = CudaDevice::open(0);
    if !libcuda_installed() {
        let err = opened.expect_err("no libcuda on this machine, yet a CUDA device opened");
        assert!(is_missing_library(&err), "{err}");
        assert!(!err.is_out_of_memory());
        eprintln!("no NVIDIA driver here, as expected: {err}");
        return;
    }
    // A driver is installed: the library must have been found, and the device opens unless
    // the driver itself says why not (no GPU, a stub library, a kernel-module mismatch).
    match (opened, CudaDevice::count()) {
        (Ok(dev), Ok(count)) => {
            assert!(count >= 1);
            assert!(dev.name().starts_with("cuda:0 ("), "{}", dev.name());
            assert!(dev.info().total_memory > 0);
            eprintln!("opened {} ({count} device(s))", dev.name());
        }
        (Err(err), count) => {
            assert!(
                !is_missing_library(&err),
                "libcuda is installed but was not loaded: {err}"
            );
            // The driver's own code, or a driver too old for this crate.
            let code = err.backend_code().map(|c| c.code);
            let too_old = matches!(&err, DeviceError::Unsupported { backend, what }
                if backend == "cuda" && what.contains("too old"));
            assert!(
                code.is_some() || too_old,
                "expected the driver's reason: {err}"
            );
            if code == Some(CUDA_ERROR_NO_DEVICE) {
                assert_eq!(
                    count.map_err(|e| e.backend_code().map(|c| c.code)),
                    Err(code)
                );
            }
            eprintln!("a driver is installed but cannot open cuda:0: {err}");
        }
        (Ok(_), Err(err)) => panic!("cuda:0 opened but counting devices failed: {err}"),
    }
}

#[test]
fn every_entry_point_fails_the_same_typed_way_without_a_driver() {
    if libcuda_installed() {
        eprintln!("a CUDA driver is installed: the no-driver errors cannot be seen here");
        return;
    }
    for err in [
        CudaDevice::count().map(drop).unwrap_err(),
        CudaDevice::open(3).map(drop).unwrap_err(),
        devices().map(drop).unwrap_err(),
        driver_version().map(drop).unwrap_err(),
        gpumem_cuda::DeviceInfo::query(0).map(drop).unwrap_err(),
    ] {
        assert!(is_missing_library(&err), "{err}");
        assert!(err
            .to_string()
            .starts_with("not supported by cuda: no NVIDIA driver"));
    }
}

#[test]
fn an_ordinal_past_the_last_device_is_an_error() {
    match CudaDevice::count() {
        Ok(count) => {
            let err = CudaDevice::open(count).unwrap_err();
            assert!(matches!(err, DeviceError::InvalidValue(_)), "{err}");
        }
        Err(err) => {
            // No usable driver: the same error, whatever the ordinal.
            let again = CudaDevice::open(usize::MAX).unwrap_err();
            assert_eq!(again, err);
        }
    }
}
