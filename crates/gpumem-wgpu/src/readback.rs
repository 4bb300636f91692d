//! The host buffer an asynchronous device-to-host copy hands back.
//!
//! wgpu cannot write into host memory it did not allocate: a read goes into a `MAP_READ`
//! staging buffer, and the bytes can be taken out only once that buffer is mapped, after the
//! copy's submission has completed. [`crate::WgpuDevice::copy_to_host_async`] therefore wraps
//! the caller's buffer in a [`Readback`] whose bytes are filled in, once, when the device sees
//! the copy's event complete (before [`gpumem_device::InFlight`] gives the buffer back).

use std::sync::{Arc, OnceLock};

use gpumem_device::{HostStorage, PinnedBuffer};

/// A [`HostStorage`] that shows the bytes read back from the device once they have arrived,
/// and the caller's original buffer (same length) before that.
pub(crate) struct Readback {
    /// The buffer the caller lent; its length is the copy's length.
    original: PinnedBuffer,
    /// Set exactly once, by the device, to the bytes read back.
    arrived: Arc<OnceLock<Vec<u8>>>,
}

impl Readback {
    /// Wraps `original`; the device fills the returned cell with `original.len()` bytes.
    pub(crate) fn new(original: PinnedBuffer) -> (Readback, Arc<OnceLock<Vec<u8>>>) {
        let arrived = Arc::new(OnceLock::new());
        let storage = Readback {
            original,
            arrived: arrived.clone(),
        };
        (storage, arrived)
    }
}

impl HostStorage for Readback {
    fn bytes(&self) -> &[u8] {
        match self.arrived.get() {
            Some(bytes) => bytes,
            None => &self.original,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.arrived.get().is_none() {
            return &mut self.original;
        }
        // The device let go of its handle when it filled the cell; should a clone still be
        // around, the bytes are copied into a cell of our own rather than shared.
        if Arc::get_mut(&mut self.arrived).is_none() {
            let bytes = self.arrived.get().cloned().unwrap_or_default();
            self.arrived = Arc::new(OnceLock::from(bytes));
        }
        match Arc::get_mut(&mut self.arrived).and_then(OnceLock::get_mut) {
            Some(bytes) => bytes,
            None => &mut self.original,
        }
    }

    fn is_page_locked(&self) -> bool {
        self.original.is_page_locked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_the_original_until_the_bytes_arrive() {
        let mut original = PinnedBuffer::pageable(4);
        original.copy_from_slice(&[1, 2, 3, 4]);
        let (storage, cell) = Readback::new(original);
        let mut buf = PinnedBuffer::new(Box::new(storage));
        assert_eq!(&buf[..], &[1, 2, 3, 4]);
        cell.set(vec![9, 8, 7, 6]).unwrap();
        assert_eq!(&buf[..], &[9, 8, 7, 6]);
        // The device still holds its handle: writing copies the bytes out first.
        buf[0] = 0;
        assert_eq!(&buf[..], &[0, 8, 7, 6]);
        assert_eq!(cell.get().unwrap(), &[9, 8, 7, 6]);
        drop(cell);
        buf[1] = 0;
        assert_eq!(&buf[..], &[0, 0, 7, 6]);
        assert!(!buf.is_page_locked());
    }
}
