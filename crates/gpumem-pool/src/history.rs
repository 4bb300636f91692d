//! Optional recording of every allocator event in a bounded ring buffer, in the vocabulary of
//! PyTorch's memory snapshots (`alloc`, `free_requested`, `free_completed`, `segment_alloc`,
//! …), so that a pool's history is a snapshot's `device_traces` as it stands. The history is
//! one observer of the pool's events ([`crate::PoolObserver`]), the one snapshots read.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use gpumem_snapshot::TraceEntry;

use crate::events::{PoolEvent, PoolObserver};

/// The recorder: off, or a ring buffer of at most `capacity` entries that drops the oldest.
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

    /// Whether recording is on.
    pub fn is_recording(&self) -> bool {
        self.ring.is_some()
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

impl PoolObserver for History {
    fn on_event(&mut self, event: &PoolEvent) {
        if let Some(ring) = &mut self.ring {
            ring.push(event);
        }
    }
}

impl Ring {
    /// Appends an event, dropping the oldest entry when full.
    fn push(&mut self, event: &PoolEvent) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
            self.dropped += 1;
        }
        let time_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        self.entries.push_back(TraceEntry {
            action: event.action,
            addr: event.addr,
            size: event.size,
            stream: event.stream.0,
            time_us,
            device_free: event.device_free,
            stack: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_device::StreamId;
    use gpumem_snapshot::Action;

    fn event(action: Action, addr: u64, size: u64) -> PoolEvent {
        PoolEvent {
            action,
            addr,
            size,
            stream: StreamId(7),
            device_free: (action == Action::Oom).then_some(42),
        }
    }

    #[test]
    fn off_records_nothing_and_ring_drops_oldest() {
        let mut h = History::default();
        h.on_event(&event(Action::Alloc, 1, 1));
        assert_eq!(h.entries().count(), 0);
        h.set_capacity(2);
        for addr in 1..=3 {
            h.on_event(&event(Action::Alloc, addr, 8));
        }
        let addrs: Vec<_> = h.entries().map(|e| e.addr).collect();
        assert_eq!(addrs, vec![2, 3]);
        assert_eq!(h.dropped(), 1);
        h.set_capacity(1);
        assert_eq!(h.entries().map(|e| e.addr).collect::<Vec<_>>(), vec![3]);
        h.on_event(&event(Action::Oom, 0, 100));
        let oom = h.entries().next().unwrap();
        assert_eq!(
            (oom.action, oom.size, oom.stream, oom.device_free),
            (Action::Oom, 100, 7, Some(42))
        );
        h.set_capacity(0);
        assert_eq!(h.entries().count(), 0);
    }
}
