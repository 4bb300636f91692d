//! Reading and writing device memory of any array kind through two traits, so that
//! [`crate::DeviceArray`], its views and [`crate::UnifiedArray`] share one implementation of
//! every copy.

use std::marker::PhantomData;
use std::ops::Range;

use bytemuck::Pod;
use gpumem_device::DevicePtr;

use crate::shape::{check_data_len, outer_slice};
use crate::{ArrayError, DeviceContext};

/// Where a device array's elements are: its context, address and shape. What
/// [`DeviceRead::memory`] returns; every method of the traits works from it.
#[derive(Clone, Copy, Debug)]
pub struct Memory<'a> {
    /// The pool and stream the memory belongs to.
    pub context: &'a DeviceContext,
    /// The address of the first element (0 for an array of no bytes).
    pub ptr: DevicePtr,
    /// The dimensions, outermost first.
    pub shape: &'a [usize],
}

/// Reading device memory of `T`s: shape queries, downloads and read-only views. Implemented
/// by every device array kind; import it (or `gpumem_array::prelude::*`) to call its methods.
pub trait DeviceRead<T: Pod> {
    /// The memory this reads.
    fn memory(&self) -> Memory<'_>;

    /// The dimensions, outermost first.
    fn shape(&self) -> &[usize] {
        self.memory().shape
    }

    /// Elements in all.
    fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Whether there are no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes in all.
    fn byte_len(&self) -> u64 {
        (self.len() * std::mem::size_of::<T>()) as u64
    }

    /// The device address of the first element, for kernels and other libraries.
    fn device_ptr(&self) -> DevicePtr {
        self.memory().ptr
    }

    /// The pool and stream this memory belongs to.
    fn context(&self) -> &DeviceContext {
        self.memory().context
    }

    /// Downloads the elements into `dst`, which must have exactly [`DeviceRead::len`] of them;
    /// returns once they have arrived (after the work queued on the array's stream).
    fn copy_to_host(&self, dst: &mut [T]) -> Result<(), ArrayError> {
        let m = self.memory();
        if dst.len() != self.len() {
            return Err(ArrayError::LengthMismatch {
                expected: self.len(),
                got: dst.len(),
            });
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        if !bytes.is_empty() {
            m.context
                .device()
                .copy_to_host(bytes, m.ptr, m.context.stream())?;
        }
        Ok(())
    }

    /// Downloads the elements into a new vector.
    fn to_vec(&self) -> Result<Vec<T>, ArrayError> {
        let mut out = vec![T::zeroed(); self.len()];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// A read-only view of the whole array.
    fn view(&self) -> ArrayView<'_, T> {
        let m = self.memory();
        ArrayView::new(m.context, m.ptr, m.shape.to_vec())
    }

    /// A read-only view of `range` of the outer dimension (rows `range` of a matrix).
    fn slice(&self, range: Range<usize>) -> Result<ArrayView<'_, T>, ArrayError> {
        let m = self.memory();
        let (shape, offset) = outer_slice(m.shape, range)?;
        Ok(ArrayView::new(
            m.context,
            element_ptr::<T>(m.ptr, offset),
            shape,
        ))
    }

    /// A read-only view of the same elements with another shape of as many elements.
    fn reshaped(&self, shape: &[usize]) -> Result<ArrayView<'_, T>, ArrayError> {
        check_data_len::<T>(shape, self.len())?;
        let m = self.memory();
        Ok(ArrayView::new(m.context, m.ptr, shape.to_vec()))
    }
}

/// Writing device memory of `T`s: uploads, device-to-device copies and mutable views.
pub trait DeviceWrite<T: Pod>: DeviceRead<T> {
    /// The memory this writes; `&mut self` so that no read-only view of it can be alive.
    fn memory_mut(&mut self) -> Memory<'_>;

    /// Uploads `src`, which must have exactly [`DeviceRead::len`] elements; returns once the
    /// bytes have arrived (after the work queued on the array's stream).
    fn copy_from_slice(&mut self, src: &[T]) -> Result<(), ArrayError> {
        let len = self.len();
        let m = self.memory_mut();
        if src.len() != len {
            return Err(ArrayError::LengthMismatch {
                expected: len,
                got: src.len(),
            });
        }
        let bytes: &[u8] = bytemuck::cast_slice(src);
        if !bytes.is_empty() {
            m.context
                .device()
                .copy_to_device(m.ptr, bytes, m.context.stream())?;
        }
        Ok(())
    }

