//! The estimator: model states per GPU, then a phase-by-phase replay of live tensors through one
//! step (forward, backward, optimizer step; or prefill and decode), reporting the peak and its phase.

use crate::checks::check;
use crate::distributed::{
    nccl_bytes, reduced_at_backward_end, sharding_buffers, zero_sizes, zero_step_gradients,
    PhaseBuffers, ShardingInputs, ZeroSizes,
};
use crate::error::Result;
use crate::graph::build_units;
use crate::model::{Architecture, ModelSpec, ParamCounts};
use crate::quant::{QuantFormat, Quantization};
use crate::releases::OldRelease;
use crate::single_gpu::model_buffer_bytes;
use crate::unit::{Unit, ACCUMULATION_COPIES};
use crate::warning::Warning;
use crate::workload::{
    BaseQuant, Checkpointing, Dtype, FsdpVersion, Mode, Optimizer, OptimizerImpl, Sharding,
    Workload,
};
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
    /// NCCL communicator buffers, outside the allocator (in nvidia-smi, not in reserved).
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
    /// Reserved plus CUDA context, framework and NCCL buffers (comparable with nvidia-smi).
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

/// Model-state bytes on one GPU.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct States {
    pub(crate) weights: f64,
    /// Gradient bytes per parameter of a unit, on this GPU.
    pub(crate) grad_per_param: f64,
    pub(crate) optimizer: f64,
    /// Communication buckets and gathered layers, by phase ([`crate::distributed`]).
    pub(crate) buffers: PhaseBuffers,
    pub(crate) step_temporaries: f64,
}

