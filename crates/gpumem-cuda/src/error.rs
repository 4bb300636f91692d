//! CUDA errors as [`DeviceError`]s: every `CUresult` goes through
//! [`DeviceError::from_backend`], and a driver that cannot be used is a typed error too.

use gpumem_device::{BackendCode, DeviceError};

use crate::ffi::{CUresult, Driver, LoadError};

/// The backend name in every [`BackendCode`] and [`DeviceError::Unsupported`] of this crate.
pub const BACKEND: &str = "cuda";

/// `CUDA_ERROR_OUT_OF_MEMORY`: the one code that means "out of memory" (the pool frees its
/// cache and retries on it).
pub const CUDA_ERROR_OUT_OF_MEMORY: i64 = 2;

/// `CUDA_ERROR_NO_DEVICE`: the driver is installed but sees no CUDA device.
pub const CUDA_ERROR_NO_DEVICE: i64 = 100;

/// Maps a driver error: its code, its name and description from the driver
/// (`cuGetErrorName`, `cuGetErrorString`), out of memory exactly for
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn cuda_error(code: CUresult) -> DeviceError {
    let number = code as u32 as i64;
    let (name, message) = crate::ffi::describe(code);
    let message = message.unwrap_or_else(|| "(no description from the CUDA driver)".into());
    DeviceError::from_backend(
        BackendCode::new(BACKEND, number, name, message),
        number == CUDA_ERROR_OUT_OF_MEMORY,
    )
}

/// Maps a driver that cannot be used: no library or an old one is
/// [`DeviceError::Unsupported`] naming what is missing; a failed `cuInit` is the driver's own
/// code (`CUDA_ERROR_NO_DEVICE` on a machine with a driver and no GPU).
pub(crate) fn load_error(error: LoadError) -> DeviceError {
    match error {
        LoadError::NoLibrary { tried } => DeviceError::unsupported(
            BACKEND,
            format!(
                "no NVIDIA driver: the CUDA driver library could not be loaded ({}); install \
                 the NVIDIA driver or add its directory to LD_LIBRARY_PATH",
                tried_names(&tried)
            ),
        ),
        LoadError::MissingSymbol(symbol) => DeviceError::unsupported(
            BACKEND,
            format!("the CUDA driver library has no {symbol}: the NVIDIA driver is too old"),
        ),
        LoadError::Init(code) => cuda_error(code),
    }
}

/// The file names tried, shortly: all of them when few, else the first, the last and how many.
fn tried_names(tried: &[String]) -> String {
    match tried {
        [] => "no file names to try".into(),
        [one] => format!("tried {one}"),
        [first, .., last] if tried.len() > 4 => {
            format!("tried {} names, {first} to {last}", tried.len())
        }
        all => format!("tried {}", all.join(", ")),
    }
}

/// The driver, loaded and initialised, or the error that says why it cannot be.
pub(crate) fn driver() -> Result<Driver, DeviceError> {
    Driver::get().map_err(load_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_out_of_memory_with_the_cuda_code() {
        let e = cuda_error(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(e.is_out_of_memory(), "{e}");
        let code = e.backend_code().expect("the driver's code is kept");
        assert_eq!(code.backend, "cuda");
        assert_eq!(code.code, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(code.name, "CUDA_ERROR_OUT_OF_MEMORY");
        // The driver's description (or the fallback without a driver) reaches the message.
        assert!(e.to_string().contains(&code.message), "{e}");
    }

    #[test]
    fn other_codes_are_driver_faults_with_their_code_and_name() {
        for (result, number, name) in [
            (
                CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
                700,
                "CUDA_ERROR_ILLEGAL_ADDRESS",
            ),
            (
                CUresult::CUDA_ERROR_INVALID_VALUE,
                1,
                "CUDA_ERROR_INVALID_VALUE",
            ),
            (
                CUresult::CUDA_ERROR_NO_DEVICE,
                CUDA_ERROR_NO_DEVICE,
                "CUDA_ERROR_NO_DEVICE",
            ),
            (CUresult::CUDA_ERROR_NOT_READY, 600, "CUDA_ERROR_NOT_READY"),
        ] {
            let e = cuda_error(result);
            assert!(!e.is_out_of_memory(), "{e}");
            match &e {
                DeviceError::Driver(code) => {
                    assert_eq!((code.backend.as_str(), code.code), ("cuda", number));
                    assert_eq!(code.name, name);
                }
                other => panic!("expected a driver error, got {other:?}"),
            }
            assert!(e.to_string().contains(name), "{e}");
        }
    }

    #[test]
    fn a_missing_library_is_unsupported_and_names_it() {
        let e = load_error(LoadError::NoLibrary {
            tried: vec!["libcuda.so".into(), "libcuda.so.1".into()],
        });
        assert!(!e.is_out_of_memory());
        assert!(
            matches!(&e, DeviceError::Unsupported { backend, what }
                if backend == "cuda" && what.contains("libcuda.so.1") && what.contains("no NVIDIA driver")),
            "{e}"
        );
        let e = load_error(LoadError::MissingSymbol("cuMemCreate"));
        assert!(e.to_string().contains("cuMemCreate"), "{e}");
        let e = load_error(LoadError::Init(CUresult::CUDA_ERROR_NO_DEVICE));
        assert_eq!(e.backend_code().map(|c| c.code), Some(CUDA_ERROR_NO_DEVICE));
    }
}
