//! PyTorch's native CUDA caching allocator policy, faithfully: 512-byte rounding with
//! `roundup_power2_divisions`, small (≤ 1 MiB) and large pools, 2 MiB / 20 MiB / 2 MiB-rounded
//! segments, best fit per stream in (stream, size, address) order, PyTorch's split rules
//! with `max_split_size` and `max_non_split_rounding`, coalescing inside a segment,
//! `garbage_collection_threshold`, freeing oversize blocks before giving up, and — with
//! `expandable_segments` — one growing segment per stream and pool over virtual-memory
//! mapping ([`expandable`]).
//!
//! The pool frame does the last-resort step (wait for events, release every cached block,
//! search again); this policy does everything before it, in PyTorch's order: search, garbage
//! collection, device allocation, `release_available_cached_blocks`, device allocation.
//!
//! Where this differs from PyTorch, and why:
//! - Settings are fixed when the pool is built; PyTorch can change them at run time.
//! - The pool's hard limit plays the role of the per-process memory fraction (the allowed
//!   memory for the limit check and for `garbage_collection_threshold`).
//! - After the final reclaim the frame searches the cache again (PyTorch does not: #189504).
//! - `oversize_allocations` drops when a block returns to the cache, which for a block used
//!   on other streams is after their events, not at the free request.
//! - Expandable large-pool chunks are `large_segment_size` (20 MiB by default).
//! - No CUDA-graph private pools and no free-memory callbacks.

mod adopt;
mod blocks;
mod expandable;
pub mod rounding;

use gpumem_device::StreamId;

use self::blocks::{BlockNode, BlockPool, Slab};
use self::expandable::ExpandableSegment;
use self::rounding::{allocation_size, round_size, MIN_BLOCK_SIZE, SMALL_SIZE};
use super::slots::{SlotIndex, SlotVec};
use super::torch_settings::TorchSettings;
use crate::policy::{
    AllocRequest, Block, BlockHandle, BlockView, Exhausted, Policy, ReleaseTarget, SegmentView,
    Upstream, UpstreamError,
};
use crate::stats::SizeClass;
use gpumem_snapshot::SettingValue;

/// PyTorch's caching allocator policy, with or without expandable segments (the `torch` and
/// `expandable` pool policies).
#[derive(Debug)]
pub struct TorchPolicy {
    settings: TorchSettings,
    blocks: Slab,
    small: BlockPool,
    large: BlockPool,
    /// Expandable segments by index; `None` once released.
    segments: SlotVec<Option<ExpandableSegment>>,
}

impl TorchPolicy {
    /// A policy with PyTorch's `settings` (`expandable_segments` selects the mode).
    pub fn new(settings: TorchSettings) -> Self {
        TorchPolicy {
            settings,
            blocks: Slab::default(),
            small: BlockPool::new(),
            large: BlockPool::new(),
            segments: SlotVec::new(None),
        }
    }

    /// The block pool of `kind`.
    fn pool(&self, kind: SizeClass) -> &BlockPool {
        match kind {
            SizeClass::Small => &self.small,
            SizeClass::Large => &self.large,
        }
    }

    /// The block pool of `kind`, to change.
    fn pool_mut(&mut self, kind: SizeClass) -> &mut BlockPool {
        match kind {
            SizeClass::Small => &mut self.small,
            SizeClass::Large => &mut self.large,
        }
    }

    /// Caches block `idx`, stamping it with the pool's search count (`insert_into_blocks`).
    fn insert_free(&mut self, idx: SlotIndex) {
        let kind = self.blocks[idx].pool;
        let searches = self.pool(kind).searches;
        let node = &mut self.blocks[idx];
        node.gc_base = searches;
        let key = (node.stream, node.size, node.addr, idx);
        self.pool_mut(kind).free.insert(key);
    }

    /// Takes block `idx` out of its pool's free set (before its key changes).
    fn remove_free(&mut self, idx: SlotIndex) {
        let n = self.blocks[idx];
        self.pool_mut(n.pool)
            .free
            .remove(&(n.stream, n.size, n.addr, idx));
    }

    /// Records block `idx` as an unmapped range of its pool.
    fn insert_unmapped(&mut self, idx: SlotIndex) {
        let n = self.blocks[idx];
        self.pool_mut(n.pool)
            .unmapped
            .insert((n.stream, n.addr, idx));
    }

