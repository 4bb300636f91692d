//! `GPUMEM_POOL=gpumem` (the default): gpumem's own placement policy.
//!
//! Each stream gets an *arena*: one large virtual-address reservation, tiled by a TLSF index
//! ([`tlsf`]) that finds a good-fitting free range in O(1) and merges neighbours on free in
//! O(1), with physical memory mapped in granularity pages ([`pages`]) only under the bytes that
//! blocks actually touch. Because an arena is one contiguous range, free neighbours always
//! merge (PyTorch never merges across segments), and reserved memory is the set of pages blocks
//! have touched rather than whole 2 or 20 MiB segments. Requests are rounded to 512 bytes only.
//!
//! - Steady state: freed ranges stay mapped, so a repeated training step is served with no
//!   device call at all.
//! - Growth by a big block (≥ 128 MiB, e.g. logits) that fits no free range: idle chunks of the
//!   arena move under it before fresh memory is mapped, and their old range leaves the index
//!   for good — stitched once, reused from then on.
//! - Pressure (device out of memory or the hard limit): an allocation that needs fresh pages
//!   takes what the device and the limit still grant, then *moves* idle chunks of any stream's
//!   arena under itself — unmap there, map here, no new memory — stitching scattered free
//!   memory into one contiguous block as GMLake does; then frees idle chunks elsewhere and
//!   maps fresh ones.
//! - Tiny requests (≤ 64 KiB) are packed into 1 MiB slabs that the stream's large arena lends
//!   as ordinary blocks and takes back, merged with its neighbours, once they empty: tiny
//!   blocks never leave sub-page slivers between large ones, and their memory is not stranded
//!   in a pool of its own. Other small-pool requests are placed in the large arena.
//! - Streams: a freed range is reused only by its own stream (cross-stream frees are delayed
//!   by the pool until their events). Memory moves between streams only as whole idle chunks,
//!   under pressure.
//! - Without VMM the same index runs over `cudaMalloc` segments sized like PyTorch's (2 MiB
//!   small, 20 MiB for 1–10 MiB requests, else the request rounded to 2 MiB); fully free
//!   segments are given back on reclaim.

mod pages;
mod tlsf;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use gpumem_device::address_map::AddressHasher;
use gpumem_device::{DevicePtr, StreamId};

use self::pages::{Chunk, PageMap, MAX_CHUNK_PAGES};
use self::tlsf::{NodeId, Tlsf};
use crate::policy::{
    AllocRequest, Block, BlockHandle, BlockView, Exhausted, Policy, ReleaseTarget, SegmentView,
    Upstream, UpstreamError,
};
use crate::stats::SizeClass;

/// Every block is a multiple of this (cudaMalloc's own alignment): the only rounding.
const ROUNDING: u64 = 512;
/// A block at least this large that needs fresh pages takes idle chunks of its own arena
/// first, even without pressure (the moved chunks' old range leaves the index for good, so
/// this happens once, not every step). Logits and their gradients — larger than any hole, and
/// arriving while activations' pages sit idle — are what this is for; applied to smaller
/// blocks it displaces blocks whose new places cost device calls for some steps longer
/// (measured at 64 and 96 MiB: the synthetic checkpointing trace then never settles).
const STITCH_ON_GROWTH_MIN: u64 = 128 << 20;
/// Bytes of address space each arena reserves per byte of device memory.
const VA_PER_DEVICE_BYTE: u64 = 4;
/// With VMM: requests up to this size are packed into slabs; larger ones, small-pool requests
/// included, are placed in the stream's large arena like any block. Tiny blocks (norm weights,
/// scalars, index tensors) would leave sub-page holes between large blocks; requests of
/// 64 KiB – 1 MiB (KV-cache slices, biases) fill such holes better than they fill slabs, where
/// the space they leave is lost to the large blocks.
const SLAB_MAX_REQUEST: u64 = 64 << 10;
/// With VMM: the slab tiny blocks are packed into, a block of the stream's large arena.
const SLAB: u64 = 1 << 20;
/// Without VMM: the segment for small requests.
const SMALL_SEGMENT: u64 = 2 << 20;
/// Without VMM: the segment for requests of 1–10 MiB.
const MID_SEGMENT: u64 = 20 << 20;
/// Without VMM: requests from this size get a segment of their own size rounded to
/// [`SEGMENT_ROUNDING`].
const LARGE_REQUEST: u64 = 10 << 20;
/// Without VMM: the rounding of segments for large requests.
const SEGMENT_ROUNDING: u64 = 2 << 20;

