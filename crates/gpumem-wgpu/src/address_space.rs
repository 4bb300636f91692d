//! The per-device address space: where each buffer lives as a [`DevicePtr`].
//!
//! wgpu has no device pointers, only buffers. Every [`crate::WgpuDevice::malloc`] therefore
//! places its buffer at a fresh range of a made-up address space, `[BASE, END)`, and keeps the
//! ranges in an ordered map, so that any address inside a live buffer resolves to the buffer
//! and an offset. Placement is next-fit: a cursor moves up through the space, so addresses are
//! not handed out again soon after a free (a stale pointer then names no buffer rather than a
//! new one); once the cursor reaches the end it wraps around and the gaps left by freed
//! buffers are reused. A live range is never handed out twice.

use std::collections::BTreeMap;

use gpumem_device::DevicePtr;

/// The lowest address handed out (4 GiB: small integers never look like device addresses).
pub const BASE: DevicePtr = 1 << 32;
/// One past the highest address handed out: a 2^48-byte space, as wide as a GPU's virtual
/// address space.
pub const END: DevicePtr = 1 << 48;

/// Ranges of one device's address space, each holding a `T` (the buffer).
#[derive(Debug)]
pub struct AddressSpace<T> {
    /// Alignment of every start address (a power of two).
    align: u64,
    /// Where the next search starts.
    cursor: DevicePtr,
    /// Live ranges by start: (length, value).
    live: BTreeMap<DevicePtr, (u64, T)>,
}

impl<T> AddressSpace<T> {
    /// An empty space whose ranges start at multiples of `align` (a power of two).
    pub fn new(align: u64) -> Self {
        assert!(align.is_power_of_two(), "alignment must be a power of two");
        AddressSpace {
            align,
            cursor: BASE,
            live: BTreeMap::new(),
        }
    }

    /// Places `len` (non-zero) bytes holding `value` at a free aligned address and returns it,
    /// or gives `value` back when no gap of the space is large enough.
    pub fn insert(&mut self, len: u64, value: T) -> Result<DevicePtr, T> {
        debug_assert!(len > 0);
        let found = self
            .find_gap(self.cursor, len)
            .or_else(|| self.find_gap(BASE, len));
        match found {
            Some(start) => {
                self.cursor = start + len;
                self.live.insert(start, (len, value));
                Ok(start)
            }
            None => Err(value),
        }
    }

    /// The first aligned start at or after `from` with `len` free bytes before the next live
    /// range and the end of the space.
    fn find_gap(&self, from: DevicePtr, len: u64) -> Option<DevicePtr> {
        let mut start = self.align_up(from)?;
        // A range that begins below `start` may still cover it.
        if let Some((&s, &(l, _))) = self.live.range(..start).next_back() {
            if s + l > start {
                start = self.align_up(s + l)?;
            }
        }
        loop {
            let end = start.checked_add(len).filter(|&e| e <= END)?;
            match self.live.range(start..).next() {
                Some((&s, _)) if s < end => {
                    let (l, _) = self.live[&s];
                    start = self.align_up(s + l)?;
                }
                _ => return Some(start),
            }
        }
    }

    fn align_up(&self, at: DevicePtr) -> Option<DevicePtr> {
        at.checked_next_multiple_of(self.align)
    }

    /// Removes the range that starts exactly at `ptr`, returning its length and value.
    pub fn remove(&mut self, ptr: DevicePtr) -> Option<(u64, T)> {
        self.live.remove(&ptr)
    }

    /// The range holding `[ptr, ptr + len)` entirely: its start, length and value. `None` when
    /// `ptr` is in no live range or the bytes run past its end (into another range or a gap).
    pub fn find(&self, ptr: DevicePtr, len: u64) -> Option<(DevicePtr, u64, &T)> {
        let (&start, (size, value)) = self.live.range(..=ptr).next_back()?;
        let end = ptr.checked_add(len)?;
        (ptr < start + size && end <= start + size).then_some((start, *size, value))
    }

    /// Whether `ptr` lies inside some live range (a range check may have failed only at its
    /// end).
    pub fn contains(&self, ptr: DevicePtr) -> bool {
        self.find(ptr, 0).is_some()
    }

    /// How many ranges are live.
    pub fn len(&self) -> usize {
        self.live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_aligned_disjoint_and_resolve_from_inside() {
        let mut space = AddressSpace::new(256);
        let a = space.insert(100, 'a').unwrap();
        let b = space.insert(512, 'b').unwrap();
        assert_eq!(a, BASE);
        assert_eq!(b, BASE + 256, "aligned right after the first range");
        assert_eq!(space.find(a + 10, 90), Some((a, 100, &'a')));
        assert_eq!(space.find(a + 99, 1), Some((a, 100, &'a')));
        assert_eq!(space.find(a + 99, 2), None, "runs past the end");
        assert_eq!(space.find(a + 100, 1), None, "the alignment gap");
        assert_eq!(space.find(b + 511, 1), Some((b, 512, &'b')));
        assert_eq!(space.find(b, 513), None, "spans past the last range");
        assert_eq!(space.find(BASE - 1, 1), None);
        assert!(space.contains(a + 50) && !space.contains(b + 512));
        assert_eq!(space.remove(a + 1), None, "only the exact start frees");
        assert_eq!(space.remove(a), Some((100, 'a')));
        assert_eq!(space.find(a, 1), None);
        assert_eq!(space.len(), 1);
    }

    #[test]
    fn freed_addresses_come_back_only_after_the_cursor_wraps() {
        let mut space = AddressSpace::new(256);
        let a = space.insert(256, 0).unwrap();
        space.remove(a);
        let b = space.insert(256, 1).unwrap();
        assert_ne!(a, b, "next-fit: the cursor moved on");
        // Fill up to the end of the space so that the next request must wrap.
        let rest = END - (b + 256);
        let big = space.insert(rest, 2).unwrap();
        assert_eq!(big + rest, END);
        let c = space.insert(256, 3).unwrap();
        assert_eq!(c, a, "wrapped around into the freed gap");
        assert_eq!(space.insert(256, 4), Err(4), "the space is full");
        assert_eq!(space.insert(END, 5), Err(5));
        space.remove(b);
        assert_eq!(space.insert(300, 6), Err(6), "the gap is too small");
        assert_eq!(space.insert(256, 7), Ok(b));
    }
}
