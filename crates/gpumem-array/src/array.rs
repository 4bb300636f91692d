//! [`DeviceArray`]: typed device memory with a shape, from a pool or wrapped.

use std::any::Any;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Mutex;

use bytemuck::Pod;
use gpumem_device::{DevicePtr, StreamId};

use crate::access::{DeviceRead, DeviceWrite};
use crate::shape::{check_data_len, elements_and_bytes};
use crate::{ArrayError, DeviceContext};

/// An n-dimensional array of `T`s in device memory.
///
/// Memory comes from the context's pool ([`DeviceArray::empty`], [`DeviceArray::zeros`],
/// [`DeviceArray::from_slice`], [`DeviceArray::from_shape`]) and goes back to it when the
/// array is dropped, in the order of the context's stream: the pool reuses it for work on that
/// stream at once, and for other streams only after the events it records
/// ([`DeviceArray::record_stream`]). [`DeviceArray::free`] gives it back at a precise point
/// and reports errors. Memory the pool does not own can be wrapped ([`DeviceArray::wrap`]).
///
/// An array of no elements is allowed and takes no device memory (its pointer is 0, as for a
/// zero-byte pool allocation); its copies do nothing.
///
/// Reading, writing and views come from [`DeviceRead`] and [`DeviceWrite`].
pub struct DeviceArray<T: Pod> {
    context: DeviceContext,
    ptr: DevicePtr,
    shape: Vec<usize>,
    owner: Owner,
    elements: PhantomData<T>,
}

/// Who gives the memory back.
enum Owner {
    /// The pool: freed into it on drop.
    Pool,
    /// Someone else, kept alive until the array is dropped.
    Wrapped(WrappedRange),
}

impl<T: Pod> DeviceArray<T> {
    /// An array of `shape` whose contents are whatever the memory held (the pool does not
    /// clear reused blocks): for memory that is written before it is read.
    pub fn empty(context: &DeviceContext, shape: &[usize]) -> Result<Self, ArrayError> {
        let (_, bytes) = elements_and_bytes::<T>(shape)?;
        let allocation = context
            .pool()
            .allocate(bytes, context.stream())
            .map_err(|e| too_large_or(context, bytes, e))?;
        Ok(DeviceArray {
            context: context.clone(),
            ptr: allocation.ptr,
            shape: shape.to_vec(),
            owner: Owner::Pool,
            elements: PhantomData,
        })
    }

    /// An array of `shape` filled with zero bytes (uploaded: the device API has no memset).
    pub fn zeros(context: &DeviceContext, shape: &[usize]) -> Result<Self, ArrayError> {
        let mut array = Self::empty(context, shape)?;
        array.copy_from_slice(&vec![T::zeroed(); array.len()])?;
        Ok(array)
    }

    /// A one-dimensional array holding a copy of `data`.
    pub fn from_slice(context: &DeviceContext, data: &[T]) -> Result<Self, ArrayError> {
        Self::from_shape(context, &[data.len()], data)
    }

    /// An array of `shape` holding a copy of `data`, which must have as many elements as the
    /// shape holds ([`ArrayError::ShapeMismatch`] otherwise, before anything is allocated).
    pub fn from_shape(
        context: &DeviceContext,
        shape: &[usize],
        data: &[T],
    ) -> Result<Self, ArrayError> {
        check_data_len::<T>(shape, data.len())?;
        let mut array = Self::empty(context, shape)?;
        array.copy_from_slice(data)?;
        Ok(array)
    }

    /// Wraps device memory the pool does not own — `shape`'s elements at `ptr`, from another
    /// library or allocator — keeping `owner` (whatever keeps that memory alive) until the
    /// array is dropped; the memory is never freed into the pool.
    ///
    /// Fails with [`ArrayError::AlreadyWrapped`] when a live array already wraps any of these
    /// bytes on the same device, and [`ArrayError::NullPointer`] for a null `ptr` with a
    /// non-zero size; `owner` is dropped then. gpumem cannot check that the memory is valid
    /// device memory of that size: a copy to or from it fails in the backend if it is not.
    pub fn wrap<O: Any + Send + Sync>(
        context: &DeviceContext,
        ptr: DevicePtr,
        shape: &[usize],
        owner: O,
    ) -> Result<Self, ArrayError> {
        let (_, bytes) = elements_and_bytes::<T>(shape)?;
        let range = WrappedRange::register(context.device_key(), ptr, bytes, Box::new(owner))?;
        Ok(DeviceArray {
            context: context.clone(),
            ptr,
            shape: shape.to_vec(),
            owner: Owner::Wrapped(range),
            elements: PhantomData,
        })
    }

