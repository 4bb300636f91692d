//! Model states per GPU: the weights, gradients and optimizer states of one pipeline stage, and
//! the optimizer step's temporaries, before and after the layout shards them over data-parallel
//! ranks or offloads them to the host. Held per step rather than per unit, they are what the
//! phase simulation (`estimate`) and the allocation sequence (`sequence`) put under the units.

use crate::distributed::{
    fsdp_accumulates_unsharded, fsdp_keeps_model_gathered, fsdp_keeps_units_gathered,
    sharding_buffers, zero3_saved_linear_bytes, zero_sizes, zero_step_gradients, PhaseBuffers,
    ShardingInputs, ZeroSizes,
};
use crate::graph::build_units;
use crate::model::{Architecture, ModelSpec, ParamCounts};
use crate::quant::{QuantFormat, Quantization};
use crate::releases::OldRelease;
use crate::single_gpu::model_buffer_bytes;
use crate::unit::Unit;
use crate::workload::{
    BaseQuant, Dtype, FsdpVersion, Mode, Optimizer, OptimizerImpl, Sharding, Workload,
};

/// Model-state bytes on one GPU.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct States {
    pub(crate) weights: f64,
    /// Gradient bytes per parameter of a unit, on this GPU.
    pub(crate) grad_per_param: f64,
    pub(crate) optimizer: f64,
    /// Bytes per element of an optimizer state (fp32 beside a master copy, else the trained
    /// parameters' dtype): how many tensors a parameter's states and step temporaries are.
    pub(crate) state_element_bytes: f64,
    /// Communication buckets and gathered layers, by phase ([`crate::distributed`]).
    pub(crate) buffers: PhaseBuffers,
    pub(crate) step_temporaries: f64,
    /// Gathered weight bytes per block parameter that a block's backward keeps from its
    /// forward (ZeRO-3 without DeepSpeed's linear: `distributed::zero3_saved_linear_bytes`).
    pub(crate) saved_linear_bytes: f64,
    /// Gathered weight bytes per block parameter that a block holds from its forward to the
    /// end of its backward, checkpointed or not (FSDP's `SHARD_GRAD_OP`:
    /// `distributed::fsdp_keeps_units_gathered`); zero where every block stays gathered
    /// through the step instead, a step buffer (`distributed::fsdp_keeps_model_gathered`).
    pub(crate) gathered_kept_bytes: f64,
}

impl States {
    /// Gathered weight bytes `unit` keeps from its forward to its backward.
    pub(crate) fn saved_linears(&self, unit: &Unit) -> f64 {
        match unit.name {
            "block" => unit.params as f64 * self.saved_linear_bytes,
            _ => 0.0,
        }
    }

    /// Gathered weight bytes `unit` holds from its forward to the end of its backward.
    pub(crate) fn gathered_through_backward(&self, unit: &Unit) -> f64 {
        match unit.name {
            "block" => unit.params as f64 * self.gathered_kept_bytes,
            _ => 0.0,
        }
    }
}

/// Parameters being trained: the LoRA adapters, else (in training) every parameter some
/// gradient reaches, else all.
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

