//! Fitting: the largest micro-batch or sequence that fits a GPU with a margin, the gradient
//! accumulation reaching a global batch, and the fewest GPUs for a layout. Searches over the
//! estimator, which is cheap, so no trial runs; a fit whose peaks another [`PeakMeasure`] takes
//! (the allocator replay) starts where the estimate's ends.

use crate::advice::{Estimated, PeakMeasure};
use crate::error::{PlanError, Result};
use crate::estimate::{estimate, Estimate, Overheads};
use crate::model::ModelSpec;
use crate::workload::{Workload, MAX_SIZE};
use serde::Serialize;

/// What a fit search varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FitTarget {
    /// Micro-batch size.
    Batch,
    /// Sequence length.
    Seq,
}

impl FitTarget {
    /// The searched quantity as a flag name ("batch" or "seq").
    pub fn name(self) -> &'static str {
        match self {
            FitTarget::Batch => "batch",
            FitTarget::Seq => "seq",
        }
    }

    fn apply(self, workload: &Workload, value: u64) -> Workload {
        match self {
            FitTarget::Batch => Workload {
                batch: value,
                ..workload.clone()
            },
            FitTarget::Seq => Workload {
                seq: value,
                ..workload.clone()
            },
        }
    }
}

/// The result of a fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    /// What was searched.
    pub target: FitTarget,
    /// Largest value that fits.
    pub value: u64,
    /// Safety margin kept free, as a fraction of GPU memory.
    pub margin: f64,
    /// GPU memory, bytes.
    pub gpu_bytes: u64,
    /// Memory the plan may use: `gpu_bytes × (1 − margin)`.
    pub usable_bytes: u64,
    /// Gradient accumulation steps to reach the requested global batch (1 without one).
    pub grad_accum: u64,
    /// Global batch actually reached: micro-batch × data-parallel ranks × accumulation.
    pub global_batch: u64,
    /// The workload at `value` (with the accumulation found).
    pub workload: Workload,
    /// The estimate at `value` (with the accumulation found), its reserved memory as the fit's
    /// measure takes it.
    pub estimate: Estimate,
}

impl Fit {
    /// The searched quantity as a flag name ("batch" or "seq").
    pub fn target_name(&self) -> &'static str {
        self.target.name()
    }
}

/// Usable bytes of a GPU after a safety margin.
pub fn usable_bytes(gpu_bytes: u64, margin: f64) -> u64 {
    (gpu_bytes as f64 * (1.0 - margin.clamp(0.0, 0.9))) as u64
}

/// Checks that `margin` is a fraction in [0, 0.9): else a typed error naming `--margin`.
pub fn check_margin(margin: f64) -> Result<()> {
    if (0.0..0.9).contains(&margin) {
        Ok(())
    } else {
        Err(PlanError::InvalidValue {
            name: "margin".into(),
            value: margin.to_string(),
            reason: "must be a fraction in [0, 0.9), e.g. 0.1 for 10 %".into(),
        })
    }
}

/// Largest value `target` may take: [`MAX_SIZE`], or for a sequence the model's learned
/// positions (less the new tokens a generation adds).
fn most(model: &ModelSpec, workload: &Workload, target: FitTarget) -> u64 {
    match (target, model.token_limit()) {
        (FitTarget::Seq, Some(limit)) => limit
            .saturating_sub(workload.tokens() - workload.seq)
            .clamp(1, MAX_SIZE),
        _ => MAX_SIZE,
    }
}

/// Largest value in `[1, most]` for which `fits` holds, searched from `start`: steps doubling
/// away from it until one value fits and one does not, then bisection between them (peak
/// memory grows with batch and sequence). None when 1 does not fit.
fn largest(
    start: u64,
    most: u64,
    mut fits: impl FnMut(u64) -> Result<bool>,
) -> Result<Option<u64>> {
    let start = start.clamp(1, most);
    // `low` fits (0: none found yet), `high` does not (`most + 1`: none found yet).
    let (mut low, mut high, mut step) = (0, most + 1, 1);
    if fits(start)? {
        low = start;
        while low < most {
            let next = (low + step).min(most);
            if !fits(next)? {
                high = next;
                break;
            }
            (low, step) = (next, step * 2);
        }
    } else {
        high = start;
        while high > 1 {
            let next = high.saturating_sub(step).max(1);
            if fits(next)? {
                low = next;
                break;
            }
            (high, step) = (next, step * 2);
        }
    }
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(mid)? {
            low = mid;
        } else {
            high = mid;
        }
    }
    Ok((low > 0).then_some(low))
}

/// Largest value of `target` in `[1, most(..)]` whose peak total by `measure` fits `usable`
/// bytes, and that peak's estimate. The search starts where the estimate's own ends
/// (microseconds a try), which a replayed peak is close to.
fn largest_fitting(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    target: FitTarget,
    usable: u64,
    measure: &dyn PeakMeasure,
) -> Result<(u64, Estimate)> {
    let most = most(model, workload, target);
    let estimated = largest(1, most, |value| {
        let e = estimate(model, &target.apply(workload, value), overheads)?;
        Ok(e.peak_total_bytes <= usable)
    })?;
    // Each value that fits is larger than the last that did: the last is the answer's.
    let (mut best, mut smallest_needs) = (None, 0);
    let found = largest(estimated.unwrap_or(1), most, |value| {
        let e = measure.measure(model, &target.apply(workload, value), overheads)?;
        let fits = e.peak_total_bytes <= usable;
        if value == 1 {
            smallest_needs = e.peak_total_bytes;
        }
        if fits {
            best = Some(e);
        }
        Ok(fits)
    })?;
    found.zip(best).ok_or_else(|| PlanError::NothingFits {
        what: target.name(),
        smallest: 1,
        needed_gib: smallest_needs as f64 / (1u64 << 30) as f64,
        usable_gib: usable as f64 / (1u64 << 30) as f64,
    })
}