    /// Copies all of `src` (on the same device, with as many elements) into this memory, on
    /// this array's stream, after the work issued so far to `src`'s stream; returns once the
    /// copy has completed.
    fn copy_from<S: DeviceRead<T> + ?Sized>(&mut self, src: &S) -> Result<(), ArrayError> {
        let (dst_len, src_len) = (self.len(), src.len());
        let source = src.memory();
        let m = self.memory_mut();
        if !m.context.same_device(source.context) {
            return Err(ArrayError::DifferentDevices {
                dst: m.context.device().name(),
                src: source.context.device().name(),
            });
        }
        if dst_len != src_len {
            return Err(ArrayError::CopyLengthMismatch {
                dst: dst_len,
                src: src_len,
            });
        }
        let bytes = (src_len * std::mem::size_of::<T>()) as u64;
        if bytes > 0 {
            m.context
                .order_streams(source.context.stream(), m.context.stream())?;
            m.context
                .device()
                .copy_on_device(m.ptr, source.ptr, bytes, m.context.stream())?;
        }
        Ok(())
    }

    /// A mutable view of the whole array.
    fn view_mut(&mut self) -> ArrayViewMut<'_, T> {
        let m = self.memory_mut();
        ArrayViewMut::new(ArrayView::new(m.context, m.ptr, m.shape.to_vec()))
    }

    /// A mutable view of `range` of the outer dimension.
    fn slice_mut(&mut self, range: Range<usize>) -> Result<ArrayViewMut<'_, T>, ArrayError> {
        let m = self.memory_mut();
        let (shape, offset) = outer_slice(m.shape, range)?;
        let ptr = element_ptr::<T>(m.ptr, offset);
        Ok(ArrayViewMut::new(ArrayView::new(m.context, ptr, shape)))
    }
}

/// The address of element `offset` of `T`s starting at `ptr`.
fn element_ptr<T>(ptr: DevicePtr, offset: usize) -> DevicePtr {
    ptr + (offset * std::mem::size_of::<T>()) as u64
}

/// A read-only view of (part of) a device array; borrows the array, so the memory cannot be
/// freed or written while the view lives.
#[derive(Clone, Debug)]
pub struct ArrayView<'a, T> {
    context: &'a DeviceContext,
    ptr: DevicePtr,
    shape: Vec<usize>,
    elements: PhantomData<&'a [T]>,
}

impl<'a, T> ArrayView<'a, T> {
    fn new(context: &'a DeviceContext, ptr: DevicePtr, shape: Vec<usize>) -> Self {
        ArrayView {
            context,
            ptr,
            shape,
            elements: PhantomData,
        }
    }
}

impl<T: Pod> DeviceRead<T> for ArrayView<'_, T> {
    fn memory(&self) -> Memory<'_> {
        Memory {
            context: self.context,
            ptr: self.ptr,
            shape: &self.shape,
        }
    }
}

/// A mutable view of (part of) a device array; borrows the array mutably.
#[derive(Debug)]
pub struct ArrayViewMut<'a, T> {
    view: ArrayView<'a, T>,
    exclusive: PhantomData<&'a mut [T]>,
}

impl<'a, T> ArrayViewMut<'a, T> {
    fn new(view: ArrayView<'a, T>) -> Self {
        ArrayViewMut {
            view,
            exclusive: PhantomData,
        }
    }
}

impl<T: Pod> DeviceRead<T> for ArrayViewMut<'_, T> {
    fn memory(&self) -> Memory<'_> {
        self.view.memory()
    }
}

impl<T: Pod> DeviceWrite<T> for ArrayViewMut<'_, T> {
    fn memory_mut(&mut self) -> Memory<'_> {
        self.view.memory()
    }
}

/// The impls every array that owns its memory shares: `Drop` releases it (a destructor cannot
/// report; the type's `free` returns the error), and [`DeviceRead`]/[`DeviceWrite`] read the
/// `context`, `ptr` and `shape` fields. The type needs those fields and a
/// `release(&mut self) -> Result<(), ArrayError>` that leaves nothing to free.
macro_rules! owned_array_impls {
    ($array:ident) => {
        impl<T: bytemuck::Pod> Drop for $array<T> {
            fn drop(&mut self) {
                let _ = self.release();
            }
        }

        impl<T: bytemuck::Pod> $crate::DeviceRead<T> for $array<T> {
            fn memory(&self) -> $crate::access::Memory<'_> {
                $crate::access::Memory {
                    context: &self.context,
                    ptr: self.ptr,
                    shape: &self.shape,
                }
            }
        }

        impl<T: bytemuck::Pod> $crate::DeviceWrite<T> for $array<T> {
            fn memory_mut(&mut self) -> $crate::access::Memory<'_> {
                $crate::DeviceRead::memory(self)
            }
        }
    };
}
pub(crate) use owned_array_impls;
