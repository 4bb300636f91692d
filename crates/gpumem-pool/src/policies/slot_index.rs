//! [`SlotIndex`]: the index of a slot in a policy's table (the TLSF node slab, PyTorch's block
//! slab, the expandable-segment table), for links that may be absent.
//!
//! A link is an `Option<SlotIndex>` rather than an integer with a "none" value: the compiler
//! checks every use, and it costs nothing, because the index is stored inverted in a
//! `NonZeroU32` — `u32::MAX`, the one index that cannot be stored, becomes the zero that
//! `None` takes, so `Option<SlotIndex>` is 4 bytes, and `get` is one `not` instruction.

use std::cmp::Ordering;
use std::fmt;
use std::num::NonZeroU32;

/// The index of a slot in a table of at most `u32::MAX` slots (0 to `u32::MAX − 1`), with a
/// niche so that `Option<SlotIndex>` is as small as a `u32`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SlotIndex(NonZeroU32);

impl SlotIndex {
    /// Index `index`; `None` for `u32::MAX`, which does not fit.
    pub(crate) const fn new(index: u32) -> Option<SlotIndex> {
        match NonZeroU32::new(!index) {
            Some(inverted) => Some(SlotIndex(inverted)),
            None => None,
        }
    }

    /// Index `index` of a table of `usize` length; `None` from `u32::MAX` on.
    pub(crate) fn from_usize(index: usize) -> Option<SlotIndex> {
        u32::try_from(index).ok().and_then(SlotIndex::new)
    }

    /// The index.
    pub(crate) const fn get(self) -> u32 {
        !self.0.get()
    }

    /// The index, for indexing a `Vec`.
    pub(crate) const fn slot(self) -> usize {
        self.get() as usize
    }
}

/// In index order (not the order of the inverted value stored).
impl Ord for SlotIndex {
    fn cmp(&self, other: &Self) -> Ordering {
        self.get().cmp(&other.get())
    }
}

impl PartialOrd for SlotIndex {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for SlotIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlotIndex({})", self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_optional_index_is_as_small_as_the_integer() {
        assert_eq!(size_of::<Option<SlotIndex>>(), size_of::<u32>());
    }

    #[test]
    fn indices_round_trip_and_order_by_value() {
        for i in [0, 1, 7, u32::MAX - 1] {
            assert_eq!(SlotIndex::new(i).map(SlotIndex::get), Some(i));
        }
        assert_eq!(SlotIndex::new(u32::MAX), None);
        assert_eq!(SlotIndex::from_usize(u32::MAX as usize), None);
        assert_eq!(SlotIndex::from_usize(3).map(SlotIndex::slot), Some(3));
        assert!(SlotIndex::new(1) < SlotIndex::new(2));
        assert!(SlotIndex::new(0) < SlotIndex::new(u32::MAX - 1));
    }
}