    /// Takes block `idx` out of its pool's unmapped set.
    fn remove_unmapped(&mut self, idx: SlotIndex) {
        let n = self.blocks[idx];
        self.pool_mut(n.pool)
            .unmapped
            .remove(&(n.stream, n.addr, idx));
    }

    /// Whether age-based garbage collection runs: a threshold is set and a limit plays the
    /// role of PyTorch's per-process memory fraction.
    fn gc_limit(&self, up: &Upstream<'_>) -> Option<(u64, f64)> {
        match (up.hard_limit(), self.settings.garbage_collection_threshold) {
            (Some(limit), Some(threshold)) => Some((limit, threshold)),
            _ => None,
        }
    }

    /// PyTorch's `get_free_block`: the best-fitting cached block of `stream`, subject to the
    /// oversize rules, taken out of the free set.
    fn get_free_block(
        &mut self,
        kind: SizeClass,
        stream: StreamId,
        size: u64,
        gc_on: bool,
    ) -> Option<SlotIndex> {
        if gc_on {
            self.pool_mut(kind).searches += 1;
        }
        let mut fits = self
            .pool(kind)
            .free
            .range((stream, size, 0, SlotIndex::MIN)..)
            .take_while(|key| key.0 == stream);
        let mut chosen = fits.next()?.3;
        if self.settings.expandable_segments {
            // A block followed by unmapped space can grow into it: best fit compares the
            // sizes blocks can expand to, stepping to larger keys while that is smaller.
            for key in fits {
                if self.expandable_size(key.3) < self.expandable_size(chosen) {
                    chosen = key.3;
                } else {
                    break;
                }
            }
        }
        let found = self.blocks[chosen].size;
        let max_split = self.settings.max_split_size;
        if size < max_split && found >= max_split {
            return None;
        }
        let rounding = self.settings.max_non_split_rounding;
        if size >= max_split && found >= size.saturating_add(rounding) {
            return None;
        }
        self.remove_free(chosen);
        Some(chosen)
    }