/// Estimates the peak memory of `workload` on `model` for the busiest GPU.
pub fn estimate(model: &ModelSpec, workload: &Workload, overheads: &Overheads) -> Result<Estimate> {
    let warnings = check(model, workload)?;
    let counts = model.params();
    let trainable = trainable_params(model, workload, &counts);
    let mut peaks: Vec<(Phase, Breakdown)> = match workload.mode {
        Mode::Train => {
            let stages = pipeline_stages(model, workload);
            let mut peaks = Vec::new();
            for (stage_units, in_flight) in stages {
                let states = model_states(model, workload, &counts, &stage_units, trainable);
                let stage = simulate_training(&stage_units, &states, workload, in_flight);
                merge_busiest(&mut peaks, stage);
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
    for (_, phase) in peaks.iter_mut() {
        phase.blas_workspace = workspace;
    }
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
    /// holds beyond the tensors (never below zero), and total follows.
    pub fn with_reserved(mut self, reserved_bytes: u64) -> Estimate {
        let allocated = self.peak_allocated_bytes;
        self.breakdown.allocator = reserved_bytes.saturating_sub(allocated);
        self.peak_reserved_bytes = allocated + self.breakdown.allocator;
        self.peak_total_bytes = self.peak_reserved_bytes + self.breakdown.framework;
        self
    }
}

/// Keeps, per phase, the larger of two pipeline stages' peaks.
fn merge_busiest(peaks: &mut Vec<(Phase, Breakdown)>, stage: Vec<(Phase, Breakdown)>) {
    if peaks.is_empty() {
        *peaks = stage;
        return;
    }
    for ((_, kept), (_, new)) in peaks.iter_mut().zip(stage) {
        if new.allocated() > kept.allocated() {
            *kept = new;
        }
    }
}

pub(crate) fn trainable_params(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
) -> u64 {
    match (&model.arch, workload.lora) {
        (Architecture::Transformer(spec), Some(lora)) => {
            crate::lora::lora_params(spec, lora.rank, lora.targets)
        }
        // Training leaves out what no gradient reaches (a frozen vision tower, the tower layers
        // after the one a vision-language model reads).
        _ if workload.mode == Mode::Train => build_units(model, workload, 1)
            .iter()
            .map(Unit::trained_params)
            .sum(),
        _ => counts.total(),
    }
}

/// Pipeline stages to evaluate: the first (most activations in flight) and the last (the head).
fn pipeline_stages(model: &ModelSpec, workload: &Workload) -> Vec<(Vec<Unit>, f64)> {
    let units = build_units(model, workload, workload.batch);
    let stages = workload.layout.pp as usize;
    if stages == 1 {
        return vec![(units, 1.0)];
    }
    let blocks: Vec<&Unit> = units.iter().filter(|u| u.name == "block").collect();
    let per_stage = blocks.len().div_ceil(stages);
    let first: Vec<Unit> = units.iter().take(1 + per_stage).cloned().collect();
    let last_blocks = blocks.len().saturating_sub(per_stage * (stages - 1)).max(1);
    let mut last: Vec<Unit> = units.iter().rev().take(1 + last_blocks).cloned().collect();
    last.reverse();
    // 1F1B: the first stage holds `pp` micro-batches in flight when there are that many.
    let in_flight = (workload.grad_accum.min(workload.layout.pp)) as f64;
    vec![(first, in_flight), (last, 1.0)]
}

/// Parameters of an untied LM head stored in the 4-bit base ([`Workload::four_bit_lm_head`]).
fn four_bit_head_params(model: &ModelSpec, workload: &Workload) -> u64 {
    match &model.arch {
        Architecture::Transformer(spec)
            if workload.four_bit_lm_head()
                && !spec.tied_embeddings
                && matches!(spec.head, crate::model::Head::CausalLm) =>
        {
            spec.vocab * spec.hidden
        }
        _ => 0,
    }
}

/// Bytes per weight of the frozen base's packed weights alone: the `Params4bit` /
/// `Int8Params` data FSDP flattens and ZeRO-3 partitions (a 4-bit weight packs two per byte
/// whatever its `quant_storage` dtype), without the quantisation statistics.
fn base_packed_bytes(quant: BaseQuant, dtype: Dtype) -> f64 {
    match quant {
        BaseQuant::None => dtype.bytes() as f64,
        BaseQuant::Int8 => 1.0,
        BaseQuant::Nf4 { .. } => 0.5,
    }
}

/// Bytes of the frozen base's quantisation statistics on this stage (`share` of the model):
/// bitsandbytes keeps each 4-bit weight's `QuantState` (absmax, and with double quantisation
/// its int8 absmax, fp32 scales and code) and each int8 weight's `SCB` as attributes of the
/// parameter and of its `Linear4bit` (`bitsandbytes/nn/modules.py`: `Params4bit.quant_state`,
/// `fix_4bit_weight_quant_state_from_module`, "the quant state got lost when the parameter got
/// converted. This happens for example for fsdp"), not as parameters or buffers: FSDP flattens
/// and shards, and ZeRO-3 partitions, only the packed data, and neither moves the statistics to
/// the host with parameter offloading. Every rank keeps the whole stage's.
fn quant_statistics_bytes(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    share: f64,
) -> f64 {
    match workload.lora {
        Some(l) if l.base != BaseQuant::None => {
            let quantised =
                (counts.block_linear + four_bit_head_params(model, workload)) as f64 * share;
            quantised
                * (base_weight_bytes(l.base, workload.dtype)
                    - base_packed_bytes(l.base, workload.dtype))
        }
        _ => 0.0,
    }
}

/// Bytes per parameter of a block as FSDP or ZeRO-3 gathers it: its linears' packed weights
/// (4-bit or int8 under a quantised LoRA base, else the dtype gathered, `module`), the rest
/// (norms) in `module`'s dtype. Without quantisation, `module`.
fn gathered_block_bytes(workload: &Workload, counts: &ParamCounts, module: f64) -> f64 {
    match workload.lora {
        Some(l) if l.base != BaseQuant::None && counts.body > 0 => {
            let linear = counts.block_linear as f64 / counts.body as f64;
            linear * base_packed_bytes(l.base, workload.dtype) + (1.0 - linear) * module
        }
        _ => module,
    }
}

/// Bytes per LM-head parameter as ZeRO-3 gathers it: 4-bit packed where the head is quantised.
fn gathered_head_bytes(model: &ModelSpec, workload: &Workload, module: f64) -> f64 {
    match workload.lora {
        Some(l) if four_bit_head_params(model, workload) > 0 => {
            base_packed_bytes(l.base, workload.dtype)
        }
        _ => module,
    }
}

/// Bytes of the parameters DeepSpeed ZeRO-3 never partitions, whole on every rank and kept on
/// the GPU with parameter offloading (`partition_parameters.py`: `ds_persist` for parameters
/// of fewer than `stage3_param_persistence_threshold` elements): the blocks' norms and biases
/// (every parameter of a block but its linears' weights), and LoRA adapter matrices under the
/// threshold.
fn zero3_persistent_bytes(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    zero: ZeroSizes,
    trained_bytes: f64,
) -> f64 {
    if workload.layout.sharding != Sharding::Zero3 {
        return 0.0;
    }
    let norms =
        counts.body.saturating_sub(counts.block_linear) as f64 * workload.dtype.bytes() as f64;
    let adapters = match (&model.arch, workload.lora) {
        (Architecture::Transformer(spec), Some(l)) => {
            crate::lora::small_adapter_params(spec, l.rank, l.targets, zero.persistence_threshold)
                as f64
                * trained_bytes
        }
        _ => 0.0,
    };
    norms + adapters
}

/// Bytes per weight of the frozen base under LoRA quantisation.
fn base_weight_bytes(quant: BaseQuant, dtype: Dtype) -> f64 {
    match quant {
        BaseQuant::None => dtype.bytes() as f64,
        BaseQuant::Int8 => Quantization::of(QuantFormat::Int8).bytes_per_weight(),
        BaseQuant::Nf4 { double_quant } => Quantization {
            double_quant,
            ..Quantization::of(QuantFormat::Nf4)
        }
        .bytes_per_weight(),
    }
}

/// Per-GPU weights, gradients and optimizer states of one pipeline stage's `units`.
pub(crate) fn model_states(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    units: &[Unit],
    trainable: u64,
) -> States {
    let layout = &workload.layout;
    let dp = layout.dp() as f64;
    let tp = layout.tp as f64;
    let stage_params: u64 = units.iter().map(|u| u.params).sum();
    let full_params = stage_params as f64 / tp;
    let trained_params = units.iter().map(Unit::trained_params).sum::<u64>() as f64 / tp;
    let share = full_params / counts.total().max(1) as f64;
    let weight_bytes = workload.dtype.bytes() as f64;
    let lora = workload.lora;
    // PEFT keeps its adapters in fp32 whatever the base's dtype (`autocast_adapter_dtype`), so
    // their gradients and optimizer states are fp32 too.
    // litgpt keeps them in the model's dtype.
    let peft = workload.framework == crate::workload::Framework::Hf;
    let trained_bytes = if lora.is_some() && peft {
        4.0
    } else {
        weight_bytes
    };
    let weights = stage_weight_bytes(
        model,
        workload,
        counts,
        full_params,
        share,
        trainable,
        trained_bytes,
    );
    let trainable_local = if lora.is_some() {
        trainable as f64 * share
    } else {
        trained_params
    };
    if workload.mode != Mode::Train {
        return States {
            weights,
            ..States::default()
        };
    }
    let master = workload.amp.is_some() && workload.dtype != Dtype::Fp32;
    // Optimizer states follow the parameter dtype unless a fp32 master copy exists.
    let state_bytes = if master { 4.0 } else { trained_bytes };
    let optimizer = trainable_local * optimizer_bytes_per_param(model, workload, state_bytes);
    let step_temporaries =
        optimizer_step_temporaries(model, workload, counts, trainable_local, state_bytes);
    let grad_bytes = trained_bytes;
    // Gradient bytes per parameter of a unit: only the trainable share (LoRA adapters) gets one.
    let grad_per_param = grad_bytes / tp * trainable_local / trained_params.max(1.0);
    let gradients_full = trainable_local * grad_bytes;
    let module = workload.module_dtype().bytes() as f64;
    let gathered = gathered_block_bytes(workload, counts, module);
    let largest_block = counts.largest_block as f64 / tp * gathered;
    let trainable_share = trainable_local / full_params.max(1.0);
    let (hidden, head_params) = match &model.arch {
        Architecture::Transformer(spec) => (
            Some(spec.hidden),
            units
                .iter()
                .filter(|u| u.name == "head")
                .map(|u| u.params)
                .sum::<u64>(),
        ),
        _ => (None, 0),
    };
    let zero = zero_sizes(layout.zero_buckets, hidden);
    let buffers = sharding_buffers(
        units,
        workload,
        &ShardingInputs {
            largest_block,
            gradients_full,
            trainable_share,
            gathered,
            bucket_bytes: weight_bytes,
            head: head_params as f64 / tp * gathered_head_bytes(model, workload, module),
            zero,
        },
    );
    // The quantisation statistics stay whole on every rank (see `quant_statistics_bytes`),
    // and so do ZeRO-3's persistent parameters.
    let statistics = quant_statistics_bytes(model, workload, counts, share)
        + zero3_persistent_bytes(model, workload, counts, zero, trained_bytes) * share;
    let mut states = States {
        weights: weights - statistics,
        grad_per_param,
        optimizer,
        buffers,
        step_temporaries,
    };
    shard_or_offload_states(&mut states, workload, dp);
    states.weights += statistics;
    states.step_temporaries += zero_step_gradients(workload, trainable_local);
    states
}

/// Bytes of a stage's weights (its `share` of the model, `full_params` of them per GPU) before
/// any sharding: the base in its dtype or quantised format, LoRA adapters in `trained_bytes`,
/// and buffers.
fn stage_weight_bytes(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    full_params: f64,
    share: f64,
    trainable: u64,
    trained_bytes: f64,
) -> f64 {
    let weight_bytes = workload.dtype.bytes() as f64;
    let mut weights = match workload.lora {
        Some(l) => {
            let quantised =
                (counts.block_linear + four_bit_head_params(model, workload)) as f64 * share;
            quantised * base_weight_bytes(l.base, workload.dtype)
                + (full_params - quantised) * weight_bytes
                + trainable as f64 * share * trained_bytes
        }
        // A quantised checkpoint stores its block linears in its format.
        None => match workload.quant {
            Some(quant) => {
                let quantised = counts.block_linear as f64 * share;
                quantised * quant.bytes_per_weight() + (full_params - quantised) * weight_bytes
            }
            None => full_params * weight_bytes,
        },
    };
    weights += counts.buffers as f64 * share * weight_bytes;
    // Buffers a family's modelling code registers (replicated, not sharded).
    if let Architecture::Transformer(spec) = &model.arch {
        weights += model_buffer_bytes(spec);
    }
    // Planning an older transformers release: the buffers its modelling code had.
    if let Architecture::Transformer(spec) = &model.arch {
        if let Some(old) = OldRelease::of(spec, workload) {
            weights += old.buffer_bytes(weight_bytes) * share;
        }
    }
    weights
}

/// Bytes of optimizer state per trainable parameter, with states of `state_bytes` each, plus any
/// fp32 master weight.
fn optimizer_bytes_per_param(model: &ModelSpec, workload: &Workload, state_bytes: f64) -> f64 {
    let per_param_states = match workload.optimizer {
        Optimizer::AdamW | Optimizer::Adam => 2.0 * state_bytes,
        Optimizer::Sgd => state_bytes,
        // Row and column second-moment factors: about (1/rows + 1/cols) of each matrix.
        Optimizer::Adafactor => state_bytes * adafactor_fraction(model),
        // Two uint8 moments plus an fp32 absmax per 2048-element block for each.
        Optimizer::Adam8bit => 2.0 + 8.0 / 2048.0,
        Optimizer::None => 0.0,
    };
    let master = workload.amp.is_some() && workload.dtype != Dtype::Fp32;
    // Without an optimizer nothing keeps fp32 master weights.
    let master_bytes = if master && workload.optimizer != Optimizer::None {
        4.0
    } else {
        0.0
    };
    per_param_states + master_bytes
}

/// Temporaries of the optimizer step before sharding, by optimizer and implementation.
fn optimizer_step_temporaries(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    trainable_local: f64,
    state_bytes: f64,
) -> f64 {
    let tp = workload.layout.tp as f64;
    let largest_trainable = match (workload.lora, &model.arch) {
        (Some(l), Architecture::Transformer(spec)) => {
            (l.rank * spec.hidden.max(spec.intermediate)) as f64
        }
        _ => counts.largest_tensor as f64 / tp,
    };
    match (workload.optimizer, workload.optimizer_impl) {
        (Optimizer::AdamW | Optimizer::Adam, OptimizerImpl::Foreach) => {
            trainable_local * state_bytes
        }
        (Optimizer::AdamW | Optimizer::Adam, OptimizerImpl::ForLoop) => {
            2.0 * largest_trainable * state_bytes
        }
        // torch.optim.Adafactor builds the full variance estimate row_var @ col_var, in its
        // factors' dtype (the gradient's): for all parameters at once (foreach) or one
        // parameter at a time.
        (Optimizer::Adafactor, OptimizerImpl::Foreach) => trainable_local * state_bytes,
        (Optimizer::Adafactor, _) => largest_trainable * state_bytes,
        (Optimizer::AdamW | Optimizer::Adam, OptimizerImpl::Fused)
        | (Optimizer::Sgd | Optimizer::Adam8bit | Optimizer::None, _) => 0.0,
    }
}

/// Divides `states` among the `dp` data-parallel ranks as the sharding strategy does, and drops
/// what CPU offload moves to the host (the optimizer step's temporaries with it).
fn shard_or_offload_states(states: &mut States, workload: &Workload, dp: f64) {
    let layout = &workload.layout;
    match layout.sharding {
        Sharding::None => {}
        Sharding::Zero1 => states.optimizer /= dp,
        Sharding::Zero2 => {
            states.optimizer /= dp;
            states.grad_per_param /= dp;
        }
        Sharding::Zero3 | Sharding::Fsdp => {
            states.optimizer /= dp;
            // FSDP accumulates under `no_sync` with unsharded gradients; ZeRO-3 reduces into
            // partitioned buffers every micro-step.
            if !(layout.sharding == Sharding::Fsdp && workload.grad_accum > 1) {
                states.grad_per_param /= dp;
            }
            states.weights /= dp;
        }
    }
    if layout.offload {
        states.optimizer = 0.0;
        // The reduced gradient partitions go to pinned host buffers (DeepSpeed's
        // `contiguous_gradients` is forced on; FSDP2's `foreach_reduce` copies each sharded
        // gradient to the host and frees it). FSDP1 keeps its GPU sharded gradient too:
        // `_accumulate_sharded_grad` stores the reduce-scatter output as `_saved_grad_shard`,
        // `_offload_grad` copies it into `_cpu_grad`, and only the post-backward final
        // callback's `prepare_gradient_for_optim` deletes it (`_runtime_utils.py`,
        // `_flat_param.py`): through the backward the sharded gradients stay on the GPU.
        let fsdp1 = layout.sharding == Sharding::Fsdp && layout.fsdp_version == FsdpVersion::V1;
        if layout.sharding != Sharding::None && !fsdp1 {
            states.grad_per_param = 0.0;
        }
        if matches!(layout.sharding, Sharding::Zero3 | Sharding::Fsdp) {
            states.weights = 0.0;
        }
    }
    states.step_temporaries = if layout.offload {
        0.0
    } else {
        states.step_temporaries / optimizer_shards(layout.sharding, dp)
    };
}

fn optimizer_shards(sharding: Sharding, dp: f64) -> f64 {
    if sharding == Sharding::None {
        1.0
    } else {
        dp
    }
}

fn adafactor_fraction(model: &ModelSpec) -> f64 {
    match &model.arch {
        Architecture::Transformer(t) => 1.0 / t.hidden as f64 + 1.0 / t.intermediate as f64,
        // 4-D conv weights factor over their last two dims: about 2/k of each kernel.
        Architecture::Resnet(_) | Architecture::Diffusion(_) => 0.67,
    }
}

/// Saved bytes of each unit under the checkpointing policy, and what its backward recomputes.
/// Checkpointable units (blocks) are counted in order for every-k-th-layer checkpointing.
pub(crate) fn kept_and_recomputed(units: &[Unit], policy: Checkpointing) -> Vec<(f64, f64)> {
    let mut block = 0;
    units
        .iter()
        .map(|unit| {
            let Some(input) = unit.checkpoint else {
                return (unit.saved, 0.0);
            };
            let covered = policy.covers_block(block);
            block += 1;
            match policy {
                _ if !covered => (unit.saved, 0.0),
                Checkpointing::Full | Checkpointing::EveryNth(_) => (input, unit.saved),
                Checkpointing::Selective => (unit.saved - unit.attention_core, unit.attention_core),
                // The saved op outputs are cached, not recomputed.
                Checkpointing::PerOp => (
                    input + unit.per_op_saved,
                    (unit.saved - unit.per_op_saved).max(0.0),
                ),
                Checkpointing::None => (unit.saved, 0.0),
            }
        })
        .collect()
}

/// Ceiling of every breakdown entry (2⁵⁹ bytes, 512 PiB): absurd workloads saturate here, so the
/// sums and differences of entries never overflow.
pub const MAX_BYTES: u64 = 1 << 59;

/// Bytes of a modelled quantity, rounded and saturated at [`MAX_BYTES`].
fn bytes(x: f64) -> u64 {
    (x.max(0.0).round() as u64).min(MAX_BYTES)
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
        let step = phase_breakdown(
            states,
            (0.0, 0.0),
            all_gradients,
            0.0,
            states.step_temporaries,
        );
        phases.push((Phase::OptimizerStep, step));
    }
    phases
}

/// Whether gradients live across steps (accumulation, or kept by the caller).
pub(crate) fn accumulates_gradients(workload: &Workload) -> bool {
    workload.grad_accum > 1 || workload.keep_grads
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
}

/// The forward's peak and its end, unit by unit, and the activations it leaves;
/// `previous_outputs`: the last step's outputs, alive until the forward returns.
fn simulate_forward(
    units: &[Unit],
    kept: &[(f64, f64)],
    states: &States,
    in_flight: f64,
    gradients_in_forward: f64,
    previous_outputs: f64,
) -> (Breakdown, Breakdown, ForwardActivations) {
    let in_forward = (states.buffers.forward_weights, 0.0);
    let mut forward = Breakdown::default();
    let mut saved = 0.0;
    let mut held = 0.0;
    let mut forward_held = 0.0;
    for (unit, (keep, _)) in units.iter().zip(kept) {
        let live = phase_breakdown(
            states,
            in_forward,
            gradients_in_forward,
            previous_outputs + saved + held + forward_held + keep,
            unit.forward_transient,
        );
        if live.allocated() > forward.allocated() {
            forward = live;
        }
        saved += keep * in_flight;
        held += unit.held;
        forward_held += unit.forward_held;
    }
    let forward_end = phase_breakdown(
        states,
        in_forward,
        gradients_in_forward,
        previous_outputs + saved + held + forward_held,
        0.0,
    );
    (forward, forward_end, ForwardActivations { saved, held })
}

/// The backward's peak: units in reverse, each at the start of its backward and as its
/// parameter gradients appear, then the backward's last reductions.
fn simulate_backward(
    units: &[Unit],
    kept: &[(f64, f64)],
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
    let ForwardActivations { mut saved, held } = activations;
    let mut backward = Breakdown::default();
    let mut gradients = gradients_in_forward;
    let mut deferred = 0.0;
    for (index, (unit, (keep, recompute))) in units.iter().zip(kept).enumerate().rev() {
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
        let starting = phase_breakdown(
            states,
            if index + 1 == units.len() {
                backward_start
            } else {
                extra
            },
            gradients,
            saved + held,
            recompute + unit.backward_transient,
        );
        saved -= keep * in_flight;
        let finishing = phase_breakdown(
            states,
            extra,
            gradients + grown,
            saved + held + unit.saved_through_gradients.min(*keep),
            unit.gradient_transient + transient_gradients,
        );
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
    let prefill = pass(units, 0.0);
    if workload.mode == Mode::Infer {
        return vec![(Phase::Prefill, prefill)];
    }
    // Decode: one token per step against a cache of prompt + new − 1 tokens; concatenating into a
    // layer's cache briefly holds the old and the new copy of that layer.
    let one_token = Workload {
        seq: 1,
        new_tokens: 1,
        ..workload.clone()
    };
    let step_units = build_units(model, &one_token, workload.batch);
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
    let tuple_cache = match &model.arch {
        Architecture::Transformer(spec) => {
            OldRelease::of(spec, workload).is_some_and(|old| old.tuple_cache())
        }
        _ => false,
    };
    decode.temporaries += bytes(if tuple_cache { cache_base } else { layer_kv });
    vec![(Phase::Prefill, prefill), (Phase::Decode, decode)]
}