/// gpumem's policy: TLSF over per-stream address reservations with pages mapped on demand.
#[derive(Debug, Default)]
pub struct GpumemPolicy {
    arenas: Vec<Arena>,
    /// Whether the device has VMM, learnt at the first request (a policy serves one device):
    /// asked on every request, and a device query is a dynamic call.
    vmm: Option<bool>,
}

impl GpumemPolicy {
    /// A policy holding no memory yet.
    pub fn new() -> Self {
        GpumemPolicy::default()
    }
}

/// The blocks of one stream and one pool kind.
#[derive(Debug)]
struct Arena {
    stream: StreamId,
    pool: SizeClass,
    /// Free and handed-out ranges; a block's handle names its node (see [`block_handle`]).
    index: Tlsf,
    backing: Backing,
}

/// Where an arena's memory comes from.
#[derive(Debug)]
enum Backing {
    /// One address reservation, pages mapped on demand.
    Paged {
        reservation: DevicePtr,
        len: u64,
        pages: PageMap,
        /// Address ranges taken out of the index when their chunks moved to back a growing
        /// block (so that nothing is placed there again and has to be mapped anew); given back
        /// to the index if it ever runs out of address space.
        retired: Vec<(DevicePtr, u64)>,
    },
    /// `cudaMalloc` segments, when the device has no VMM.
    Segments(Vec<Segment>),
    /// Tiny blocks with VMM: 1 MiB slabs taken from the stream's large arena as blocks and
    /// handed back as soon as they empty, so tiny blocks share pages with large ones and
    /// their idle memory returns to the large arena. By the slab's first node here.
    Slabs(HashMap<NodeId, SlabLoan, BuildHasherDefault<AddressHasher>>),
}

/// A slab lent by the stream's large arena to its slab arena.
#[derive(Clone, Copy, Debug)]
struct SlabLoan {
    /// The slab's address.
    addr: DevicePtr,
    /// The large arena's node that is the slab.
    node: NodeId,
}

/// A block's [`Block::handle`]: its node, with bit 32 set when it lies in a slab arena (the
/// arena kind, so that a free finds the arena without recomputing where the block went).
fn block_handle(node: NodeId, arena: SizeClass) -> BlockHandle {
    BlockHandle::new(u64::from(node.get()) | u64::from(arena == SizeClass::Small) << 32)
}

/// The node and the arena kind a [`block_handle`] names (`None` for a handle no node has).
fn handle_parts(handle: BlockHandle) -> Option<(NodeId, SizeClass)> {
    let raw = handle.get();
    let arena = if raw >> 32 & 1 == 1 {
        SizeClass::Small
    } else {
        SizeClass::Large
    };
    Some((NodeId::new(raw as u32)?, arena))
}

/// An idle chunk that can be moved under a block that needs pages.
#[derive(Clone, Copy, Debug)]
struct Donor {
    /// Its arena.
    arena: usize,
    /// Its first page there.
    page: u64,
    chunk: Chunk,
    /// The free node that holds it.
    node: NodeId,
}

/// A device allocation backing part of an arena without VMM.
#[derive(Debug)]
struct Segment {
    ptr: DevicePtr,
    size: u64,
    /// The index node that starts the segment (stable for its life).
    first: NodeId,
}

/// Bytes the device and the hard limit would still grant.
fn headroom(up: &Upstream<'_>) -> u64 {
    let device_free = up.device().mem_info().map_or(0, |info| info.free);
    let under_limit = up
        .hard_limit()
        .map_or(u64::MAX, |limit| limit.saturating_sub(up.reserved()));
    device_free.min(under_limit)
}

/// The failure for a request no arena could ever hold.
fn too_large(requested: u64, up: &Upstream<'_>) -> Exhausted {
    Exhausted {
        attempted: requested,
        cause: up.out_of_memory(requested),
    }
}

