//! Taking over a cudaMalloc'd segment held before the pool began (a trace recorded
//! mid-process): one segment of the same size from the device, its live blocks at their
//! offsets, and each gap between them one cached block. PyTorch merges a freed block with its
//! free neighbours, so that is how it leaves a segment (blocks still waiting on other streams'
//! events aside, which a trace cannot show).

use super::blocks::BlockNode;
use super::rounding::{round_size, MIN_BLOCK_SIZE, SMALL_SIZE};
use super::TorchPolicy;
use crate::adopt::{AdoptError, SegmentToAdopt};
use crate::policy::{Block, BlockHandle, Policy, Upstream};
use crate::stats::SizeClass;

/// A range of an adopted segment: a live block (with its request) or a cached gap.
struct Piece {
    offset: u64,
    size: u64,
    requested: Option<u64>,
}

impl TorchPolicy {
    /// [`Policy::adopt_segment`] for PyTorch's allocator: the segment comes from one
    /// `malloc_segment` of its size; expandable ranges are refused, since where they lay in
    /// their reservation is not known.
    pub(super) fn adopt(
        &mut self,
        segment: &SegmentToAdopt,
        up: &mut Upstream<'_>,
    ) -> Result<Vec<Block>, AdoptError> {
        if segment.expandable {
            return Err(AdoptError::Unsupported {
                policy: self.name(),
                what: "a range of an expandable segment held before it began",
            });
        }
        segment.check()?;
        let pieces = self.lay_out(segment);
        let (kind, stream) = (segment.size_class, segment.stream);
        let base = up.malloc_segment(segment.size, kind, stream)?;
        if segment.size >= self.settings.max_split_size {
            up.stats.oversize_segments.increase(1);
        }
        let mut previous = None;
        let mut nodes = Vec::with_capacity(pieces.len());
        for piece in &pieces {
            let idx = self.blocks.insert(BlockNode {
                allocated: piece.requested.is_some(),
                ..BlockNode::new(base + piece.offset, piece.size, stream, kind)
            });
            self.blocks.splice(idx, previous, None);
            previous = Some(idx);
            nodes.push(idx);
        }
        let split = pieces.len() > 1;
        let mut live = Vec::with_capacity(segment.blocks.len());
        for (piece, idx) in pieces.iter().zip(nodes) {
            let Some(requested) = piece.requested else {
                self.insert_free(idx);
                if split {
                    up.stats.inactive_split.increase(kind, 1);
                    up.stats.inactive_split_bytes.increase(kind, piece.size);
                }
                continue;
            };
            if piece.size >= self.settings.max_split_size {
                up.stats.oversize_allocations.increase(1);
            }
            live.push(Block {
                addr: base + piece.offset,
                size: piece.size,
                requested,
                stream,
                size_class: kind,
                handle: BlockHandle::new(u64::from(idx.get())),
            });
        }
        Ok(live)
    }

    /// The live blocks of a checked segment and the gaps between them, in address order.
    fn lay_out(&self, segment: &SegmentToAdopt) -> Vec<Piece> {
        let mut pieces = Vec::with_capacity(2 * segment.blocks.len() + 1);
        let mut cursor = 0;
        let gap = |from: u64, to: u64| Piece {
            offset: from,
            size: to - from,
            requested: None,
        };
        for (i, block) in segment.blocks.iter().enumerate() {
            if block.offset > cursor {
                pieces.push(gap(cursor, block.offset));
            }
            let next = segment.blocks.get(i + 1).map_or(segment.size, |b| b.offset);
            let size = block.size.unwrap_or_else(|| {
                self.occupied(segment.size_class, block.requested, next - block.offset)
            });
            pieces.push(Piece {
                offset: block.offset,
                size,
                requested: Some(block.requested),
            });
            cursor = block.offset + size;
        }
        if cursor < segment.size {
            pieces.push(gap(cursor, segment.size));
        }
        pieces
    }

    /// The bytes a block of `requested` bytes occupies when `room` bytes lie before the next
    /// block or the segment's end: its rounded size, and the rest too where PyTorch would not
    /// have split it off (`should_split`; an oversize block takes a cached block whole, if it
    /// is less than `max_non_split_rounding` larger). What lies beyond, a cached block.
    fn occupied(&self, kind: SizeClass, requested: u64, room: u64) -> u64 {
        let divisions = &self.settings.roundup_power2_divisions;
        let rounded = round_size(requested, divisions)
            .unwrap_or(requested)
            .min(room);
        let rest = room - rounded;
        let unsplit = if kind == SizeClass::Small || self.settings.expandable_segments {
            rest < MIN_BLOCK_SIZE
        } else if rounded < self.settings.max_split_size {
            rest <= SMALL_SIZE
        } else {
            rest < self.settings.max_non_split_rounding
        };
        if unsplit {
            room
        } else {
            rounded
        }
    }
}
