//! The estimator: a phase-by-phase replay of live tensors through one step (forward, backward,
//! optimizer step; or prefill and decode) on top of the model states per GPU (`states`),
//! reporting the peak and its phase.

use crate::checks::check;
use crate::distributed::{nccl_bytes, reduced_at_backward_end};
use crate::error::{PlanError, Result};
use crate::graph::build_units;
use crate::model::{ModelSpec, ParamCounts};
use crate::releases::OldRelease;
use crate::states::{model_states, trainable_params, States};
use crate::unit::{Unit, ACCUMULATION_COPIES};
use crate::warning::Warning;
use crate::workload::{Checkpointing, Mode, Optimizer, Workload};
use serde::Serialize;

/// CUDA context and kernels of one process (CUDA ≥ 11.7 with lazy loading); the cuBLAS
/// workspaces are PyTorch allocations (`Breakdown::blas_workspace`).
pub const DEFAULT_CONTEXT_BYTES: u64 = 500 << 20;

/// Share of allocated bytes the caching allocator keeps reserved on top (block rounding and
/// fragmentation; +5–10 % on the published V100 bert-large points).
pub const DEFAULT_ALLOCATOR_FRACTION: f64 = 0.06;

/// Memory outside PyTorch tensors.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Overheads {
    /// CUDA context + framework bytes per process.
    pub context_bytes: u64,
    /// Reserved-but-unallocated share of allocated bytes.
    pub allocator_fraction: f64,
}

impl Default for Overheads {
    fn default() -> Self {
        Overheads {
            context_bytes: DEFAULT_CONTEXT_BYTES,
            allocator_fraction: DEFAULT_ALLOCATOR_FRACTION,
        }
    }
}

/// Where in the step the memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the first step: what the framework puts on the GPU while it sets the model up
    /// (DeepSpeed ZeRO-3 without `zero.Init`: the whole model, then its partitions; see
    /// [`crate::sequence::startup_sequence`]).
    Startup,
    /// Inside the forward pass (a transient: attention scores, logits and the loss).
    Forward,
    /// After the forward pass: all saved activations alive.
    ForwardEnd,
    /// Inside the backward pass: gradients appear as activations are freed.
    Backward,
    /// Inside `optimizer.step()`: gradients, states and step temporaries.
    OptimizerStep,
    /// Prompt processing of generation (or a plain no-grad forward).
    Prefill,
    /// Token-by-token decoding with a full KV cache.
    Decode,
}

impl Phase {
    /// Human-readable name.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Startup => "start-up",
            Phase::Forward => "forward",
            Phase::ForwardEnd => "forward end",
            Phase::Backward => "backward",
            Phase::OptimizerStep => "optimizer step",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

/// Bytes by kind, at one moment of the step.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Breakdown {
    /// Model weights (and buffers, gathered ZeRO-3 layers).
    pub weights: u64,
    /// Parameter gradients (and DDP/ZeRO buckets).
    pub gradients: u64,
    /// Optimizer states, fp32 master weights included.
    pub optimizer_states: u64,
    /// Activations saved for backward (or alive in a no-grad forward).
    pub activations: u64,
    /// Key/value cache.
    pub kv_cache: u64,
    /// Short-lived tensors: logits and loss, gradients of activations, optimizer-step buffers.
    pub temporaries: u64,
    /// cuBLAS workspaces, allocated through PyTorch's allocator at the first matrix product of
    /// each thread and stream and kept: the forward's, and the autograd engine's in training.
    pub blas_workspace: u64,
    /// CUDA context, kernels and framework, outside the allocator.
    pub framework: u64,
    /// NCCL's communicators (their buffers and the rest), outside the allocator (in
    /// nvidia-smi, not in reserved).
    pub communication: u64,
    /// Reserved by the caching allocator but not allocated.
    pub allocator: u64,
}

impl Breakdown {
    /// Tensor bytes (what `torch.cuda.max_memory_allocated` reports).
    pub fn allocated(&self) -> u64 {
        self.weights
            + self.gradients
            + self.optimizer_states
            + self.activations
            + self.kv_cache
            + self.temporaries
            + self.blas_workspace
    }

