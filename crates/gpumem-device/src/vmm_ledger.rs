//! The bookkeeping every [`crate::VirtualMemory`] backend keeps: which address ranges are
//! reserved and which are mapped, with the checks the VMM calls make against them.
//!
//! A backend refuses a bad call with a typed error before its driver sees it (the CUDA driver
//! would fail with an opaque code, or not at all), and finds the mappings under an address
//! range for copies. One ledger serves the simulated and the real backends, so that they
//! refuse exactly the same calls.

use std::collections::BTreeMap;

use crate::{DeviceError, DevicePtr};

/// Checks that `size` is a non-zero multiple of the granularity `g`, as reservations and
/// physical chunks must be; `what` names the thing sized in the error.
pub fn check_granularity_multiple(size: u64, g: u64, what: &str) -> Result<(), DeviceError> {
    if size == 0 || !size.is_multiple_of(g) {
        return Err(DeviceError::InvalidValue(format!(
            "{what} of {size} bytes is not a non-zero multiple of the granularity {g}"
        )));
    }
    Ok(())
}

/// A mapped range: its size and what the backend keeps with it (the chunk's handle, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped<M> {
    /// Bytes mapped from the range's start.
    pub size: u64,
    /// The backend's own data.
    pub data: M,
}

/// Reservations and mappings of one device, by start address.
#[derive(Debug)]
pub struct VmmLedger<M> {
    reservations: BTreeMap<DevicePtr, u64>,
    mappings: BTreeMap<DevicePtr, Mapped<M>>,
}

impl<M> Default for VmmLedger<M> {
    fn default() -> Self {
        VmmLedger {
            reservations: BTreeMap::new(),
            mappings: BTreeMap::new(),
        }
    }
}

impl<M> VmmLedger<M> {
    /// Records a reservation of `size` bytes at `ptr`.
    pub fn add_reservation(&mut self, ptr: DevicePtr, size: u64) {
        self.reservations.insert(ptr, size);
    }

    /// Removes the reservation of `size` bytes at `ptr`; an error if no reservation of that
    /// size starts there or something is still mapped inside it.
    pub fn remove_reservation(&mut self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        if self.reservations.get(&ptr) != Some(&size) {
            return Err(DeviceError::InvalidAddress {
                ptr,
                what: format!("no reservation of {size} bytes starts here"),
            });
        }
        if self.mappings.range(ptr..ptr + size).next().is_some() {
            return Err(DeviceError::InvalidValue(format!(
                "reservation at {ptr:#x} still has mapped chunks"
            )));
        }
        self.reservations.remove(&ptr);
        Ok(())
    }

    /// Checks that `size` bytes can be mapped at `ptr`: aligned to the granularity `g`, inside
    /// one reservation, over nothing mapped.
    pub fn check_map(&self, ptr: DevicePtr, size: u64, g: u64) -> Result<(), DeviceError> {
        if !ptr.is_multiple_of(g) {
            return Err(DeviceError::InvalidAddress {
                ptr,
                what: format!("map address is not aligned to the granularity {g}"),
            });
        }
        let end = ptr.checked_add(size).ok_or(DeviceError::InvalidAddress {
            ptr,
            what: "range overflows the address space".into(),
        })?;
        let inside = matches!(
            self.reservations.range(..=ptr).next_back(),
            Some((&start, &len)) if end <= start + len
        );
        if !inside {
            return Err(DeviceError::InvalidAddress {
                ptr,
                what: format!("{size} bytes from here are not inside one reservation"),
            });
        }
        // Mappings never overlap, so the last one starting before `end` is the only one that
        // can reach into the range: one lookup, on the path of every map call.
        let overlaps = matches!(
            self.mappings.range(..end).next_back(),
            Some((&start, m)) if start + m.size > ptr
        );
        if overlaps {
            return Err(DeviceError::InvalidAddress {
                ptr,
                what: "range is already mapped".into(),
            });
        }
        Ok(())
    }

    /// Records a mapping of `size` bytes at `ptr` (checked with [`VmmLedger::check_map`]).
    pub fn add_mapping(&mut self, ptr: DevicePtr, size: u64, data: M) {
        self.mappings.insert(ptr, Mapped { size, data });
    }