/// The arena kind that holds a block of `size` bytes (rounded) accounted to `pool`: with VMM,
/// small-pool blocks above [`SLAB_MAX_REQUEST`] live in the large arena.
fn arena_pool(pool: SizeClass, size: u64, vmm: bool) -> SizeClass {
    if vmm && size > SLAB_MAX_REQUEST {
        SizeClass::Large
    } else {
        pool
    }
}

/// The segment that serves a `size`-byte request of `pool` when no segment has room.
fn segment_size(pool: SizeClass, size: u64) -> Option<u64> {
    match pool {
        SizeClass::Small => Some(SMALL_SEGMENT),
        SizeClass::Large if size < LARGE_REQUEST => Some(MID_SEGMENT),
        SizeClass::Large => size.checked_next_multiple_of(SEGMENT_ROUNDING),
    }
}

impl Arena {
    /// A new arena: an address reservation when the device has VMM, else segments on demand.
    fn new(stream: StreamId, pool: SizeClass, up: &mut Upstream<'_>) -> Result<Arena, Exhausted> {
        let mut index = Tlsf::default();
        let backing = match up.granularity() {
            Some(_) if pool == SizeClass::Small => Backing::Slabs(HashMap::default()),
            Some(page) => {
                // Address space is cheap: four times the device, so that however the
                // ranges fragment, physical memory runs out before addresses do.
                let total = up.device().mem_info().map_err(|e| Exhausted {
                    attempted: 0,
                    cause: e.into(),
                })?;
                let len = total
                    .total
                    .saturating_mul(VA_PER_DEVICE_BYTE)
                    .next_multiple_of(page);
                let reservation = up.reserve_address(len).map_err(|cause| Exhausted {
                    attempted: len,
                    cause,
                })?;
                if index.add_span(reservation, len).is_none() {
                    let _ = up.release_address(reservation, len);
                    return Err(too_large(len, up));
                }
                Backing::Paged {
                    reservation,
                    len,
                    pages: PageMap::new(reservation, page),
                    retired: Vec::new(),
                }
            }
            None => Backing::Segments(Vec::new()),
        };
        Ok(Arena {
            stream,
            pool,
            index,
            backing,
        })
    }

    /// The page table of a paged arena.
    fn pages(&self) -> Option<&PageMap> {
        match &self.backing {
            Backing::Paged { pages, .. } => Some(pages),
            Backing::Segments(_) | Backing::Slabs(_) => None,
        }
    }

    /// Maps a fresh chunk of `n` pages at page `p` of a paged arena.
    fn map_fresh(&mut self, p: u64, n: u64, up: &mut Upstream<'_>) -> Result<(), UpstreamError> {
        match &mut self.backing {
            Backing::Paged { pages, .. } => pages.map_fresh(p, n, up, self.pool, self.stream),
            Backing::Segments(_) | Backing::Slabs(_) => Ok(()),
        }
    }

    /// Gives the address ranges retired by moved chunks back to the index; whether there
    /// were any.
    fn restore_retired(&mut self) -> bool {
        let Backing::Paged { retired, .. } = &mut self.backing else {
            return false;
        };
        let restored = !retired.is_empty();
        for (addr, len) in retired.drain(..) {
            // A full slab leaves the range out: it stays unusable, nothing else breaks.
            let _ = self.index.restore(addr, len);
        }
        restored
    }

    /// Whether the arena holds neither blocks nor device memory.
    fn is_empty(&self) -> bool {
        self.index.used_nodes().next().is_none()
            && match &self.backing {
                Backing::Paged { pages, .. } => pages.mapped_bytes() == 0,
                Backing::Segments(segments) => segments.is_empty(),
                Backing::Slabs(slabs) => slabs.is_empty(),
            }
    }

    /// Idle chunks (wholly inside free ranges) of a paged arena, as (first page, chunk, the
    /// free node holding it), lowest first.
    fn idle_chunks(&self) -> Vec<(u64, Chunk, NodeId)> {
        let Backing::Paged { pages, .. } = &self.backing else {
            return Vec::new();
        };
        let mut idle: Vec<(u64, Chunk, NodeId)> = self
            .index
            .free_nodes()
            .flat_map(|id| {
                pages
                    .chunks_inside(self.index.offset(id), self.index.size(id))
                    .map(move |(p, c)| (p, c, id))
            })
            .collect();
        idle.sort_unstable_by_key(|&(p, _, _)| p);
        idle
    }

