//! Page-locked host memory and its fence: an asynchronous copy runs only from and to these
//! allocations, and every access to their bytes, and their release, waits for the copies
//! recorded behind them.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use gpumem_device::{HostStorage, PinnedBuffer};

use super::context::PrimaryContext;
use super::handles::{Event, Stream};
use super::{check, lock, CUresult, CuResult};

impl PrimaryContext {
    /// Allocates `len` zeroed bytes of page-locked host memory (`cuMemHostAlloc`, portable: any
    /// context may copy from and to it).
    pub(crate) fn alloc_pinned(self: &Arc<Self>, len: usize) -> CuResult<PinnedHost> {
        let fence = Arc::new(Fence::default());
        if len == 0 {
            return Ok(PinnedHost {
                ptr: NonNull::dangling(),
                len: 0,
                fence,
                ctx: None,
            });
        }
        let _bound = self.bind()?;
        let mut raw: *mut c_void = ptr::null_mut();
        // SAFETY: context current; the out-pointer is a live local.
        check(unsafe { sys::cuMemHostAlloc(&mut raw, len, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        };
        // SAFETY: the driver returned `len` writable bytes at `ptr`, which nothing else uses;
        // zeroing them makes them initialised (the trait promises zeroed bytes).
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        lock(&PINNED).insert(ptr.as_ptr() as usize, (len, Arc::clone(&fence)));
        Ok(PinnedHost {
            ptr,
            len,
            fence,
            ctx: Some(Arc::clone(self)),
        })
    }

    /// Enqueues a copy of `src` to device memory at `dst` on `stream` and records `event`
    /// behind it. `src` must be page-locked memory from [`PrimaryContext::alloc_pinned`]
    /// (any device's); other memory is refused with [`AsyncCopyError::NotPageLocked`], before
    /// anything is enqueued, so the caller can stage it.
    pub(crate) fn enqueue_upload(
        &self,
        dst: u64,
        src: &PinnedBuffer,
        stream: &Stream,
        event: &Arc<Event>,
    ) -> Result<(), AsyncCopyError> {
        // Reading through the storage settles any earlier copy into the buffer.
        let bytes: &[u8] = src;
        let registry = lock(&PINNED);
        let fence = fence_of(&registry, bytes.as_ptr() as usize, bytes.len())
            .ok_or(AsyncCopyError::NotPageLocked)?;
        let _bound = self.bind()?;
        // SAFETY: context current; `stream` is live. `bytes` lies inside a live page-locked
        // allocation of this module: it is in the registry, and an allocation leaves the
        // registry (under the lock held here) before it is freed. The copy engine reads the
        // bytes until `event` completes, and from here on the allocation's fence holds `event`
        // (or is poisoned, see `fence_behind`): every access to the bytes and the release of the
        // allocation wait for it first.
        check(unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst,
                bytes.as_ptr().cast::<c_void>(),
                bytes.len(),
                stream.raw,
            )
        })?;
        fence_behind(&fence, stream, event)
    }

    /// Enqueues a copy of `dst.len()` bytes of device memory at `src` into `dst` on `stream`
    /// and records `event` behind it; as [`PrimaryContext::enqueue_upload`] otherwise.
    pub(crate) fn enqueue_download(
        &self,
        dst: &mut PinnedBuffer,
        src: u64,
        stream: &Stream,
        event: &Arc<Event>,
    ) -> Result<(), AsyncCopyError> {
        let bytes: &mut [u8] = dst;
        let (at, len) = (bytes.as_mut_ptr(), bytes.len());
        let registry = lock(&PINNED);
        let fence = fence_of(&registry, at as usize, len).ok_or(AsyncCopyError::NotPageLocked)?;
        let _bound = self.bind()?;
        // SAFETY: as in `enqueue_upload`; the copy engine writes the bytes until `event`
        // completes, and until then nothing reads or frees them (the fence).
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(at.cast::<c_void>(), src, len, stream.raw) })?;
        fence_behind(&fence, stream, event)
    }
}

/// Why an asynchronous copy was not enqueued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AsyncCopyError {
    /// The host buffer is not page-locked memory from this module; nothing was enqueued.
    NotPageLocked,
    /// The driver failed.
    Driver(CUresult),
}

impl From<CUresult> for AsyncCopyError {
    fn from(code: CUresult) -> Self {
        AsyncCopyError::Driver(code)
    }
}