    /// Named entries, largest first, for printing.
    pub fn entries(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer_states", self.optimizer_states),
            ("activations", self.activations),
            ("kv_cache", self.kv_cache),
            ("temporaries", self.temporaries),
            ("blas_workspace", self.blas_workspace),
            ("framework", self.framework),
            ("communication", self.communication),
            ("allocator", self.allocator),
        ]
    }
}

/// What the KV cache of an estimate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheKind {
    /// The cache a plain inference forward builds and returns (`use_cache`, on in Hugging Face
    /// configs); `--no-cache` (`use_cache=False`) drops it.
    Returned,
    /// The cache generation prefills and decodes with.
    Generation,
}

impl KvCacheKind {
    /// A note for the breakdown line.
    pub fn note(self) -> &'static str {
        match self {
            KvCacheKind::Returned => "returned by the forward, use_cache=True; --no-cache drops it",
            KvCacheKind::Generation => "prompt and generated tokens",
        }
    }
}

/// Peak of one phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhasePeak {
    /// The phase.
    pub phase: Phase,
    /// Peak allocated bytes within it.
    pub allocated_bytes: u64,
}

/// The answer for one GPU (the busiest).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// Tensor bytes at the peak (comparable with `torch.cuda.max_memory_allocated`).
    pub peak_allocated_bytes: u64,
    /// Allocated plus allocator overhead (comparable with `max_memory_reserved`).
    pub peak_reserved_bytes: u64,
    /// Reserved plus CUDA context, framework and NCCL memory (comparable with nvidia-smi).
    pub peak_total_bytes: u64,
    /// Phase holding the peak.
    pub peak_phase: Phase,
    /// What the peak consists of.
    pub breakdown: Breakdown,
    /// What the breakdown's KV cache is, when it holds one.
    pub kv_cache_kind: Option<KvCacheKind>,
    /// The peak of every phase, in step order.
    pub phases: Vec<PhasePeak>,
    /// Parameters of the whole model.
    pub total_params: u64,
    /// Parameters being trained (all, or the LoRA adapters).
    pub trainable_params: u64,
    /// What the workload asks that a run would do, but probably not as meant.
    pub warnings: Vec<Warning>,
}

/// Estimates the peak memory of `workload` on `model` for the busiest GPU.
pub fn estimate(model: &ModelSpec, workload: &Workload, overheads: &Overheads) -> Result<Estimate> {
    let mut warnings = check(model, workload)?;
    let counts = model.params();
    let trainable = trainable_params(model, workload, &counts);
    let mut peaks: Vec<(Phase, Breakdown)> = match workload.mode {
        Mode::Train => {
            let (first, last) = training_stages(model, workload, &counts, trainable);
            warnings.extend(selective_without_scores(model, workload, &first.units));
            let mut peaks = first.peaks;
            if let Some(last) = last {
                merge_busiest(&mut peaks, last.peaks);
            }
            let startup = crate::sequence::startup_peak(model, workload)?;
            if startup > 0 {
                let weights = Breakdown {
                    weights: startup,
                    ..Breakdown::default()
                };
                peaks.insert(0, (Phase::Startup, weights));
            }
            peaks
        }
        Mode::Infer | Mode::Generate => {
            let units = build_units(model, workload, workload.batch);
            let states = model_states(model, workload, &counts, &units, trainable);
            simulate_inference(model, &units, &states, workload)
        }
    };
    let workspace = blas_workspace_count(workload.mode) * workload.blas_workspace;
    // No matrix product runs before the first step.
    for (_, phase) in peaks.iter_mut().filter(|(p, _)| *p != Phase::Startup) {
        phase.blas_workspace = workspace;
    }
    check_bounded(model, workload, &peaks)?;
    let (peak_phase, mut breakdown) = peaks
        .iter()
        .copied()
        .max_by_key(|(_, b)| b.allocated())
        .unwrap_or((Phase::Forward, Breakdown::default()));
    let allocated = breakdown.allocated();
    breakdown.allocator = bytes(allocated as f64 * overheads.allocator_fraction);
    breakdown.framework = overheads.context_bytes.min(MAX_BYTES);
    breakdown.communication = match workload.mode {
        Mode::Train => nccl_bytes(&workload.layout),
        // Inference shards only over tensor-parallel ranks.
        Mode::Infer | Mode::Generate => nccl_bytes(&crate::workload::Layout {
            gpus: workload.layout.tp,
            pp: 1,
            ..workload.layout
        }),
    };
    let phases = peaks
        .drain(..)
        .map(|(phase, b)| PhasePeak {
            phase,
            allocated_bytes: b.allocated(),
        })
        .collect();
    let kv_cache_kind = match (workload.mode, breakdown.kv_cache) {
        (_, 0) | (Mode::Train, _) => None,
        (Mode::Generate, _) => Some(KvCacheKind::Generation),
        (Mode::Infer, _) => Some(KvCacheKind::Returned),
    };
    Ok(Estimate {
        peak_allocated_bytes: allocated,
        peak_reserved_bytes: allocated + breakdown.allocator,
        peak_total_bytes: allocated
            + breakdown.allocator
            + breakdown.framework
            + breakdown.communication,
        peak_phase,
        breakdown,
        kv_cache_kind,
        phases,
        total_params: counts.total(),
        trainable_params: trainable,
        warnings,
    })
}

