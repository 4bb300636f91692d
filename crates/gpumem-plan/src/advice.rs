//! Advice: concrete changes to a plan, each re-estimated, ranked by memory saved, with its cost.

use crate::checks::check;
use crate::error::Result;
use crate::estimate::{estimate, Estimate, Overheads};
use crate::fit::{fit_measured, FitGoal, FitTarget};
use crate::model::{Architecture, ModelSpec};
use crate::quant::{QuantFormat, Quantization};
use crate::workload::{
    Attention, BaseQuant, Checkpointing, Dtype, FsdpSharding, Lora, Mode, Offload, Optimizer,
    OptimizerImpl, Sharding, Workload,
};
use serde::Serialize;

/// How the peak total of a plan is measured when changes to it are compared or a fit is
/// searched: the estimate's own ([`Estimated`]: allocated plus the allocator share plus the
/// context), or another (the `gpumem_replay` crate replays the plan's allocation sequence
/// through PyTorch's allocator for reserved memory).
pub trait PeakMeasure {
    /// Peak total bytes (reserved plus context) of `workload` on `model`.
    fn peak_total(
        &self,
        model: &ModelSpec,
        workload: &Workload,
        overheads: &Overheads,
    ) -> Result<u64>;

    /// The estimate of `workload` on `model` whose peak total is [`PeakMeasure::peak_total`]'s:
    /// by default the estimate with the reserved memory that total leaves beside the context
    /// and NCCL's memory.
    fn measure(
        &self,
        model: &ModelSpec,
        workload: &Workload,
        overheads: &Overheads,
    ) -> Result<Estimate> {
        let planned = estimate(model, workload, overheads)?;
        let outside = planned.breakdown.framework + planned.breakdown.communication;
        let total = self.peak_total(model, workload, overheads)?;
        Ok(planned.with_reserved(total.saturating_sub(outside)))
    }
}

/// The estimate's peak total ([`crate::Estimate::peak_total_bytes`]): milliseconds for any
/// number of candidates, no allocator replay.
pub struct Estimated;

impl PeakMeasure for Estimated {
    fn peak_total(
        &self,
        model: &ModelSpec,
        workload: &Workload,
        overheads: &Overheads,
    ) -> Result<u64> {
        Ok(estimate(model, workload, overheads)?.peak_total_bytes)
    }

    fn measure(
        &self,
        model: &ModelSpec,
        workload: &Workload,
        overheads: &Overheads,
    ) -> Result<Estimate> {
        estimate(model, workload, overheads)
    }
}

/// One suggested change and its effect.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suggestion {
    /// What to change, as a flag or setting.
    pub change: String,
    /// Peak total bytes after the change.
    pub new_peak_total_bytes: u64,
    /// Bytes saved against the current plan (negative: the change needs more).
    pub saved_bytes: i64,
    /// What the change costs (compute, quality, hardware).
    pub cost: &'static str,
    /// Whether the changed plan fits the GPU (when one is given).
    pub fits: Option<bool>,
}

