//! The memory a snapshot's trace found when its recording began: PyTorch records history
//! from `_record_memory_history` on, so a process that allocated before (a training run, the
//! cuBLAS workspaces of a first matmul) holds segments and live blocks the trace never
//! created. They are inferred from what the trace and the dump-time `segments` show:
//!
//! - a segment existed when recording began if the trace frees or unmaps it without having
//!   allocated or mapped it, or if it is in `segments` but no `segment_alloc`/`segment_map`
//!   of the trace created it (for an expandable segment, the parts of a mapped range that no
//!   map of the trace covers);
//! - a block was live then if the trace's first mention of its address is its free (its
//!   request is the free's size), or if it is still active in `segments` and the trace never
//!   mentions it (its size and request are the block's).
//!
//! Each such block is placed in the segment that contains it; one that lies in none, or
//! that contradicts the segments (beyond its segment's end, over another block, freed after
//! its segment was), is kept as a bare allocation at the start, as before segments were
//! inferred.

use std::collections::{BTreeMap, HashSet};

use super::SegmentType;
use crate::trace::{Event, InitialBlock, InitialSegment};

/// PyTorch's small-pool segment size (`kSmallBuffer`): a segment no larger, with no block
/// that says otherwise, served the small pool.
const SMALL_SEGMENT: u64 = 2 << 20;
/// PyTorch's largest small-pool request (`kSmallSize`).
const SMALL_REQUEST: u64 = 1 << 20;

/// Disjoint address ranges, start → end, merged where they touch.
#[derive(Debug, Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    /// Adds `[start, end)`.
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&before, &before_end)) = self.0.range(..=start).next_back() {
            if before_end >= start {
                start = before;
                end = end.max(before_end);
            }
        }
        let absorbed: Vec<(u64, u64)> = self.0.range(start..=end).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in absorbed {
            self.0.remove(&s);
            end = end.max(e);
        }
        self.0.insert(start, end);
    }

    /// The parts of `[start, end)` that no range covers, in address order.
    fn uncovered(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut parts = Vec::new();
        let mut cursor = start;
        let first = self
            .0
            .range(..=start)
            .next_back()
            .map_or(start, |(&s, _)| s);
        for (&s, &e) in self.0.range(first..end) {
            if s > cursor {
                parts.push((cursor, s));
            }
            cursor = cursor.max(e);
            if cursor >= end {
                break;
            }
        }
        if cursor < end {
            parts.push((cursor, end));
        }
        parts
    }
}

/// A segment of the dump-time `segments` list of the device whose trace is built.
#[derive(Debug)]
pub(super) struct DumpSegment {
    /// Device index.
    pub device: u64,
    /// Base address.
    pub address: u64,
    /// Bytes reserved.
    pub total_size: u64,
    /// Stream it serves.
    pub stream: u64,
    /// Pool it serves, if the producer said.
    pub segment_type: Option<SegmentType>,
    /// Whether it is a mapped range of an expandable segment.
    pub expandable: bool,
    /// Address, size and requested size of each block that is not inactive.
    pub active_blocks: Vec<(u64, u64, u64)>,
}

/// A block whose first mention in the trace is its free.
#[derive(Debug)]
struct FreedUnseen {
    addr: u64,
    requested: u64,
    stream: u64,
    /// Index of the free's entry.
    at: usize,
}

/// A range that existed when recording began, gathering the blocks live in it then.
#[derive(Debug)]
struct Piece {
    start: u64,
    end: u64,
    stream: u64,
    pool: Option<SegmentType>,
    expandable: bool,
    /// Index of the entry that freed or unmapped it, if the trace did.
    released_at: Option<usize>,
    blocks: Vec<InitialBlock>,
}

/// What the trace shows of segments and of blocks allocated before it, entry by entry.
#[derive(Debug, Default)]
pub(super) struct SegmentHistory {
    /// Everything a `segment_alloc` or `segment_map` of the trace created.
    created: Ranges,
    /// Ranges freed or unmapped that the trace had not created: they existed at its start.
    released: Vec<Piece>,
    released_ranges: Ranges,
    freed_unseen: Vec<FreedUnseen>,
}

/// The memory held when recording began.
#[derive(Debug, Default)]
pub(super) struct InitialState {
    /// The segments, in address order, with their live blocks.
    pub segments: Vec<InitialSegment>,
    /// Allocations of blocks live at the start that no segment holds, in the order found.
    pub orphans: Vec<Event>,
    /// How many live blocks (placed or not) came from `segments` rather than from frees.
    pub from_segments: usize,
}

impl SegmentHistory {
    /// A `segment_alloc` or `segment_map` of `[addr, addr + size)`.
    pub(super) fn created(&mut self, addr: u64, size: u64) {
        self.created.insert(addr, addr.saturating_add(size));
    }

    /// A `segment_free` or `segment_unmap` (entry `at`) of `[addr, addr + size)`: the parts the
    /// trace did not create existed when it began.
    pub(super) fn released(
        &mut self,
        addr: u64,
        size: u64,
        stream: u64,
        expandable: bool,
        at: usize,
    ) {
        let end = addr.saturating_add(size);
        for (start, end) in self.created.uncovered(addr, end) {
            for (start, end) in self.released_ranges.uncovered(start, end) {
                self.released.push(Piece {
                    start,
                    end,
                    stream,
                    pool: None,
                    expandable,
                    released_at: Some(at),
                    blocks: Vec::new(),
                });
                self.released_ranges.insert(start, end);
            }
        }
    }