/// How many cuBLAS workspaces a step makes: one for the thread that runs the forward, and one
/// more in training for the autograd engine's device thread, which runs the backward (seen on
/// an H200, docs/gpu.md).
pub fn blas_workspace_count(mode: Mode) -> u64 {
    match mode {
        Mode::Train => 2,
        Mode::Infer | Mode::Generate => 1,
    }
}

impl Estimate {
    /// This estimate with its reserved memory measured elsewhere (the allocation sequence
    /// replayed through an allocator policy): the allocator share becomes what that reserve
    /// holds beyond the tensors (never below zero), and total follows (with the context and
    /// NCCL's memory, which live outside the pool).
    pub fn with_reserved(mut self, reserved_bytes: u64) -> Estimate {
        let allocated = self.peak_allocated_bytes;
        self.breakdown.allocator = reserved_bytes.saturating_sub(allocated);
        self.peak_reserved_bytes = allocated + self.breakdown.allocator;
        self.peak_total_bytes =
            self.peak_reserved_bytes + self.breakdown.framework + self.breakdown.communication;
        self
    }
}

/// Keeps, per phase, the larger of two pipeline stages' peaks.
fn merge_busiest(peaks: &mut [(Phase, Breakdown)], stage: Vec<(Phase, Breakdown)>) {
    for ((_, kept), (_, new)) in peaks.iter_mut().zip(stage) {
        if new.allocated() > kept.allocated() {
            *kept = new;
        }
    }
}

/// One pipeline stage of a training step on one GPU (the whole model without pipeline
/// parallelism): its units, the micro-batches whose activations it holds at once, and the
/// peaks of its phases.
pub(crate) struct Stage {
    /// The stage's units, in forward order.
    pub(crate) units: Vec<Unit>,
    /// Micro-batches in flight (1F1B: the first stage holds up to `pp`).
    pub(crate) in_flight: f64,
    /// Its phases' peaks (without the cuBLAS workspaces, the same on every stage).
    peaks: Vec<(Phase, Breakdown)>,
}

impl Stage {
    /// The stage's peak allocated bytes over its phases.
    fn peak(&self) -> u64 {
        self.peaks
            .iter()
            .map(|(_, b)| b.allocated())
            .max()
            .unwrap_or(0)
    }
}

/// The pipeline stages of a training step ([`pipeline_stages`]), each simulated over its own
/// model states: the first, and the last where there is pipeline parallelism.
fn training_stages(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    trainable: u64,
) -> (Stage, Option<Stage>) {
    let stage = |units: Vec<Unit>, in_flight: f64| {
        let states = model_states(model, workload, counts, &units, trainable);
        let peaks = simulate_training(&units, &states, workload, in_flight);
        Stage {
            units,
            in_flight,
            peaks,
        }
    };
    let ((first, in_flight), last) = pipeline_stages(model, workload);
    (stage(first, in_flight), last.map(|units| stage(units, 1.0)))
}

/// The pipeline stage of a training step whose peak is the step's: the one the busiest GPU
/// runs, which the allocation sequence plans ([`crate::sequence::allocation_sequence`]).
pub(crate) fn busiest_stage(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    trainable: u64,
) -> Stage {
    match training_stages(model, workload, counts, trainable) {
        (first, Some(last)) if last.peak() > first.peak() => last,
        (first, _) => first,
    }
}