    /// Gives back idle device memory, highest addresses first, until `want` bytes are freed;
    /// returns the bytes freed.
    fn release_idle(&mut self, want: u64, up: &mut Upstream<'_>) -> u64 {
        let mut released = 0;
        match &mut self.backing {
            Backing::Paged { .. } => {
                let idle = self.idle_chunks();
                let Backing::Paged { pages, .. } = &mut self.backing else {
                    return 0;
                };
                for (p, _, _) in idle.into_iter().rev() {
                    if released >= want {
                        break;
                    }
                    released += pages.release(p, up, self.pool, self.stream).unwrap_or(0);
                }
            }
            // Empty slabs go back to the large arena at once: nothing idle is kept here.
            Backing::Slabs(_) => {}
            Backing::Segments(segments) => {
                let index = &mut self.index;
                segments.retain(|s| {
                    let idle = index.is_free(s.first) && index.size(s.first) == s.size;
                    if released >= want || !idle {
                        return true;
                    }
                    if up
                        .free_segment(s.ptr, s.size, self.pool, self.stream)
                        .is_err()
                    {
                        return true;
                    }
                    index.remove_span(s.first);
                    released += s.size;
                    false
                });
            }
        }
        released
    }

    /// A node as a block view.
    fn block_view(&self, id: NodeId) -> BlockView {
        BlockView {
            address: self.index.offset(id),
            size: self.index.size(id),
            in_use: !self.index.is_free(id),
        }
    }

    /// The nodes of the span starting at `first`, in address order, as block views.
    fn span_blocks(&self, first: NodeId) -> impl Iterator<Item = BlockView> + '_ {
        std::iter::successors(Some(first), |&id| self.index.next_in_span(id))
            .map(|id| self.block_view(id))
    }

    /// The segments of this arena, with `slab_blocks` (slab address → the small blocks tiling
    /// it) shown in place of the slabs a paged arena lends to small blocks.
    fn segment_views(
        &self,
        slab_blocks: &HashMap<DevicePtr, Vec<BlockView>>,
        views: &mut Vec<SegmentView>,
    ) {
        let view = |address, total_size, is_expandable, blocks| SegmentView {
            address,
            total_size,
            stream: self.stream,
            size_class: self.pool,
            is_expandable,
            blocks,
        };
        match &self.backing {
            Backing::Paged { pages, .. } => {
                // One segment per run of mapped pages, with the blocks clipped to it.
                let mut ids: Vec<NodeId> = self.index.used_nodes().collect();
                ids.extend(self.index.free_nodes());
                ids.sort_unstable_by_key(|&id| self.index.offset(id));
                let nodes: Vec<BlockView> = ids
                    .into_iter()
                    .map(|id| self.block_view(id))
                    .flat_map(|b| match slab_blocks.get(&b.address) {
                        Some(inner) if b.in_use => inner.clone(),
                        _ => vec![b],
                    })
                    .collect();
                for (first, end) in pages.mapped_runs() {
                    let (start, stop) = (pages.address(first), pages.address(end));
                    let blocks = clip(&nodes, start, stop);
                    views.push(view(start, stop - start, true, blocks));
                }
            }
            // Shown inside the large arena's segments.
            Backing::Slabs(_) => {}
            Backing::Segments(segments) => {
                for s in segments {
                    views.push(view(
                        s.ptr,
                        s.size,
                        false,
                        self.span_blocks(s.first).collect(),
                    ));
                }
            }
        }
    }

    /// The largest free range backed by memory right now.
    fn largest_free_block(&self) -> u64 {
        let free = self.index.free_nodes();
        match &self.backing {
            Backing::Segments(_) | Backing::Slabs(_) => {
                free.map(|id| self.index.size(id)).max().unwrap_or(0)
            }
            Backing::Paged { pages, .. } => {
                let runs = pages.mapped_runs();
                free.map(|id| {
                    let (lo, hi) = (
                        self.index.offset(id),
                        self.index.offset(id) + self.index.size(id),
                    );
                    runs.iter()
                        .map(|&(a, b)| {
                            let (a, b) = (pages.address(a).max(lo), pages.address(b).min(hi));
                            b.saturating_sub(a)
                        })
                        .max()
                        .unwrap_or(0)
                })
                .max()
                .unwrap_or(0)
            }
        }
    }
}

