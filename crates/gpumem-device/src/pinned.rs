//! Host buffers for transfers: [`PinnedBuffer`] over any [`HostStorage`].
//!
//! A real backend allocates page-locked memory (`cuMemHostAlloc`) so that the GPU can copy
//! from and to it while the host runs on; that allocation and its release live in the
//! backend's own storage type, behind its own small unsafe module. This crate only sees the
//! storage through the safe [`HostStorage`] trait, so it needs no unsafe code itself.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// Where a [`PinnedBuffer`] keeps its bytes: ordinary host memory (`Vec<u8>`) or a backend's
/// page-locked allocation, freed when the storage is dropped.
///
/// An implementation must return the same bytes from every call while it lives, because a
/// backend reads or writes them after the call that lent them out returned: an asynchronous
/// copy uses them until its event completes (see [`crate::InFlight`]), and the buffer is not
/// dropped before that.
pub trait HostStorage: Send + Sync {
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// The bytes, for writing.
    fn bytes_mut(&mut self) -> &mut [u8];
    /// Whether the memory is page-locked, so that the device can copy from and to it without
    /// staging. A hint for choosing a copy path; safety must not depend on it.
    fn is_page_locked(&self) -> bool;
}

/// Ordinary (pageable) host memory: what [`crate::Device::alloc_pinned`] gives on a backend
/// that cannot lock pages.
impl HostStorage for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }

    fn is_page_locked(&self) -> bool {
        false
    }
}

/// A host buffer for transfers, from [`crate::Device::alloc_pinned`]. It dereferences to its
/// bytes. An asynchronous copy takes it by value and gives it back only once the copy has
/// completed ([`crate::InFlight`]), so the bytes cannot be read, changed or freed while the
/// device uses them.
pub struct PinnedBuffer {
    storage: Box<dyn HostStorage>,
}

impl PinnedBuffer {
    /// A buffer over `storage`: how a backend wraps the page-locked memory it allocated.
    pub fn new(storage: Box<dyn HostStorage>) -> Self {
        PinnedBuffer { storage }
    }

    /// `len` zeroed bytes of ordinary host memory, not page-locked.
    pub fn pageable(len: usize) -> Self {
        PinnedBuffer::new(Box::new(vec![0u8; len]))
    }

    /// Whether the bytes are page-locked (see [`HostStorage::is_page_locked`]).
    pub fn is_page_locked(&self) -> bool {
        self.storage.is_page_locked()
    }
}

impl Deref for PinnedBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.storage.bytes()
    }
}

impl DerefMut for PinnedBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.storage.bytes_mut()
    }
}

impl fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len())
            .field("page_locked", &self.is_page_locked())
            .finish()
    }
}
