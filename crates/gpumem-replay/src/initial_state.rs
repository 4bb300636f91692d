//! Starting a replay where the traced process stood when its recording began.
//!
//! A trace recorded mid-process carries the segments that existed then, with the blocks live
//! in them ([`Trace::initial_segments`]), and allocates those blocks in its first events. The
//! replay has the pool take each segment over ([`Pool::adopt_segment`]): reserved at its size,
//! its live blocks at their offsets, the rest cached, so that reserved memory starts where
//! the process's did and later requests reuse that space as its allocator did. The first
//! events are then already done. A segment the policy cannot take over (gpumem's own
//! placement, `none`) has its blocks allocated instead, as if the process had held only
//! them; the report says which happened ([`InitialState`]).

use gpumem_device::{AddressMap, StreamId};
use gpumem_pool::{AdoptError, BlockToAdopt, Pool, PoolError, SegmentToAdopt, SizeClass};
use gpumem_trace::{InitialSegment, SegmentType, Trace};
use serde::Serialize;

use crate::{drive, FirstOom, Mismatch, ReplayError};

/// How a replay began from the memory a trace held when its recording began.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InitialState {
    /// Segments that existed when recording began.
    pub segments: usize,
    /// Of those, the segments the policy took over as they were.
    pub adopted_segments: usize,
    /// Bytes of the segments taken over: reserved before the first recorded event.
    pub adopted_bytes: u64,
    /// Live blocks of segments not taken over, allocated at the start instead.
    pub allocated_blocks: usize,
    /// Why segments were not taken over, one line per reason.
    pub notes: Vec<String>,
}

/// [`drive_until`] over the whole trace.
pub(crate) fn drive_trace(
    pool: &Pool,
    trace: &Trace,
    live: &mut AddressMap<u64>,
    on_event: &mut dyn FnMut(usize),
) -> Result<Driven, ReplayError> {
    drive_until(pool, trace, trace.events.len(), live, on_event)
}

/// What [`drive_until`] did: the allocating device calls of each step (the initial state's
/// counted in the first), where it ran out of memory, how it began.
pub(crate) type Driven = (Vec<u64>, Option<FirstOom>, Option<InitialState>);

/// Replays `trace`'s events before `end` into `pool` from the trace's initial state: its
/// initial segments taken over (or their blocks allocated), which stands for its first
/// events, then the rest as [`drive`] does, with event indices of the whole trace.
pub(crate) fn drive_until(
    pool: &Pool,
    trace: &Trace,
    end: usize,
    live: &mut AddressMap<u64>,
    on_event: &mut dyn FnMut(usize),
) -> Result<Driven, ReplayError> {
    let calls_before = pool.stats().device_calls.allocating();
    if let Err(error) = trace.validate_initial_segments() {
        // Not a state to start from: the events, which allocate whatever they allocate, are
        // replayed from the first.
        let ignored = InitialState {
            segments: trace.initial_segments.len(),
            notes: vec![format!("initial segments ignored: {error}")],
            ..InitialState::default()
        };
        let (calls, oom) = drive(pool, &trace.events[..end], live, Mismatch::Reject, on_event)?;
        return Ok((calls, oom, Some(ignored)));
    }
    let first = trace.initial_allocs().min(end);
    let (initial, oom) = establish(pool, trace, live)?;
    for index in 0..first {
        on_event(index);
    }
    if oom.is_some() {
        return Ok((Vec::new(), oom, initial));
    }
    let initial_calls = pool.stats().device_calls.allocating() - calls_before;
    let events = &trace.events[first..end.max(first)];
    let (mut calls, oom) = drive(pool, events, live, Mismatch::Reject, &mut |index| {
        on_event(first + index)
    })
    .map_err(|error| shifted(error, first))?;
    if let Some(calls) = calls.first_mut() {
        *calls += initial_calls;
    }
    let oom = oom.map(|(index, error)| (first + index, error));
    Ok((calls, oom, initial))
}

/// A [`drive`] error of events from `first` on, with the index in the whole trace.
fn shifted(error: ReplayError, first: usize) -> ReplayError {
    match error {
        ReplayError::FreeOfNonLive { index, addr } => ReplayError::FreeOfNonLive {
            index: first + index,
            addr,
        },
        ReplayError::AllocOfLive { index, addr } => ReplayError::AllocOfLive {
            index: first + index,
            addr,
        },
        ReplayError::Pool { index, source } => ReplayError::Pool {
            index: first + index,
            source,
        },
        other => other,
    }
}

/// Brings `pool` to the trace's initial state, mapping each initial block's trace address to
/// its pointer in `live`. Returns what happened (`None` for a trace without initial segments)
/// and, if the pool ran out of memory, where: at the alloc of the block that did not fit.
fn establish(
    pool: &Pool,
    trace: &Trace,
    live: &mut AddressMap<u64>,
) -> Result<(Option<InitialState>, Option<FirstOom>), ReplayError> {
    if trace.initial_segments.is_empty() {
        return Ok((None, None));
    }
    let mut state = InitialState {
        segments: trace.initial_segments.len(),
        ..InitialState::default()
    };
    // Segments not taken over, by reason: (reason, segments, blocks).
    let mut declined: Vec<(String, usize, usize)> = Vec::new();
    let mut index = 0;
    for segment in &trace.initial_segments {
        let reason = match pool.adopt_segment(&to_adopt(segment)) {
            Ok(allocations) => {
                for (block, allocation) in segment.blocks.iter().zip(allocations) {
                    live.insert(block.address, allocation.ptr);
                }
                state.adopted_segments += 1;
                state.adopted_bytes += segment.size;
                index += segment.blocks.len();
                continue;
            }
            Err(AdoptError::Pool(PoolError::OutOfMemory(oom))) => {
                state.notes.push(format!(
                    "the segment of {} bytes at {:#x} held when recording began does not fit",
                    segment.size, segment.address
                ));
                return Ok((Some(state), Some((index, oom))));
            }
            Err(AdoptError::Pool(source)) => return Err(ReplayError::Pool { index, source }),
            Err(other) => other.to_string(),
        };
        for block in &segment.blocks {
            match pool.allocate(block.requested, StreamId(segment.stream)) {
                Ok(allocation) => {
                    live.insert(block.address, allocation.ptr);
                }
                Err(PoolError::OutOfMemory(oom)) => return Ok((Some(state), Some((index, oom)))),
                Err(source) => return Err(ReplayError::Pool { index, source }),
            }
            state.allocated_blocks += 1;
            index += 1;
        }
        match declined.iter_mut().find(|(r, _, _)| *r == reason) {
            Some((_, segments, blocks)) => {
                *segments += 1;
                *blocks += segment.blocks.len();
            }
            None => declined.push((reason, 1, segment.blocks.len())),
        }
    }
    for (reason, segments, blocks) in declined {
        state.notes.push(format!(
            "{reason}: {segments} segment(s) held when recording began not taken over; \
             their {blocks} live block(s) allocated at the start instead"
        ));
    }
    Ok((Some(state), None))
}

/// The pool's view of an initial segment: its blocks by offset.
fn to_adopt(segment: &InitialSegment) -> SegmentToAdopt {
    SegmentToAdopt {
        size: segment.size,
        stream: StreamId(segment.stream),
        size_class: match segment.pool {
            SegmentType::Small => SizeClass::Small,
            SegmentType::Large => SizeClass::Large,
        },
        expandable: segment.expandable,
        blocks: segment
            .blocks
            .iter()
            .map(|block| BlockToAdopt {
                offset: block.address.saturating_sub(segment.address),
                requested: block.requested,
                size: block.size,
            })
            .collect(),
    }
}
