//! Optional recording of every allocator event in a bounded ring buffer, in the vocabulary of
//! PyTorch's memory snapshots (`alloc`, `free_requested`, `free_completed`, `segment_alloc`,
//! …). When recording is off the cost is one branch per event.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use gpumem_device::{DevicePtr, StreamId};

/// What happened, named as in PyTorch's `device_traces`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A block was handed out (size = requested bytes).
    Alloc,
    /// The user freed a block; it may still wait on stream events.
    FreeRequested,
    /// The block is back in the pool.
    FreeCompleted,
    /// A device allocation of a new segment.
    SegmentAlloc,
    /// A segment returned to the device.
    SegmentFree,
    /// Physical memory mapped into a segment.
    SegmentMap,
    /// Physical memory unmapped from a segment.
    SegmentUnmap,
    /// An allocation failed; `size` is the request, `addr` holds the device's free bytes.
    Oom,
}

impl Action {
    /// PyTorch's name for the action.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }
}

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    /// What happened.
    pub action: Action,
    /// Block or segment address (for [`Action::Oom`], the device's free bytes).
    pub addr: DevicePtr,
    /// Bytes concerned.
    pub size: u64,
    /// Stream of the block or segment.
    pub stream: StreamId,
    /// Wall-clock time, microseconds since the Unix epoch.
    pub time_us: u64,
}

/// The recorder: off, or a ring buffer of at most `capacity` entries that drops the oldest.
#[derive(Debug, Default)]
pub struct History {
    ring: Option<Ring>,
}

#[derive(Debug)]
struct Ring {
    capacity: usize,
    entries: VecDeque<HistoryEntry>,
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

    /// Whether events are being recorded.
    pub fn is_on(&self) -> bool {
        self.ring.is_some()
    }

    /// Records an event if recording is on.
    #[inline]
    pub fn record(&mut self, action: Action, addr: DevicePtr, size: u64, stream: StreamId) {
        if let Some(ring) = &mut self.ring {
            if ring.entries.len() == ring.capacity {
                ring.entries.pop_front();
                ring.dropped += 1;
            }
            let time_us = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0);
            ring.entries.push_back(HistoryEntry {
                action,
                addr,
                size,
                stream,
                time_us,
            });
        }
    }

    /// The recorded entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &HistoryEntry> {
        self.ring.iter().flat_map(|r| r.entries.iter())
    }

    /// How many entries the ring has dropped to stay within its capacity.
    pub fn dropped(&self) -> u64 {
        self.ring.as_ref().map_or(0, |r| r.dropped)
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
        h.set_capacity(0);
        assert!(!h.is_on());
    }
}
