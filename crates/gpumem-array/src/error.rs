//! [`ArrayError`]: everything an array call can fail with.

use gpumem_device::{DeviceError, DevicePtr};
use gpumem_pool::PoolError;

/// What an array call can fail with. Every variant names what was wrong; device and pool
/// failures (out of memory, a lost device) keep the error underneath.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArrayError {
    /// The data's length does not match the shape's element count.
    #[error("shape {shape:?} holds {elements} elements, but the data has {data_len}")]
    ShapeMismatch {
        /// The shape asked for.
        shape: Vec<usize>,
        /// Elements the shape holds (the product of its dimensions).
        elements: usize,
        /// Elements the data has.
        data_len: usize,
    },
    /// The product of the dimensions, or the bytes they take, does not fit in `usize`/`u64`.
    #[error("shape {shape:?} of {elem_size}-byte elements overflows the address space")]
    ShapeOverflow {
        /// The shape asked for.
        shape: Vec<usize>,
        /// Bytes per element.
        elem_size: usize,
    },
    /// A host slice given to a copy has the wrong number of elements.
    #[error("host slice has {got} elements, but the device array has {expected}")]
    LengthMismatch {
        /// Elements of the device array.
        expected: usize,
        /// Elements of the host slice.
        got: usize,
    },
    /// Two device arrays of a device-to-device copy have different lengths.
    #[error("device-to-device copy of {src} elements into an array of {dst}")]
    CopyLengthMismatch {
        /// Elements of the destination.
        dst: usize,
        /// Elements of the source.
        src: usize,
    },
    /// More bytes than the device has in all: no amount of freeing would make it fit.
    #[error(
        "{bytes} bytes requested, more than the device's {device_total} bytes in all ({device})"
    )]
    TooLarge {
        /// Bytes the array needs.
        bytes: u64,
        /// The device's total memory.
        device_total: u64,
        /// The device's name.
        device: String,
    },
    /// A range of the outer dimension that is not inside it, or a view of a 0-dimensional
    /// array.
    #[error("range {start}..{end} is not inside the outer dimension of length {len}")]
    OutOfBounds {
        /// Start of the range.
        start: usize,
        /// End of the range (exclusive).
        end: usize,
        /// Length of the outer dimension.
        len: usize,
    },
    /// Wrapping device memory that another live array already wraps (a pointer wrapped twice
    /// would be freed or written through two owners).
    #[error("device memory {ptr:#x}..{end:#x} overlaps memory another array already wraps ({other:#x}..{other_end:#x})")]
    AlreadyWrapped {
        /// Start of the new range.
        ptr: DevicePtr,
        /// End of the new range (exclusive).
        end: DevicePtr,
        /// Start of the range already wrapped.
        other: DevicePtr,
        /// End of the range already wrapped (exclusive).
        other_end: DevicePtr,
    },
    /// Wrapping a null device pointer with a non-zero length.
    #[error("cannot wrap {bytes} bytes at the null device pointer")]
    NullPointer {
        /// Bytes that were to be wrapped.
        bytes: u64,
    },
    /// Two arrays of a copy live on different devices.
    #[error("copy between arrays of different devices ({dst} and {src})")]
    DifferentDevices {
        /// The destination's device.
        dst: String,
        /// The source's device.
        src: String,
    },
    /// The pool refused (out of memory, with its explanation) or failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The device failed (lost or reset device, unsupported call, driver error).
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl ArrayError {
    /// Whether the device or pool refused for lack of memory (freeing memory may help).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            ArrayError::Pool(PoolError::OutOfMemory(_)) => true,
            ArrayError::Pool(PoolError::Device(e)) | ArrayError::Device(e) => e.is_out_of_memory(),
            _ => false,
        }
    }
}
