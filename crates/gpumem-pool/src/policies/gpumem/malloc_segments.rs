//! The backing of an arena on a device without VMM: `cudaMalloc` segments sized like
//! PyTorch's, each a span of the arena's index (spans never merge), given back once wholly
//! free.

use gpumem_device::{DevicePtr, StreamId};

use super::tlsf::{NodeId, Tlsf};
use super::{ArenaBacking, GpumemPolicy, GpumemSettings, StreamArena};
use crate::policy::{Exhausted, SegmentView, Upstream};
use crate::stats::SizeClass;

/// The device segments of an arena.
#[derive(Debug, Default)]
pub(super) struct MallocSegments {
    segments: Vec<MallocSegment>,
}

/// A device allocation backing part of an arena.
#[derive(Debug)]
struct MallocSegment {
    ptr: DevicePtr,
    size: u64,
    /// The index node that starts the segment (stable for its life).
    first: NodeId,
}

/// The segment that serves a `size`-byte request of `pool` when no segment has room.
fn segment_size(settings: &GpumemSettings, pool: SizeClass, size: u64) -> Option<u64> {
    match pool {
        SizeClass::Small => Some(settings.small_segment),
        SizeClass::Large if size < settings.large_request => Some(settings.mid_segment),
        SizeClass::Large => size.checked_next_multiple_of(settings.segment_rounding),
    }
}

impl MallocSegments {
    /// Whether there are no segments.
    pub(super) fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Frees wholly free segments (and their spans in `index`) until `want` bytes are given
    /// back; returns the bytes freed.
    pub(super) fn release_idle(
        &mut self,
        index: &mut Tlsf,
        want: u64,
        up: &mut Upstream<'_>,
        pool: SizeClass,
        stream: StreamId,
    ) -> u64 {
        let mut released = 0;
        self.segments.retain(|s| {
            let idle = index.is_free(s.first) && index.size(s.first) == s.size;
            if released >= want || !idle {
                return true;
            }
            if up.free_segment(s.ptr, s.size, pool, stream).is_err() {
                return true;
            }
            index.remove_span(s.first);
            released += s.size;
            false
        });
        released
    }

    /// The segments of `arena` (whose backing this is), with their blocks.
    pub(super) fn segment_views(&self, arena: &StreamArena, views: &mut Vec<SegmentView>) {
        for s in &self.segments {
            let blocks = arena.span_blocks(s.first).collect();
            views.push(arena.segment_view(s.ptr, s.size, false, blocks));
        }
    }
}

impl GpumemPolicy {
    /// Places `size` bytes in the segment arena `a`, allocating a segment when none has room;
    /// returns the block's node.
    pub(super) fn place_in_segment(
        &mut self,
        a: usize,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<NodeId, Exhausted> {
        match self.arenas[a].index.allocate(size) {
            Some(node) => Ok(node),
            None => self.grow_segments(a, size, up),
        }
    }

    /// Adds a segment to arena `a` for a `size`-byte request and allocates from it.
    fn grow_segments(
        &mut self,
        a: usize,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<NodeId, Exhausted> {
        let (pool, stream) = (self.arenas[a].pool, self.arenas[a].stream);
        let seg = segment_size(&self.settings, pool, size)
            .ok_or_else(|| Exhausted::too_large(size, up))?;
        let exhausted = |cause| Exhausted {
            attempted: seg,
            cause,
        };
        let ptr = match up.malloc_segment(seg, pool, stream) {
            Ok(ptr) => ptr,
            Err(cause) if cause.is_out_of_memory() && self.release_idle(seg, up) > 0 => {
                up.malloc_segment(seg, pool, stream).map_err(exhausted)?
            }
            Err(cause) => return Err(exhausted(cause)),
        };
        let arena = &mut self.arenas[a];
        let Some(first) = arena.index.add_span(ptr, seg) else {
            let _ = up.free_segment(ptr, seg, pool, stream);
            return Err(Exhausted::too_large(seg, up));
        };
        if let ArenaBacking::Segments(segments) = &mut arena.backing {
            segments.segments.push(MallocSegment {
                ptr,
                size: seg,
                first,
            });
        }
        // The new span is filed at the head of its class, so the search finds it.
        arena
            .index
            .allocate(size)
            .ok_or_else(|| Exhausted::too_large(size, up))
    }
}
