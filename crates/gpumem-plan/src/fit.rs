//! Fitting: the largest micro-batch or sequence that fits a GPU with a margin, the gradient
//! accumulation reaching a global batch, and the fewest GPUs for a layout. Binary search over
//! the estimator, which is cheap, so no trial runs.

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
    /// The estimate at `value`.
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

fn check_margin(margin: f64) -> Result<()> {
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

/// Largest value of `target` in `[1, most(..)]` whose peak total fits `usable` bytes.
fn largest_fitting(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    target: FitTarget,
    usable: u64,
) -> Result<(u64, Estimate)> {
    let most = most(model, workload, target);
    let fits = |value: u64| -> Result<(bool, Estimate)> {
        let e = estimate(model, &target.apply(workload, value), overheads)?;
        Ok((e.peak_total_bytes <= usable, e))
    };
    let (ok, smallest) = fits(1)?;
    if !ok {
        return Err(PlanError::NothingFits {
            what: target.name(),
            smallest: 1,
            needed_gib: smallest.peak_total_bytes as f64 / (1u64 << 30) as f64,
            usable_gib: usable as f64 / (1u64 << 30) as f64,
        });
    }
    // Exponential search for an upper bound, then bisection: peak memory grows with both.
    let (mut low, mut best) = (1, smallest);
    let mut high = 2;
    while high <= most {
        let (ok, e) = fits(high)?;
        if !ok {
            break;
        }
        (low, best) = (high, e);
        high *= 2;
    }
    let mut high = high.min(most + 1);
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        let (ok, e) = fits(mid)?;
        if ok {
            (low, best) = (mid, e);
        } else {
            high = mid;
        }
    }
    Ok((low, best))
}

/// Finds the largest micro-batch (or sequence) that fits `gpu_bytes` with `margin`, and the
/// accumulation reaching `global_batch` (accumulating keeps gradients alive during forward, so
/// the search is redone with accumulation when one is needed).
pub fn fit(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    target: FitTarget,
    gpu_bytes: u64,
    margin: f64,
    global_batch: Option<u64>,
) -> Result<Fit> {
    check_margin(margin)?;
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
    let mut current = workload.clone();
    let (mut value, mut best) = largest_fitting(model, &current, overheads, target, usable)?;
    let accumulation_for =
        |micro: u64| global_batch.map_or(workload.grad_accum, |g| g.div_ceil(micro * dp).max(1));
    let micro_batch = |w: &Workload, v: u64| {
        if target == FitTarget::Batch {
            v
        } else {
            w.batch
        }
    };
    let mut grad_accum = accumulation_for(micro_batch(&current, value));
    if grad_accum > 1 && current.grad_accum == 1 {
        current.grad_accum = grad_accum;
        (value, best) = largest_fitting(model, &current, overheads, target, usable)?;
        grad_accum = accumulation_for(micro_batch(&current, value)).max(2);
    }
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
                current.grad_accum = grad_accum;
                best = estimate(model, &target.apply(&current, value), overheads)?;
            }
        }
    }
    let micro = micro_batch(&current, value);
    let mut fitted = target.apply(&current, value);
    fitted.grad_accum = grad_accum;
    Ok(Fit {
        workload: fitted,
        target,
        value,
        margin,
        gpu_bytes,
        usable_bytes: usable,
        grad_accum,
        global_batch: micro * dp * grad_accum,
        estimate: best,
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