/// Parameters of an untied LM head stored in the 4-bit base ([`Workload::four_bit_lm_head`]).
pub(crate) fn four_bit_head_params(model: &ModelSpec, workload: &Workload) -> u64 {
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

/// The quantisation of a LoRA base; None when it is not quantised.
fn base_quantization(quant: BaseQuant) -> Option<Quantization> {
    match quant {
        BaseQuant::None => None,
        BaseQuant::Int8 => Some(Quantization::of(QuantFormat::Int8)),
        BaseQuant::Nf4 { double_quant } => Some(Quantization {
            double_quant,
            ..Quantization::of(QuantFormat::Nf4)
        }),
    }
}

/// Bytes per weight of the frozen base's packed weights alone: the `Params4bit` /
/// `Int8Params` data FSDP flattens and ZeRO-3 partitions (a 4-bit weight packs two per byte
/// whatever its `quant_storage` dtype), without the quantisation statistics.
pub(crate) fn base_packed_bytes(quant: BaseQuant, dtype: Dtype) -> f64 {
    base_quantization(quant).map_or(dtype.bytes() as f64, |q| q.packed_bytes_per_weight())
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

/// Bytes per weight of the frozen base under LoRA quantisation, statistics included.
fn base_weight_bytes(quant: BaseQuant, dtype: Dtype) -> f64 {
    base_quantization(quant).map_or(dtype.bytes() as f64, |q| q.bytes_per_weight())
}

/// Per-GPU weights, gradients and optimizer states of one pipeline stage's `units`.
pub(crate) fn model_states(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    units: &[Unit],
    trainable: u64,
) -> States {
    let stage = StageParams::of(workload, counts, units, trainable);
    let weights = stage_weight_bytes(
        model,
        workload,
        counts,
        stage.full_params,
        stage.share,
        trainable,
        stage.trained_bytes,
    );
    if workload.mode != Mode::Train {
        return States {
            weights,
            ..States::default()
        };
    }
    let master = workload.amp.is_some() && workload.dtype != Dtype::Fp32;
    // Optimizer states follow the parameter dtype unless a fp32 master copy exists.
    let state_bytes = if master { 4.0 } else { stage.trained_bytes };
    let trainable_local = stage.trainable_local;
    let optimizer = trainable_local * optimizer_bytes_per_param(model, workload, state_bytes);
    let step_temporaries =
        optimizer_step_temporaries(model, workload, counts, trainable_local, state_bytes);
    // Gradient bytes per parameter of a unit: only the trainable share (LoRA adapters) gets one.
    let grad_per_param =
        stage.trained_bytes / stage.tp * trainable_local / stage.trained_params.max(1.0);
    let (buffers, zero) = stage_buffers(model, workload, counts, units, &stage);
    // The quantisation statistics stay whole on every rank (see `quant_statistics_bytes`),
    // and so do ZeRO-3's persistent parameters and the module buffers.
    let statistics = quant_statistics_bytes(model, workload, counts, stage.share)
        + zero3_persistent_bytes(model, workload, counts, zero, stage.trained_bytes) * stage.share
        + module_buffer_bytes(model, workload, counts, stage.share);
    let mut states = States {
        weights: weights - statistics,
        grad_per_param,
        optimizer,
        state_element_bytes: state_bytes,
        buffers,
        step_temporaries,
        saved_linear_bytes: zero3_saved_linear_bytes(model, workload, counts),
        gathered_kept_bytes: if fsdp_keeps_units_gathered(workload)
            && !fsdp_keeps_model_gathered(workload)
        {
            gathered_block_bytes(workload, counts, workload.module_dtype().bytes() as f64)
                / stage.tp
        } else {
            0.0
        },
    };
    shard_or_offload_states(&mut states, workload);
    states.weights += statistics;
    states.step_temporaries += zero_step_gradients(
        workload,
        trainable_local,
        largest_trainable_tensor(model, workload, counts),
    );
    states
}

/// The parameters of one pipeline stage on one GPU (split over tensor-parallel ranks, before
/// any data-parallel sharding), and the bytes each trained one takes.
#[derive(Debug, Clone, Copy)]
struct StageParams {
    /// Tensor-parallel degree.
    tp: f64,
    /// Parameters of the stage's units on this GPU.
    full_params: f64,
    /// Of those, the parameters the units train.
    trained_params: f64,
    /// The stage's share of the whole model's parameters.
    share: f64,
    /// Trainable parameters on this GPU: the stage's share of the LoRA adapters, or
    /// `trained_params`.
    trainable_local: f64,
    /// Bytes of a trained parameter, its gradient and (without a fp32 master copy) each of
    /// its optimizer states.
    trained_bytes: f64,
}

impl StageParams {
    /// The parameters of `units` (`trainable` of the whole model) on one GPU.
    fn of(workload: &Workload, counts: &ParamCounts, units: &[Unit], trainable: u64) -> Self {
        let tp = workload.layout.tp as f64;
        let stage_params: u64 = units.iter().map(|u| u.params).sum();
        let full_params = stage_params as f64 / tp;
        let trained_params = units.iter().map(Unit::trained_params).sum::<u64>() as f64 / tp;
        let share = full_params / counts.total().max(1) as f64;
        let lora = workload.lora;
        // PEFT since 0.12 keeps its adapters in fp32 whatever the base's dtype
        // (`autocast_adapter_dtype`), so their gradients and optimizer states are fp32 too.
        // litgpt, and PEFT before 0.12, keep them in the model's dtype.
        let trained_bytes = if lora.is_some() && workload.fp32_adapters() {
            4.0
        } else {
            workload.dtype.bytes() as f64
        };
        let trainable_local = if lora.is_some() {
            trainable as f64 * share
        } else {
            trained_params
        };
        StageParams {
            tp,
            full_params,
            trained_params,
            share,
            trainable_local,
            trained_bytes,
        }
    }
}

/// The communication buckets and gathered layers of a training stage, by phase
/// ([`sharding_buffers`]), and DeepSpeed's sizes for the model.
fn stage_buffers(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    units: &[Unit],
    stage: &StageParams,
) -> (PhaseBuffers, ZeroSizes) {
    let tp = stage.tp;
    let gradients_full = stage.trainable_local * stage.trained_bytes;
    let module = workload.module_dtype().bytes() as f64;
    let gathered = gathered_block_bytes(workload, counts, module);
    let largest_block = counts.largest_block as f64 / tp * gathered;
    let trainable_share = stage.trainable_local / stage.full_params.max(1.0);
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
    let zero = zero_sizes(workload.layout.zero_buckets, hidden);
    let buffers = sharding_buffers(
        units,
        workload,
        &ShardingInputs {
            largest_block,
            gradients_full,
            trainable_share,
            gathered,
            bucket_bytes: workload.dtype.bytes() as f64,
            head: head_params as f64 / tp * gathered_head_bytes(model, workload, module),
            largest_trainable: largest_trainable_tensor(model, workload, counts),
            trainable_local: stage.trainable_local,
            zero,
        },
    );
    (buffers, zero)
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
    let base = match (workload.lora, workload.quant) {
        (Some(l), _) if l.base != BaseQuant::None => {
            let quantised =
                (counts.block_linear + four_bit_head_params(model, workload)) as f64 * share;
            quantised * base_weight_bytes(l.base, workload.dtype)
                + (full_params - quantised) * weight_bytes
        }
        // A quantised checkpoint (in inference, with or without adapters over it) stores its
        // block linears in its format; its kernel may allocate a buffer per GPU when the model
        // is loaded.
        (_, Some(quant)) => {
            let quantised = counts.block_linear as f64 * share;
            let kernel = match &model.arch {
                Architecture::Transformer(spec) => quant.kernel_buffer_bytes(spec),
                _ => 0.0,
            };
            quantised * quant.bytes_per_weight() + (full_params - quantised) * weight_bytes + kernel
        }
        _ => full_params * weight_bytes,
    };
    let adapters = match workload.lora {
        Some(_) => trainable as f64 * share * trained_bytes,
        None => 0.0,
    };
    base + adapters + module_buffer_bytes(model, workload, counts, share)
}

/// Bytes of a stage's module buffers (its `share` of the model): the model's own (norm
/// statistics), those a family's modelling code registers today ([`model_buffer_bytes`]) and,
/// planning an older transformers release, those its modelling code had. FSDP and ZeRO-3
/// shard and offload parameters only: every rank keeps the buffers whole, on the GPU.
fn module_buffer_bytes(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    share: f64,
) -> f64 {
    let weight_bytes = workload.dtype.bytes() as f64;
    let own = counts.buffers as f64 * share * weight_bytes;
    let Architecture::Transformer(spec) = &model.arch else {
        return own;
    };
    let old = OldRelease::of(spec, workload).map_or(0.0, |old| old.buffer_bytes(weight_bytes));
    own + model_buffer_bytes(spec) + old * share
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

/// Elements of the largest trained tensor on this GPU (a LoRA adapter's under LoRA).
fn largest_trainable_tensor(model: &ModelSpec, workload: &Workload, counts: &ParamCounts) -> f64 {
    match (workload.lora, &model.arch) {
        (Some(l), Architecture::Transformer(spec)) => {
            (l.rank * spec.hidden.max(spec.intermediate)) as f64
        }
        _ => counts.largest_tensor as f64 / workload.layout.tp as f64,
    }
}

/// Temporaries of the optimizer step before sharding, by optimizer and implementation.
fn optimizer_step_temporaries(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
    trainable_local: f64,
    state_bytes: f64,
) -> f64 {
    let largest_trainable = largest_trainable_tensor(model, workload, counts);
    match (workload.optimizer, workload.optimizer_impl) {
        (Optimizer::AdamW | Optimizer::Adam, OptimizerImpl::Foreach) => {
            workload.foreach_adam_intermediates() * trainable_local * state_bytes
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

/// Divides `states` among the data-parallel ranks the sharding strategy shards over
/// ([`crate::Layout::shard_ranks`]), and drops what CPU offload moves to the host (the
/// optimizer step's temporaries with it).
fn shard_or_offload_states(states: &mut States, workload: &Workload) {
    let layout = &workload.layout;
    let dp = layout.shard_ranks() as f64;
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
            if !fsdp_accumulates_unsharded(workload) {
                states.grad_per_param /= dp;
            }
            states.weights /= dp;
        }
    }
    if layout.offload.optimizer() {
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
        if layout.offload.params() && matches!(layout.sharding, Sharding::Zero3 | Sharding::Fsdp) {
            states.weights = 0.0;
        }
    }
    states.step_temporaries = if layout.offload.optimizer() {
        0.0
    } else {
        states.step_temporaries / dp
    };
}

fn adafactor_fraction(model: &ModelSpec) -> f64 {
    match &model.arch {
        Architecture::Transformer(t) => 1.0 / t.hidden as f64 + 1.0 / t.intermediate as f64,
        // 4-D conv weights factor over their last two dims: about 2/k of each kernel.
        Architecture::Resnet(_) | Architecture::Diffusion(_) => 0.67,
    }
}
