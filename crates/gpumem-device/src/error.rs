use crate::DevicePtr;

/// What a device call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device has too little free memory for the request.
    #[error("device out of memory: requested {requested} bytes, {free} of {total} bytes free")]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes free at the time.
        free: u64,
        /// Device total.
        total: u64,
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
    /// without it).
    #[error("not supported by {backend}: {what}")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// What was asked.
        what: String,
    },
    /// An error reported by a driver, with its text.
    #[error("driver error: {0}")]
    Driver(String),
}

impl DeviceError {
    /// Whether the device refused for lack of memory (worth freeing cached memory and
    /// retrying) rather than for a fault. The one place that decides it: every backend maps its
    /// own out-of-memory codes to [`DeviceError::OutOfMemory`].
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, DeviceError::OutOfMemory { .. })
    }
}