/// The parts of `blocks` (in address order) that lie in `[start, stop)`.
fn clip(blocks: &[BlockView], start: u64, stop: u64) -> Vec<BlockView> {
    let from = blocks.partition_point(|b| b.address + b.size <= start);
    blocks[from..]
        .iter()
        .take_while(|b| b.address < stop)
        .map(|b| {
            let address = b.address.max(start);
            BlockView {
                address,
                size: (b.address + b.size).min(stop) - address,
                in_use: b.in_use,
            }
        })
        .collect()
}

impl GpumemPolicy {
    /// The arena of `stream` and `pool`, created on first use.
    fn arena(
        &mut self,
        stream: StreamId,
        pool: SizeClass,
        up: &mut Upstream<'_>,
    ) -> Result<usize, Exhausted> {
        if let Some(i) = self.find_arena(stream, pool) {
            return Ok(i);
        }
        self.arenas.push(Arena::new(stream, pool, up)?);
        Ok(self.arenas.len() - 1)
    }

    /// The arena of `stream` and `pool`, if it exists.
    fn find_arena(&self, stream: StreamId, pool: SizeClass) -> Option<usize> {
        self.arenas
            .iter()
            .position(|a| a.stream == stream && a.pool == pool)
    }

    /// Places `size` bytes in the slab arena `a`, taking a new slab from the stream's large
    /// arena when no slab has room; returns the block's node.
    fn place_in_slab(
        &mut self,
        a: usize,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<NodeId, Exhausted> {
        if let Some(node) = self.arenas[a].index.allocate(size) {
            return Ok(node);
        }
        let large = self.arena(self.arenas[a].stream, SizeClass::Large, up)?;
        let loan = self.place_paged(large, SLAB, up)?;
        let addr = self.arenas[large].index.offset(loan);
        let arena = &mut self.arenas[a];
        let Some(first) = arena.index.add_span(addr, SLAB) else {
            self.arenas[large].index.free(loan);
            return Err(too_large(size, up));
        };
        if let Backing::Slabs(slabs) = &mut arena.backing {
            slabs.insert(first, SlabLoan { addr, node: loan });
        }
        // The new span is filed at the head of its class, so the search finds it.
        arena
            .index
            .allocate(size)
            .ok_or_else(|| too_large(size, up))
    }

    /// Places `size` bytes in the paged arena `a`, mapping the pages it touches that are not
    /// mapped yet; returns the block's node.
    fn place_paged(
        &mut self,
        a: usize,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<NodeId, Exhausted> {
        let arena = &mut self.arenas[a];
        let Some(node) = arena.index.allocate(size).or_else(|| {
            arena
                .restore_retired()
                .then(|| arena.index.allocate(size))?
        }) else {
            return Err(too_large(size, up));
        };
        let addr = arena.index.offset(node);
        if let Backing::Paged { pages, .. } = &arena.backing {
            let (first, end) = pages.pages_touching(addr, size);
            if !pages.all_mapped(first, end) {
                let interior = pages.pages_inside(addr, size);
                if let Err(e) = self.map_pages(a, (first, end), interior, up) {
                    self.arenas[a].index.free(node);
                    return Err(e);
                }
            }
        }
        Ok(node)
    }

    /// Maps the unmapped pages among `touched` (first, end) of arena `a`, for a block whose
    /// own pages are `interior`: idle chunks moved here (largest that fits first) when the
    /// block is big or memory is short; fresh chunks while the device and the limit allow (one
    /// per interior run, one per shared boundary page); else fresh memory after freeing idle
    /// chunks elsewhere.
    fn map_pages(
        &mut self,
        a: usize,
        (first, end): (u64, u64),
        (inner_first, inner_end): (u64, u64),
        up: &mut Upstream<'_>,
    ) -> Result<(), Exhausted> {
        let pool = self.arenas[a].pool;
        let mut pressure: Option<UpstreamError> = None;
        let mut try_fresh = true;
        let mut donors: Option<Vec<Donor>> = None;
        let mut p = first;
        while p < end {
            let Some(pages) = self.arenas[a].pages() else {
                return Ok(());
            };
            if pages.is_mapped(p) {
                p += 1;
                continue;
            }
            let page = pages.page_size();
            let gap = pages.unmapped_run_end(p, end) - p;
            let exhausted = |cause| Exhausted {
                attempted: gap * page,
                cause,
            };
            // Stitch first: an idle chunk that fits the gap moves here — from this arena when a
            // big block grows it, from any arena of the pool under pressure.
            let list = donors.get_or_insert_with(|| self.idle_chunks_of(pool));
            let growing_big = (end - first) * page >= STITCH_ON_GROWTH_MIN;
            let fits = |d: &Donor| {
                d.chunk.pages <= gap && (pressure.is_some() || (growing_big && d.arena == a))
            };
            if let Some(i) = list.iter().rposition(fits) {
                let donor = list[i];
                self.move_chunk(&donor, a, p, up).map_err(exhausted)?;
                p += donor.chunk.pages;
                // The donor's range left its index: the other donors' nodes may have changed.
                donors = None;
                continue;
            }
            let mut n = if (inner_first..inner_end).contains(&p) {
                (gap.min(inner_end - p)).min(MAX_CHUNK_PAGES)
            } else {
                1
            };
            if pressure.is_some() {
                n = n.min(headroom(up) / page);
            }
            if try_fresh && n > 0 {
                match self.arenas[a].map_fresh(p, n, up) {
                    Ok(()) => p += n,
                    Err(cause) if cause.is_out_of_memory() => {
                        // A second refusal: the headroom estimate is wrong, stop asking.
                        try_fresh = pressure.is_none();
                        pressure = Some(cause);
                    }
                    Err(cause) => return Err(exhausted(cause)),
                }
                continue;
            }
            let Some(cause) = pressure.clone() else {
                return Ok(());
            };
            let released = self.release_idle(gap * page, up) / page;
            if released == 0 {
                return Err(exhausted(cause));
            }
            donors = None;
            let n = gap.min(released).min(MAX_CHUNK_PAGES);
            self.arenas[a].map_fresh(p, n, up).map_err(exhausted)?;
            p += n;
        }
        Ok(())
    }

    /// Idle chunks of every paged arena of `pool`, smallest first.
    fn idle_chunks_of(&self, pool: SizeClass) -> Vec<Donor> {
        let mut idle: Vec<Donor> = self
            .arenas
            .iter()
            .enumerate()
            .filter(|(_, arena)| arena.pool == pool)
            .flat_map(|(arena, a)| {
                a.idle_chunks()
                    .into_iter()
                    .map(move |(page, chunk, node)| Donor {
                        arena,
                        page,
                        chunk,
                        node,
                    })
            })
            .collect();
        idle.sort_by_key(|d| d.chunk.pages);
        idle
    }

    /// Moves an idle chunk to page `p` of arena `a`, and takes its old address range out of
    /// its arena's index for good, so that nothing placed there later needs mapping again.
    fn move_chunk(
        &mut self,
        donor: &Donor,
        a: usize,
        p: u64,
        up: &mut Upstream<'_>,
    ) -> Result<(), UpstreamError> {
        let arena = &mut self.arenas[donor.arena];
        let pool = arena.pool;
        let Backing::Paged {
            pages: from,
            retired,
            ..
        } = &mut arena.backing
        else {
            return Ok(());
        };
        let page = from.page_size();
        let chunk = from.take(donor.page, up)?;
        let range = (from.address(donor.page), chunk.pages * page);
        if arena.index.carve(donor.node, range.0, range.1) {
            retired.push(range);
        }
        let Backing::Paged { pages, .. } = &mut self.arenas[a].backing else {
            return Ok(());
        };
        if let Err(e) = pages.map_moved(p, chunk, up) {
            // The chunk is mapped nowhere now: give it back so reserved stays exact.
            let _ = up.release_physical(chunk.handle, chunk.pages * page, pool);
            return Err(e);
        }
        Ok(())
    }

    /// Places `size` bytes in the segment arena `a`, allocating a segment when none has room;
    /// returns the block's node.
    fn place_in_segment(
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
        let seg = segment_size(pool, size).ok_or_else(|| too_large(size, up))?;
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
            return Err(too_large(seg, up));
        };
        if let Backing::Segments(segments) = &mut arena.backing {
            segments.push(Segment {
                ptr,
                size: seg,
                first,
            });
        }
        // The new span is filed at the head of its class, so the search finds it.
        arena
            .index
            .allocate(size)
            .ok_or_else(|| too_large(size, up))
    }

    /// Frees idle memory across all arenas until `want` bytes are given back.
    fn release_idle(&mut self, want: u64, up: &mut Upstream<'_>) -> u64 {
        let mut released = 0;
        for arena in &mut self.arenas {
            if released >= want {
                break;
            }
            released += arena.release_idle(want - released, up);
        }
        released
    }
}

impl Policy for GpumemPolicy {
    fn name(&self) -> &'static str {
        "gpumem"
    }