/// Default safety margin of a fit: the share of GPU memory kept free (10 %).
pub const DEFAULT_MARGIN: f64 = 0.1;

/// What a fit looks for: the quantity searched, the GPU and margin it must fit, and the global
/// batch accumulation should reach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitGoal {
    /// What is searched.
    pub target: FitTarget,
    /// GPU memory, bytes.
    pub gpu_bytes: u64,
    /// Safety margin kept free, as a fraction of GPU memory.
    pub margin: f64,
    /// Global batch to reach with gradient accumulation, if any.
    pub global_batch: Option<u64>,
}

/// Finds the largest micro-batch (or sequence) that fits `gpu_bytes` with `margin` by the
/// estimate, and the accumulation reaching `global_batch`, at most [`crate::limits::BATCH`]:
/// [`fit_measured`] with [`Estimated`].
pub fn fit(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    target: FitTarget,
    gpu_bytes: u64,
    margin: f64,
    global_batch: Option<u64>,
) -> Result<Fit> {
    let goal = FitGoal {
        target,
        gpu_bytes,
        margin,
        global_batch,
    };
    fit_measured(model, workload, overheads, &goal, &Estimated)
}

/// Finds the largest micro-batch (or sequence) whose peak total by `measure` fits the goal's
/// GPU with its margin, and the accumulation reaching its global batch (accumulating keeps
/// gradients alive during forward, so the search is redone while the accumulation needed
/// grows); the fit's estimate is `measure`'s of the fitted workload.
pub fn fit_measured(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    goal: &FitGoal,
    measure: &dyn PeakMeasure,
) -> Result<Fit> {
    let FitGoal {
        target,
        gpu_bytes,
        margin,
        global_batch,
    } = *goal;
    check_margin(margin)?;
    if let Some(global) = global_batch {
        crate::limits::BATCH.check("global-batch", global)?;
    }
    workload.validate()?;
    if target == FitTarget::Seq && !model.reads_tokens() {
        return Err(PlanError::InvalidValue {
            name: "fit".into(),
            value: "seq".into(),
            reason: format!(
                "{} has no sequence length (fit batch, or set --image-size)",
                model.name
            ),
        });
    }
    let usable = usable_bytes(gpu_bytes, margin);
    let dp = workload.layout.dp();
    let accumulation_for =
        |micro: u64| global_batch.map_or(workload.grad_accum, |g| g.div_ceil(micro * dp).max(1));
    let micro_batch = |w: &Workload, v: u64| {
        if target == FitTarget::Batch {
            v
        } else {
            w.batch
        }
    };
    let mut current = workload.clone();
    let (mut value, mut best) =
        largest_fitting(model, &current, overheads, target, usable, measure)?;
    let mut grad_accum = accumulation_for(micro_batch(&current, value));
    while grad_accum > current.grad_accum {
        current.grad_accum = grad_accum;
        (value, best) = largest_fitting(model, &current, overheads, target, usable, measure)?;
        grad_accum = accumulation_for(micro_batch(&current, value));
    }
    let searched = (value, current.grad_accum);
    // Prefer a micro-batch that divides the global batch exactly (64 = 16 × 4, not 24 × 3).
    if let (FitTarget::Batch, Some(global)) = (target, global_batch) {
        if global.is_multiple_of(dp) {
            let per_rank = global / dp;
            if let Some(divisor) = (1..=value.min(per_rank))
                .rev()
                .find(|d| per_rank.is_multiple_of(*d))
            {
                value = divisor;
                grad_accum = per_rank / divisor;
            }
        }
    }
    current.grad_accum = grad_accum;
    let fitted = target.apply(&current, value);
    if (value, grad_accum) != searched {
        best = measure.measure(model, &fitted, overheads)?;
    }
    Ok(Fit {
        target,
        value,
        margin,
        gpu_bytes,
        usable_bytes: usable,
        grad_accum,
        global_batch: micro_batch(&current, value) * dp * grad_accum,
        estimate: best,
        workload: fitted,
    })
}

/// Most GPUs [`fewest_gpus`] considers.
pub const MAX_GPUS: u64 = 4096;

/// Fewest GPUs (multiples of `tp × pp`, up to [`MAX_GPUS`]) on which the workload's layout fits.
///
/// One data-parallel rank is tried first (it has no gradient buckets); from two ranks on, the
/// peak per GPU never grows with more ranks (sharding divides states, buckets and activations
/// stay), so a bisection finds the fewest in ~12 estimates rather than one per count.
pub fn fewest_gpus(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    gpu_bytes: u64,
    margin: f64,
) -> Result<Option<u64>> {
    check_margin(margin)?;
    let usable = usable_bytes(gpu_bytes, margin);
    let group = workload.layout.tp * workload.layout.pp;
    let fits = |ranks: u64| -> Result<bool> {
        let mut candidate = workload.clone();
        candidate.layout.gpus = ranks * group;
        candidate.layout.nodes = 1;
        Ok(estimate(model, &candidate, overheads)?.peak_total_bytes <= usable)
    };
    let most = MAX_GPUS / group;
    if most == 0 {
        return Ok(None);
    }
    if fits(1)? {
        return Ok(Some(group));
    }
    if most < 2 || !fits(most)? {
        return Ok(None);
    }
    // `low` does not fit (or is the single rank), `high` fits.
    let (mut low, mut high) = (1, most);
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(mid)? {
            high = mid;
        } else {
            low = mid;
        }
    }
    Ok(Some(high * group))
}
