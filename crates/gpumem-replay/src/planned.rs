//! Replaying a plan: the allocation sequence `gpumem plan` predicts
//! ([`gpumem_plan::allocation_sequence`]) becomes a trace, replayed through the policies like a
//! recorded one, so that the plan predicts reserved memory as each allocator would hold it.

use gpumem_plan::{
    allocation_sequence, estimate, startup_sequence, Estimate, Fit, FitTarget, ModelSpec,
    Overheads, PeakMeasure, PlanError, PlannedEvent, Workload,
};
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
                PlannedEvent::Alloc { id, bytes, stream } => Event::Alloc {
                    addr: address(id),
                    size: bytes,
                    stream: stream.id(),
                },
                PlannedEvent::Free { id } => Event::Free {
                    addr: address(id),
                    stream: 0,
                },
                PlannedEvent::Step { index } => Event::Step { index },
            })
            .collect(),
        ..Trace::default()
    }
}

/// The bytes PyTorch's pool can take on the GPU `workload` names (`Workload::device_memory`):
/// its memory less what lives outside the pool as `estimate` has it (the CUDA context and
/// NCCL's memory). None where no GPU is named.
pub fn pool_capacity(workload: &Workload, estimate: &Estimate) -> Option<u64> {
    let outside = estimate.breakdown.framework + estimate.breakdown.communication;
    workload.device_memory.map(|m| m.saturating_sub(outside))
}

/// Peaks of `workload`'s run replayed through each of `policies` (default settings): its steps
/// ([`allocation_sequence`]) and, where it has one, its start-up ([`startup_sequence`]), each
/// replayed on its own because the start-up ends by emptying the allocator's cache; every peak
/// is the larger of the two (the rest of a report is the steps'). The sequences are planned
/// once for all the policies. With a `capacity` (the pool's share of the GPU,
/// [`pool_capacity`]) a run whose cache would outgrow it is replayed on a device of that size,
/// as the allocator frees its cached blocks and retries there: reserved memory stays within
/// it, and the report counts the retries; where even that runs out of memory, the report is
/// the unbounded run's, with the failure.
pub fn replay_run(
    model: &ModelSpec,
    workload: &Workload,
    policies: &[PolicyKind],
    capacity: Option<u64>,
) -> Result<Vec<PolicyReport>, PlanReplayError> {
    let options = ReplayOptions {
        capacity,
        ..ReplayOptions::default()
    };
    let steps = planned_trace(&model.name, &allocation_sequence(model, workload)?);
    let startup = startup_sequence(model, workload)?;
    let startup =
        (!startup.is_empty()).then(|| planned_trace(&format!("{} start-up", model.name), &startup));
    policies
        .iter()
        .map(|&policy| {
            let steps = replay_peaks(&steps, policy, &options)?;
            let Some(startup) = &startup else {
                return Ok(steps);
            };
            let startup = replay_peaks(startup, policy, &options)?;
            let allocated = steps.peak_allocated_bytes.max(startup.peak_allocated_bytes);
            let reserved = steps.peak_reserved_bytes.max(startup.peak_reserved_bytes);
            Ok(PolicyReport {
                peak_allocated_bytes: allocated,
                peak_requested_bytes: steps.peak_requested_bytes.max(startup.peak_requested_bytes),
                peak_reserved_bytes: reserved,
                num_alloc_retries: steps.num_alloc_retries + startup.num_alloc_retries,
                oom: steps.oom.clone().or(startup.oom),
                utilization: if reserved == 0 {
                    steps.utilization
                } else {
                    allocated as f64 / reserved as f64
                },
                ..steps
            })
        })
        .collect()
}

/// Peak reserved bytes of `workload`'s run replayed through PyTorch's policy (`torch`, default
/// settings; [`replay_run`], within `capacity`).
pub fn torch_reserved(
    model: &ModelSpec,
    workload: &Workload,
    capacity: Option<u64>,
) -> Result<u64, PlanReplayError> {
    let mut reports = replay_run(model, workload, &[PolicyKind::Torch], capacity)?;
    Ok(reports.remove(0).peak_reserved_bytes)
}

