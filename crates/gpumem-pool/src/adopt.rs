//! Taking over memory that was in use before a pool began: a segment that a process had
//! reserved, with the blocks live in it, recreated at a fresh address as it was laid out.
//!
//! A replay of a trace recorded mid-process (PyTorch's history started after earlier work)
//! must start where that process stood: its segments reserved, its live blocks in place and
//! the rest of each segment cached, so that later requests reuse that space as the process
//! did. [`crate::Pool::adopt_segment`] does that through the policy's
//! [`crate::Policy::adopt_segment`]; a policy that cannot lay memory out as asked says so
//! ([`AdoptError::Unsupported`]) and the caller allocates the blocks instead.

use gpumem_device::StreamId;

use crate::policy::UpstreamError;
use crate::pool::PoolError;
use crate::stats::SizeClass;

/// A segment to take over: its size, stream, pool and kind, and the blocks live in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentToAdopt {
    /// Bytes reserved from the device for it.
    pub size: u64,
    /// The stream it serves.
    pub stream: StreamId,
    /// The pool it serves (PyTorch's small or large pool).
    pub size_class: SizeClass,
    /// Whether it was a mapped range of an expandable segment.
    pub expandable: bool,
    /// The live blocks, in address order, none overlapping.
    pub blocks: Vec<BlockToAdopt>,
}

/// A live block of a [`SegmentToAdopt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockToAdopt {
    /// Where it starts, from the segment's start.
    pub offset: u64,
    /// Bytes its owner asked for.
    pub requested: u64,
    /// Bytes it occupies, when known; otherwise the policy rounds `requested` as it would.
    pub size: Option<u64>,
}

impl BlockToAdopt {
    /// The bytes the block surely occupies: its size when known, else its request.
    pub fn extent(&self) -> u64 {
        self.size.unwrap_or(self.requested)
    }
}

/// Why a segment's layout cannot be taken over as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The segment has no bytes.
    #[error("a segment to adopt must have at least one byte")]
    EmptySegment,
    /// A block asks for no bytes, or its size is below its request.
    #[error("the block at offset {offset} requests no bytes or occupies fewer than it requests")]
    BlockSize {
        /// The block's offset.
        offset: u64,
    },
    /// A block starts before the previous one ends.
    #[error("the block at offset {offset} starts before the block before it ends")]
    Overlap {
        /// The block's offset.
        offset: u64,
    },
    /// A block ends past the segment's end.
    #[error(
        "the block at offset {offset} ({extent} bytes) ends past the segment's {segment} bytes"
    )]
    OutsideSegment {
        /// The block's offset.
        offset: u64,
        /// The bytes it occupies at least.
        extent: u64,
        /// The segment's size.
        segment: u64,
    },
}

/// Why a segment was not taken over.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AdoptError {
    /// The policy cannot lay memory out as the segment was (its own placement, or a kind of
    /// segment it does not hold): the caller should allocate the blocks instead.
    #[error("the {policy} policy cannot adopt {what}")]
    Unsupported {
        /// The policy's name.
        policy: &'static str,
        /// What it cannot take over.
        what: &'static str,
    },
    /// The layout is impossible: blocks overlapping or outside the segment.
    #[error("segment layout: {0}")]
    Layout(#[from] LayoutError),
    /// The device or the hard limit refused the segment's memory (what a policy returns; the
    /// pool turns it into [`AdoptError::Pool`]).
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The pool could not obtain the memory even after freeing its cache (an explained
    /// out-of-memory error), or the device failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
}

impl SegmentToAdopt {
    /// Checks that the blocks lie in the segment in address order without overlapping, each
    /// asking for at least one byte and occupying at least what it asks for.
    pub fn check(&self) -> Result<(), LayoutError> {
        if self.size == 0 {
            return Err(LayoutError::EmptySegment);
        }
        let mut free_from = 0;
        for block in &self.blocks {
            let offset = block.offset;
            if block.requested == 0 || block.size.is_some_and(|size| size < block.requested) {
                return Err(LayoutError::BlockSize { offset });
            }
            if offset < free_from {
                return Err(LayoutError::Overlap { offset });
            }
            let extent = block.extent();
            free_from = offset
                .checked_add(extent)
                .filter(|&end| end <= self.size)
                .ok_or(LayoutError::OutsideSegment {
                    offset,
                    extent,
                    segment: self.size,
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(blocks: &[(u64, u64, Option<u64>)]) -> SegmentToAdopt {
        SegmentToAdopt {
            size: 4096,
            stream: StreamId::DEFAULT,
            size_class: SizeClass::Small,
            expandable: false,
            blocks: blocks
                .iter()
                .map(|&(offset, requested, size)| BlockToAdopt {
                    offset,
                    requested,
                    size,
                })
                .collect(),
        }
    }

    #[test]
    fn a_layout_is_checked_block_by_block() {
        assert_eq!(
            segment(&[(0, 512, None), (512, 100, Some(512))]).check(),
            Ok(())
        );
        assert_eq!(
            segment(&[(0, 0, None)]).check(),
            Err(LayoutError::BlockSize { offset: 0 })
        );
        assert_eq!(
            segment(&[(0, 600, Some(512))]).check(),
            Err(LayoutError::BlockSize { offset: 0 })
        );
        assert_eq!(
            segment(&[(0, 600, None), (512, 1, None)]).check(),
            Err(LayoutError::Overlap { offset: 512 })
        );
        let outside = segment(&[(4000, 97, None)]).check().unwrap_err();
        assert_eq!(
            outside.to_string(),
            "the block at offset 4000 (97 bytes) ends past the segment's 4096 bytes"
        );
        let empty = SegmentToAdopt {
            size: 0,
            ..segment(&[])
        };
        assert_eq!(empty.check(), Err(LayoutError::EmptySegment));
    }
}