/// Pipeline stages to evaluate: the first (most activations in flight) with its micro-batches
/// in flight, and, with pipeline parallelism, the last (the head).
fn pipeline_stages(
    model: &ModelSpec,
    workload: &Workload,
) -> ((Vec<Unit>, f64), Option<Vec<Unit>>) {
    let units = build_units(model, workload, workload.batch);
    let stages = workload.layout.pp as usize;
    if stages == 1 {
        return ((units, 1.0), None);
    }
    // The stages split the language model's blocks; a vision-language model's tower and
    // projector, which run before its embeddings, are the first stage's.
    let start = units
        .iter()
        .rposition(|u| u.name == "embeddings")
        .unwrap_or(0);
    let blocks = units[start..].iter().filter(|u| u.name == "block").count();
    let per_stage = blocks.div_ceil(stages);
    let first: Vec<Unit> = units.iter().take(start + 1 + per_stage).cloned().collect();
    let last_blocks = blocks.saturating_sub(per_stage * (stages - 1)).max(1);
    let mut last: Vec<Unit> = units.iter().rev().take(1 + last_blocks).cloned().collect();
    last.reverse();
    // 1F1B: the first stage holds `pp` micro-batches in flight when there are that many.
    let in_flight = (workload.grad_accum.min(workload.layout.pp)) as f64;
    ((first, in_flight), Some(last))
}

/// What a unit saves for backward under the checkpointing policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Kept {
    /// Bytes saved from the forward.
    pub(crate) saved: f64,
    /// Bytes its backward recomputes.
    pub(crate) recomputed: f64,
    /// A checkpoint wraps the whole unit (full, every-k-th, per-op): its forward saves nothing
    /// but the checkpoint's input, what it would save existing only from its recomputation to
    /// its backward.
    pub(crate) wrapped: bool,
}

impl Kept {
    /// Whether `unit`'s forward keeps its checkpoint's input alone (full or every-k-th
    /// checkpointing of this block): it runs as [`Unit::checkpointed_forward`].
    pub(crate) fn input_only(&self, unit: &Unit) -> bool {
        self.wrapped && unit.checkpoint == Some(self.saved)
    }
}

/// Saved bytes of each unit under the checkpointing policy, and what its backward recomputes.
/// Checkpointable units (blocks) are counted in order for every-k-th-layer checkpointing.
pub(crate) fn kept_and_recomputed(units: &[Unit], policy: Checkpointing) -> Vec<Kept> {
    let mut block = 0;
    units
        .iter()
        .map(|unit| {
            let whole = |saved, recomputed| Kept {
                saved,
                recomputed,
                wrapped: true,
            };
            let part = |saved, recomputed| Kept {
                saved,
                recomputed,
                wrapped: false,
            };
            let Some(input) = unit.checkpoint else {
                return part(unit.saved, 0.0);
            };
            let covered = policy.covers_block(block);
            block += 1;
            match policy {
                _ if !covered => part(unit.saved, 0.0),
                Checkpointing::Full | Checkpointing::EveryNth(_) => whole(input, unit.saved),
                Checkpointing::Selective => {
                    part(unit.saved - unit.attention_core, unit.attention_core)
                }
                // The saved op outputs are cached, not recomputed.
                Checkpointing::PerOp => whole(
                    input + unit.per_op_saved,
                    (unit.saved - unit.per_op_saved).max(0.0),
                ),
                Checkpointing::None => part(unit.saved, 0.0),
            }
        })
        .collect()
}

/// The planner's bound on the memory of one moment on one GPU: 2⁴⁸ bytes (256 TiB), about a
/// thousand times the largest GPU's memory, and a quarter of the largest simulated device the
/// allocation sequence is replayed on (1 PiB), so that every allocator policy's reserve of a
/// plan within the bound fits there. A breakdown entry saturates here, so that sums of
/// entries never overflow, and a phase that reaches it is an error (`past_bound`), never a
/// saturated figure.
pub const MAX_BYTES: u64 = 1 << 48;

/// Bytes of a modelled quantity, rounded and saturated at [`MAX_BYTES`].
fn bytes(x: f64) -> u64 {
    (x.max(0.0).round() as u64).min(MAX_BYTES)
}

