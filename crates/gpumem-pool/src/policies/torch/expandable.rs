//! Expandable segments (PyTorch's Note [Expandable Segments]): one segment per stream and
//! pool reserves address space for 1⅛ × the device's memory and maps physical chunks (2 MiB
//! for the small pool, `large_segment_size` — 20 MiB — for the large pool) at the lowest
//! address that fits, filling holes first. Unmapped ranges are blocks too, kept per pool in
//! address order; a cached block followed by unmapped space counts that space in best fit.
//! Releasing cache unmaps the chunks that lie wholly inside free blocks.

use gpumem_device::{DeviceError, DevicePtr, PhysicalHandle, StreamId};

use super::blocks::BlockNode;
use super::rounding::SMALL_BUFFER;
use super::TorchPolicy;
use crate::policies::slots::SlotIndex;
use crate::policy::{Upstream, UpstreamError};
use crate::stats::SizeClass;

/// One reserved address range and the chunks mapped into it.
#[derive(Debug)]
pub(super) struct ExpandableSegment {
    /// Start of the reservation.
    base: DevicePtr,
    /// Bytes per physical chunk.
    chunk: u64,
    /// Chunks the reservation holds.
    capacity: u64,
    /// The chunk mapped at each index, if any; grows as far as the highest mapped chunk.
    handles: Vec<Option<PhysicalHandle>>,
}

impl ExpandableSegment {
    /// Bytes of address space reserved.
    fn len(&self) -> u64 {
        self.chunk * self.capacity
    }

    /// Address of chunk `i`.
    fn chunk_addr(&self, i: u64) -> DevicePtr {
        self.base + i * self.chunk
    }

    /// Index of the chunk containing `addr`.
    fn chunk_floor(&self, addr: DevicePtr) -> u64 {
        (addr - self.base) / self.chunk
    }

    /// Index of the first chunk starting at or after `addr`.
    fn chunk_ceil(&self, addr: DevicePtr) -> u64 {
        (addr - self.base).div_ceil(self.chunk)
    }
}

impl TorchPolicy {
    /// The chunk size of `kind`'s expandable segments, rounded up to the VMM granularity.
    fn chunk_size(&self, kind: SizeClass, up: &Upstream<'_>) -> Result<u64, UpstreamError> {
        let granularity = up.granularity().ok_or_else(|| {
            UpstreamError::Device(DeviceError::Unsupported {
                backend: up.device().name(),
                what: "virtual memory management (needed by expandable segments)".into(),
            })
        })?;
        let wanted = match kind {
            SizeClass::Small => SMALL_BUFFER,
            SizeClass::Large => self.settings.large_segment_size,
        };
        wanted
            .checked_next_multiple_of(granularity.max(1))
            .ok_or_else(|| up.out_of_memory(wanted))
    }

    /// The size block `idx` can grow to: itself plus the unmapped range after it.
    pub(super) fn expandable_size(&self, idx: SlotIndex) -> u64 {
        let n = &self.blocks[idx];
        match n.next {
            Some(next) if !self.blocks[next].mapped => n.size + self.blocks[next].size,
            _ => n.size,
        }
    }

    /// Whether free and unmapped blocks from `idx` on add up to `size` bytes.
    fn has_available_address_space(&self, idx: SlotIndex, size: u64) -> bool {
        let mut bytes = 0;
        let mut cursor = Some(idx);
        while let Some(idx) = cursor.filter(|&i| bytes < size && !self.blocks[i].allocated) {
            bytes += self.blocks[idx].size;
            cursor = self.blocks[idx].next;
        }
        bytes >= size
    }

