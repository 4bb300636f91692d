//! [`SlotVec`] and its index [`SlotIndex`]: the tables of the policies (the TLSF node slab,
//! PyTorch's block slab, the expandable-segment table), whose entries link to each other by
//! index, and whose links may be absent.
//!
//! A link is an `Option<SlotIndex>` rather than an integer with a "none" value (`u32::MAX`,
//! `usize::MAX`): the compiler checks every use, and it costs nothing. Slot 0 of a
//! [`SlotVec`] holds a placeholder that no index names, so an index is a non-zero position,
//! stored as it is in a `NonZeroU32`: `Option<SlotIndex>` is 4 bytes (`None` is the zero),
//! and indexing is plain `Vec` indexing, with no arithmetic. (Storing `position + 1` or
//! `!position` instead, for a table without a placeholder, costs an instruction per lookup:
//! measured at 1–3 % more instructions per policy operation.)

use std::num::NonZeroU32;
use std::ops::{Index, IndexMut};

/// The position of an entry of a [`SlotVec`]: 1 to `u32::MAX`, with a niche so that
/// `Option<SlotIndex>` is as small as a `u32`. Ordered by position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct SlotIndex(NonZeroU32);

impl SlotIndex {
    /// The first position: the lower bound of a key range.
    pub(crate) const MIN: SlotIndex = SlotIndex(NonZeroU32::MIN);
    /// The last position: the upper bound of a key range.
    pub(crate) const MAX: SlotIndex = SlotIndex(NonZeroU32::MAX);

    /// Position `position` of any integer type (a `Vec` length, a block handle); `None` for 0
    /// (the placeholder's slot) and beyond `u32::MAX`.
    pub(crate) fn new(position: impl TryInto<u32>) -> Option<SlotIndex> {
        NonZeroU32::new(position.try_into().ok()?).map(SlotIndex)
    }

    /// The position.
    pub(crate) const fn get(self) -> u32 {
        self.0.get()
    }

    /// The position, for indexing.
    const fn slot(self) -> usize {
        self.0.get() as usize
    }
}

/// A `Vec` addressed by [`SlotIndex`]: slot 0 holds a placeholder that no index names, so that
/// indices are non-zero and need no arithmetic. Entries are never removed (tables recycle
/// slots themselves), so an index stays valid for the table's life.
#[derive(Clone, Debug)]
pub(crate) struct SlotVec<T> {
    slots: Vec<T>,
}

impl<T> SlotVec<T> {
    /// A table with no entries, only the `placeholder` in slot 0 (never handed out or
    /// iterated over).
    pub(crate) fn new(placeholder: T) -> Self {
        SlotVec {
            slots: vec![placeholder],
        }
    }

    /// Appends `value`; its index, or `None` (and nothing appended) when the table already
    /// holds `u32::MAX` slots.
    pub(crate) fn push(&mut self, value: T) -> Option<SlotIndex> {
        let index = SlotIndex::new(self.slots.len())?;
        self.slots.push(value);
        Some(index)
    }

    /// Entry `index`, if the table has it (for indices that come back from outside, such as a
    /// block's handle).
    pub(crate) fn get(&self, index: SlotIndex) -> Option<&T> {
        self.slots.get(index.slot())
    }

    /// Entry `index` to change, if the table has it.
    pub(crate) fn get_mut(&mut self, index: SlotIndex) -> Option<&mut T> {
        self.slots.get_mut(index.slot())
    }

    /// Every entry with its index, in index order (the placeholder left out).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SlotIndex, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, value)| Some((SlotIndex::new(i)?, value)))
    }
}

impl<T> Index<SlotIndex> for SlotVec<T> {
    type Output = T;

    fn index(&self, index: SlotIndex) -> &T {
        &self.slots[index.slot()]
    }
}

impl<T> IndexMut<SlotIndex> for SlotVec<T> {
    fn index_mut(&mut self, index: SlotIndex) -> &mut T {
        &mut self.slots[index.slot()]
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
    fn indices_are_positions_from_one() {
        for i in [1, 7, u32::MAX] {
            assert_eq!(SlotIndex::new(i).map(SlotIndex::get), Some(i));
        }
        assert_eq!(SlotIndex::new(0u32), None);
        assert_eq!(SlotIndex::new(u64::from(u32::MAX) + 1), None);
        assert_eq!(SlotIndex::MIN.get(), 1);
        assert_eq!(SlotIndex::MAX.get(), u32::MAX);
        assert!(SlotIndex::new(1u32) < SlotIndex::new(2u32));
    }

    #[test]
    fn the_placeholder_is_never_named() {
        let mut table = SlotVec::new("placeholder");
        let a = table.push("a").unwrap();
        let b = table.push("b").unwrap();
        assert_eq!((a.get(), b.get()), (1, 2));
        assert_eq!((table[a], table[b]), ("a", "b"));
        table[b] = "B";
        let entries: Vec<_> = table.iter().collect();
        assert_eq!(entries, [(a, &"a"), (b, &"B")]);
        assert_eq!(table.get(SlotIndex::new(3u32).unwrap()), None);
    }
}