/// The error for a plan whose `moment` (a phase, what it mostly holds) reaches [`MAX_BYTES`]
/// under the sizes `value` names; `advice` says what to make smaller.
pub(crate) fn past_bound(value: String, moment: String, advice: &str) -> PlanError {
    PlanError::InvalidValue {
        name: "workload".into(),
        value,
        reason: format!(
            "{moment} reaches the planner's bound of {MAX_BYTES} bytes (2⁴⁸, 256 TiB) on one \
             GPU, far beyond any GPU's memory; {advice}"
        ),
    }
}

/// Refuses a plan one of whose phases reaches [`MAX_BYTES`] allocated: its figures would be
/// saturated, not planned ([`past_bound`], naming the phase, its largest entry and the
/// workload's sizes).
fn check_bounded(
    model: &ModelSpec,
    workload: &Workload,
    peaks: &[(Phase, Breakdown)],
) -> Result<()> {
    let Some((phase, breakdown)) = peaks.iter().find(|(_, b)| b.allocated() >= MAX_BYTES) else {
        return Ok(());
    };
    // The first of the largest entries (saturated ones tie).
    let (largest, _) = breakdown
        .entries()
        .into_iter()
        .rev()
        .max_by_key(|(_, bytes)| *bytes)
        .unwrap_or(("memory", 0));
    let mut sizes = vec![format!("batch {}", workload.batch)];
    if model.reads_tokens() {
        sizes.push(format!("seq {}", workload.seq));
    }
    if workload.mode == Mode::Generate {
        sizes.push(format!("new-tokens {}", workload.new_tokens));
    }
    if model.reads_images() {
        sizes.push(format!("image-size {}", workload.image_size));
    }
    Err(past_bound(
        sizes.join(", "),
        format!("its {} phase, mostly {largest},", phase.label()),
        "plan a smaller batch, sequence or image",
    ))
}

/// `--grad-ckpt-selective` recomputes what the attention cores save: where no unit saves any
/// (a fused SDPA or FlashAttention kernel keeps no score matrix; a CNN has no attention), it
/// changes nothing, which is warned about.
fn selective_without_scores(
    model: &ModelSpec,
    workload: &Workload,
    units: &[Unit],
) -> Option<Warning> {
    let nothing = units.iter().all(|u| u.attention_core == 0.0);
    (workload.checkpointing == Checkpointing::Selective && nothing).then(|| Warning::Ignored {
        flag: "--grad-ckpt-selective",
        reason: format!(
            "{}'s attention saves no score matrices for backward (a fused attention kernel, or \
             no attention), so recomputing its core frees nothing; --grad-ckpt recomputes \
             whole blocks",
            model.name
        ),
    })
}

fn simulate_training(
    units: &[Unit],
    states: &States,
    workload: &Workload,
    in_flight: f64,
) -> Vec<(Phase, Breakdown)> {
    let total_params: f64 = units.iter().map(|u| u.trained_params() as f64).sum();
    let all_gradients = total_params * states.grad_per_param;
    let accumulating = accumulates_gradients(workload);
    let kept = kept_and_recomputed(units, workload.checkpointing);
    let gradients_in_forward = if accumulating { all_gradients } else { 0.0 };
    let (forward, forward_end, activations) = simulate_forward(
        units,
        &kept,
        states,
        in_flight,
        gradients_in_forward,
        previous_outputs(units, workload),
    );
    let backward = simulate_backward(
        units,
        &kept,
        states,
        workload,
        in_flight,
        gradients_in_forward,
        activations,
    );
    let mut phases = vec![
        (Phase::Forward, forward),
        (Phase::ForwardEnd, forward_end),
        (Phase::Backward, backward),
    ];
    // Without an optimizer the step ends with backward, its gradients allocated.
    if workload.optimizer != Optimizer::None {
        // What the units hold until the step ends (outputs the caller holds) lives through it.
        let held = units.iter().map(|u| u.held).sum();
        let step = phase_breakdown(
            states,
            (0.0, 0.0),
            all_gradients,
            held,
            states.step_temporaries,
        );
        phases.push((Phase::OptimizerStep, step));
    }
    phases
}

/// Whether gradients live across steps (accumulation, kept by the caller, or ZeRO-3's flat
/// buffer of gradient partitions: `distributed::zero3_keeps_gradient_partitions`).
pub(crate) fn accumulates_gradients(workload: &Workload) -> bool {
    workload.grad_accum > 1
        || workload.keep_grads
        || crate::distributed::zero3_keeps_gradient_partitions(workload)
}