    /// Gives the memory back now — to the pool, or by dropping a wrapped array's owner — and
    /// reports what dropping the array would have to ignore (e.g. a pointer the pool no longer
    /// knows).
    pub fn free(mut self) -> Result<(), ArrayError> {
        self.release()
    }

    /// Marks the memory as used on `stream` as well as the context's, so that when it is
    /// freed the pool reuses it only after the work queued on `stream` so far
    /// (`Tensor.record_stream`). Does nothing for wrapped memory, which the pool never reuses.
    pub fn record_stream(&self, stream: StreamId) -> Result<(), ArrayError> {
        if matches!(self.owner, Owner::Pool) && self.ptr != 0 {
            self.context.pool().record_stream(self.ptr, stream)?;
        }
        Ok(())
    }

    /// The same memory with another shape of as many elements.
    pub fn into_shape(mut self, shape: &[usize]) -> Result<Self, ArrayError> {
        check_data_len::<T>(shape, self.len())?;
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// Whether the memory is wrapped rather than from the pool.
    pub fn is_wrapped(&self) -> bool {
        matches!(self.owner, Owner::Wrapped(_))
    }

    /// Frees pooled memory into the pool, or drops a wrapped array's owner; leaves nothing to
    /// free, so that a second call (from `Drop` after `free`) does nothing.
    fn release(&mut self) -> Result<(), ArrayError> {
        let ptr = std::mem::take(&mut self.ptr);
        match std::mem::replace(&mut self.owner, Owner::Pool) {
            Owner::Pool => self.context.pool().free(ptr)?,
            Owner::Wrapped(range) => drop(range),
        }
        Ok(())
    }
}

crate::access::owned_array_impls!(DeviceArray);

impl<T: Pod> std::fmt::Debug for DeviceArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceArray")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("shape", &self.shape)
            .field("element", &std::any::type_name::<T>())
            .field("wrapped", &self.is_wrapped())
            .finish()
    }
}

/// Turns an out-of-memory refusal of more bytes than the device has in all into
/// [`ArrayError::TooLarge`] (no freeing can help); any other error stays as it is.
pub(crate) fn too_large_or(
    context: &DeviceContext,
    bytes: u64,
    error: gpumem_pool::PoolError,
) -> ArrayError {
    let error = ArrayError::from(error);
    if error.is_out_of_memory() {
        if let Ok(info) = context.device().mem_info() {
            if bytes > info.total {
                return ArrayError::TooLarge {
                    bytes,
                    device_total: info.total,
                    device: context.device().name(),
                };
            }
        }
    }
    error
}

/// Wrapped ranges of every device, by (device key, start): end. A range is in it while an
/// array wraps it.
static WRAPPED: Mutex<BTreeMap<(usize, DevicePtr), DevicePtr>> = Mutex::new(BTreeMap::new());

fn wrapped() -> std::sync::MutexGuard<'static, BTreeMap<(usize, DevicePtr), DevicePtr>> {
    // The map is updated in single inserts and removes, consistent even after a panic.
    WRAPPED.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registered wrapped range and the owner that keeps its memory alive.
struct WrappedRange {
    /// The registry key, or `None` for zero bytes (nothing to overlap).
    key: Option<(usize, DevicePtr)>,
    owner: Option<Box<dyn Any + Send + Sync>>,
}

impl WrappedRange {
    fn register(
        device: usize,
        ptr: DevicePtr,
        bytes: u64,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<WrappedRange, ArrayError> {
        if bytes == 0 {
            return Ok(WrappedRange {
                key: None,
                owner: Some(owner),
            });
        }
        if ptr == 0 {
            return Err(ArrayError::NullPointer { bytes });
        }
        let end = ptr.checked_add(bytes).ok_or(ArrayError::ShapeOverflow {
            shape: vec![bytes as usize],
            elem_size: 1,
        })?;
        let mut map = wrapped();
        if let Some((&(_, other), &other_end)) = map.range((device, 0)..(device, end)).next_back() {
            if other_end > ptr {
                return Err(ArrayError::AlreadyWrapped {
                    ptr,
                    end,
                    other,
                    other_end,
                });
            }
        }
        map.insert((device, ptr), end);
        Ok(WrappedRange {
            key: Some((device, ptr)),
            owner: Some(owner),
        })
    }
}

impl Drop for WrappedRange {
    fn drop(&mut self) {
        // The owner goes first, so that the range is never free to wrap while its memory is.
        drop(self.owner.take());
        if let Some(key) = self.key {
            wrapped().remove(&key);
        }
    }
}