/// The estimate with reserved memory from the allocator replay ([`torch_reserved`]) in place of
/// the fixed allocator share; total is that plus the context and NCCL's memory.
pub fn estimate_replayed(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
) -> Result<Estimate, PlanReplayError> {
    let planned = estimate(model, workload, overheads)?;
    let capacity = pool_capacity(workload, &planned);
    Ok(planned.with_reserved(torch_reserved(model, workload, capacity)?))
}

/// Peak totals measured by the allocator replay ([`estimate_replayed`]), for ranking advice on
/// the memory PyTorch would reserve; a sequence that does not replay (a defect of the planner)
/// is an error naming the model.
pub struct Replayed;

impl PeakMeasure for Replayed {
    fn peak_total(
        &self,
        model: &ModelSpec,
        workload: &Workload,
        overheads: &Overheads,
    ) -> Result<u64, PlanError> {
        match estimate_replayed(model, workload, overheads) {
            Ok(e) => Ok(e.peak_total_bytes),
            Err(PlanReplayError::Plan(e)) => Err(e),
            Err(PlanReplayError::Replay(e)) => Err(replay_failed(model, e)),
        }
    }
}

/// A planned allocation sequence that did not replay (a defect of the planner), as a plan error.
pub fn replay_failed(model: &ModelSpec, e: ReplayError) -> PlanError {
    PlanError::InvalidValue {
        name: "planned allocation sequence".into(),
        value: model.name.clone(),
        reason: format!("does not replay: {e}"),
    }
}

/// A fit checked on reserved memory: the largest value whose replayed reserved memory plus the
/// CUDA context and NCCL's memory fits the usable memory.
#[derive(Debug, Clone)]
pub struct ReservedFit {
    /// The fit (its `gpu_bytes`, `usable_bytes` and `margin` are the ones asked for).
    pub fit: Fit,
    /// Peak reserved bytes of the fitted plan replayed through PyTorch's policy (`torch`).
    pub reserved_bytes: u64,
    /// `reserved_bytes` plus the context and NCCL's memory: what the fit compared with
    /// `fit.usable_bytes`.
    pub total_bytes: u64,
}

/// Why planning with the allocator replay (a reserved-memory fit, a replayed estimate) failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanReplayError {
    /// The planner refused or nothing fits.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The planned sequence did not replay.
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// Rounds of [`fit_reserved`]: each shrinks the memory the allocated-memory fit may use by the
/// reserved overshoot of the last (and by 3 % more when the value did not drop); the
/// reserved/allocated ratio changes little with the value, so a few rounds settle.
const FIT_ROUNDS: usize = 16;