/// A training phase's breakdown: the step's states and buffers, plus `extra`, the phase's
/// (weights, gradients) buffers on top of those of the whole step.
fn phase_breakdown(
    states: &States,
    extra: (f64, f64),
    gradients: f64,
    activations: f64,
    temporaries: f64,
) -> Breakdown {
    let buffers = &states.buffers;
    Breakdown {
        weights: bytes(states.weights + buffers.step_weights + extra.0),
        gradients: bytes(gradients + buffers.step_gradients + extra.1),
        optimizer_states: bytes(states.optimizer),
        activations: bytes(activations),
        temporaries: bytes(temporaries),
        ..Breakdown::default()
    }
}

/// Bytes of the previous step's outputs alive through a step's forward: a loop that keeps its
/// last outputs (`outputs = model(...)` rebinds only when the forward returns) holds what they
/// still reference (`Unit::retained`) until then.
fn previous_outputs(units: &[Unit], workload: &Workload) -> f64 {
    if workload.keep_outputs && workload.mode == Mode::Train {
        units.iter().map(|u| u.retained).sum()
    } else {
        0.0
    }
}

/// Activation bytes live when the forward ends, with `in_flight` micro-batches.
#[derive(Clone, Copy)]
struct ForwardActivations {
    /// Saved for the backward.
    saved: f64,
    /// Held until the step ends.
    held: f64,
    /// Gathered weights saved or kept for the backward ([`States::saved_linears`],
    /// [`States::gathered_through_backward`]).
    linears: f64,
}

/// The forward's peak and its end, unit by unit, and the activations it leaves;
/// `previous_outputs`: the last step's outputs, alive until the forward returns.
fn simulate_forward(
    units: &[Unit],
    kept: &[Kept],
    states: &States,
    in_flight: f64,
    gradients_in_forward: f64,
    previous_outputs: f64,
) -> (Breakdown, Breakdown, ForwardActivations) {
    let in_forward = |linears: f64| (states.buffers.forward_weights + linears, 0.0);
    let mut forward = Breakdown::default();
    let mut saved = 0.0;
    let mut held = 0.0;
    let mut forward_held = 0.0;
    let mut linears = 0.0;
    for (unit, kept) in units.iter().zip(kept) {
        // A unit kept gathered to its backward is gathered as its forward starts.
        linears += states.gathered_through_backward(unit);
        let transient = if kept.input_only(unit) {
            unit.checkpointed_forward_transient()
        } else {
            unit.forward_transient
        };
        let live = phase_breakdown(
            states,
            in_forward(linears),
            gradients_in_forward,
            previous_outputs + saved + held + forward_held + kept.saved,
            transient,
        );
        if live.allocated() > forward.allocated() {
            forward = live;
        }
        saved += kept.saved * in_flight;
        held += unit.held;
        forward_held += unit.forward_held;
        if !kept.wrapped {
            linears += states.saved_linears(unit) * in_flight;
        }
    }
    let forward_end = phase_breakdown(
        states,
        in_forward(linears),
        gradients_in_forward,
        previous_outputs + saved + held + forward_held,
        0.0,
    );
    (
        forward,
        forward_end,
        ForwardActivations {
            saved,
            held,
            linears,
        },
    )
}