    fn allocate(
        &mut self,
        req: AllocRequest,
        up: &mut Upstream<'_>,
    ) -> Result<Block, Box<Exhausted>> {
        let pool = SizeClass::for_request(req.size);
        let size = req
            .size
            .checked_next_multiple_of(ROUNDING)
            .ok_or_else(|| too_large(req.size, up))?;
        let vmm = *self.vmm.get_or_insert_with(|| up.granularity().is_some());
        let kind = arena_pool(pool, size, vmm);
        let a = self.arena(req.stream, kind, up)?;
        let node = match self.arenas[a].backing {
            Backing::Paged { .. } => self.place_paged(a, size, up)?,
            Backing::Segments(_) => self.place_in_segment(a, size, up)?,
            Backing::Slabs(_) => self.place_in_slab(a, size, up)?,
        };
        Ok(Block {
            addr: self.arenas[a].index.offset(node),
            size,
            requested: req.size,
            stream: req.stream,
            size_class: pool,
            handle: block_handle(node, kind),
        })
    }

    fn free(&mut self, block: Block, _up: &mut Upstream<'_>) {
        let Some((node, kind)) = handle_parts(block.handle) else {
            return;
        };
        let Some(a) = self.find_arena(block.stream, kind) else {
            return;
        };
        let arena = &mut self.arenas[a];
        if !arena.index.is_used_at(node, block.addr) {
            return;
        }
        let merged = arena.index.free(node);
        let Backing::Slabs(slabs) = &mut arena.backing else {
            return;
        };
        // An empty slab goes back to the large arena, where it merges with its neighbours.
        if arena.index.size(merged) != SLAB {
            return;
        }
        let Some(loan) = slabs.remove(&merged) else {
            return;
        };
        arena.index.remove_span(merged);
        if let Some(large) = self.find_arena(block.stream, SizeClass::Large) {
            self.arenas[large].index.free(loan.node);
        }
    }