    /// PyTorch's `find_expandable_block`: the lowest address in `stream`'s segments of
    /// `kind` where free and unmapped space add up to `size` (starting at the free block
    /// before an unmapped range, if any), or a new segment's unmapped range.
    fn find_expandable_block(
        &mut self,
        kind: SizeClass,
        stream: StreamId,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<SlotIndex, UpstreamError> {
        let holes = self
            .pool(kind)
            .unmapped
            .range((stream, 0, SlotIndex::MIN)..)
            .take_while(|key| key.0 == stream);
        for &(_, _, hole) in holes {
            let start = match self.blocks[hole].prev {
                Some(prev) if !self.blocks[prev].allocated => prev,
                _ => hole,
            };
            if self.has_available_address_space(start, size) {
                return Ok(start);
            }
        }
        let chunk = self.chunk_size(kind, up)?;
        let total = up.device().mem_info()?.total;
        let address_space = total.saturating_add(total / 8);
        let capacity = address_space.div_ceil(chunk);
        let len = capacity
            .checked_mul(chunk)
            .filter(|&len| len >= size)
            .ok_or_else(|| up.out_of_memory(size))?;
        let base = up.reserve_address(len)?;
        let segment = Some(ExpandableSegment {
            base,
            chunk,
            capacity,
            handles: Vec::new(),
        });
        let free_slot = self.segments.iter().find(|(_, s)| s.is_none());
        let id = match free_slot.map(|(id, _)| id) {
            Some(id) => {
                self.segments[id] = segment;
                id
            }
            None => self
                .segments
                .push(segment)
                .expect("fewer than u32::MAX segments: each reserves the device's size"),
        };
        let idx = self.blocks.insert(BlockNode {
            mapped: false,
            expandable: Some(id),
            ..BlockNode::new(base, len, stream, kind)
        });
        self.insert_unmapped(idx);
        Ok(idx)
    }

    /// The expandable segment block `idx` lies in.
    fn segment_of(&mut self, idx: SlotIndex) -> &mut ExpandableSegment {
        self.blocks[idx]
            .expandable
            .and_then(|id| self.segments[id].as_mut())
            .expect("a block of an expandable segment points at a live segment")
    }

    /// PyTorch's `map_block`: maps the chunks covering the first `size` bytes of the unmapped
    /// block `idx`, which becomes a cached block merged with its free neighbours (its index
    /// stays valid); the rest of the range stays unmapped. All or nothing.
    fn map_block(
        &mut self,
        idx: SlotIndex,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<(), UpstreamError> {
        let node = self.blocks[idx];
        let segment = self.segment_of(idx);
        let begin = segment.chunk_floor(node.addr);
        let end = segment.chunk_ceil(node.addr + size);
        let chunk = segment.chunk;
        let at = segment.chunk_addr(begin);
        let handles = up.map_new_chunks(at, chunk, end - begin, node.pool, node.stream)?;
        if segment.handles.len() < end as usize {
            segment.handles.resize(end as usize, None);
        }
        for (slot, handle) in segment.handles[begin as usize..end as usize]
            .iter_mut()
            .zip(handles)
        {
            *slot = Some(handle);
        }
        let mapped = (end - begin) * chunk;
        self.remove_unmapped(idx);
        self.blocks[idx].mapped = true;
        if mapped < node.size {
            let rest = self.blocks.insert(BlockNode {
                mapped: false,
                expandable: node.expandable,
                ..BlockNode::new(
                    node.addr + mapped,
                    node.size - mapped,
                    node.stream,
                    node.pool,
                )
            });
            self.blocks.splice(rest, Some(idx), node.next);
            self.insert_unmapped(rest);
            self.blocks[idx].size = mapped;
        }
        self.try_merge_blocks(idx, self.blocks[idx].prev);
        self.try_merge_blocks(idx, self.blocks[idx].next);
        self.insert_free(idx);
        Ok(())
    }

    /// PyTorch's `try_allocate_expandable_block`: maps as much of the lowest fitting range as
    /// the request needs and returns it as one block of at least `size` bytes, out of the
    /// free set.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        kind: SizeClass,
        stream: StreamId,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<SlotIndex, UpstreamError> {
        let mut candidate = self.find_expandable_block(kind, stream, size, up)?;
        if !self.blocks[candidate].mapped {
            let first = size.min(self.blocks[candidate].size);
            self.map_block(candidate, first, up)?;
        }
        // Invariant: free → unmapped → …; each mapping merges the free block before it.
        while self.blocks[candidate].size < size {
            let unmapped = self.blocks[candidate]
                .next
                .filter(|&next| !self.blocks[next].mapped && !self.blocks[next].allocated);
            let Some(next) = unmapped else {
                return Err(up.out_of_memory(size));
            };
            let missing = size - self.blocks[candidate].size;
            let wanted = missing.min(self.blocks[next].size);
            self.map_block(next, wanted, up)?;
            candidate = next;
        }
        self.remove_free(candidate);
        Ok(candidate)
    }

    /// PyTorch's `unmap_block`: unmaps the chunks lying wholly inside the cached block `idx`,
    /// which becomes (merged with unmapped neighbours) an unmapped block; the mapped slivers
    /// before and after stay cached. Returns the bytes given back.
    pub(super) fn unmap_block(&mut self, idx: SlotIndex, up: &mut Upstream<'_>) -> u64 {
        let node = self.blocks[idx];
        let segment = self.segment_of(idx);
        let begin = segment.chunk_ceil(node.addr);
        let end = segment.chunk_floor(node.addr + node.size).max(begin);
        let chunk = segment.chunk;
        // Every chunk inside a cached block is mapped: blocks never span unmapped space.
        let handles: Vec<PhysicalHandle> = segment
            .handles
            .get(begin as usize..end as usize)
            .unwrap_or_default()
            .iter()
            .map_while(|h| *h)
            .collect();
        let start = segment.chunk_addr(begin);
        // PyTorch's `unmapHandles`: unlike cudaFree, unmapping does not wait for the GPU, so
        // the segment's stream is synchronised first.
        if !handles.is_empty() && up.synchronize_stream(node.stream).is_err() {
            return 0;
        }
        let released =
            up.unmap_release_chunks(start, chunk, &handles, node.pool, node.stream) as u64;
        // The device may have refused a chunk: only those before it are unmapped.
        let end = begin + released;
        for slot in &mut segment.handles[begin as usize..end as usize] {
            *slot = None;
        }
        trim_handles(&mut segment.handles);
        if begin >= end {
            return 0;
        }
        let unmapped = (end - begin) * chunk;
        self.remove_free(idx);
        let before = start - node.addr;
        if before > 0 {
            let sliver = self.blocks.insert(BlockNode {
                expandable: node.expandable,
                ..BlockNode::new(node.addr, before, node.stream, node.pool)
            });
            self.blocks.splice(sliver, node.prev, Some(idx));
            self.insert_free(sliver);
        }
        let after = node.size - before - unmapped;
        if after > 0 {
            let sliver = self.blocks.insert(BlockNode {
                expandable: node.expandable,
                ..BlockNode::new(start + unmapped, after, node.stream, node.pool)
            });
            self.blocks.splice(sliver, Some(idx), node.next);
            self.insert_free(sliver);
        }
        let block = &mut self.blocks[idx];
        block.addr = start;
        block.size = unmapped;
        block.mapped = false;
        self.try_merge_blocks(idx, self.blocks[idx].prev);
        self.try_merge_blocks(idx, self.blocks[idx].next);
        self.insert_unmapped(idx);
        unmapped
    }

    /// PyTorch's `release_expandable_segment`: once block `idx` is the whole, unmapped
    /// segment, returns the address space and forgets the segment.
    pub(super) fn release_segment_if_empty(&mut self, idx: SlotIndex, up: &mut Upstream<'_>) {
        let node = self.blocks[idx];
        if node.mapped || node.is_split() {
            return;
        }
        let segment = self.segment_of(idx);
        let (base, len) = (segment.base, segment.len());
        if up.release_address(base, len).is_err() {
            return;
        }
        self.remove_unmapped(idx);
        if let Some(id) = node.expandable {
            self.segments[id] = None;
        }
        self.blocks.remove(idx);
    }
}

/// Drops unmapped chunks at the end of the handle table.
fn trim_handles(handles: &mut Vec<Option<PhysicalHandle>>) {
    while handles.last().is_some_and(Option::is_none) {
        handles.pop();
    }
}