/// The backward's peak: units in reverse, each at the start of its backward and as its
/// parameter gradients appear, then the backward's last reductions.
fn simulate_backward(
    units: &[Unit],
    kept: &[Kept],
    states: &States,
    workload: &Workload,
    in_flight: f64,
    gradients_in_forward: f64,
    activations: ForwardActivations,
) -> Breakdown {
    let accumulating = accumulates_gradients(workload);
    let buffers = &states.buffers;
    let in_backward = (buffers.backward_weights, buffers.backward_gradients);
    let backward_start = (buffers.backward_start_weights, 0.0);
    let ForwardActivations {
        mut saved,
        held,
        mut linears,
    } = activations;
    // A phase's gathered weights with `linears` saved ones on top.
    let with = |(weights, gradients): (f64, f64), linears: f64| (weights + linears, gradients);
    let mut backward = Breakdown::default();
    let mut gradients = gradients_in_forward;
    let mut deferred = 0.0;
    for (index, (unit, kept)) in units.iter().zip(kept).enumerate().rev() {
        let mut new_gradients = unit.trained_params() as f64 * states.grad_per_param;
        // (Accumulating under `no_sync`, FSDP keeps unsharded gradients and reduces none.)
        if !accumulating && reduced_at_backward_end(workload, unit) {
            deferred += new_gradients;
            new_gradients = 0.0;
        }
        // Accumulating into existing gradients: the new one and the sum exist briefly.
        let (grown, transient_gradients) = if accumulating {
            (0.0, ACCUMULATION_COPIES * new_gradients)
        } else {
            (new_gradients, 0.0)
        };
        // Two moments: the unit's backward starts (all its saved tensors, no gradients yet) and
        // its parameter gradients appear (its saved tensors released).
        // The embeddings' backward runs with every block resharded; the head's starts before
        // any parameter gradient exists.
        let extra = if index == 0 {
            buffers.backward_last
        } else {
            in_backward
        };
        // A wrapped unit's recomputation saves its gathered weights again, to its backward.
        let own_linears = states.saved_linears(unit);
        let recomputed_linears = if kept.wrapped { own_linears } else { 0.0 };
        let starting = phase_breakdown(
            states,
            with(
                if index + 1 == units.len() {
                    backward_start
                } else {
                    extra
                },
                linears + recomputed_linears,
            ),
            gradients,
            saved + held,
            // A recomputing unit first runs its forward again in grad mode, its short-lived
            // tensors beside what it saves and the gradient that arrived (which is what
            // starts the recomputation).
            kept.recomputed
                + unit.backward_transient.max(if kept.recomputed > 0.0 {
                    unit.forward_transient + unit.gradient_transient + unit.pre_recompute_gradient
                } else {
                    0.0
                }),
        );
        saved -= kept.saved * in_flight;
        if !kept.wrapped {
            linears -= own_linears * in_flight;
        }
        // The head's unsharded gradient, where the layout keeps one, while the head finishes;
        // the block before, where it is gathered only now, and the all-gather's copy, with
        // the block's first norm still to run its backward: what it saved beside the copy,
        // its fp32 temporaries once the copy is gone.
        let (prefetched, gather_copy) = buffers.prefetched_by(units, index);
        let finishing_extra = if index + 1 == units.len() {
            (extra.0, extra.1 + buffers.head_gradients)
        } else {
            (extra.0 + prefetched + gather_copy, extra.1)
        };
        let first_norm = if prefetched > 0.0 {
            let (norm_saved, norm_backward) = unit.first_norm;
            norm_saved.max(norm_backward - gather_copy)
        } else {
            0.0
        };
        let finishing = phase_breakdown(
            states,
            with(finishing_extra, linears),
            gradients + grown,
            saved + held + unit.saved_through_gradients.min(kept.saved),
            unit.gradient_transient + transient_gradients + first_norm,
        );
        // Resharded once its gradients are made.
        linears -= states.gathered_through_backward(unit);
        for live in [starting, finishing] {
            if live.allocated() > backward.allocated() {
                backward = live;
            }
        }
        gradients += grown;
    }
    // The backward's last reductions, with every activation released.
    gradients += deferred;
    let ending = phase_breakdown(
        states,
        (0.0, buffers.backward_end_gradients),
        gradients,
        saved + held,
        0.0,
    );
    if ending.allocated() > backward.allocated() {
        backward = ending;
    }
    backward
}

