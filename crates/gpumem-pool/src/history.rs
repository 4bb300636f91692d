//! Optional recording of every allocator event in a bounded ring buffer, in the vocabulary of
//! PyTorch's memory snapshots (`alloc`, `free_requested`, `free_completed`, `segment_alloc`,
//! …), so that a pool's history is a snapshot's `device_traces` as it stands. When recording
//! is off the cost is one branch per event.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use gpumem_device::{DevicePtr, StreamId};
use gpumem_snapshot::{Action, TraceEntry};

/// The recorder: off, or a ring buffer of at most `capacity` entries that drops the oldest.
/// Public so that a policy can be driven without a pool (benchmarks of placement alone build
/// their own [`crate::Upstream`] over a device, statistics and a history that is off).
#[derive(Debug, Default)]
pub struct History {
    ring: Option<Ring>,
}

#[derive(Debug)]
struct Ring {
    capacity: usize,
    entries: VecDeque<TraceEntry>,
    dropped: u64,
}

impl History {
    /// Starts recording into a ring of `capacity` entries (0 turns recording off). Entries
    /// already recorded are kept if recording was on.
    pub fn set_capacity(&mut self, capacity: usize) {
        if capacity == 0 {
            self.ring = None;
            return;
        }
        let ring = self.ring.get_or_insert_with(|| Ring {
            capacity,
            entries: VecDeque::new(),
            dropped: 0,
        });
        ring.capacity = capacity;
        while ring.entries.len() > capacity {
            ring.entries.pop_front();
            ring.dropped += 1;
        }
    }

    /// Records an event if recording is on.
    #[inline]
    pub fn record(&mut self, action: Action, addr: DevicePtr, size: u64, stream: StreamId) {
        // The test is here, inlined into every caller, so that a pool with recording off
        // pays one branch and no call.
        if let Some(ring) = &mut self.ring {
            ring.push(action, addr, size, stream, None);
        }
    }

    /// Records an out-of-memory failure of a `size`-byte request while the device had
    /// `device_free` bytes free.
    pub fn record_oom(&mut self, size: u64, stream: StreamId, device_free: u64) {
        if let Some(ring) = &mut self.ring {
            ring.push(Action::Oom, 0, size, stream, Some(device_free));
        }
    }

    /// The recorded entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &TraceEntry> {
        self.ring.iter().flat_map(|r| r.entries.iter())
    }

    /// How many entries the ring has dropped to stay within its capacity.
    pub fn dropped(&self) -> u64 {
        self.ring.as_ref().map_or(0, |r| r.dropped)
    }
}

impl Ring {
    /// Appends an entry, dropping the oldest when full.
    fn push(
        &mut self,
        action: Action,
        addr: DevicePtr,
        size: u64,
        stream: StreamId,
        device_free: Option<u64>,
    ) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
            self.dropped += 1;
        }
        let time_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream: stream.0,
            time_us,
            device_free,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_records_nothing_and_ring_drops_oldest() {
        let mut h = History::default();
        h.record(Action::Alloc, 1, 1, StreamId::DEFAULT);
        assert_eq!(h.entries().count(), 0);
        h.set_capacity(2);
        for addr in 1..=3 {
            h.record(Action::Alloc, addr, 8, StreamId::DEFAULT);
        }
        let addrs: Vec<_> = h.entries().map(|e| e.addr).collect();
        assert_eq!(addrs, vec![2, 3]);
        assert_eq!(h.dropped(), 1);
        h.set_capacity(1);
        assert_eq!(h.entries().map(|e| e.addr).collect::<Vec<_>>(), vec![3]);
        h.record_oom(100, StreamId(7), 42);
        let oom = h.entries().next().unwrap();
        assert_eq!(
            (oom.action, oom.size, oom.stream, oom.device_free),
            (Action::Oom, 100, 7, Some(42))
        );
        h.set_capacity(0);
        assert_eq!(h.entries().count(), 0);
    }
}