    /// PyTorch's `should_split`: small-pool and expandable blocks split off any remainder of
    /// at least 512 B; large blocks only below `max_split_size` and for more than 1 MiB.
    fn should_split(&self, idx: SlotIndex, size: u64) -> bool {
        let block = &self.blocks[idx];
        let remaining = block.size - size;
        if block.pool == SizeClass::Small || self.settings.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.settings.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// PyTorch's `alloc_found_block`: hands out the front `size` bytes of block `idx` (taken
    /// out of the free set), leaving the rest cached.
    fn alloc_found_block(
        &mut self,
        idx: SlotIndex,
        size: u64,
        req: AllocRequest,
        up: &mut Upstream<'_>,
    ) -> Block {
        let found = self.blocks[idx];
        let counts_inactive_split = !found.is_expandable();
        let handed_out = if self.should_split(idx, size) {
            let front = self.blocks.insert(BlockNode {
                expandable: found.expandable,
                ..BlockNode::new(found.addr, size, found.stream, found.pool)
            });
            self.blocks.splice(front, found.prev, Some(idx));
            let remaining = &mut self.blocks[idx];
            remaining.addr += size;
            remaining.size -= size;
            let remaining_size = remaining.size;
            self.insert_free(idx);
            if counts_inactive_split {
                if found.is_split() {
                    up.stats.inactive_split_bytes.decrease(found.pool, size);
                } else {
                    up.stats
                        .inactive_split_bytes
                        .increase(found.pool, remaining_size);
                    up.stats.inactive_split.increase(found.pool, 1);
                }
            }
            front
        } else {
            if counts_inactive_split && found.is_split() {
                up.stats
                    .inactive_split_bytes
                    .decrease(found.pool, found.size);
                up.stats.inactive_split.decrease(found.pool, 1);
            }
            idx
        };
        let node = &mut self.blocks[handed_out];
        node.allocated = true;
        let block = Block {
            addr: node.addr,
            size: node.size,
            requested: req.size,
            stream: node.stream,
            size_class: node.pool,
            handle: BlockHandle::new(u64::from(handed_out.get())),
        };
        if block.size >= self.settings.max_split_size {
            up.stats.oversize_allocations.increase(1);
        }
        block
    }

    /// PyTorch's `free_block`: caches block `idx` after merging it with free neighbours.
    fn free_block(&mut self, idx: SlotIndex, up: &mut Upstream<'_>) {
        let node = self.blocks[idx];
        let mut inactive_blocks: i64 = 0;
        let mut inactive_bytes: i64 = 0;
        for neighbour in [node.prev, node.next] {
            let subsumed = self.try_merge_blocks(idx, neighbour);
            if subsumed > 0 {
                inactive_blocks -= 1;
                inactive_bytes -= subsumed as i64;
            }
        }
        self.insert_free(idx);
        let merged = self.blocks[idx];
        if merged.is_split() {
            inactive_blocks += 1;
            inactive_bytes += merged.size as i64;
        }
        // PyTorch leaves expandable segments out of inactive_split: their empty pages can
        // always be given back.
        if !merged.is_expandable() {
            apply_change(&mut up.stats.inactive_split, merged.pool, inactive_blocks);
            apply_change(
                &mut up.stats.inactive_split_bytes,
                merged.pool,
                inactive_bytes,
            );
        }
    }

    /// PyTorch's `try_merge_blocks`: absorbs neighbour `src` into `dst` (which must be out of
    /// every set) when `src` is free and mapped alike; returns the bytes absorbed.
    fn try_merge_blocks(&mut self, dst: SlotIndex, src: Option<SlotIndex>) -> u64 {
        let Some(src) = src else {
            return 0;
        };
        let s = self.blocks[src];
        if s.allocated || s.mapped != self.blocks[dst].mapped {
            return 0;
        }
        if s.mapped {
            self.remove_free(src);
        } else {
            self.remove_unmapped(src);
        }
        if self.blocks[dst].prev == Some(src) {
            self.blocks[dst].addr = s.addr;
            self.blocks.splice(dst, s.prev, self.blocks[dst].next);
        } else {
            self.blocks.splice(dst, self.blocks[dst].prev, s.next);
        }
        self.blocks[dst].size += s.size;
        self.blocks.remove(src);
        s.size
    }

    /// PyTorch's `alloc_block`: a new segment of `alloc_size` bytes from the device, or with
    /// expandable segments a mapped block of at least `size` bytes. The block is not cached.
    fn alloc_block(
        &mut self,
        kind: SizeClass,
        stream: StreamId,
        size: u64,
        alloc_size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<SlotIndex, UpstreamError> {
        if self.settings.expandable_segments {
            // PyTorch checks the allowed memory against the segment size before mapping.
            if let Some(limit) = up.hard_limit() {
                let reserved = up.reserved();
                if reserved.saturating_add(alloc_size) > limit {
                    return Err(UpstreamError::OverLimit {
                        limit,
                        reserved,
                        requested: alloc_size,
                    });
                }
            }
            return self.try_allocate_expandable_block(kind, stream, size, up);
        }
        let addr = up.malloc_segment(alloc_size, kind, stream)?;
        if alloc_size >= self.settings.max_split_size {
            up.stats.oversize_segments.increase(1);
        }
        Ok(self
            .blocks
            .insert(BlockNode::new(addr, alloc_size, stream, kind)))
    }

    /// PyTorch's `release_block`: gives the unsplit cached block `idx` back to the device;
    /// returns the bytes released (0 if the device refused, the block then stays cached).
    fn release_block(&mut self, idx: SlotIndex, up: &mut Upstream<'_>) -> u64 {
        let n = self.blocks[idx];
        if up.free_segment(n.addr, n.size, n.pool, n.stream).is_err() {
            return 0;
        }
        self.remove_free(idx);
        if n.size >= self.settings.max_split_size {
            up.stats.oversize_segments.decrease(1);
        }
        self.blocks.remove(idx);
        n.size
    }

    /// Gives back the cached block `idx` as far as possible: a whole unsplit segment, or the
    /// empty chunks of an expandable block (and the segment once nothing is mapped).
    fn release_cached_block(&mut self, idx: SlotIndex, up: &mut Upstream<'_>) -> u64 {
        if self.blocks[idx].is_expandable() {
            let released = self.unmap_block(idx, up);
            self.release_segment_if_empty(idx, up);
            released
        } else {
            self.release_block(idx, up)
        }
    }

    /// PyTorch's `release_available_cached_blocks`, run when `max_split_size` is set: frees
    /// one unsplit oversize cached block large enough for the request, or, largest first,
    /// oversize blocks until their sizes add up to it. Returns whether that succeeded.
    fn release_available_cached_blocks(
        &mut self,
        kind: SizeClass,
        stream: StreamId,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> bool {
        let max_split = self.settings.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let wanted = size.max(max_split);
        let pool = self.pool(kind);
        let releasable = |key: &&blocks::FreeKey| {
            let n = &self.blocks[key.3];
            !n.is_expandable() && !n.is_split()
        };
        let single = pool
            .free
            .range((stream, wanted, 0, SlotIndex::MIN)..)
            .next()
            .filter(|key| key.0 == stream)
            .filter(releasable);
        if let Some(&(_, _, _, idx)) = single {
            return self.release_block(idx, up) > 0;
        }
        let oversize: Vec<SlotIndex> = pool
            .free
            .range((stream, max_split, 0, SlotIndex::MIN)..(stream, wanted, 0, SlotIndex::MIN))
            .rev()
            .filter(releasable)
            .map(|key| key.3)
            .collect();
        let mut released = 0;
        for idx in oversize {
            if released >= wanted {
                break;
            }
            released += self.release_block(idx, up);
        }
        released >= wanted
    }

    /// PyTorch's `garbage_collect_cached_blocks`: when reserved memory exceeds `threshold` of
    /// `limit`, frees unsplit large-pool cached blocks at least as old as the average age, pass
    /// after pass, until the excess is reclaimed (not stopping exactly there, so that it runs
    /// rarely).
    fn garbage_collect(&mut self, limit: u64, threshold: f64, up: &mut Upstream<'_>) {
        let gc_threshold = (threshold * limit as f64) as u64;
        let total = up.reserved();
        if total <= gc_threshold {
            return;
        }
        let target = total - gc_threshold;
        let now = self.large.searches;
        let mut freeable: Vec<(SlotIndex, u64)> = self
            .large
            .free
            .iter()
            .filter_map(|key| {
                let n = &self.blocks[key.3];
                (!n.is_split() && !n.is_expandable()).then_some((key.3, now - n.gc_base))
            })
            .collect();
        let mut total_age: u64 = freeable.iter().map(|&(_, age)| age).sum();
        let mut reclaimed = 0;
        let mut freed_one = true;
        while reclaimed < target && freed_one && !freeable.is_empty() {
            let age_threshold = total_age as f64 / freeable.len() as f64;
            freed_one = false;
            let mut kept = Vec::with_capacity(freeable.len());
            for (idx, age) in freeable {
                let released = if age as f64 >= age_threshold {
                    self.release_block(idx, up)
                } else {
                    0
                };
                if released > 0 {
                    freed_one = true;
                    reclaimed += released;
                    total_age -= age;
                } else {
                    kept.push((idx, age));
                }
            }
            freeable = kept;
        }
    }

    /// Obtains a block for a request no cached block serves: garbage collection, the device,
    /// then freeing oversize cached blocks and the device again.
    fn grow(
        &mut self,
        kind: SizeClass,
        stream: StreamId,
        size: u64,
        alloc_size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<SlotIndex, Exhausted> {
        if let Some((limit, threshold)) = self.gc_limit(up) {
            self.garbage_collect(limit, threshold, up);
        }
        let exhausted = |cause| Exhausted {
            attempted: alloc_size,
            cause,
        };
        match self.alloc_block(kind, stream, size, alloc_size, up) {
            Ok(idx) => Ok(idx),
            Err(cause) if !cause.is_out_of_memory() => Err(exhausted(cause)),
            Err(cause) => {
                if !self.release_available_cached_blocks(kind, stream, size, up) {
                    return Err(exhausted(cause));
                }
                self.alloc_block(kind, stream, size, alloc_size, up)
                    .map_err(exhausted)
            }
        }
    }

    /// The blocks of a segment from `head` on, while they are mapped.
    fn segment_view(&self, head: SlotIndex) -> SegmentView {
        let first = &self.blocks[head];
        let mut view = SegmentView {
            address: first.addr,
            total_size: 0,
            stream: first.stream,
            size_class: first.pool,
            is_expandable: first.is_expandable(),
            blocks: Vec::new(),
        };
        let mut cursor = Some(head);
        while let Some(idx) = cursor.filter(|&i| self.blocks[i].mapped) {
            let n = &self.blocks[idx];
            view.total_size += n.size;
            view.blocks.push(BlockView {
                address: n.addr,
                size: n.size,
                in_use: n.allocated,
            });
            cursor = n.next;
        }
        view
    }
}

/// Adds a signed change to a statistic.
fn apply_change(stat: &mut crate::stats::StatArray, pool: SizeClass, change: i64) {
    if change > 0 {
        stat.increase(pool, change.unsigned_abs());
    } else if change < 0 {
        stat.decrease(pool, change.unsigned_abs());
    }
}

impl Policy for TorchPolicy {
    fn name(&self) -> &'static str {
        if self.settings.expandable_segments {
            "expandable"
        } else {
            "torch"
        }
    }

    fn settings(&self) -> Vec<(String, SettingValue)> {
        self.settings.snapshot_settings()
    }

    fn max_split_size(&self) -> Option<u64> {
        Some(self.settings.max_split_size)
    }

    fn fragmentation_advice(&self) -> String {
        if self.settings.expandable_segments {
            "try GPUMEM_POOL=gpumem".into()
        } else {
            "try GPUMEM_POOL=gpumem (or GPUMEM_POOL=expandable)".into()
        }
    }

    fn allocate(
        &mut self,
        req: AllocRequest,
        up: &mut Upstream<'_>,
    ) -> Result<Block, Box<Exhausted>> {
        let sizes =
            round_size(req.size, &self.settings.roundup_power2_divisions).and_then(|size| {
                allocation_size(size, self.settings.large_segment_size)
                    .map(|alloc_size| (size, alloc_size))
            });
        let Some((size, alloc_size)) = sizes else {
            return Err(Box::new(Exhausted::too_large(req.size, up)));
        };
        let kind = SizeClass::for_request(size);
        let gc_on = self.gc_limit(up).is_some();
        let idx = match self.get_free_block(kind, req.stream, size, gc_on) {
            Some(idx) => idx,
            None => self.grow(kind, req.stream, size, alloc_size, up)?,
        };
        Ok(self.alloc_found_block(idx, size, req, up))
    }

    fn free(&mut self, block: Block, up: &mut Upstream<'_>) {
        let Some(idx) = SlotIndex::new(block.handle.get()) else {
            return;
        };
        let Some(node) = self
            .blocks
            .get_mut(idx)
            .filter(|n| n.allocated && n.addr == block.addr)
        else {
            return;
        };
        node.allocated = false;
        if node.size >= self.settings.max_split_size {
            up.stats.oversize_allocations.decrease(1);
        }
        self.free_block(idx, up);
    }

    fn release_cached(&mut self, target: ReleaseTarget, up: &mut Upstream<'_>) -> u64 {
        // What can go back: whole unsplit segments, and the empty chunks of expandable blocks.
        let candidates = |pool: &BlockPool| -> Vec<SlotIndex> {
            pool.free
                .iter()
                .map(|key| key.3)
                .filter(|&idx| {
                    let n = &self.blocks[idx];
                    n.is_expandable() || !n.is_split()
                })
                .collect()
        };
        let mut releasable = candidates(&self.large);
        releasable.extend(candidates(&self.small));
        let wanted = match target {
            // PyTorch's release_cached_blocks: the large pool, then the small pool.
            ReleaseTarget::All => u64::MAX,
            ReleaseTarget::AtLeast(bytes) => {
                // The largest first, the longest cached among equals.
                releasable.sort_by_key(|&idx| {
                    let n = &self.blocks[idx];
                    (std::cmp::Reverse(n.size), n.gc_base)
                });
                bytes
            }
        };
        let mut released = 0;
        for idx in releasable {
            if released >= wanted {
                break;
            }
            released += self.release_cached_block(idx, up);
        }
        released
    }

    fn segments(&self) -> Vec<SegmentView> {
        let mut views: Vec<SegmentView> = self
            .blocks
            .iter()
            .filter(|(_, n)| {
                // A cudaMalloc'd segment starts at a block without predecessor; an expandable
                // one is shown as one segment per contiguous mapped range, as PyTorch does.
                n.mapped && n.prev.is_none_or(|prev| !self.blocks[prev].mapped)
            })
            .map(|(idx, _)| self.segment_view(idx))
            .collect();
        views.sort_by_key(|v| v.address);
        views
    }

    fn largest_free_block(&self) -> u64 {
        self.small
            .largest_free_block()
            .max(self.large.largest_free_block())
    }

    fn adopt_segment(
        &mut self,
        segment: &crate::adopt::SegmentToAdopt,
        up: &mut Upstream<'_>,
    ) -> Result<Vec<Block>, crate::adopt::AdoptError> {
        self.adopt(segment, up)
    }
}