    fn release_cached(&mut self, target: ReleaseTarget, up: &mut Upstream<'_>) -> u64 {
        let want = match target {
            ReleaseTarget::All => u64::MAX,
            ReleaseTarget::AtLeast(n) => n,
        };
        let released = self.release_idle(want, up);
        if target == ReleaseTarget::All {
            // Arenas left with nothing give their address space back too.
            self.arenas.retain(|arena| {
                if !arena.is_empty() {
                    return true;
                }
                match arena.backing {
                    Backing::Paged {
                        reservation, len, ..
                    } => up.release_address(reservation, len).is_err(),
                    Backing::Segments(_) | Backing::Slabs(_) => false,
                }
            });
        }
        released
    }

    fn segments(&self) -> Vec<SegmentView> {
        let mut slab_blocks: HashMap<DevicePtr, Vec<BlockView>> = HashMap::new();
        for arena in &self.arenas {
            if let Backing::Slabs(slabs) = &arena.backing {
                for (&first, loan) in slabs {
                    slab_blocks.insert(loan.addr, arena.span_blocks(first).collect());
                }
            }
        }
        let mut views = Vec::new();
        for arena in &self.arenas {
            arena.segment_views(&slab_blocks, &mut views);
        }
        views
    }

    fn largest_free_block(&self) -> u64 {
        self.arenas
            .iter()
            .map(Arena::largest_free_block)
            .max()
            .unwrap_or(0)
    }
}