/// Generation with a static KV cache of `positions` per sequence: the cache (and gpt-fast's
/// causal-mask buffer) is allocated before the prompt runs and lives through every forward;
/// decoding writes into it in place (no concatenation copy), and each decode step's attention
/// reads every position (`TransformerGraph::static_cache_reads`). transformers' StaticCache
/// allocates a layer's cache when the prefill first reaches it, which changes no peak after
/// the prefill's first layer. gpt-fast's mask is made from a `ones` tensor of its size, alive
/// beside it before the cache exists: the prefill phase is that moment where it is larger.
/// `pass` runs the units over a cache already holding its bytes.
fn static_cache_generation(
    model: &ModelSpec,
    units: &[Unit],
    states: &States,
    workload: &Workload,
    positions: u64,
    pass: impl Fn(&[Unit], f64) -> Breakdown,
) -> Vec<(Phase, Breakdown)> {
    let mask = workload.static_causal_mask_bytes() as f64;
    // The units' caches are the static cache's layers, allocated before the pass.
    let preallocated = |units: &[Unit]| -> (Vec<Unit>, f64) {
        let cache: f64 = units.iter().map(|u| u.kv_cache).sum();
        let units = units
            .iter()
            .map(|u| Unit {
                kv_cache: 0.0,
                ..u.clone()
            })
            .collect();
        (units, cache + mask)
    };
    let (prompt_units, cache) = preallocated(units);
    let mut prefill = pass(&prompt_units, cache);
    let setup = Breakdown {
        weights: bytes(states.weights),
        kv_cache: bytes(mask),
        temporaries: bytes(mask),
        ..Breakdown::default()
    };
    if setup.allocated() > prefill.allocated() {
        prefill = setup;
    }
    let static_cache = Workload {
        cache_len: Some(positions),
        ..workload.clone()
    };
    let (step_units, cache) = preallocated(&decode_step_units(model, &static_cache));
    let decode = pass(&step_units, cache);
    vec![(Phase::Prefill, prefill), (Phase::Decode, decode)]
}

fn simulate_inference(
    model: &ModelSpec,
    units: &[Unit],
    states: &States,
    workload: &Workload,
) -> Vec<(Phase, Breakdown)> {
    let pass = |units: &[Unit], kv_base: f64| -> Breakdown {
        let mut peak = Breakdown::default();
        let mut kv = kv_base;
        let mut held = 0.0;
        let mut body = 0.0;
        let last = units.len().saturating_sub(1);
        for (index, unit) in units.iter().enumerate() {
            // The model's body returns, releasing what it held, before its head runs.
            let body_held = if index < last {
                body + unit.body_held
            } else {
                0.0
            };
            let live = Breakdown {
                weights: bytes(states.weights),
                activations: bytes(unit.inference_live + body_held),
                kv_cache: bytes(kv + unit.kv_cache),
                temporaries: bytes(held + unit.held),
                ..Breakdown::default()
            };
            if live.allocated() > peak.allocated() {
                peak = live;
            }
            kv += unit.kv_cache;
            held += unit.held;
            body += unit.body_held;
        }
        peak
    };
    if let Some(positions) = workload.static_cache_positions() {
        return static_cache_generation(model, units, states, workload, positions, pass);
    }
    let prefill = pass(units, 0.0);
    // `generate` takes its first new token from the prefill's logits: one new token is the
    // prefill alone, no decode step (and no second cache beside the prompt's).
    if workload.mode == Mode::Infer || workload.new_tokens <= 1 {
        return vec![(Phase::Prefill, prefill)];
    }
    // Decode: one token per step against a cache of prompt + new − 1 tokens; concatenating into a
    // layer's cache briefly holds the old and the new copy of that layer.
    let step_units = decode_step_units(model, workload);
    let cached_tokens = workload.tokens() as f64;
    // Each layer's cache holds every earlier token, a sliding-window layer the last window.
    let earlier = cached_tokens - 1.0;
    let cache_base: f64 = step_units
        .iter()
        .map(|u| u.kv_cache * u.kv_window.map_or(earlier, |w| w.min(earlier)))
        .sum();
    let layer_kv = step_units.iter().map(|u| u.kv_cache).fold(0.0, f64::max) * cached_tokens;
    let mut decode = pass(&step_units, cache_base);
    // An old release's tuple cache: the previous step's whole cache lives beside the new one.
    let concatenating = if tuple_cache(model, workload) {
        cache_base
    } else {
        layer_kv
    };
    decode.temporaries += bytes(concatenating);
    vec![(Phase::Prefill, prefill), (Phase::Decode, decode)]
}

/// The units of one of `workload`'s decode steps: its forward over one new token.
pub(crate) fn decode_step_units(model: &ModelSpec, workload: &Workload) -> Vec<Unit> {
    let one_token = Workload {
        seq: 1,
        new_tokens: 1,
        ..workload.clone()
    };
    build_units(model, &one_token, workload.batch)
}

/// Whether `workload` plans an older transformers release that decodes with a tuple cache
/// (`OldRelease::tuple_cache`): each step makes every layer's new keys and values before the
/// previous step's cache is dropped.
pub(crate) fn tuple_cache(model: &ModelSpec, workload: &Workload) -> bool {
    OldRelease::of_model(model, workload).is_some_and(|old| old.tuple_cache())
}
