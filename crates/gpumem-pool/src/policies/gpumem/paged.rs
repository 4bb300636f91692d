//! The backing of an arena on a device with VMM: one address reservation, tiled by the arena's
//! index, with physical pages mapped on demand under the bytes blocks touch ([`super::pages`]).
//! Also what only paged arenas do: stitching idle chunks under a block that needs pages (a big
//! one, or any under pressure) and retiring the address ranges the chunks leave.

use std::collections::HashMap;

use gpumem_device::{DevicePtr, StreamId};

use super::pages::{Chunk, PageMap};
use super::tlsf::{NodeId, Tlsf};
use super::{ArenaBacking, GpumemPolicy, StreamArena};
use crate::policy::{BlockView, Exhausted, SegmentView, Upstream, UpstreamError};
use crate::stats::SizeClass;

/// An arena's address reservation and the pages mapped in it.
#[derive(Debug)]
pub(super) struct PagedReservation {
    /// First address of the reservation.
    base: DevicePtr,
    /// Bytes reserved.
    len: u64,
    pages: PageMap,
    /// Address ranges taken out of the index when their chunks moved to back a growing
    /// block (so that nothing is placed there again and has to be mapped anew); given back
    /// to the index if it ever runs out of address space.
    retired: Vec<(DevicePtr, u64)>,
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

/// Bytes the device and the hard limit would still grant.
fn headroom(up: &Upstream<'_>) -> u64 {
    let device_free = up.device().mem_info().map_or(0, |info| info.free);
    let under_limit = up
        .hard_limit()
        .map_or(u64::MAX, |limit| limit.saturating_sub(up.reserved()));
    device_free.min(under_limit)
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

/// Whether the free node `node` of `index` is a leftover hole for a block touching `block`
/// bytes of pages: at most `1 / divisor` of it (0: never), and not exactly one block handed
/// back (which a repeated request of that size would fit again). Retiring a chunk of such a
/// hole displaces nothing that repeats: the holes that repeated shapes refill are whole
/// blocks, or as large as the blocks that refill them.
fn is_leftover_hole(index: &Tlsf, node: NodeId, block: u64, divisor: u64) -> bool {
    divisor > 0 && !index.is_whole_block(node) && index.size(node).saturating_mul(divisor) <= block
}

impl PagedReservation {
    /// Reserves an arena's address space, `va_per_device_byte` times the device's memory in
    /// pages of `page` bytes, and adds it to `index` as one free span.
    pub(super) fn reserve(
        index: &mut Tlsf,
        page: u64,
        va_per_device_byte: u64,
        up: &mut Upstream<'_>,
    ) -> Result<PagedReservation, Exhausted> {
        let total = up.device().mem_info().map_err(|e| Exhausted {
            attempted: 0,
            cause: e.into(),
        })?;
        let len = total
            .total
            .saturating_mul(va_per_device_byte)
            .next_multiple_of(page);
        let base = up.reserve_address(len).map_err(|cause| Exhausted {
            attempted: len,
            cause,
        })?;
        if index.add_span(base, len).is_none() {
            let _ = up.release_address(base, len);
            return Err(Exhausted::too_large(len, up));
        }
        Ok(PagedReservation {
            base,
            len,
            pages: PageMap::new(base, page),
            retired: Vec::new(),
        })
    }

    /// Gives the address space back (the arena must hold nothing); whether the device took it.
    pub(super) fn release(&self, up: &mut Upstream<'_>) -> bool {
        up.release_address(self.base, self.len).is_ok()
    }

    /// Whether no page is mapped.
    pub(super) fn is_unmapped(&self) -> bool {
        self.pages.mapped_bytes() == 0
    }

    /// Gives the address ranges retired by moved chunks back to `index`; whether there were
    /// any.
    fn restore_retired(&mut self, index: &mut Tlsf) -> bool {
        let restored = !self.retired.is_empty();
        for (addr, len) in self.retired.drain(..) {
            // A full slab leaves the range out: it stays unusable, nothing else breaks.
            let _ = index.restore(addr, len);
        }
        restored
    }

    /// Idle chunks (wholly inside free ranges of `index`), as (first page, chunk, the free
    /// node holding it), lowest first.
    fn idle_chunks(&self, index: &Tlsf) -> Vec<(u64, Chunk, NodeId)> {
        let mut idle: Vec<(u64, Chunk, NodeId)> = index
            .free_nodes()
            .flat_map(|id| {
                self.pages
                    .chunks_inside(index.offset(id), index.size(id))
                    .map(move |(p, c)| (p, c, id))
            })
            .collect();
        idle.sort_unstable_by_key(|&(p, _, _)| p);
        idle
    }

    /// Gives back idle chunks, highest addresses first, until `want` bytes are freed; returns
    /// the bytes freed. Work queued on `stream` that may still use them is waited for first.
    pub(super) fn release_idle(
        &mut self,
        index: &Tlsf,
        want: u64,
        up: &mut Upstream<'_>,
        pool: SizeClass,
        stream: StreamId,
    ) -> u64 {
        let idle = self.idle_chunks(index);
        if idle.is_empty() || want == 0 || up.settle_stream(stream).is_err() {
            return 0;
        }
        let mut released = 0;
        for (p, _, _) in idle.into_iter().rev() {
            if released >= want {
                break;
            }
            released += self.pages.release(p, up, pool, stream).unwrap_or(0);
        }
        released
    }

    /// The segments of `arena` (whose backing this is): one per run of mapped pages, with the
    /// blocks clipped to it, and `slab_blocks` (slab address → the small blocks tiling it)
    /// shown in place of the slabs lent to small blocks.
    pub(super) fn segment_views(
        &self,
        arena: &StreamArena,
        slab_blocks: &HashMap<DevicePtr, Vec<BlockView>>,
        views: &mut Vec<SegmentView>,
    ) {
        let index = &arena.index;
        let mut ids: Vec<NodeId> = index.used_nodes().collect();
        ids.extend(index.free_nodes());
        ids.sort_unstable_by_key(|&id| index.offset(id));
        let nodes: Vec<BlockView> = ids
            .into_iter()
            .map(|id| arena.block_view(id))
            .flat_map(|b| match slab_blocks.get(&b.address) {
                Some(inner) if b.in_use => inner.clone(),
                _ => vec![b],
            })
            .collect();
        for (first, end) in self.pages.mapped_runs() {
            let (start, stop) = (self.pages.address(first), self.pages.address(end));
            let blocks = clip(&nodes, start, stop);
            views.push(arena.segment_view(start, stop - start, true, blocks));
        }
    }

    /// The largest free range of `index` backed by mapped pages right now.
    pub(super) fn largest_free_block(&self, index: &Tlsf) -> u64 {
        let runs = self.pages.mapped_runs();
        index
            .free_nodes()
            .map(|id| {
                let (lo, hi) = (index.offset(id), index.offset(id) + index.size(id));
                runs.iter()
                    .map(|&(a, b)| {
                        let (a, b) = (self.pages.address(a).max(lo), self.pages.address(b).min(hi));
                        b.saturating_sub(a)
                    })
                    .max()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }
}

impl StreamArena {
    /// The free node of this arena's index that holds `donor`'s chunk: the node recorded with
    /// it, unless a chunk that moved out of that node since split it and left this chunk in
    /// the part after it (or the node's id was recycled); then the free node found around the
    /// chunk. None if no free node holds it.
    fn node_holding(&self, donor: &Donor) -> Option<NodeId> {
        let paged = self.paged()?;
        let start = paged.pages.address(donor.page);
        let stop = start + donor.chunk.pages * paged.pages.page_size();
        let index = &self.index;
        let holds = |id: NodeId| {
            index.is_free(id)
                && index.offset(id) <= start
                && stop <= index.offset(id) + index.size(id)
        };
        if holds(donor.node) {
            return Some(donor.node);
        }
        index.free_nodes().find(|&id| holds(id))
    }

    /// The reservation, if this is a paged arena.
    fn paged(&self) -> Option<&PagedReservation> {
        match &self.backing {
            ArenaBacking::Paged(paged) => Some(paged),
            ArenaBacking::Segments(_) | ArenaBacking::Slabs(_) => None,
        }
    }

    /// Maps a fresh chunk of `n` pages at page `p` of a paged arena.
    fn map_fresh(&mut self, p: u64, n: u64, up: &mut Upstream<'_>) -> Result<(), UpstreamError> {
        match &mut self.backing {
            ArenaBacking::Paged(paged) => paged.pages.map_fresh(p, n, up, self.pool, self.stream),
            ArenaBacking::Segments(_) | ArenaBacking::Slabs(_) => Ok(()),
        }
    }
}

impl GpumemPolicy {
    /// Places `size` bytes in the paged arena `a`, mapping the pages it touches that are not
    /// mapped yet; returns the block's node.
    pub(super) fn place_paged(
        &mut self,
        a: usize,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<NodeId, Exhausted> {
        let mut node = self.arenas[a].index.allocate(size);
        if node.is_none()
            && self.arenas[a]
                .paged()
                .is_some_and(|p| !p.retired.is_empty())
        {
            // Retired ranges come back only once their old mappings are gone.
            self.deferred.settle(true, up);
            let arena = &mut self.arenas[a];
            if let ArenaBacking::Paged(paged) = &mut arena.backing {
                if paged.restore_retired(&mut arena.index) {
                    node = arena.index.allocate(size);
                }
            }
        }
        let Some(node) = node else {
            return Err(Exhausted::too_large(size, up));
        };
        let arena = &mut self.arenas[a];
        let addr = arena.index.offset(node);
        if let Some(paged) = arena.paged() {
            let (first, end) = paged.pages.pages_touching(addr, size);
            if !paged.pages.all_mapped(first, end) {
                let interior = paged.pages.pages_inside(addr, size);
                if let Err(e) = self.map_pages(a, (first, end), interior, up) {
                    self.arenas[a].index.free(node);
                    return Err(e);
                }
            }
        }
        Ok(node)
    }

    /// Maps the unmapped pages among `touched` (first, end) of arena `a`, for a block whose
    /// own pages are `interior` (see [`GpumemPolicy::map_missing`]). If they cannot all be
    /// mapped, the fresh chunks mapped on the way are released again: a failed request leaves
    /// reserved memory as it was (or lower, by the idle chunks freed to make room), instead of
    /// holding everything the device and the limit granted before the refusal.
    fn map_pages(
        &mut self,
        a: usize,
        touched: (u64, u64),
        interior: (u64, u64),
        up: &mut Upstream<'_>,
    ) -> Result<(), Exhausted> {
        let mut fresh = Vec::new();
        let mapped = self.map_missing(a, touched, interior, &mut fresh, up);
        if mapped.is_err() {
            let arena = &mut self.arenas[a];
            let (pool, stream) = (arena.pool, arena.stream);
            if let ArenaBacking::Paged(paged) = &mut arena.backing {
                for p in fresh {
                    // A chunk the device will not take back stays mapped and counted.
                    let _ = paged.pages.release(p, up, pool, stream);
                }
            }
        }
        mapped
    }

    /// Maps the unmapped pages among `touched` (first, end) of arena `a`, for a block whose
    /// own pages are `interior`: idle chunks moved here (largest that fits first) when the
    /// block is big or memory is short; fresh chunks while the device and the limit allow (one
    /// per interior run, one per shared boundary page); else fresh memory after freeing idle
    /// chunks elsewhere. The first page of every fresh chunk is pushed to `fresh`.
    fn map_missing(
        &mut self,
        a: usize,
        (first, end): (u64, u64),
        (inner_first, inner_end): (u64, u64),
        fresh: &mut Vec<u64>,
        up: &mut Upstream<'_>,
    ) -> Result<(), Exhausted> {
        let pool = self.arenas[a].pool;
        let mut pressure: Option<UpstreamError> = None;
        let mut try_fresh = true;
        let mut donors: Option<Vec<Donor>> = None;
        let mut p = first;
        while p < end {
            let Some(pages) = self.arenas[a].paged().map(|paged| &paged.pages) else {
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
            // A smaller block growing its arena takes only chunks of leftover holes.
            let list = donors.get_or_insert_with(|| self.idle_chunks_of(pool));
            let block = (end - first) * page;
            let growing_big = block >= self.settings.stitch_on_growth_min;
            let (arena, divisor) = (&self.arenas[a], self.settings.stitch_hole_divisor);
            let fits = |d: &Donor| {
                d.chunk.pages <= gap
                    && (pressure.is_some()
                        || (d.arena == a
                            && (growing_big
                                || arena.node_holding(d).is_some_and(|node| {
                                    is_leftover_hole(&arena.index, node, block, divisor)
                                }))))
            };
            if let Some(i) = list.iter().rposition(fits) {
                // The list stays as it is but for this donor: moving a chunk changes no other
                // chunk, only the free node it left (see `node_holding`). Remaking the list
                // after every move made a block of many chunks quadratic in them.
                let mut donor = list.remove(i);
                let Some(node) = self.arenas[donor.arena].node_holding(&donor) else {
                    donors = None;
                    continue;
                };
                donor.node = node;
                self.move_chunk(&donor, a, p, up).map_err(exhausted)?;
                p += donor.chunk.pages;
                continue;
            }
            let mut n = if (inner_first..inner_end).contains(&p) {
                (gap.min(inner_end - p)).min(self.settings.max_chunk_pages)
            } else {
                1
            };
            if pressure.is_some() {
                n = n.min(headroom(up) / page);
            }
            if try_fresh && n > 0 {
                match self.arenas[a].map_fresh(p, n, up) {
                    Ok(()) => {
                        fresh.push(p);
                        p += n;
                    }
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
            let n = gap.min(released).min(self.settings.max_chunk_pages);
            self.arenas[a].map_fresh(p, n, up).map_err(exhausted)?;
            fresh.push(p);
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
            .flat_map(|(a, arena)| {
                let chunks = arena.paged().map(|paged| paged.idle_chunks(&arena.index));
                chunks
                    .into_iter()
                    .flatten()
                    .map(move |(page, chunk, node)| Donor {
                        arena: a,
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
    /// If work queued on the donor's stream may still use the chunk, its old address is
    /// unmapped only once that work is done, and arena `a`'s stream (if another) is ordered
    /// after it ([`super::deferred`]).
    fn move_chunk(
        &mut self,
        donor: &Donor,
        a: usize,
        p: u64,
        up: &mut Upstream<'_>,
    ) -> Result<(), UpstreamError> {
        let to_stream = self.arenas[a].stream;
        let arena = &mut self.arenas[donor.arena];
        let (pool, from_stream) = (arena.pool, arena.stream);
        let ArenaBacking::Paged(from) = &mut arena.backing else {
            return Ok(());
        };
        let page = from.pages.page_size();
        let mut in_use = up.may_be_in_use(from_stream);
        if in_use
            && self
                .deferred
                .order_after(from_stream, to_stream, up)
                .is_err()
        {
            // No event to order by: wait for the whole device instead.
            up.synchronize_device()?;
            in_use = false;
        }
        let chunk = if in_use {
            from.pages.detach(donor.page)?
        } else {
            from.pages.take(donor.page, up)?
        };
        let range = (from.pages.address(donor.page), chunk.pages * page);
        if arena.index.carve(donor.node, range.0, range.1) {
            from.retired.push(range);
        }
        let ArenaBacking::Paged(to) = &mut self.arenas[a].backing else {
            return Ok(());
        };
        let moved = to.pages.map_moved(p, chunk, up);
        let bytes = chunk.pages * page;
        match (moved, in_use) {
            (Ok(()), true) => self.deferred.unmap_later(from_stream, range.0, bytes, None),
            (Ok(()), false) => {}
            (Err(e), true) => {
                // Mapped only at its old address now: unmap and give it back once unused.
                let release = Some((chunk.handle, pool));
                self.deferred
                    .unmap_later(from_stream, range.0, bytes, release);
                return Err(e);
            }
            (Err(e), false) => {
                // The chunk is mapped nowhere now: give it back so reserved stays exact.
                let _ = up.release_physical(chunk.handle, bytes, pool);
                return Err(e);
            }
        }
        Ok(())
    }
}