    /// A free (entry `at`) of an address the trace never allocated: live at its start.
    pub(super) fn freed_unseen(&mut self, addr: u64, requested: u64, stream: u64, at: usize) {
        self.freed_unseen.push(FreedUnseen {
            addr,
            requested,
            stream,
            at,
        });
    }

    /// The segments and live blocks at the start of recording, given the dump-time segments of
    /// the device and the addresses the trace mentions (`seen`, which gains the addresses of
    /// blocks taken from `segments`).
    pub(super) fn resolve(
        self,
        segments: &[&DumpSegment],
        seen: &mut HashSet<u64>,
    ) -> InitialState {
        let mut pieces = self.released;
        for segment in segments {
            let end = segment.address.saturating_add(segment.total_size);
            for (start, end) in self.created.uncovered(segment.address, end) {
                for (start, end) in self.released_ranges.uncovered(start, end) {
                    pieces.push(Piece {
                        start,
                        end,
                        stream: segment.stream,
                        pool: segment.segment_type,
                        expandable: segment.expandable,
                        released_at: None,
                        blocks: Vec::new(),
                    });
                }
            }
        }
        pieces.sort_by_key(|piece| piece.start);
        // Segments of a consistent trace never overlap; a piece that does is dropped.
        let mut last_end = 0;
        pieces.retain(|piece| {
            let keep = piece.start >= last_end;
            if keep {
                last_end = piece.end;
            }
            keep
        });

        let mut state = InitialState::default();
        for freed in self.freed_unseen {
            let block = InitialBlock {
                address: freed.addr,
                requested: freed.requested,
                size: None,
            };
            let before_release = |piece: &Piece| piece.released_at.is_none_or(|r| freed.at < r);
            place(&mut pieces, block, freed.stream, before_release, &mut state);
        }
        for segment in segments {
            for &(address, size, requested) in &segment.active_blocks {
                if seen.insert(address) {
                    state.from_segments += 1;
                    let block = InitialBlock {
                        address,
                        requested,
                        size: Some(size),
                    };
                    let still_there = |piece: &Piece| piece.released_at.is_none();
                    place(&mut pieces, block, segment.stream, still_there, &mut state);
                }
            }
        }

        for piece in &mut pieces {
            piece.blocks.sort_by_key(|block| block.address);
            let mut free_from = piece.start;
            let mut kept = Vec::with_capacity(piece.blocks.len());
            for block in piece.blocks.drain(..) {
                if block.address >= free_from {
                    free_from = block.address + block.extent();
                    kept.push(block);
                } else {
                    state.orphans.push(Event::Alloc {
                        addr: block.address,
                        size: block.requested,
                        stream: piece.stream,
                    });
                }
            }
            piece.blocks = kept;
        }

        for piece in pieces {
            let joins_previous = state.segments.last().is_some_and(|previous| {
                previous.expandable
                    && piece.expandable
                    && previous.stream == piece.stream
                    && previous.address + previous.size == piece.start
                    && piece.pool.is_none_or(|pool| pool == previous.pool)
            });
            if joins_previous {
                if let Some(previous) = state.segments.last_mut() {
                    previous.size += piece.end - piece.start;
                    previous.blocks.extend(piece.blocks);
                }
                continue;
            }
            let pool = piece.pool.unwrap_or_else(|| infer_pool(&piece));
            state.segments.push(InitialSegment {
                address: piece.start,
                size: piece.end - piece.start,
                stream: piece.stream,
                pool,
                expandable: piece.expandable,
                blocks: piece.blocks,
            });
        }
        state
    }
}

/// Puts `block` into the piece that holds it whole, if that piece passes `fits`; otherwise it
/// becomes an orphan allocation (on `stream`).
fn place(
    pieces: &mut [Piece],
    block: InitialBlock,
    stream: u64,
    fits: impl Fn(&Piece) -> bool,
    state: &mut InitialState,
) {
    let holder = pieces
        .partition_point(|piece| piece.start <= block.address)
        .checked_sub(1)
        .map(|index| &mut pieces[index])
        .filter(|piece| {
            block.requested > 0
                && block
                    .address
                    .checked_add(block.extent())
                    .is_some_and(|end| end <= piece.end)
                && fits(piece)
        });
    match holder {
        Some(piece) => piece.blocks.push(block),
        None => state.orphans.push(Event::Alloc {
            addr: block.address,
            size: block.requested,
            stream,
        }),
    }
}

/// The pool of a segment the producer did not name (one the trace freed, or from a producer
/// that writes no `segment_type`): its blocks say, as only the small pool holds blocks of at
/// most 1 MiB; without blocks, PyTorch's small segments are 2 MiB and its large ones at
/// least 10 MiB.
fn infer_pool(piece: &Piece) -> SegmentType {
    match piece.blocks.first() {
        Some(block) if block.extent() <= SMALL_REQUEST => SegmentType::Small,
        Some(_) => SegmentType::Large,
        None if piece.end - piece.start <= SMALL_SEGMENT => SegmentType::Small,
        None => SegmentType::Large,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_report_what_they_do_not_cover() {
        let mut ranges = Ranges::default();
        ranges.insert(10, 20);
        ranges.insert(30, 40);
        ranges.insert(20, 25);
        assert_eq!(ranges.uncovered(0, 50), vec![(0, 10), (25, 30), (40, 50)]);
        assert_eq!(ranges.uncovered(12, 18), vec![]);
        assert_eq!(ranges.uncovered(15, 35), vec![(25, 30)]);
        ranges.insert(5, 45);
        assert_eq!(ranges.0.len(), 1);
        assert_eq!(ranges.uncovered(0, 50), vec![(0, 5), (45, 50)]);
    }
}
