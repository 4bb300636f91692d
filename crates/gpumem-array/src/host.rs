//! Host-side arrays: [`HostArray`] (ordinary memory with a shape) and [`PinnedHostArray`]
//! (page-locked memory for fast, asynchronous copies).

use std::marker::PhantomData;

use bytemuck::Pod;
use gpumem_device::{DeviceError, PinnedBuffer};

use crate::shape::{check_data_len, elements_and_bytes};
use crate::{ArrayError, DeviceArray, DeviceContext, DeviceRead};

/// An n-dimensional array of `T`s in ordinary host memory: what is uploaded into a
/// [`DeviceArray`] of the same shape, and what one downloads into.
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray<T> {
    data: Vec<T>,
    shape: Vec<usize>,
}

impl<T: Pod> HostArray<T> {
    /// `data` with `shape`, which must hold exactly `data.len()` elements.
    pub fn new(shape: &[usize], data: Vec<T>) -> Result<Self, ArrayError> {
        check_data_len::<T>(shape, data.len())?;
        Ok(HostArray {
            data,
            shape: shape.to_vec(),
        })
    }

    /// `data` as a one-dimensional array.
    pub fn from_vec(data: Vec<T>) -> Self {
        HostArray {
            shape: vec![data.len()],
            data,
        }
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The elements, outermost dimension slowest.
    pub fn data(&self) -> &[T] {
        &self.data
    }

    /// The elements, for writing.
    pub fn data_mut(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// The elements, without the shape.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }

    /// Uploads into a new device array of the same shape.
    pub fn to_device(&self, context: &DeviceContext) -> Result<DeviceArray<T>, ArrayError> {
        DeviceArray::from_shape(context, &self.shape, &self.data)
    }

    /// Downloads a device array, shape and all.
    pub fn from_device<A: DeviceRead<T> + ?Sized>(array: &A) -> Result<Self, ArrayError> {
        Ok(HostArray {
            data: array.to_vec()?,
            shape: array.shape().to_vec(),
        })
    }
}

/// An n-dimensional array of `T`s in host memory from [`gpumem_device::Device::alloc_pinned`]:
/// page-locked where the backend can, so that the device copies straight from and to it and
/// asynchronous copies overlap with host work. What the batch iterator stages uploads in.
#[derive(Debug)]
pub struct PinnedHostArray<T> {
    buffer: PinnedBuffer,
    shape: Vec<usize>,
    elements: PhantomData<T>,
}

impl<T: Pod> PinnedHostArray<T> {
    /// A zeroed array of `shape`, allocated by `context`'s device.
    ///
    /// Fails with [`DeviceError::InvalidValue`] in the rare case that the backend's memory is
    /// not aligned for `T` (page-locked memory is page-aligned; ordinary memory comes from the
    /// system allocator, aligned for every primitive).
    pub fn zeros(context: &DeviceContext, shape: &[usize]) -> Result<Self, ArrayError> {
        let (_, bytes) = elements_and_bytes::<T>(shape)?;
        let buffer = context.device().alloc_pinned(bytes as usize)?;
        Self::from_buffer(buffer, shape)
    }

    /// An array of `shape` over `buffer` (whose length must be the shape's bytes), e.g. one
    /// that came back from an asynchronous copy.
    pub(crate) fn from_buffer(buffer: PinnedBuffer, shape: &[usize]) -> Result<Self, ArrayError> {
        let (_, bytes) = elements_and_bytes::<T>(shape)?;
        if buffer.len() as u64 != bytes {
            return Err(DeviceError::InvalidValue(format!(
                "pinned buffer of {} bytes for shape {shape:?} ({bytes} bytes)",
                buffer.len()
            ))
            .into());
        }
        if bytemuck::try_cast_slice::<u8, T>(&buffer).is_err() {
            return Err(DeviceError::InvalidValue(format!(
                "host memory from alloc_pinned is not aligned for {} ({} bytes)",
                std::any::type_name::<T>(),
                std::mem::align_of::<T>()
            ))
            .into());
        }
        Ok(PinnedHostArray {
            buffer,
            shape: shape.to_vec(),
            elements: PhantomData,
        })
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether the memory is page-locked (otherwise copies stage through the driver).
    pub fn is_page_locked(&self) -> bool {
        self.buffer.is_page_locked()
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        bytemuck::cast_slice(&self.buffer)
    }

    /// The elements, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        bytemuck::cast_slice_mut(&mut self.buffer)
    }

    /// Uploads into a new device array of the same shape (a synchronous copy straight from
    /// the page-locked memory).
    pub fn to_device(&self, context: &DeviceContext) -> Result<DeviceArray<T>, ArrayError> {
        DeviceArray::from_shape(context, &self.shape, self.as_slice())
    }

    /// Downloads all of `array`, which must have as many elements, into this memory.
    pub fn copy_from_device<A: DeviceRead<T> + ?Sized>(
        &mut self,
        array: &A,
    ) -> Result<(), ArrayError> {
        array.copy_to_host(self.as_mut_slice())
    }
}
