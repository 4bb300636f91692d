//! Replaying a plan: the allocation sequence `gpumem plan` predicts
//! ([`gpumem_plan::allocation_sequence`]) becomes a trace, replayed through the policies like a
//! recorded one, so that the plan predicts reserved memory as each allocator would hold it.

use gpumem_plan::fit::{fit_measured, FitGoal};
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
/// NCCL's memory). None where no GPU is named; a GPU that this leaves nothing is an error
/// naming `--gpu` and `--context-mib`, with the sizes.
pub fn pool_capacity(workload: &Workload, estimate: &Estimate) -> Result<Option<u64>, PlanError> {
    let Some(memory) = workload.device_memory else {
        return Ok(None);
    };
    let (context, nccl) = (
        estimate.breakdown.framework,
        estimate.breakdown.communication,
    );
    match memory.checked_sub(context.saturating_add(nccl)) {
        Some(capacity) if capacity > 0 => Ok(Some(capacity)),
        _ => {
            let mib = |bytes: u64| format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64);
            let nccl = match nccl {
                0 => String::new(),
                n => format!(" and NCCL's communicators {}", mib(n)),
            };
            Err(PlanError::Conflict {
                first: format!("--gpu of {}", mib(memory)),
                second: format!("--context-mib {}", context >> 20),
                reason: format!(
                    "the CUDA context and framework take {}{nccl} outside PyTorch's allocator, \
                     no less than the GPU holds, which leaves the allocator nothing; name a \
                     larger GPU or give a smaller --context-mib",
                    mib(context)
                ),
            })
        }
    }
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
    let capacity = pool_capacity(workload, &planned)?;
    Ok(planned.with_reserved(torch_reserved(model, workload, capacity)?))
}

/// Peaks measured by the allocator replay ([`estimate_replayed`]), for ranking advice and
/// fitting on the memory PyTorch would reserve; a sequence that does not replay (a defect of
/// the planner) is an error naming the model.
pub struct Replayed;

impl PeakMeasure for Replayed {
    fn peak_total(
        &self,
        model: &ModelSpec,
        workload: &Workload,
        overheads: &Overheads,
    ) -> Result<u64, PlanError> {
        Ok(self.measure(model, workload, overheads)?.peak_total_bytes)
    }

    fn measure(
        &self,
        model: &ModelSpec,
        workload: &Workload,
        overheads: &Overheads,
    ) -> Result<Estimate, PlanError> {
        estimate_replayed(model, workload, overheads).map_err(|e| match e {
            PlanReplayError::Plan(e) => e,
            PlanReplayError::Replay(e) => replay_failed(model, e),
        })
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

/// A fit on reserved memory: the largest value whose replayed reserved memory plus the CUDA
/// context and NCCL's memory fits the usable memory.
#[derive(Debug, Clone)]
pub struct ReservedFit {
    /// The fit (its `estimate` is the replayed one of the fitted plan).
    pub fit: Fit,
    /// Peak reserved bytes of the fitted plan replayed through PyTorch's policy (`torch`).
    pub reserved_bytes: u64,
    /// `reserved_bytes` plus the context and NCCL's memory: what the fit compared with
    /// `fit.usable_bytes`.
    pub total_bytes: u64,
}

/// Why planning with the allocator replay (a replayed estimate) failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanReplayError {
    /// The planner refused.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The planned sequence did not replay.
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// [`gpumem_plan::fit()`] on reserved memory: the largest value whose plan, replayed through the
/// `torch` policy within the GPU of `gpu_bytes` exactly as `gpumem plan` replays the plan it
/// prints ([`Replayed`]: emptying its cache where it must), keeps its reserved peak plus the
/// context and NCCL's memory within `gpu_bytes × (1 − margin)`. The search starts where the
/// estimate's fit ends, a few replays away. The margin then covers what neither models: cuDNN
/// workspaces, NCCL's memory beyond its buffers, other processes, the planner's own error.
pub fn fit_reserved(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    target: FitTarget,
    gpu_bytes: u64,
    margin: f64,
    global_batch: Option<u64>,
) -> Result<ReservedFit, PlanError> {
    let on_gpu = Workload {
        device_memory: Some(gpu_bytes),
        ..workload.clone()
    };
    let goal = FitGoal {
        target,
        gpu_bytes,
        margin,
        global_batch,
    };
    let fit = fit_measured(model, &on_gpu, overheads, &goal, &Replayed)?;
    Ok(ReservedFit {
        reserved_bytes: fit.estimate.peak_reserved_bytes,
        total_bytes: fit.estimate.peak_total_bytes,
        fit,
    })
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
