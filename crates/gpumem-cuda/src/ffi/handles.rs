//! Streams, events and physical VMM chunks: owned values that destroy their handle exactly
//! once, on drop or when destroyed explicitly.

use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;

use super::context::{chunk_properties, PrimaryContext};
use super::{check, CUresult, CuResult};

impl PrimaryContext {
    /// The legacy default stream (the null `CUstream`).
    pub(crate) fn legacy_stream(self: &Arc<Self>) -> Stream {
        Stream {
            raw: ptr::null_mut(),
            ctx: Arc::clone(self),
            owned: false,
        }
    }

    /// A stream someone else created in this context (PyTorch's `cudaStream_t`), used but
    /// never destroyed: its creator owns it and must keep it alive while this device uses it.
    pub(crate) fn foreign_stream(self: &Arc<Self>, raw: u64) -> Stream {
        Stream {
            raw: raw as sys::CUstream,
            ctx: Arc::clone(self),
            owned: false,
        }
    }

    /// A new stream that does not synchronise with the legacy default stream
    /// (`CU_STREAM_NON_BLOCKING`, as PyTorch's side streams).
    pub(crate) fn create_stream(self: &Arc<Self>) -> CuResult<Stream> {
        let _bound = self.bind()?;
        let mut raw = ptr::null_mut();
        // SAFETY: context current; the out-pointer is a live local.
        check(unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream {
            raw,
            ctx: Arc::clone(self),
            owned: true,
        })
    }

    /// A new event without timing (`CU_EVENT_DISABLE_TIMING`, as PyTorch's allocator uses),
    /// not yet recorded.
    pub(crate) fn create_event(self: &Arc<Self>) -> CuResult<Event> {
        let _bound = self.bind()?;
        let mut raw = ptr::null_mut();
        // SAFETY: context current; the out-pointer is a live local.
        check(unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(Event {
            raw,
            done: AtomicBool::new(false),
            ctx: Arc::clone(self),
        })
    }

    /// Creates a physical chunk of `size` bytes of device memory (`cuMemCreate`).
    pub(crate) fn create_physical(self: &Arc<Self>, size: u64) -> CuResult<Physical> {
        let _bound = self.bind()?;
        let prop = chunk_properties(self.dev);
        let mut handle = 0;
        // SAFETY: context current; the property struct and out-pointer are live locals.
        check(unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) })?;
        Ok(Physical {
            handle: Some(handle),
            size,
            ctx: Arc::clone(self),
        })
    }
}

/// A stream: the legacy default stream (null) or one from [`PrimaryContext::create_stream`],
/// destroyed on drop.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(super) raw: sys::CUstream,
    pub(super) ctx: Arc<PrimaryContext>,
    /// Whether this value created the handle and so destroys it.
    owned: bool,
}

// SAFETY: a CUstream is a handle any thread may use; the driver synchronises enqueueing.
unsafe impl Send for Stream {}
// SAFETY: as for Send.
unsafe impl Sync for Stream {}

impl Stream {
    /// The raw handle as a number: 0 for the legacy default stream.
    pub(crate) fn id(&self) -> u64 {
        self.raw as u64
    }

    /// Blocks until all work queued on the stream has finished.
    pub(crate) fn synchronize(&self) -> CuResult<()> {
        let _bound = self.ctx.bind()?;
        // SAFETY: context current; the stream is live while `self` is.
        check(unsafe { sys::cuStreamSynchronize(self.raw) })
    }

    /// Destroys the stream now, reporting the driver's answer (dropping does the same silently).
    pub(crate) fn destroy(mut self) -> CuResult<()> {
        self.destroy_handle()
    }