/// A candidate change: description, cost, and the modified workload (None when the model cannot
/// run it).
type Candidate = (String, &'static str, Option<Workload>);

/// The changes worth re-estimating for `w`, in the order they are offered.
fn candidates(model: &ModelSpec, w: &Workload) -> Vec<Candidate> {
    let mut list = precision_candidates(model, w);
    if w.mode == Mode::Train {
        list.extend(training_candidates(model, w));
        list.extend(sharding_and_accumulation_candidates(model, w));
    }
    list.extend(forward_candidates(model, w));
    list
}

/// `w` changed by `change`, or None when the model cannot run it (a LoRA rank above a toy
/// model's width, accumulation past the size bound): such a change is no advice.
fn runnable(model: &ModelSpec, w: &Workload, change: &dyn Fn(&mut Workload)) -> Option<Workload> {
    let mut changed = w.clone();
    change(&mut changed);
    check(model, &changed).is_ok().then_some(changed)
}

/// Mixed precision or bf16 weights for an fp32 plan.
fn precision_candidates(model: &ModelSpec, w: &Workload) -> Vec<Candidate> {
    let with = |change: &dyn Fn(&mut Workload)| runnable(model, w, change);
    let mut list: Vec<Candidate> = Vec::new();
    if w.dtype == Dtype::Fp32 && w.amp.is_none() {
        list.push((
            "--amp bf16".into(),
            "none on Ampere or newer (fp16 with loss scaling on V100/T4)",
            with(&|x| x.amp = Some(Dtype::Bf16)),
        ));
        list.push((
            "--dtype bf16".into(),
            "pure bf16 weights and optimizer states: small precision risk for long training",
            with(&|x| x.dtype = Dtype::Bf16),
        ));
    }
    list
}

/// Training's cheaper states: checkpointing, a leaner optimizer, LoRA adapters.
fn training_candidates(model: &ModelSpec, w: &Workload) -> Vec<Candidate> {
    let transformer = matches!(model.arch, Architecture::Transformer(_));
    let with = |change: &dyn Fn(&mut Workload)| runnable(model, w, change);
    let mut list: Vec<Candidate> = Vec::new();
    if w.checkpointing == Checkpointing::None {
        list.push((
            "--grad-ckpt".into(),
            "~33% more compute (one extra forward per step)",
            with(&|x| x.checkpointing = Checkpointing::Full),
        ));
        if transformer {
            list.push((
                "--grad-ckpt-selective".into(),
                "~5% more compute (attention core recomputed)",
                with(&|x| x.checkpointing = Checkpointing::Selective),
            ));
        }
    }
    if matches!(w.optimizer, Optimizer::AdamW | Optimizer::Adam) {
        list.push((
            "--optimizer adam8bit".into(),
            "bitsandbytes dependency; usually no quality loss",
            with(&|x| x.optimizer = Optimizer::Adam8bit),
        ));
        list.push((
            "--optimizer adafactor".into(),
            "different optimizer dynamics; may need LR retuning",
            with(&|x| x.optimizer = Optimizer::Adafactor),
        ));
        if w.optimizer_impl != OptimizerImpl::Fused {
            list.push((
                "--optimizer-impl fused".into(),
                "none (PyTorch ≥ 2.0 on CUDA)",
                with(&|x| x.optimizer_impl = OptimizerImpl::Fused),
            ));
        }
    }
    if transformer && w.lora.is_none() {
        list.push((
            "--lora-rank 16".into(),
            "trains adapters only: a different fine-tune, not full training",
            with(&|x| x.lora = Some(Lora::new(16, BaseQuant::None))),
        ));
        // A 4-bit base computes in 16 bits: an fp32 plan moves to bf16 weights, and says so.
        let dtype = match w.dtype {
            Dtype::Fp32 => Dtype::Bf16,
            other => other,
        };
        list.push((
            if dtype == w.dtype {
                "--qlora"
            } else {
                "--qlora --dtype bf16"
            }
            .into(),
            "4-bit frozen base: ~20-30% slower steps, small quality loss",
            with(&|x| {
                x.lora = Some(Lora::new(16, BaseQuant::QLORA));
                x.dtype = dtype;
            }),
        ));
    }
    list
}

/// Training's next ZeRO stage or offload across data-parallel ranks, and a halved micro-batch.
fn sharding_and_accumulation_candidates(model: &ModelSpec, w: &Workload) -> Vec<Candidate> {
    let with = |change: &dyn Fn(&mut Workload)| runnable(model, w, change);
    let mut list: Vec<Candidate> = Vec::new();
    if w.layout.dp() > 1 {
        let next = match w.layout.sharding {
            Sharding::None => Some(("--zero 1", Sharding::Zero1)),
            Sharding::Zero1 => Some(("--zero 2", Sharding::Zero2)),
            Sharding::Zero2 => Some(("--zero 3", Sharding::Zero3)),
            Sharding::Zero3 | Sharding::Fsdp => None,
        };
        if let Some((flag, stage)) = next {
            list.push((
                flag.into(),
                "more communication (ZeRO-3: ~1.5× the traffic of DDP)",
                with(&|x| x.layout.sharding = stage),
            ));
        }
        // An FSDP strategy that shards less than FULL_SHARD over all ranks.
        if w.layout.sharding == Sharding::Fsdp && w.layout.fsdp_sharding != FsdpSharding::FullShard
        {
            list.push((
                "--fsdp-sharding full-shard".into(),
                "an all-gather of every unit again in backward (and across machines for a \
                 hybrid strategy)",
                with(&|x| x.layout.fsdp_sharding = FsdpSharding::FullShard),
            ));
        }
        if w.layout.offload != Offload::All && w.layout.sharding != Sharding::None {
            list.push((
                "--offload".into(),
                "CPU memory and PCIe time per step; often 2× slower",
                with(&|x| x.layout.offload = Offload::All),
            ));
        }
    }
    if w.batch > 1 {
        list.push((
            format!("--batch {} --grad-accum {}", w.batch / 2, w.grad_accum * 2),
            "same global batch; lower GPU utilisation per micro-step",
            with(&|x| {
                x.batch /= 2;
                x.grad_accum *= 2;
            }),
        ));
    }
    list
}

/// Changes to the forward pass and to inference: SDPA attention, quantised weights, no KV cache,
/// a halved batch.
fn forward_candidates(model: &ModelSpec, w: &Workload) -> Vec<Candidate> {
    let training = w.mode == Mode::Train;
    let transformer = matches!(model.arch, Architecture::Transformer(_));
    let with = |change: &dyn Fn(&mut Workload)| runnable(model, w, change);
    let mut list: Vec<Candidate> = Vec::new();
    if transformer && w.attention == Attention::Eager {
        list.push((
            "--attn sdpa".into(),
            "none (PyTorch ≥ 2.0)",
            with(&|x| x.attention = Attention::Sdpa),
        ));
    }
    if !training && transformer && w.quant.is_none() && w.lora.is_none() {
        list.push((
            "--quant int8".into(),
            "bitsandbytes LLM.int8 at load: slower matmuls, little quality loss",
            with(&|x| x.quant = Some(Quantization::of(QuantFormat::Int8))),
        ));
        list.push((
            "--quant nf4:double,compute=bf16".into(),
            "4-bit weights (bitsandbytes, or a GPTQ/AWQ checkpoint): some quality loss",
            with(&|x| {
                x.quant = Some(Quantization {
                    double_quant: true,
                    compute: Dtype::Bf16,
                    ..Quantization::of(QuantFormat::Nf4)
                })
            }),
        ));
    }
    if w.mode == Mode::Infer && w.use_cache && model.has_decoder() {
        list.push((
            "--no-cache".into(),
            "none unless the caller decodes from the returned past_key_values",
            with(&|x| x.use_cache = false),
        ));
    }
    if !training && w.batch > 1 {
        list.push((
            format!("--batch {}", w.batch / 2),
            "lower throughput",
            with(&|x| x.batch /= 2),
        ));
    }
    list
}

/// Ranks the applicable changes by memory saved (largest first; those saving less than
/// [`MIN_SAVING_SHARE`] of the peak are left out), each plan's peak taken by `measure`. With
/// `gpu_bytes`, marks which fit and, when the plan leaves most of the GPU idle, first suggests
/// the largest batch that fits.
pub fn advise(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    gpu_bytes: Option<u64>,
    measure: &dyn PeakMeasure,
) -> Result<Vec<Suggestion>> {
    let current = measure.peak_total(model, workload, overheads)?;
    let mut suggestions = Vec::new();
    for (change, cost, changed) in candidates(model, workload) {
        let Some(changed) = changed else { continue };
        let new_peak = measure.peak_total(model, &changed, overheads)?;
        let saved = current as i64 - new_peak as i64;
        if saved > 0 && saved as f64 >= current as f64 * MIN_SAVING_SHARE {
            suggestions.push(Suggestion {
                change,
                new_peak_total_bytes: new_peak,
                saved_bytes: saved,
                cost,
                fits: gpu_bytes.map(|g| new_peak <= g),
            });
        }
    }
    suggestions.sort_by_key(|s| std::cmp::Reverse(s.saved_bytes));
    if let Some(gpu) = gpu_bytes {
        if let Some(larger) = use_headroom(model, workload, overheads, gpu, current, measure)? {
            suggestions.insert(0, larger);
        }
    }
    Ok(suggestions)
}

/// Changes applied one after another, each the largest remaining saving by `measure`, until the
/// plan fits `gpu_bytes` (None when even all of them do not suffice). Returns the flags (each
/// once, at its last value), the final workload and its peak.
pub fn combine_until_fits(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    gpu_bytes: u64,
    measure: &dyn PeakMeasure,
) -> Result<Option<(Vec<String>, Workload, u64)>> {
    let mut current = workload.clone();
    let mut peak = measure.peak_total(model, &current, overheads)?;
    let mut changes = Vec::new();
    while peak > gpu_bytes {
        let mut best: Option<(String, Workload, u64)> = None;
        for (change, _, changed) in candidates(model, &current) {
            let Some(changed) = changed else { continue };
            let new_peak = measure.peak_total(model, &changed, overheads)?;
            if new_peak < best.as_ref().map_or(peak, |b| b.2) {
                best = Some((change, changed, new_peak));
            }
        }
        let Some((change, changed, new_peak)) = best else {
            return Ok(None);
        };
        changes.push(change);
        (current, peak) = (changed, new_peak);
    }
    Ok(Some((merge_flags(&changes), current, peak)))
}

/// The flags of `changes` (each one or more `--flag [value]`), each flag once where it was
/// first set, at the value set last: halving the batch twice is `--batch 1 --grad-accum 4`,
/// not `--batch 2 --grad-accum 2 --batch 1 --grad-accum 4`, which no command line takes.
fn merge_flags(changes: &[String]) -> Vec<String> {
    let mut flags: Vec<String> = Vec::new();
    for flag in changes.iter().flat_map(|c| c.split(" --")) {
        let flag = format!("--{}", flag.trim_start_matches("--"));
        let name = |f: &str| f.split(' ').next().unwrap_or_default().to_string();
        match flags.iter_mut().find(|kept| name(kept) == name(&flag)) {
            Some(kept) => *kept = flag,
            None => flags.push(flag),
        }
    }
    flags
}

/// Least share of the peak a change must save to be advised: below it the saving is within
/// the planner's own error and the change's cost (checkpointing's recomputation, say) buys
/// nothing, as for checkpointing a one-token step.
pub const MIN_SAVING_SHARE: f64 = 0.005;

/// Share of GPU memory below which a fitting plan is said to leave the GPU idle.
pub const IDLE_SHARE: f64 = 0.5;

/// Safety margin kept when suggesting a larger batch: a fit's default.
pub const HEADROOM_MARGIN: f64 = crate::fit::DEFAULT_MARGIN;

/// When the plan uses less than [`IDLE_SHARE`] of the GPU, the largest batch whose peak by
/// `measure` keeps [`HEADROOM_MARGIN`] of it free.
fn use_headroom(
    model: &ModelSpec,
    workload: &Workload,
    overheads: &Overheads,
    gpu: u64,
    current: u64,
    measure: &dyn PeakMeasure,
) -> Result<Option<Suggestion>> {
    if current as f64 >= IDLE_SHARE * gpu as f64 {
        return Ok(None);
    }
    let goal = FitGoal {
        target: FitTarget::Batch,
        gpu_bytes: gpu,
        margin: HEADROOM_MARGIN,
        global_batch: None,
    };
    let larger = fit_measured(model, workload, overheads, &goal, measure)?;
    if larger.value <= workload.batch {
        return Ok(None);
    }
    let new_peak = larger.estimate.peak_total_bytes;
    Ok(Some(Suggestion {
        change: format!("--batch {}", larger.value),
        new_peak_total_bytes: new_peak,
        saved_bytes: current as i64 - new_peak as i64,
        cost: "none: uses idle memory for throughput (10% margin kept)",
        fits: Some(new_peak <= gpu),
    }))
}
