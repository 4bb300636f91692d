//! wgpu's errors as [`DeviceError`]s.
//!
//! wgpu reports errors as kinds with a message, not as numeric codes, so gpumem numbers the
//! kinds ([`codes`]) for [`BackendCode::code`]. Every mapping goes through
//! [`DeviceError::from_backend`]; only [`wgpu::Error::OutOfMemory`] is out of memory.

use gpumem_device::{BackendCode, DeviceError};

/// The backend name in every [`BackendCode`] of this crate.
pub const BACKEND: &str = "wgpu";

/// The numbers gpumem gives wgpu's error kinds in [`BackendCode::code`].
pub mod codes {
    /// [`wgpu::Error::OutOfMemory`]: the only code that is out of memory.
    pub const OUT_OF_MEMORY: i64 = 1;
    /// [`wgpu::Error::Validation`]: a call wgpu rejected.
    pub const VALIDATION: i64 = 2;
    /// [`wgpu::Error::Internal`]: any other failure wgpu reported.
    pub const INTERNAL: i64 = 3;
    /// Waiting for or polling a submission failed ([`wgpu::PollError`]).
    pub const POLL: i64 = 4;
    /// Mapping a staging buffer for reading failed ([`wgpu::BufferAsyncError`]).
    pub const MAP: i64 = 5;
    /// No adapter (GPU, or a software driver) could be found or picked.
    pub const NO_ADAPTER: i64 = 6;
    /// The adapter refused to open a device ([`wgpu::RequestDeviceError`]).
    pub const REQUEST_DEVICE: i64 = 7;
}

/// A backend error that is not out of memory.
pub(crate) fn driver(code: i64, name: &str, message: impl Into<String>) -> DeviceError {
    DeviceError::from_backend(BackendCode::new(BACKEND, code, name, message), false)
}

/// Maps an error that an error scope caught during `what`.
pub(crate) fn from_wgpu(what: &str, error: wgpu::Error) -> DeviceError {
    let (code, name, oom) = match &error {
        wgpu::Error::OutOfMemory { .. } => (codes::OUT_OF_MEMORY, "OutOfMemory", true),
        wgpu::Error::Validation { .. } => (codes::VALIDATION, "Validation", false),
        wgpu::Error::Internal { .. } => (codes::INTERNAL, "Internal", false),
    };
    let mut message = format!("{what}: {error}");
    if let wgpu::Error::OutOfMemory { source } = &error {
        message.push_str(&format!(" ({source})"));
    }
    DeviceError::from_backend(BackendCode::new(BACKEND, code, name, message), oom)
}

/// Maps a failed poll or wait.
pub(crate) fn from_poll(what: &str, error: wgpu::PollError) -> DeviceError {
    let name = match error {
        wgpu::PollError::Timeout => "PollError::Timeout",
        wgpu::PollError::WrongSubmissionIndex(..) => "PollError::WrongSubmissionIndex",
    };
    driver(codes::POLL, name, format!("{what}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_out_of_memory_is_out_of_memory() {
        let source = || Box::<dyn std::error::Error + Send + Sync>::from("budget exceeded");
        let oom = from_wgpu("malloc", wgpu::Error::OutOfMemory { source: source() });
        assert!(oom.is_out_of_memory(), "{oom}");
        let code = oom.backend_code().unwrap();
        assert_eq!((code.backend.as_str(), code.code), ("wgpu", 1));
        assert!(code.message.contains("budget exceeded"), "{code}");
        let invalid = from_wgpu(
            "copy",
            wgpu::Error::Validation {
                source: source(),
                description: "bad offset".into(),
            },
        );
        assert!(!invalid.is_out_of_memory());
        assert!(matches!(&invalid, DeviceError::Driver(c) if c.code == codes::VALIDATION));
        assert_eq!(invalid.backend_code().unwrap().message, "copy: bad offset");
        let poll = from_poll("wait", wgpu::PollError::Timeout);
        assert!(matches!(poll, DeviceError::Driver(c) if c.code == codes::POLL));
    }
}