    /// The start addresses of the mappings that `[ptr, ptr + size)` covers exactly — whole
    /// mappings, back to back — or an error: what an unmap may remove.
    pub fn covered_mappings(
        &self,
        ptr: DevicePtr,
        size: u64,
    ) -> Result<Vec<DevicePtr>, DeviceError> {
        let end = ptr.saturating_add(size);
        let starts: Vec<DevicePtr> = self.mappings.range(ptr..end).map(|(&a, _)| a).collect();
        let mut at = ptr;
        for start in &starts {
            if *start != at {
                break;
            }
            at += self.mappings[start].size;
        }
        if starts.is_empty() || at != end {
            return Err(DeviceError::InvalidAddress {
                ptr,
                what: format!("{size} bytes from here do not cover whole mappings"),
            });
        }
        Ok(starts)
    }

    /// Removes the mapping that starts at `ptr`.
    pub fn remove_mapping(&mut self, ptr: DevicePtr) -> Option<Mapped<M>> {
        self.mappings.remove(&ptr)
    }

    /// The mappings under `[ptr, ptr + len)`, in address order, as `(start, mapping)`: they
    /// must follow each other without a gap, or the range is an error.
    pub fn spans(
        &self,
        ptr: DevicePtr,
        len: u64,
    ) -> Result<Vec<(DevicePtr, &Mapped<M>)>, DeviceError> {
        let bad = |at: DevicePtr, what: &str| DeviceError::InvalidAddress {
            ptr: at,
            what: what.into(),
        };
        let end = ptr
            .checked_add(len)
            .ok_or_else(|| bad(ptr, "range overflows the address space"))?;
        let mut spans = Vec::new();
        let mut at = ptr;
        while at < end {
            match self.mappings.range(..=at).next_back() {
                Some((&start, mapped)) if at < start + mapped.size => {
                    spans.push((start, mapped));
                    at = start + mapped.size;
                }
                _ => return Err(bad(at, "not inside a live allocation or mapping")),
            }
        }
        Ok(spans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn maps_inside_reservations_only_and_unmaps_whole_mappings() {
        let mut ledger = VmmLedger::default();
        let base = 64 * MIB;
        ledger.add_reservation(base, 8 * MIB);
        assert!(
            ledger.check_map(base + MIB, 2 * MIB, 2 * MIB).is_err(),
            "misaligned"
        );
        assert!(
            ledger.check_map(base + 6 * MIB, 4 * MIB, 2 * MIB).is_err(),
            "past the end"
        );
        ledger.check_map(base, 2 * MIB, 2 * MIB).unwrap();
        ledger.add_mapping(base, 2 * MIB, 'a');
        ledger.add_mapping(base + 2 * MIB, 2 * MIB, 'b');
        assert!(
            ledger.check_map(base, 2 * MIB, 2 * MIB).is_err(),
            "already mapped"
        );
        ledger.add_mapping(base + 6 * MIB, 2 * MIB, 'c');
        assert!(
            ledger.check_map(base + 4 * MIB, 4 * MIB, 2 * MIB).is_err(),
            "runs into a later mapping"
        );
        ledger.check_map(base + 4 * MIB, 2 * MIB, 2 * MIB).unwrap();
        ledger.remove_mapping(base + 6 * MIB).unwrap();
        assert!(
            ledger.remove_reservation(base, 8 * MIB).is_err(),
            "still mapped"
        );
        let spans = ledger.spans(base + MIB, 2 * MIB).unwrap();
        assert_eq!(spans.iter().map(|s| s.1.data).collect::<String>(), "ab");
        assert!(
            ledger.spans(base + 3 * MIB, 2 * MIB).is_err(),
            "runs into a gap"
        );
        assert!(
            ledger.covered_mappings(base, 3 * MIB).is_err(),
            "half a mapping"
        );
        assert!(
            ledger.covered_mappings(base + MIB, 2 * MIB).is_err(),
            "not at a start"
        );
        assert_eq!(
            ledger.covered_mappings(base, 4 * MIB).unwrap(),
            [base, base + 2 * MIB]
        );
        for start in [base, base + 2 * MIB] {
            ledger.remove_mapping(start).unwrap();
        }
        assert!(
            ledger.remove_reservation(base, 4 * MIB).is_err(),
            "wrong size"
        );
        ledger.remove_reservation(base, 8 * MIB).unwrap();
        assert!(check_granularity_multiple(3 * MIB, 2 * MIB, "chunk").is_err());
        assert!(check_granularity_multiple(0, 2 * MIB, "chunk").is_err());
        check_granularity_multiple(4 * MIB, 2 * MIB, "chunk").unwrap();
    }
}
