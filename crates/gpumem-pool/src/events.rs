//! Pool events and the observers that watch them.
//!
//! Everything a pool does to memory — a block handed out, a free requested or completed, a
//! segment allocated, mapped, unmapped or freed, an allocation that ran out of memory — is one
//! [`PoolEvent`] in the vocabulary of PyTorch's memory snapshots ([`Action`]). The pool hands
//! each event to its [`EventSink`]: the history ring ([`History`], read back by
//! [`crate::Pool::snapshot`]) and any [`PoolObserver`]s attached with
//! [`crate::Pool::add_observer`] — the C ABI's callbacks, a monitor's publisher, a test's
//! recorder — without the pool knowing what they are. With no history and no observer, an
//! event costs one branch.

use gpumem_device::{DevicePtr, StreamId};
use gpumem_snapshot::Action;

use crate::history::History;

/// One thing the pool did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolEvent {
    /// What happened: `Alloc`, `FreeRequested`, `FreeCompleted`, `SegmentAlloc`,
    /// `SegmentFree`, `SegmentMap`, `SegmentUnmap` or `Oom`.
    pub action: Action,
    /// The block's or segment's address (0 for `Oom`).
    pub addr: DevicePtr,
    /// Bytes: as requested for blocks, as mapped or allocated for segments, the request's
    /// size for `Oom`.
    pub size: u64,
    /// The stream the block or segment serves.
    pub stream: StreamId,
    /// For `Oom`: the device's free memory at the time.
    pub device_free: Option<u64>,
}

/// Something that watches a pool's events.
///
/// Called with the pool's lock held, in the order events happen: an observer must be quick
/// and must not call back into the pool (that would deadlock).
pub trait PoolObserver: Send {
    /// Receives one event.
    fn on_event(&mut self, event: &PoolEvent);
}

/// Where a pool's events go: the history ring and the attached observers.
#[derive(Default)]
pub struct EventSink {
    history: History,
    observers: Vec<Box<dyn PoolObserver>>,
    /// Whether anything listens: history on, or an observer attached.
    listening: bool,
}

impl EventSink {
    /// Hands an event to the history and every observer, if anything listens.
    #[inline]
    pub fn emit(&mut self, action: Action, addr: DevicePtr, size: u64, stream: StreamId) {
        // The test is here, inlined into every caller, so that a pool nobody watches pays one
        // branch and no call.
        if self.listening {
            self.dispatch(PoolEvent {
                action,
                addr,
                size,
                stream,
                device_free: None,
            });
        }
    }

    /// Hands an out-of-memory event for a `size`-byte request to the listeners.
    pub fn emit_oom(&mut self, size: u64, stream: StreamId, device_free: u64) {
        if self.listening {
            self.dispatch(PoolEvent {
                action: Action::Oom,
                addr: 0,
                size,
                stream,
                device_free: Some(device_free),
            });
        }
    }

    /// Attaches an observer; it sees every event from now on.
    pub fn add_observer(&mut self, observer: Box<dyn PoolObserver>) {
        self.observers.push(observer);
        self.listening = true;
    }

    /// The history ring.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// Starts (capacity > 0) or stops (0) recording history.
    pub fn set_history_capacity(&mut self, capacity: usize) {
        self.history.set_capacity(capacity);
        self.listening = self.history.is_recording() || !self.observers.is_empty();
    }

    fn dispatch(&mut self, event: PoolEvent) {
        self.history.on_event(&event);
        for observer in &mut self.observers {
            observer.on_event(&event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    struct Recorder(Arc<Mutex<Vec<PoolEvent>>>);

    impl PoolObserver for Recorder {
        fn on_event(&mut self, event: &PoolEvent) {
            self.0.lock().unwrap().push(*event);
        }
    }

    #[test]
    fn observers_and_history_see_events_only_while_listening() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut sink = EventSink::default();
        sink.emit(Action::Alloc, 1, 8, StreamId::DEFAULT);
        assert_eq!(sink.history().entries().count(), 0);
        sink.add_observer(Box::new(Recorder(seen.clone())));
        sink.emit(Action::Alloc, 2, 8, StreamId(3));
        sink.emit_oom(64, StreamId(3), 7);
        let events = seen.lock().unwrap().clone();
        assert_eq!(events.len(), 2);
        assert_eq!((events[0].addr, events[0].stream), (2, StreamId(3)));
        assert_eq!(
            (events[1].action, events[1].device_free),
            (Action::Oom, Some(7))
        );
        assert_eq!(
            sink.history().entries().count(),
            0,
            "history stays off until asked"
        );
        sink.set_history_capacity(4);
        sink.emit(Action::FreeRequested, 2, 8, StreamId(3));
        assert_eq!(sink.history().entries().count(), 1);
        assert_eq!(seen.lock().unwrap().len(), 3);
    }
}
