use std::fmt;

use crate::{DevicePtr, MemInfo};

/// What a device call can fail with.
///
/// Backends map their own errors through [`DeviceError::from_backend`], which keeps the
/// backend's code ([`BackendCode`]) and files out-of-memory codes under
/// [`DeviceError::OutOfMemory`]; whether an error means "out of memory" is then decided by
/// [`DeviceError::is_out_of_memory`] alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device has too little free memory for the request. Built by
    /// [`DeviceError::out_of_memory`] (a refusal decided by gpumem or a simulated device) or by
    /// [`DeviceError::from_backend`] (a driver's out-of-memory code).
    #[error("device out of memory{}", oom_details(*.requested, *.info, .code.as_deref()))]
    OutOfMemory {
        /// Bytes asked for, when the refused call was a request for memory.
        requested: Option<u64>,
        /// Free and total memory at the time, when they are known.
        info: Option<MemInfo>,
        /// The backend's own error, when a driver refused.
        code: Option<Box<BackendCode>>,
    },
    /// An argument the device rejects (zero size, misaligned address …).
    #[error("invalid value: {0}")]
    InvalidValue(String),
    /// An address that no live allocation, reservation or mapping starts at.
    #[error("invalid device address {ptr:#x}: {what}")]
    InvalidAddress {
        /// The address given.
        ptr: DevicePtr,
        /// Why it was rejected.
        what: String,
    },
    /// A stream, event or physical handle that does not exist.
    #[error("unknown {kind} {id}")]
    UnknownHandle {
        /// "stream", "event" or "physical handle".
        kind: &'static str,
        /// Its id.
        id: u64,
    },
    /// The backend cannot do this (e.g. copies on an address-only simulation, VMM on a device
    /// without it, transfers on a backend that implements only memory).
    #[error("not supported by {backend}: {what}")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// What was asked.
        what: String,
    },
    /// Any other error a driver reported, with the driver's own code.
    #[error("driver error: {0}")]
    Driver(Box<BackendCode>),
}

/// A backend's own error, kept whole so that messages, logs and a C ABI can report exactly
/// what the driver said (e.g. `cuda`, 2, `CUDA_ERROR_OUT_OF_MEMORY`, "out of memory").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendCode {
    /// The backend that reported it, e.g. `"cuda"` or `"wgpu"`.
    pub backend: String,
    /// The numeric code (a `CUresult` for CUDA; a backend without numeric codes numbers its
    /// error kinds).
    pub code: i64,
    /// The code's symbolic name, e.g. `"CUDA_ERROR_OUT_OF_MEMORY"`.
    pub name: String,
    /// The driver's description of the error.
    pub message: String,
}

impl BackendCode {
    /// A code as a backend reports it.
    pub fn new(
        backend: impl Into<String>,
        code: i64,
        name: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        BackendCode {
            backend: backend.into(),
            code,
            name: name.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for BackendCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} error {} ({}): {}",
            self.backend, self.code, self.name, self.message
        )
    }
}

/// The optional parts of an out-of-memory message: `: requested N bytes, F of T bytes free
/// (backend error …)`, each part only when known.
fn oom_details(
    requested: Option<u64>,
    info: Option<MemInfo>,
    code: Option<&BackendCode>,
) -> String {
    let mut parts = Vec::new();
    if let Some(requested) = requested {
        parts.push(format!("requested {requested} bytes"));
    }
    if let Some(info) = info {
        parts.push(format!("{} of {} bytes free", info.free, info.total));
    }
    let mut text = if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join(", "))
    };
    if let Some(code) = code {
        text.push_str(&format!(" ({code})"));
    }
    text
}

impl DeviceError {
    /// A refusal of `requested` bytes for lack of memory, decided without a driver (a simulated
    /// device's capacity, a policy's own check), with the device's memory at the time when
    /// known.
    pub fn out_of_memory(requested: u64, info: Option<MemInfo>) -> Self {
        DeviceError::OutOfMemory {
            requested: Some(requested),
            info,
            code: None,
        }
    }

    /// Maps a backend's error: every backend turns its errors into [`DeviceError`]s through
    /// this one constructor. `out_of_memory` is the backend's reading of its own code (CUDA:
    /// `CUDA_ERROR_OUT_OF_MEMORY`, 2; wgpu: `Error::OutOfMemory`): such an error becomes
    /// [`DeviceError::OutOfMemory`] carrying the code, any other a [`DeviceError::Driver`].
    pub fn from_backend(code: BackendCode, out_of_memory: bool) -> Self {
        let code = Box::new(code);
        if out_of_memory {
            DeviceError::OutOfMemory {
                requested: None,
                info: None,
                code: Some(code),
            }
        } else {
            DeviceError::Driver(code)
        }
    }

    /// Whether the device refused for lack of memory (worth freeing cached memory and
    /// retrying) rather than for a fault. The one place that decides it: every backend maps its
    /// own out-of-memory codes to [`DeviceError::OutOfMemory`] through
    /// [`DeviceError::from_backend`].
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, DeviceError::OutOfMemory { .. })
    }

    /// The backend's own error code, when a driver reported this error.
    pub fn backend_code(&self) -> Option<&BackendCode> {
        match self {
            DeviceError::OutOfMemory { code, .. } => code.as_deref(),
            DeviceError::Driver(code) => Some(code),
            _ => None,
        }
    }

    /// The error a backend returns for a capability it lacks.
    pub fn unsupported(backend: impl Into<String>, what: impl Into<String>) -> Self {
        DeviceError::Unsupported {
            backend: backend.into(),
            what: what.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuda_oom() -> BackendCode {
        BackendCode::new("cuda", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    }

    #[test]
    fn backend_out_of_memory_is_out_of_memory_and_keeps_its_code() {
        let e = DeviceError::from_backend(cuda_oom(), true);
        assert!(e.is_out_of_memory());
        assert_eq!(e.backend_code(), Some(&cuda_oom()));
        assert_eq!(
            e.to_string(),
            "device out of memory (cuda error 2 (CUDA_ERROR_OUT_OF_MEMORY): out of memory)"
        );
        let wgpu = BackendCode::new("wgpu", 1, "OutOfMemory", "not enough memory left");
        assert!(DeviceError::from_backend(wgpu, true).is_out_of_memory());
    }

    #[test]
    fn other_backend_errors_are_driver_faults_with_their_code() {
        let code = BackendCode::new("cuda", 700, "CUDA_ERROR_ILLEGAL_ADDRESS", "illegal address");
        let e = DeviceError::from_backend(code.clone(), false);
        assert!(!e.is_out_of_memory());
        assert_eq!(e, DeviceError::Driver(Box::new(code.clone())));
        assert_eq!(e.backend_code(), Some(&code));
        assert_eq!(
            e.to_string(),
            "driver error: cuda error 700 (CUDA_ERROR_ILLEGAL_ADDRESS): illegal address"
        );
    }

    #[test]
    fn gpumem_decided_out_of_memory_has_no_code() {
        let info = MemInfo { free: 2, total: 8 };
        let e = DeviceError::out_of_memory(4, Some(info));
        assert!(e.is_out_of_memory());
        assert_eq!(e.backend_code(), None);
        assert_eq!(
            e.to_string(),
            "device out of memory: requested 4 bytes, 2 of 8 bytes free"
        );
        assert_eq!(
            DeviceError::out_of_memory(4, None).to_string(),
            "device out of memory: requested 4 bytes"
        );
        assert!(!DeviceError::unsupported("sim", "copies").is_out_of_memory());
        assert!(!DeviceError::InvalidValue("zero".into()).is_out_of_memory());
    }
}
