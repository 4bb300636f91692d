//! [`UnifiedArray`]: managed (unified) memory that the host and the device both address.

use std::marker::PhantomData;

use bytemuck::Pod;
use gpumem_device::{DevicePtr, ManagedAdvice, MemoryLocation};

use crate::access::{DeviceRead, DeviceWrite};
use crate::shape::{check_data_len, elements_and_bytes};
use crate::{ArrayError, DeviceContext};

/// An n-dimensional array of `T`s in managed memory ([`gpumem_device::Device::alloc_managed`]):
/// CUDA managed memory that the driver migrates between host and device on demand, with
/// [`UnifiedArray::prefetch`] and [`UnifiedArray::advise`] to place it ahead of use; host
/// memory on the simulated device. Backends without managed memory (wgpu) refuse it with
/// [`gpumem_device::DeviceError::Unsupported`].
///
/// Managed memory does not come from the pool: each array is one managed allocation, freed
/// when the array is dropped or at [`UnifiedArray::free`]. Copies work as for a
/// [`crate::DeviceArray`] ([`DeviceRead`], [`DeviceWrite`]); an empty array allocates nothing.
pub struct UnifiedArray<T: Pod> {
    context: DeviceContext,
    ptr: DevicePtr,
    shape: Vec<usize>,
    elements: PhantomData<T>,
}

impl<T: Pod> UnifiedArray<T> {
    /// An array of `shape` filled with zero bytes.
    pub fn zeros(context: &DeviceContext, shape: &[usize]) -> Result<Self, ArrayError> {
        let (elements, _) = elements_and_bytes::<T>(shape)?;
        Self::from_shape(context, shape, &vec![T::zeroed(); elements])
    }

    /// An array of `shape` holding a copy of `data` (as many elements as the shape holds).
    pub fn from_shape(
        context: &DeviceContext,
        shape: &[usize],
        data: &[T],
    ) -> Result<Self, ArrayError> {
        check_data_len::<T>(shape, data.len())?;
        let (_, bytes) = elements_and_bytes::<T>(shape)?;
        let ptr = if bytes == 0 {
            0
        } else {
            context.device().alloc_managed(bytes)?
        };
        let mut array = UnifiedArray {
            context: context.clone(),
            ptr,
            shape: shape.to_vec(),
            elements: PhantomData,
        };
        array.copy_from_slice(data)?;
        Ok(array)
    }

    /// Starts migrating the array to `to` on the context's stream, so that the next use
    /// there does not fault page by page.
    pub fn prefetch(&self, to: MemoryLocation) -> Result<(), ArrayError> {
        if self.ptr != 0 {
            let device = self.context.device();
            device.prefetch_managed(self.ptr, self.byte_len(), to, self.context.stream())?;
        }
        Ok(())
    }

    /// Tells the driver how the array is used (read mostly, where it should live, who
    /// accesses it).
    pub fn advise(&self, advice: ManagedAdvice) -> Result<(), ArrayError> {
        if self.ptr != 0 {
            let device = self.context.device();
            device.advise_managed(self.ptr, self.byte_len(), advice)?;
        }
        Ok(())
    }

    /// Frees the memory now and reports the device's answer.
    pub fn free(mut self) -> Result<(), ArrayError> {
        self.release()
    }

    fn release(&mut self) -> Result<(), ArrayError> {
        let ptr = std::mem::take(&mut self.ptr);
        if ptr != 0 {
            self.context.device().free_managed(ptr)?;
        }
        Ok(())
    }
}

crate::access::owned_array_impls!(UnifiedArray);