/// [`gpumem_plan::fit()`] on reserved memory: the fit on the planner's allocated estimate, then
/// the fitted plan's allocation sequence replayed through the `torch` policy (within the usable
/// memory, emptying its cache where it must); while its reserved peak plus the context and
/// NCCL's memory exceeds `gpu_bytes × (1 − margin)`, the allocated-memory fit is repeated on
/// memory shrunk by the overshoot. The margin then covers what neither models: cuDNN
/// workspaces, NCCL's memory beyond its buffers, other processes, the planner's own error.
pub fn fit_reserved(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    target: FitTarget,
    gpu_bytes: u64,
    margin: f64,
    global_batch: Option<u64>,
) -> Result<ReservedFit, PlanReplayError> {
    let usable = gpumem_plan::fit::usable_bytes(gpu_bytes, margin) as f64;
    let mut budget = gpu_bytes as f64;
    let mut last = None;
    for _ in 0..FIT_ROUNDS {
        let mut fit = match gpumem_plan::fit(
            model,
            workload,
            overheads,
            target,
            budget as u64,
            margin,
            global_batch,
        ) {
            Ok(fit) => fit,
            // Shrunk past the smallest value: nothing fits the memory asked for (below).
            Err(PlanError::NothingFits { .. }) if last.is_some() => break,
            Err(e) => return Err(e.into()),
        };
        // Beside the pool: the context and NCCL's memory. Within the usable memory the
        // allocator frees its cache before it fails.
        let outside = overheads.context_bytes + fit.estimate.breakdown.communication;
        let capacity = (usable as u64).saturating_sub(outside);
        let reserved = torch_reserved(model, &fit.workload, Some(capacity))?;
        let total = reserved.saturating_add(outside);
        fit.gpu_bytes = gpu_bytes;
        fit.usable_bytes = usable as u64;
        let found = ReservedFit {
            fit,
            reserved_bytes: reserved,
            total_bytes: total,
        };
        if total as f64 <= usable {
            return Ok(found);
        }
        let value = found.fit.value;
        let stalled = last
            .as_ref()
            .is_some_and(|l: &ReservedFit| l.fit.value <= value);
        last = Some(found);
        if value == 1 {
            break;
        }
        // Shrink what the allocated fit may use by the overshoot, more when that did not
        // lower the value.
        budget *= (usable / total as f64).min(0.999) * if stalled { 0.97 } else { 1.0 };
    }
    let (smallest, needed) = last.map_or((1, 0), |f| (f.fit.value, f.total_bytes));
    Err(PlanReplayError::Plan(PlanError::NothingFits {
        what: match target {
            FitTarget::Batch => "batch",
            FitTarget::Seq => "seq",
        },
        smallest,
        needed_gib: needed as f64 / (1u64 << 30) as f64,
        usable_gib: usable / (1u64 << 30) as f64,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_plan::Stream;

    /// A block freed on a side stream stays in that stream's pool: the compute stream's request
    /// of the same size grows the pool, where a block freed on the compute stream is reused.
    #[test]
    fn a_side_stream_block_serves_only_its_stream() {
        let reserved = |first: Stream| {
            let bytes = 100 << 20;
            let events = [
                PlannedEvent::Alloc {
                    id: 0,
                    bytes,
                    stream: first,
                },
                PlannedEvent::Free { id: 0 },
                PlannedEvent::Alloc {
                    id: 1,
                    bytes,
                    stream: Stream::Compute,
                },
                PlannedEvent::Free { id: 1 },
            ];
            let trace = planned_trace("streams", &events);
            replay_peaks(&trace, PolicyKind::Torch, &ReplayOptions::default())
                .unwrap()
                .peak_reserved_bytes
        };
        assert_eq!(reserved(Stream::Compute), 100 << 20);
        assert_eq!(reserved(Stream::Unshard), 200 << 20);
    }

    /// A cache that would outgrow the GPU is emptied within it: a 100 MiB block cached, then a
    /// 150 MiB request it cannot serve reserves 250 MiB on an unbounded device; within 200 MiB
    /// the allocator frees the cached block and retries (one `num_alloc_retries`), reserving
    /// 150 MiB at most. Within 120 MiB even that fails: the unbounded peak stays, with the
    /// failure.
    #[test]
    fn a_cache_that_outgrows_the_gpu_is_emptied_within_it() {
        let mib = 1u64 << 20;
        let alloc = |id, bytes| PlannedEvent::Alloc {
            id,
            bytes,
            stream: Stream::Compute,
        };
        let events = [
            alloc(0, 100 * mib),
            PlannedEvent::Free { id: 0 },
            alloc(1, 150 * mib),
            PlannedEvent::Free { id: 1 },
        ];
        let trace = planned_trace("flush", &events);
        let within = |capacity: Option<u64>| {
            let options = ReplayOptions {
                capacity,
                ..ReplayOptions::default()
            };
            replay_peaks(&trace, PolicyKind::Torch, &options).unwrap()
        };
        let unbounded = within(None);
        assert_eq!(unbounded.peak_reserved_bytes, 250 * mib);
        assert_eq!(unbounded.num_alloc_retries, 0);
        let flushed = within(Some(200 * mib));
        assert_eq!(flushed.peak_reserved_bytes, 150 * mib);
        assert_eq!(flushed.num_alloc_retries, 1);
        assert!(flushed.oom.is_none());
        let failed = within(Some(120 * mib));
        assert_eq!(failed.peak_reserved_bytes, 250 * mib);
        assert_eq!(failed.oom.map(|o| o.capacity_bytes), Some(120 * mib));
    }
}