    fn destroy_handle(&mut self) -> CuResult<()> {
        let raw = std::mem::replace(&mut self.raw, ptr::null_mut());
        if raw.is_null() || !self.owned {
            return Ok(());
        }
        let _bound = self.ctx.bind()?;
        // SAFETY: `raw` was created by cuStreamCreate and is destroyed once (it was replaced by
        // null above); nobody else holds it (this is the owner, shared only through `Arc`s).
        check(unsafe { sys::cuStreamDestroy_v2(raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.destroy_handle();
    }
}

/// An event from [`PrimaryContext::create_event`], destroyed on drop. Remembers once it has
/// been seen complete, so that later checks need no driver call.
#[derive(Debug)]
pub(crate) struct Event {
    raw: sys::CUevent,
    done: AtomicBool,
    ctx: Arc<PrimaryContext>,
}

// SAFETY: a CUevent is a handle any thread may use; the driver synchronises.
unsafe impl Send for Event {}
// SAFETY: as for Send; the completion flag is atomic.
unsafe impl Sync for Event {}

impl Event {
    /// The raw handle as a number.
    pub(crate) fn id(&self) -> u64 {
        self.raw as u64
    }

    /// Records the event after the work queued so far on `stream` (`cuEventRecord`).
    pub(crate) fn record(&self, stream: &Stream) -> CuResult<()> {
        let _bound = self.ctx.bind()?;
        self.done.store(false, Ordering::Release);
        // SAFETY: context current; event and stream are live while `self` and `stream` are.
        check(unsafe { sys::cuEventRecord(self.raw, stream.raw) })
    }

    /// Makes work queued on `stream` from now on wait for this event (`cuStreamWaitEvent`);
    /// the host does not wait.
    pub(crate) fn make_wait(&self, stream: &Stream) -> CuResult<()> {
        let _bound = self.ctx.bind()?;
        // SAFETY: context current; event and stream are live while `self` and `stream` are.
        check(unsafe { sys::cuStreamWaitEvent(stream.raw, self.raw, 0) })
    }

    /// Whether the work before the event has finished (`cuEventQuery`).
    pub(crate) fn query(&self) -> CuResult<bool> {
        if self.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        let _bound = self.ctx.bind()?;
        // SAFETY: context current; the event is live while `self` is.
        match unsafe { sys::cuEventQuery(self.raw) } {
            CUresult::CUDA_SUCCESS => {
                self.done.store(true, Ordering::Release);
                Ok(true)
            }
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(e),
        }
    }

    /// Blocks until the work before the event has finished (`cuEventSynchronize`).
    pub(crate) fn synchronize(&self) -> CuResult<()> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let _bound = self.ctx.bind()?;
        // SAFETY: context current; the event is live while `self` is.
        check(unsafe { sys::cuEventSynchronize(self.raw) })?;
        self.done.store(true, Ordering::Release);
        Ok(())
    }

    /// Destroys the event now, reporting the driver's answer (dropping does the same silently).
    pub(crate) fn destroy(mut self) -> CuResult<()> {
        self.destroy_handle()
    }

    fn destroy_handle(&mut self) -> CuResult<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        let raw = std::mem::replace(&mut self.raw, ptr::null_mut());
        let _bound = self.ctx.bind()?;
        // SAFETY: `raw` was created by cuEventCreate and is destroyed once; nobody else holds
        // it (fences and tables hold this owner through `Arc`s, and it is being dropped).
        check(unsafe { sys::cuEventDestroy_v2(raw) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.destroy_handle();
    }
}

/// A physical VMM chunk from [`PrimaryContext::create_physical`]; released on drop.
#[derive(Debug)]
pub(crate) struct Physical {
    pub(super) handle: Option<sys::CUmemGenericAllocationHandle>,
    pub(super) size: u64,
    ctx: Arc<PrimaryContext>,
}

impl Physical {
    /// The raw handle as a number.
    pub(crate) fn id(&self) -> u64 {
        self.handle.unwrap_or(0)
    }

    /// The chunk's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Releases the handle now (`cuMemRelease`), reporting the driver's answer. The memory
    /// goes back once no mapping of it is left.
    pub(crate) fn release(mut self) -> CuResult<()> {
        self.release_handle()
    }

    fn release_handle(&mut self) -> CuResult<()> {
        let Some(handle) = self.handle.take() else {
            return Ok(());
        };
        let _bound = self.ctx.bind()?;
        // SAFETY: `handle` came from cuMemCreate and is released once (taken above).
        check(unsafe { sys::cuMemRelease(handle) })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        let _ = self.release_handle();
    }
}