/// After an asynchronous copy was enqueued on `stream`: records `event` behind it and adds the
/// event to the buffer's fence. If the event cannot be recorded, waits for the stream (or the
/// whole context) instead; if even that fails the fence is poisoned, so that the buffer is
/// never read or freed again.
fn fence_behind(fence: &Fence, stream: &Stream, event: &Arc<Event>) -> Result<(), AsyncCopyError> {
    match event.record(stream) {
        Ok(()) => {
            fence.hold(event);
            Ok(())
        }
        Err(e) => {
            if stream.synchronize().is_err() && stream.ctx.synchronize().is_err() {
                fence.poison();
            }
            Err(AsyncCopyError::Driver(e))
        }
    }
}

/// The live page-locked allocations of this module, by start address: length and fence. An
/// allocation leaves it before it is freed.
static PINNED: Mutex<BTreeMap<usize, (usize, Arc<Fence>)>> = Mutex::new(BTreeMap::new());

/// The fence of the allocation that contains `[at, at + len)`, if one does.
fn fence_of(
    registry: &BTreeMap<usize, (usize, Arc<Fence>)>,
    at: usize,
    len: usize,
) -> Option<Arc<Fence>> {
    let (&start, (size, fence)) = registry.range(..=at).next_back()?;
    (at.checked_add(len)? <= start + size).then(|| Arc::clone(fence))
}

/// The copies that may still use an allocation: the events recorded behind them.
#[derive(Debug, Default)]
struct Fence {
    /// Whether `state` may hold anything: lets every access to the bytes (each `buf[i]` is
    /// one) skip the lock once the fence is clear. Set under the lock, after the state changed.
    busy: AtomicBool,
    state: Mutex<FenceState>,
}

#[derive(Debug, Default)]
struct FenceState {
    pending: Vec<Arc<Event>>,
    /// A copy was enqueued and its completion could not be established.
    poisoned: bool,
}

impl Fence {
    /// Waits until no copy uses the allocation any more. Fails if that cannot be established.
    fn settle(&self) -> Result<(), String> {
        if !self.busy.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut state = lock(&self.state);
        if state.poisoned {
            return Err("an asynchronous copy's completion could not be established".into());
        }
        for event in &state.pending {
            event
                .synchronize()
                .map_err(|e| format!("waiting for an asynchronous copy failed: {e:?}"))?;
        }
        state.pending.clear();
        self.busy.store(false, Ordering::Release);
        Ok(())
    }

    /// Adds the event behind a copy that uses the allocation.
    fn hold(&self, event: &Arc<Event>) {
        let mut state = lock(&self.state);
        state.pending.push(Arc::clone(event));
        self.busy.store(true, Ordering::Release);
    }

    /// A copy uses the allocation and its end cannot be known: never touch it again.
    fn poison(&self) {
        let mut state = lock(&self.state);
        state.poisoned = true;
        self.busy.store(true, Ordering::Release);
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed with `cuMemFreeHost` on drop. It holds
/// its context, so the memory outlives the device that allocated it.
pub(crate) struct PinnedHost {
    ptr: NonNull<u8>,
    len: usize,
    fence: Arc<Fence>,
    /// `None` for the empty buffer, which owns no memory.
    ctx: Option<Arc<PrimaryContext>>,
}

// SAFETY: owns its bytes exclusively, like a `Box<[u8]>`; the fence is thread-safe.
unsafe impl Send for PinnedHost {}
// SAFETY: `&PinnedHost` gives only shared access to the bytes (after the fence), like `&[u8]`.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// Waits for copies that may still use the bytes. If their completion cannot be
    /// established, the bytes must not be touched, and this accessor cannot return an error.
    fn settled(&self) {
        if let Err(why) = self.fence.settle() {
            panic!("page-locked buffer used while the device may still copy into it: {why}");
        }
    }
}

impl HostStorage for PinnedHost {
    fn bytes(&self) -> &[u8] {
        self.settled();
        // SAFETY: `ptr` points at `len` initialised bytes (zeroed at allocation) owned by
        // `self` until drop; no copy uses them any more (settled), and new copies need a shared
        // borrow of them, which this one's lifetime keeps from becoming exclusive.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.settled();
        // SAFETY: as in `bytes`, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn is_page_locked(&self) -> bool {
        true
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        let Some(ctx) = &self.ctx else {
            return;
        };
        lock(&PINNED).remove(&(self.ptr.as_ptr() as usize));
        if self.fence.settle().is_err() {
            // A copy may still use the memory: leaking it is safe, freeing it is not.
            return;
        }
        if let Ok(_bound) = ctx.bind() {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once; it left the registry
            // above, so no new copy can start on it, and the fence says no copy uses it.
            let _ = unsafe { sys::cuMemFreeHost(self.ptr.as_ptr().cast::<c_void>()) };
        }
    }
}
