//! What a replay looks like over time, for charts (`gpumem report`): the allocated and
//! reserved bytes after every event, and the pool's segments with their blocks at the moment
//! reserved memory peaks.

use gpumem_device::AddressMap;
use gpumem_pool::SegmentView;
use gpumem_trace::Trace;

use crate::initial_state::{drive_trace, drive_until};
use crate::{
    new_pool, PolicySource, Progress, ReplayError, ReplayOptions, PROGRESS_EVERY,
    UNLIMITED_CAPACITY,
};

/// The memory of one policy's replay after each event, on a device without a limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Allocated bytes (after the policy's rounding) after each event, one entry per event.
    pub allocated: Vec<u64>,
    /// Reserved bytes after each event, one entry per event.
    pub reserved: Vec<u64>,
}

impl Timeline {
    /// The first event after which reserved memory is at its highest (0 for an empty trace).
    pub fn peak_index(&self) -> usize {
        let peak = self.reserved.iter().copied().max().unwrap_or(0);
        self.reserved.iter().position(|&r| r == peak).unwrap_or(0)
    }
}

/// The pool's segments after one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentMap {
    /// The event after which the segments were taken.
    pub event_index: usize,
    /// The segments in address order, each with the blocks that tile it.
    pub segments: Vec<SegmentView>,
}

/// Replays `trace` through `policy` on a device without a limit and records the allocated and
/// reserved bytes after every event. The figures of [`crate::replay`] come from the pool's
/// statistics, which also count peaks inside an event; the timeline samples between events.
pub fn timeline(
    trace: &Trace,
    policy: impl PolicySource,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Timeline, ReplayError> {
    let pool = new_pool(trace, &policy, UNLIMITED_CAPACITY, options, 0)?;
    let total = trace.events.len();
    let mut line = Timeline {
        allocated: Vec::with_capacity(total),
        reserved: Vec::with_capacity(total),
    };
    let mut on_event = |index: usize| {
        let stats = pool.stats();
        line.allocated.push(stats.allocated_bytes.all.current);
        line.reserved.push(stats.reserved_bytes.all.current);
        if index.is_multiple_of(PROGRESS_EVERY) {
            progress(Progress {
                policy: policy.name(),
                done: index,
                total,
            });
        }
    };
    drive_trace(&pool, trace, &mut AddressMap::default(), &mut on_event)?;
    Ok(line)
}

/// The segments `policy`'s pool holds after event `event_index` of `trace` (replayed on a
/// device without a limit): what is live, what is cached and where the holes are at that
/// moment. An index past the end gives the pool after the last event.
pub fn segments_after(
    trace: &Trace,
    policy: impl PolicySource,
    options: &ReplayOptions,
    event_index: usize,
) -> Result<SegmentMap, ReplayError> {
    let pool = new_pool(trace, &policy, UNLIMITED_CAPACITY, options, 0)?;
    let end = event_index.saturating_add(1).min(trace.events.len());
    drive_until(&pool, trace, end, &mut AddressMap::default(), &mut |_| {})?;
    let mut segments = pool.segments();
    segments.sort_by_key(|s| s.address);
    Ok(SegmentMap {
        event_index: end.saturating_sub(1),
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_pool::PolicyKind;
    use gpumem_trace::{Event, TraceMeta};

    #[test]
    fn timeline_follows_the_pool_and_the_map_shows_the_peak() {
        let mib = 1 << 20;
        let events = vec![
            Event::Alloc {
                addr: 1,
                size: 3 * mib,
                stream: 0,
            },
            Event::Alloc {
                addr: 2,
                size: 5 * mib,
                stream: 0,
            },
            Event::Free { addr: 1, stream: 0 },
            Event::Free { addr: 2, stream: 0 },
        ];
        let trace = Trace::new(TraceMeta::default(), events);
        let options = ReplayOptions::default();
        let line = timeline(&trace, PolicyKind::None, &options, &mut |_| {}).unwrap();
        assert_eq!(line.allocated, vec![3 * mib, 8 * mib, 5 * mib, 0]);
        assert_eq!(line.reserved[3], 0, "the none policy frees every block");
        assert_eq!(line.peak_index(), 1);
        let report = crate::replay(&trace, PolicyKind::None, &options, &mut |_| {}).unwrap();
        assert_eq!(
            line.reserved.iter().max(),
            Some(&report.report.peak_reserved_bytes)
        );
        let map = segments_after(&trace, PolicyKind::Torch, &options, 1).unwrap();
        assert_eq!(map.event_index, 1);
        let live: u64 = map
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.in_use)
            .map(|b| b.size)
            .sum();
        assert_eq!(live, 8 * mib);
        let after_end = segments_after(&trace, PolicyKind::Torch, &options, 99).unwrap();
        assert_eq!(after_end.event_index, 3);
        assert!(after_end
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .all(|b| !b.in_use));
    }
}
