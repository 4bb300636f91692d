//! Old addresses of moved chunks, unmapped once the work that may still use them is done.
//!
//! Stitching moves an idle chunk under a block that needs pages. The chunk's memory may still
//! be in use through its old address by kernels queued before the free that made it idle, and
//! `cuMemUnmap` does not wait for them. So when its stream may still be busy
//! ([`Upstream::may_be_in_use`]), the chunk is mapped at its new address at once (a chunk may
//! be mapped at two addresses), an event recorded on the old stream marks the end of the work
//! that may use it (the new block's stream, if another, waits for that event on the GPU, not
//! the host), and the old address is unmapped only once the event has completed: polled on
//! later requests, waited for when the memory or address space is needed now. Nothing is
//! placed at an old address meanwhile: it was retired from the arena's index when the chunk
//! left. No host synchronisation on the way.

use gpumem_device::{DevicePtr, EventId, PhysicalHandle, StreamId};

use crate::policy::{Upstream, UpstreamError};
use crate::stats::SizeClass;

/// Old addresses waiting for events, in batches that share one event.
#[derive(Debug, Default)]
pub(super) struct DeferredUnmaps {
    batches: Vec<Batch>,
}

/// The old addresses left on one stream by one request, and the event after their last use.
#[derive(Debug)]
struct Batch {
    stream: StreamId,
    event: EventId,
    /// Whether the request that opened it is still running (its later moves join it).
    open: bool,
    /// Streams already made to wait for `event`.
    waiting: Vec<StreamId>,
    unmaps: Vec<Unmap>,
}

/// An address range to unmap, and the chunk to release after it when the move failed.
#[derive(Clone, Copy, Debug)]
struct Unmap {
    addr: DevicePtr,
    bytes: u64,
    release: Option<(PhysicalHandle, SizeClass)>,
}

impl DeferredUnmaps {
    /// Whether nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Orders a new use of memory last used on `from` after that use: the event of this
    /// request's batch for `from` (recorded now if there is none yet), which `to` waits for
    /// when it is another stream.
    pub(super) fn order_after(
        &mut self,
        from: StreamId,
        to: StreamId,
        up: &mut Upstream<'_>,
    ) -> Result<(), UpstreamError> {
        let i = match self.batches.iter().position(|b| b.open && b.stream == from) {
            Some(i) => i,
            None => {
                let event = up.record_event(from)?;
                self.batches.push(Batch {
                    stream: from,
                    event,
                    open: true,
                    waiting: Vec::new(),
                    unmaps: Vec::new(),
                });
                self.batches.len() - 1
            }
        };
        let batch = &mut self.batches[i];
        if to != from && !batch.waiting.contains(&to) {
            up.stream_wait_event(to, batch.event)?;
            batch.waiting.push(to);
        }
        Ok(())
    }

    /// Unmaps `[addr, addr + bytes)` once the work of `from` before this request is done (see
    /// [`DeferredUnmaps::order_after`], which must have been called for `from`); with
    /// `release`, releases the chunk then too.
    pub(super) fn unmap_later(
        &mut self,
        from: StreamId,
        addr: DevicePtr,
        bytes: u64,
        release: Option<(PhysicalHandle, SizeClass)>,
    ) {
        if let Some(batch) = self.batches.iter_mut().find(|b| b.open && b.stream == from) {
            batch.unmaps.push(Unmap {
                addr,
                bytes,
                release,
            });
        }
    }

    /// The request is over: its batches take no more moves.
    pub(super) fn close(&mut self) {
        for batch in &mut self.batches {
            batch.open = false;
        }
    }

    /// Unmaps the old addresses whose work has completed; with `wait`, waits for all of them
    /// first. A batch the device refuses stays for a later try.
    pub(super) fn settle(&mut self, wait: bool, up: &mut Upstream<'_>) {
        let mut i = 0;
        while i < self.batches.len() {
            let event = self.batches[i].event;
            let done = if wait {
                up.wait_event(event).is_ok()
            } else {
                up.event_completed(event).unwrap_or(false)
            };
            if !done {
                i += 1;
                continue;
            }
            let batch = &mut self.batches[i];
            while let Some(unmap) = batch.unmaps.last().copied() {
                if up.unmap(unmap.addr, unmap.bytes).is_err() {
                    break;
                }
                if let Some((handle, pool)) = unmap.release {
                    // A chunk the device will not release stays counted as reserved.
                    let _ = up.release_physical(handle, unmap.bytes, pool);
                }
                batch.unmaps.pop();
            }
            if batch.unmaps.is_empty() {
                let _ = up.destroy_event(event);
                self.batches.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
}
