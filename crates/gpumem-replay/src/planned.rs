//! Replaying a plan: the allocation sequence `gpumem plan` predicts
//! ([`gpumem_plan::allocation_sequence`]) becomes a trace, replayed through the policies like a
//! recorded one, so that the plan predicts reserved memory as each allocator would hold it.

use gpumem_plan::PlannedEvent;
use gpumem_pool::PolicyKind;
use gpumem_trace::{Event, Trace, TraceMeta};

use crate::{replay_peaks, PolicyReport, ReplayError, ReplayOptions};

/// The policies a plan is replayed through: PyTorch's allocator, with expandable segments, and
/// gpumem's own.
pub const PLAN_POLICIES: [PolicyKind; 3] = [
    PolicyKind::Torch,
    PolicyKind::Expandable,
    PolicyKind::Gpumem,
];

/// A planned allocation sequence as a trace named `name`: a tensor's id becomes its address.
pub fn planned_trace(name: &str, events: &[PlannedEvent]) -> Trace {
    let address = |id: u64| (id + 1) << 12;
    Trace {
        meta: TraceMeta {
            name: name.to_string(),
            source: "gpumem-plan".into(),
            ..TraceMeta::default()
        },
        events: events
            .iter()
            .map(|e| match *e {
                PlannedEvent::Alloc { id, bytes } => Event::Alloc {
                    addr: address(id),
                    size: bytes,
                    stream: 0,
                },
                PlannedEvent::Free { id } => Event::Free {
                    addr: address(id),
                    stream: 0,
                },
                PlannedEvent::Step { index } => Event::Step { index },
            })
            .collect(),
    }
}

/// Replays a planned trace once through each of [`PLAN_POLICIES`] with default settings
/// ([`replay_peaks`]).
pub fn replay_planned(trace: &Trace) -> Result<Vec<PolicyReport>, ReplayError> {
    PLAN_POLICIES
        .iter()
        .map(|&policy| replay_peaks(trace, policy, &ReplayOptions::default()))
        .collect()
}
