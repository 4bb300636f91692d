//! What multi-GPU training allocates beyond the sharded model states: PyTorch FSDP's gathered
//! units and gradient reduction buffers (FSDP1 and FSDP2, with or without mixed precision),
//! DeepSpeed ZeRO's gradient buckets and gathered layers (its config defaults), the GPU side of
//! CPU offloading, and the NCCL communicator buffers outside PyTorch's caching allocator.
//!
//! Sources (read for this module; docs/plan.md "Distributed training" cites the lines):
//! `torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py` (FSDP2 all-gather copy-in into
//! the all-gather output, copy-out into per-parameter unsharded tensors, reduce-scatter input
//! and output), `_fsdp_param_group.py` (backward prefetch of the next unit, the root kept
//! unsharded after forward), `_flat_param.py` / `_runtime_utils.py` (FSDP1 flat parameters,
//! BACKWARD_PRE prefetch, the root not resharded after forward); DeepSpeed
//! `runtime/zero/config.py` (bucket defaults), `stage_1_and_2.py` (the `ipg_buffer` of
//! `reduce_bucket_size` elements allocated in every backward), `stage3.py` (the IPG flat buffer,
//! prefetch bucket); NCCL `NCCL_BUFFSIZE` and its LL/LL128 buffers per channel and connection.

use crate::model::{Architecture, ModelSpec, ParamCounts};
use crate::sequence::Stream;
use crate::unit::Unit;
// The FSDP version and NCCL buffer size are workload settings, defined with it.
use crate::workload::{
    BaseQuant, Dtype, FsdpSharding, Layout, Optimizer, Sharding, Target, Workload, ZeroBuckets,
    DEEPSPEED_OVERFLOW_CHECK_MASKS_SINCE,
};
pub use crate::workload::{FsdpVersion, DEFAULT_FSDP_VERSION, DEFAULT_NCCL_BUFFSIZE};

/// DeepSpeed `reduce_bucket_size` default (elements; `runtime/zero/config.py`).
pub const REDUCE_BUCKET_ELEMENTS: u64 = 500_000_000;
/// DeepSpeed `stage3_prefetch_bucket_size` default (elements).
pub const PREFETCH_BUCKET_ELEMENTS: u64 = 50_000_000;
/// DeepSpeed `stage3_param_persistence_threshold` default (elements).
pub const PERSISTENCE_THRESHOLD_ELEMENTS: u64 = 100_000;
/// DeepSpeed `stage3_max_live_parameters` default (elements): the prefetcher gathers no more
/// than this many elements ahead (`partitioned_param_coordinator.py`, `max_params_to_prefetch
/// = min(max_n_available − n_available, prefetch_bucket_sz)`).
pub const MAX_LIVE_ELEMENTS: u64 = 1_000_000_000;
/// DeepSpeed `stage3_max_reuse_distance` default (elements): a module's parameters are not
/// released if the trace uses them again within this many elements (`__params_to_release`).
pub const MAX_REUSE_ELEMENTS: u64 = 1_000_000_000;

/// DeepSpeed `sub_group_size` default (elements; `runtime/zero/config.py`): ZeRO-3's optimizer
/// step converts gradients to fp32 one sub-group of partitions at a time.
pub const ZERO3_SUB_GROUP_ELEMENTS: u64 = 1_000_000_000;

/// DeepSpeed ZeRO's sizes in elements, as `--zero-buckets` sets them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZeroSizes {
    /// `reduce_bucket_size`: the IPG bucket (stages 1-3).
    pub reduce_bucket: u64,
    /// `stage3_prefetch_bucket_size`.
    pub prefetch_bucket: u64,
    /// `stage3_param_persistence_threshold`: smaller parameters are never partitioned.
    pub persistence_threshold: u64,
}

/// The sizes DeepSpeed runs with: its defaults, or "auto" as accelerate and the HF Trainer fill
/// it from the model's `hidden_size` (`accelerator.py` `_prepare_deepspeed`; transformers
/// `integrations/deepspeed.py` `trainer_config_finalize`): h², int(0.9·h²), 10·h. A model
/// without a hidden size keeps the defaults (accelerate raises there).
pub fn zero_sizes(buckets: ZeroBuckets, hidden: Option<u64>) -> ZeroSizes {
    match (buckets, hidden) {
        (ZeroBuckets::Auto, Some(h)) => ZeroSizes {
            reduce_bucket: h * h,
            prefetch_bucket: (0.9 * (h * h) as f64) as u64,
            persistence_threshold: 10 * h,
        },
        _ => ZeroSizes {
            reduce_bucket: REDUCE_BUCKET_ELEMENTS,
            prefetch_bucket: PREFETCH_BUCKET_ELEMENTS,
            persistence_threshold: PERSISTENCE_THRESHOLD_ELEMENTS,
        },
    }
}

/// What [`sharding_buffers`] sizes the buffers from, per GPU.
pub(crate) struct ShardingInputs {
    /// The largest block as gathered, bytes.
    pub(crate) largest_block: f64,
    /// Bytes of all local gradients.
    pub(crate) gradients_full: f64,
    /// Share of the parameters trained.
    pub(crate) trainable_share: f64,
    /// Bytes per parameter of a gathered block (the module dtype, or a quantised base's
    /// packed weights).
    pub(crate) gathered: f64,
    /// Bytes per element of DeepSpeed's buckets: the dtype the engine casts the module to
    /// (`engine.py` `_cast_module_mixed_precision`; `communication_data_type` and
    /// `grad_accum_dtype` follow it), LoRA adapters included.
    pub(crate) bucket_bytes: f64,
    /// The LM head as ZeRO-3 gathers it, bytes (none for a model without one).
    pub(crate) head: f64,
    /// Elements of the largest trained tensor on this GPU.
    pub(crate) largest_trainable: f64,
    /// Elements of all trained parameters on this GPU (before ZeRO partitions them).
    pub(crate) trainable_local: f64,
    /// DeepSpeed's sizes.
    pub(crate) zero: ZeroSizes,
}

/// NCCL's LL128 buffer per connection (`NCCL_LL128_BUFFSIZE` default: 120 elements × 640
/// threads × 8 steps × 8 bytes).
pub const NCCL_LL128_BYTES: u64 = 4_915_200;
/// NCCL's LL buffer per connection (`NCCL_LL_BUFFSIZE` default: 8 lines × 512 threads × 8 steps
/// × 16 bytes).
pub const NCCL_LL_BYTES: u64 = 524_288;
/// Channels of a communicator within an NVLink node (NCCL picks 16–32 on A100/H100).
pub const NCCL_CHANNELS: u64 = 16;
/// Connections with buffers per channel and rank: the ring's receive side and the tree's.
pub const NCCL_CONNECTIONS_PER_CHANNEL: u64 = 2;

/// Bytes of buffers alive in a phase of a training step on one GPU, beyond the sharded states.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct PhaseBuffers {
    /// Unsharded (gathered) parameters alive through the forward pass.
    pub(crate) forward_weights: f64,
    /// Unsharded parameters alive when the backward starts (the loss's gradient, before any
    /// parameter gradient exists).
    pub(crate) backward_start_weights: f64,
    /// Unsharded parameters alive through the rest of the backward pass.
    pub(crate) backward_weights: f64,
    /// Unsharded parameters and gradients alive in the backward of the first unit (the
    /// embeddings: every block done and resharded, the root still gathered).
    pub(crate) backward_last: (f64, f64),
    /// Unsharded gradients and reduction buffers alive through the backward pass.
    pub(crate) backward_gradients: f64,
    /// Reduction buffers alive when the backward ends, after the last activations are freed
    /// (FSDP's reduce-scatter of the root's gradients, ZeRO-3's bucket copy).
    pub(crate) backward_end_gradients: f64,
    /// The stream `backward_end_gradients` is allocated on: FSDP1's post-backward stream,
    /// ZeRO-3's reduce-and-partition stream, the compute stream otherwise.
    pub(crate) backward_end_stream: Stream,
    /// The LM head's unsharded gradient while the head's backward finishes (ZeRO-3, which
    /// moves it into the IPG bucket or reduces it only after its matmul has made it whole).
    pub(crate) head_gradients: f64,
    /// Buffers alive the whole step (weights kind): ZeRO-3's gathered layers.
    pub(crate) step_weights: f64,
    /// Buffers alive the whole step (gradients kind): DDP buckets, ZeRO's IPG bucket.
    pub(crate) step_gradients: f64,
    /// Of each unsharded-weights field above, the host shard copied to the GPU before an
    /// all-gather (parameter offload).
    pub(crate) staging: f64,
    /// Of `backward_gradients`, the reduce-scatter's buffers (the reduce-dtype copy and the
    /// sharded output).
    pub(crate) backward_reduce: f64,
    /// Unsharded weights freed in backward but not yet reusable: on FSDP1's unshard stream, a
    /// resharded unit's output returns to the pool only when its free event has completed
    /// (see [`side_streams`]).
    pub(crate) backward_pending: f64,
    /// Unsharded weights freed in forward but not yet reusable: FSDP1 frees a unit's output on
    /// the host as its forward ends (`_post_forward_reshard`, after `record_stream` on the
    /// compute stream), before the next unit's all-gather allocates, so the unit in flight is
    /// cached, not allocated, while the GPU still reads it (see [`side_streams`]).
    pub(crate) forward_pending: f64,
    /// Whether these buffers are made on the producer's own streams (see [`side_streams`]).
    pub(crate) side_streams: bool,
    /// The block before the one whose backward runs, gathered only as that backward finishes
    /// (see [`fsdp1_prefetches_blocks_late`]): beyond `backward_weights` from a block's
    /// finishing moment to its end, for every block with a block before it.
    pub(crate) backward_prefetched: f64,
    /// The all-gather's own copy of its output while it runs, per byte gathered:
    /// ProcessGroupGloo gathers into a new flat tensor of the output's size and copies it out
    /// (`AsyncAllgatherWork`, `newLikeFlat`), which NCCL does not: 1 on the CPU, 0 on a GPU.
    /// Its peak is planned where a late prefetch meets a block's finishing moment; the other
    /// all-gathers run with fewer tensors alive, and the planned sequence makes the first, the
    /// root's, as the forward starts, which leaves a block of its size in the allocator's pool.
    pub(crate) gather_copy_share: f64,
}

impl PhaseBuffers {
    /// The block before `units[index]` gathered as its backward finishes and the all-gather's
    /// copy beside it (`backward_prefetched`, `gather_copy_share`): nothing but for a block with a
    /// block before it, where a block is gathered late.
    pub(crate) fn prefetched_by(&self, units: &[Unit], index: usize) -> (f64, f64) {
        let after_block =
            index > 0 && units[index].name == "block" && units[index - 1].name == "block";
        if after_block && self.backward_prefetched > 0.0 {
            (
                self.backward_prefetched,
                self.backward_prefetched * self.gather_copy_share,
            )
        } else {
            (0.0, 0.0)
        }
    }
}

/// Whether FSDP makes its buffers on streams of its own, each with its own pool in PyTorch's
/// caching allocator: FSDP1 on a GPU (PyTorch 2.1-2.3, `torch/distributed/fsdp/`):
/// `_runtime_utils.py` `_init_streams` creates the unshard, post-backward and pre-unshard
/// streams; `_unshard` runs `handle.pre_unshard()` under the pre-unshard stream (with parameter
/// offload `_flat_param.py` `pre_unshard` → `flat_param_to(self.device, non_blocking=True)`,
/// the host shard's GPU copy) and `handle.unshard()` under the unshard stream
/// (`_alloc_padded_unsharded_flat_param`, the all-gather output); `_free_unsharded_flat_param`
/// frees that output after `_no_dispatch_record_stream` on the compute stream, and the
/// `limit_all_gathers` rate limiter (`_free_event_queue.dequeue_if_needed`, two in flight)
/// makes the host wait for the free of the unit resharded two all-gathers before, so a freed
/// output is back in the unshard pool by the all-gather after next. In backward a unit is
/// unsharded only by the prefetch of the unit before it (`_pre_backward_hook` skips `_unshard`
/// for a prefetched handle; `_prefetch_handle`, `BACKWARD_PRE`), so while a unit computes, the
/// one after it has been resharded with its event still queued: the queue holds fewer than two
/// events when the next prefetch comes, which then waits for none and cannot reuse that
/// output. The pool holds three units' outputs in backward (computing, prefetched, awaiting
/// its event) where it holds two in forward. `_post_backward_hook` runs
/// the reduce-dtype cast and `_reduce_grad` (`_get_reduce_scatter_tensors`: the padded input
/// and `new_sharded_grad`) under the post-backward stream. On the CPU (gloo) there is one
/// stream. FSDP2's streams are not modelled: its buffers stay on the compute stream.
pub(crate) fn side_streams(workload: &Workload) -> bool {
    workload.layout.sharding == Sharding::Fsdp
        && workload.layout.fsdp_version == FsdpVersion::V1
        && workload.target == Target::Gpu
}

/// Whether FSDP keeps each block gathered from its forward to the end of its backward:
/// `SHARD_GRAD_OP` and `_HYBRID_SHARD_ZERO2` (FSDP1 `_runtime_utils.py`
/// `_post_forward_reshard` frees a non-root unit only under the strategies that reshard after
/// forward; its pre-backward `unshard` finds the parameter still gathered (`needs_unshard`) and
/// gathers nothing; `_post_backward_reshard` frees it once its gradients are reduced), FSDP2's
/// `reshard_after_forward=False`.
pub(crate) fn fsdp_keeps_units_gathered(workload: &Workload) -> bool {
    let layout = &workload.layout;
    layout.sharding == Sharding::Fsdp && layout.fsdp_sharding.keeps_units_gathered()
}

/// Whether FSDP accumulates gradients unsharded: more than one micro-batch a step, all but the
/// last under `no_sync`, which keeps each unit's `flat_param.grad` whole between them (FSDP2's
/// `set_requires_gradient_sync(False)` likewise) until the synchronising backward adds into it
/// and reduce-scatters it.
pub(crate) fn fsdp_accumulates_unsharded(workload: &Workload) -> bool {
    workload.layout.sharding == Sharding::Fsdp && workload.grad_accum > 1
}

/// Whether FSDP1 keeps every block gathered through the whole step: a unit kept gathered from
/// its forward ([`fsdp_keeps_units_gathered`]) is freed in backward only when gradients are
/// synchronised (`_should_free_in_backward`: `state._sync_gradients` or a strategy that
/// reshards after forward), so accumulating under `no_sync` keeps them all from one
/// micro-batch to the next. FSDP2 reshards after backward whether it synchronises or not
/// (`reshard_after_backward` defaults to true; `set_reshard_after_backward(False)` is the
/// caller's choice).
pub(crate) fn fsdp_keeps_model_gathered(workload: &Workload) -> bool {
    fsdp_keeps_units_gathered(workload)
        && workload.layout.fsdp_version == FsdpVersion::V1
        && fsdp_accumulates_unsharded(workload)
}

/// Whether FSDP1 gathers the block before a block only as that block's backward finishes:
/// `BACKWARD_PRE` prefetches the handle before the current one in post-forward order
/// (`_exec_order_utils.py` `get_handle_to_backward_prefetch`, from `_pre_backward_hook` →
/// `_prefetch_handle`), and where every LoRA adapter is a unit of its own (PEFT's
/// `fsdp_auto_wrap_policy`, fsdp_qlora's, the Trainer's for a PEFT model) that handle is the
/// block's own last adapter, whose post-forward ran just before the block's. The block before
/// is prefetched by the pre-backward of the block's first adapter (the q/k/v projections'), as
/// its backward ends, and the block is resharded once its input's gradient exists
/// (`_post_backward_reshard_only_hook` on the inputs, its flat parameter being frozen): one
/// block gathered through a block's backward, two as it finishes. Between two blocks the
/// adapters' own all-gathers and reshards pass through the `limit_all_gathers` queue, so a
/// resharded block's free event has been waited on before the next block's all-gather, which
/// reuses its output (no unit pending, see [`side_streams`]). Seen on CPU traces of FSDP1 with
/// PEFT LoRA and QLoRA (PyTorch 2.15, two gloo ranks), reentrant checkpointing or not.
pub(crate) fn fsdp1_prefetches_blocks_late(workload: &Workload) -> bool {
    let layout = &workload.layout;
    layout.sharding == Sharding::Fsdp
        && layout.fsdp_version == FsdpVersion::V1
        && layout.fsdp_sharding != FsdpSharding::NoShard
        && !layout.fsdp_sharding.keeps_units_gathered()
        && workload.lora.is_some()
}

/// Bytes per element of the gradient reduction: FSDP mixed precision reduces in fp32 (as
/// torchtitan's `mixed_precision_reduce` default and FSDP1's `reduce_dtype=float32` set it), so
/// the reduce-scatter input is an fp32 copy of the unit's gradients.
fn reduce_bytes(workload: &Workload) -> f64 {
    match workload.layout.fsdp_mp {
        Some(_) => Dtype::Fp32.bytes() as f64,
        None => workload.dtype.bytes() as f64,
    }
}

/// The gathered units and reduction buffers of FSDP full sharding, per GPU.
///
/// Wrapping as every recipe does (each block its own unit, the root holding embeddings, final
/// norm and head): the root is not resharded after forward (FSDP2 sets
/// `reshard_after_forward=False` for the root; FSDP1 frees no root handle post-forward), so it
/// stays gathered from its all-gather to the end of backward, and its unsharded gradients live
/// from the head's backward until the root's post-backward reduce-scatter at the end. A block is
/// gathered while it runs; the root's pre-backward prefetches the last block, and each block's
/// the one before it (FSDP2's default, FSDP1's `BACKWARD_PRE`), so one block is gathered when
/// the backward starts and two after. A block's backward ends with its unsharded gradients and
/// the reduce-scatter input (their copy in the reduce dtype) alive together. The backward ends
/// with the root's post-backward: its gradients cast to the reduce dtype (FSDP2's
/// `foreach_reduce`; the same bytes as the fp32 gradients without mixed precision) and the
/// reduce-scatter input, two root-sized tensors in the reduce dtype. FSDP1 holds the other
/// ranks' part of one more (a root-sized tensor less its own shard: 1/2 of the root's
/// gradients on 2 ranks, 3/4 on 4, as measured; the holder inside `_reduce_grad` and its
/// callbacks was not identified in the source).
///
/// On a GPU the collectives run on their own streams and the CPU runs ahead: the next block's
/// all-gather output exists while the current block computes (FSDP2's implicit forward
/// prefetch, held as allocated; FSDP1's `limit_all_gathers` allows two in flight, but FSDP1
/// frees the current block on the host before the next one's all-gather allocates, so the
/// one in flight is cached, not allocated: `forward_pending`), and FSDP2 keeps the previous
/// reduce-scatter input alive until the next reduce-scatter (`reduce_scatter_state`, so that
/// the allocator does not reuse it while the other stream reads it). On the CPU (gloo) the
/// streams are the current stream and neither happens, as the CPU measurements show.
/// Only the trainable share (`trainable_share`, LoRA adapters) of a unit has gradients; a tied
/// LM head's parameters are the head unit's (its backward makes the embedding's gradient).
fn fsdp_buffers(
    units: &[Unit],
    workload: &Workload,
    tp: f64,
    trainable_share: f64,
    gathered: f64,
) -> PhaseBuffers {
    let layout = &workload.layout;
    let shards = layout.shard_ranks() as f64;
    let module = workload.module_dtype().bytes() as f64;
    // Under NO_SHARD a unit's flat parameter is whole on every rank: nothing is gathered, and
    // with mixed precision the unit computes on a low-precision copy made as it is unsharded
    // and freed as it is resharded (FSDP1 `_flat_param.py` `pre_unshard` →
    // `_use_low_precision_shard`, `post_reshard` → `_free_low_precision_sharded_param` for an
    // unsharded strategy), the root's from the forward's start to the backward's end like a
    // gathered root. Its gradient is made in that dtype and cast to the reduce dtype, which is
    // the gradient the states hold, before the in-place all-reduce (`_reduce_grad_no_shard`).
    let no_shard = layout.fsdp_sharding == FsdpSharding::NoShard;
    let low_precision = match (no_shard, layout.fsdp_mp) {
        (false, _) => module,
        (true, Some(mp)) => mp.bytes() as f64,
        (true, None) => 0.0,
    };
    let gathered = if no_shard { low_precision } else { gathered };
    // Parameters, per tensor-parallel rank, of the units `keep` selects.
    let params = |keep: &dyn Fn(&Unit) -> bool| {
        units
            .iter()
            .filter(|u| keep(u))
            .map(|u| u.params as f64)
            .sum::<f64>()
            / tp
    };
    let root = params(&|u| u.name != "block");
    let block = units
        .iter()
        .filter(|u| u.name == "block")
        .map(|u| u.params as f64)
        .fold(0.0, f64::max)
        / tp;
    let reduce = if no_shard {
        0.0
    } else {
        reduce_bytes(workload)
    };
    // The root gradients that exist while the blocks' backward runs: the head's (the
    // embeddings' appear at the very end).
    let head = params(&|u| u.name == "head");
    let in_flight = match workload.target {
        Target::Gpu => block,
        Target::Cpu => 0.0,
    };
    // With parameters offloaded, each unshard first copies the host shard to the GPU (FSDP1
    // `_flat_param.py` `pre_unshard` → `flat_param_to(device, non_blocking=True)`, a new
    // shard-sized tensor the all-gather reads, freed once it is done; FSDP2 the all-gather
    // copy-in of `sharded_param.to(device)`): one block's shard per all-gather in flight.
    let staging = match (layout.offload.params(), workload.target) {
        (true, Target::Gpu) if !no_shard => block * gathered / shards,
        _ => 0.0,
    };
    let backward_reduce = trainable_share * (block + in_flight) * reduce;
    let fsdp1_streams = side_streams(workload);
    let root_weights = root * low_precision;
    // Accumulating unsharded, a unit's unsharded gradient is the accumulated one the states
    // hold: no second one.
    let unsharded_gradients = if fsdp_accumulates_unsharded(workload) {
        0.0
    } else {
        low_precision
    };
    let keeps_model = fsdp_keeps_model_gathered(workload);
    // A unit kept gathered from its forward (`fsdp_keeps_units_gathered`) is counted with the
    // unit (`States::gathered_through_backward`): the forward gathers only the one in flight,
    // the backward none; accumulating, every block stays gathered through the step (counted
    // once, as a step buffer; the last micro-batch's backward frees them before the optimizer
    // step, which the plan does not model).
    let late_prefetch = fsdp1_prefetches_blocks_late(workload);
    // FSDP2 holds the next block's all-gather output while the current one computes; FSDP1's
    // is the one it freed, still cached (`forward_pending`).
    let (forward_in_flight, forward_freed) = if fsdp1_streams {
        (0.0, in_flight)
    } else {
        (in_flight, 0.0)
    };
    let (forward_blocks, forward_pending, backward_start_blocks, backward_blocks, pending) =
        if keeps_model {
            (0.0, 0.0, 0.0, 0.0, 0.0)
        } else if fsdp_keeps_units_gathered(workload) {
            (in_flight, 0.0, 0.0, 0.0, 0.0)
        } else if late_prefetch {
            (block + forward_in_flight, forward_freed, block, block, 0.0)
        } else {
            (
                block + forward_in_flight,
                forward_freed,
                block,
                2.0 * block,
                if fsdp1_streams { block } else { 0.0 },
            )
        };
    let blocks = params(&|u| u.name == "block");
    PhaseBuffers {
        step_weights: if keeps_model { blocks * gathered } else { 0.0 },
        forward_weights: root_weights + forward_blocks * gathered + staging,
        backward_start_weights: root_weights + backward_start_blocks * gathered + staging,
        backward_weights: root_weights + backward_blocks * gathered + staging,
        backward_gradients: trainable_share * (head + block) * unsharded_gradients
            + backward_reduce,
        backward_last: (root_weights, trainable_share * head * unsharded_gradients),
        backward_end_gradients: trainable_share
            * if no_shard {
                root * low_precision
            } else {
                2.0 * root * reduce
                    + match layout.fsdp_version {
                        FsdpVersion::V1 => root * reduce * (1.0 - 1.0 / shards),
                        FsdpVersion::V2 => 0.0,
                    }
            },
        staging,
        backward_reduce,
        backward_pending: pending * gathered,
        forward_pending: forward_pending * gathered,
        backward_prefetched: if late_prefetch { block * gathered } else { 0.0 },
        gather_copy_share: match workload.target {
            Target::Cpu if !no_shard => 1.0,
            _ => 0.0,
        },
        backward_end_stream: if fsdp1_streams {
            Stream::PostBackward
        } else {
            Stream::Compute
        },
        side_streams: fsdp1_streams,
        ..PhaseBuffers::default()
    }
}

/// Buffers of a sharded or data-parallel layout for `units` (see [`ShardingInputs`]).
pub(crate) fn sharding_buffers(
    units: &[Unit],
    workload: &Workload,
    inputs: &ShardingInputs,
) -> PhaseBuffers {
    let layout = &workload.layout;
    let bucket = inputs.zero.reduce_bucket as f64 * inputs.bucket_bytes;
    match layout.sharding {
        // DDP's gradient buckets hold a copy of every gradient.
        Sharding::None if layout.dp() > 1 => PhaseBuffers {
            step_gradients: inputs.gradients_full,
            ..PhaseBuffers::default()
        },
        Sharding::None => PhaseBuffers::default(),
        // `contiguous_gradients` (on by default, forced by offloading) allocates one
        // `reduce_bucket_size` buffer every backward, whatever the model's size (a second one
        // with `overlap_comm`, off by default below stage 3). With optimizer offload the
        // optimizer also keeps a GPU buffer of the largest trained parameter's size in the
        // module dtype for the gradients it copies to the host (`stage_1_and_2.py`
        // `temp_grad_buffer_for_gpu_offload`, allocated with the optimizer, v0.14.2 lines
        // 445-455 and 476-478; `async_accumulate_grad_in_cpu_via_gpu`, 1182-1188).
        Sharding::Zero1 | Sharding::Zero2 => {
            let offload_buffer = if layout.offload.optimizer() {
                inputs.largest_trainable * inputs.bucket_bytes
            } else {
                0.0
            };
            let check = zero_offload_overflow_check(workload, inputs);
            // The check runs as the parameter's bucket is reduced: the head's, as the head's
            // backward finishes, when its weight is the largest trained tensor (an untied LM
            // head); any other's is planned at the backward's end, with the last reductions.
            let head_elements = inputs.head / inputs.gathered.max(1.0);
            let head_is_largest =
                workload.lora.is_none() && head_elements >= inputs.largest_trainable;
            let (head_gradients, backward_end_gradients) = if head_is_largest {
                (check, 0.0)
            } else {
                (0.0, check)
            };
            PhaseBuffers {
                step_gradients: bucket + offload_buffer,
                head_gradients,
                backward_end_gradients,
                ..PhaseBuffers::default()
            }
        }
        // Stage 3: the IPG flat buffer of `reduce_bucket_size` elements (`stage3.py`, allocated
        // with the optimizer for the run); the layer in use and the prefetch bucket gathered
        // (no more than `stage3_max_live_parameters` ahead). At the turn from forward to
        // backward the LM head is used again at once (its backward), within
        // `stage3_max_reuse_distance`, so `__params_to_release` keeps it gathered from its
        // forward through its backward, beside the last block (reused after the head's
        // forward and backward).
        Sharding::Zero3 => {
            let prefetch = inputs.zero.prefetch_bucket.min(MAX_LIVE_ELEMENTS) as f64;
            let prefetched = (prefetch * inputs.gathered).min(inputs.largest_block);
            let head = if inputs.head / inputs.gathered.max(1.0) < MAX_REUSE_ELEMENTS as f64 {
                inputs.head
            } else {
                0.0
            };
            // A trained head's weight gradient is made whole by its matmul's backward before
            // its hook runs (`create_reduce_and_remove_grad_hooks`: on the parameter's
            // AccumulateGrad), which copies it into the IPG bucket if it fits and drops it, or,
            // for a head of more than `reduce_bucket_size` elements (Llama-3's 128256 × 4096
            // over 5e8), keeps it as its own tensor until the next hook reduces it
            // (`__add_grad_to_ipg_bucket`, v0.14.2 `stage3.py` 1230-1247; `partition_grads`
            // drops `param.grad`, 1418-1478): the unsharded head gradient, in the module
            // dtype, is alive while the head's backward finishes.
            let head_elements = inputs.head / inputs.gathered.max(1.0);
            let head_gradients = if workload.lora.is_none() {
                head_elements * inputs.bucket_bytes
            } else {
                0.0
            };
            PhaseBuffers {
                step_weights: inputs.largest_block + prefetched,
                step_gradients: bucket,
                head_gradients,
                backward_end_gradients: zero3_bucket_copy(inputs),
                backward_end_stream: zero3_reduce_stream(workload),
                // Released after its backward in DeepSpeed; here it stays to the embeddings'
                // backward, as the planned sequence frees what backward gathered (an
                // over-count of at most the head through the blocks' backward).
                backward_start_weights: head,
                backward_weights: head,
                ..PhaseBuffers::default()
            }
        }
        Sharding::Fsdp => fsdp_buffers(
            units,
            workload,
            layout.tp as f64,
            inputs.trainable_share,
            inputs.gathered,
        ),
    }
}

/// The copy ZeRO-3 makes of a gradient bucket to reduce-scatter it, bytes: with `reduce_scatter`
/// on (the default, `runtime/zero/config.py`) `__reduce_and_partition_ipg_grads` reduces a bucket
/// through `__avg_scatter_grads` → `reduce_scatter_coalesced` (DeepSpeed v0.14.2 `stage3.py`
/// 1249-1285 and 1327-1350), which concatenates the bucket's gradients, each padded to a
/// multiple of the ranks, into one new flat tensor in the module dtype
/// (`comm/coalesced_collectives.py` 100-122; only a bucket of one tensor that needs no padding
/// is reduced in place). The reduced partitions are views of that tensor, alive until
/// `partition_grads` has copied them into `grad_partitions_flat_buffer`. A bucket holds at most
/// `reduce_bucket_size` elements (`reduce_independent_p_g_buckets_and_remove_grads` reduces it
/// before it would overflow), and the last is reduced as the backward ends
/// (`independent_gradient_partition_epilogue`); the largest copy is the smaller of the bucket
/// and this GPU's trained parameters (a model that fits one bucket is copied whole once, at the
/// backward's end).
fn zero3_bucket_copy(inputs: &ShardingInputs) -> f64 {
    inputs.trainable_local.min(inputs.zero.reduce_bucket as f64) * inputs.bucket_bytes
}

/// The stream ZeRO-3 reduces its gradient buckets on: `reduce_and_partition_stream`, a stream of
/// its own on a GPU with `overlap_comm` (on by default for stage 3, `runtime/zero/config.py`
/// `overlap_comm_valid`), the default stream on a synchronized device such as the CPU
/// (DeepSpeed v0.14.2 `stage3.py` 227-228). `__reduce_and_partition_ipg_grads` runs the
/// reduction and `partition_grads` under it (1265-1285), so the bucket copy
/// ([`zero3_bucket_copy`]) is allocated, freed and cached in that stream's pool; `has_overflow`
/// (2138-2150) makes its fp16 `isinf`/`isnan` masks of the gradient partitions there too, which
/// that cached copy serves (each mask is one byte per element of a partition, the copy two).
fn zero3_reduce_stream(workload: &Workload) -> Stream {
    match workload.target {
        Target::Gpu => Stream::ReduceAndPartition,
        Target::Cpu => Stream::Compute,
    }
}

/// DeepSpeed ZeRO-1/2 with optimizer offload checks every gradient of this rank's partition for
/// inf/NaN on the GPU once its bucket is reduced (`stage_1_and_2.py` v0.14.2
/// `copy_grads_in_partition` → `update_overflow_tracker_for_param_grad`, lines 1167-1170 and
/// 1320-1331), over the parameter's whole gradient: since v0.14.0 `_has_inf_or_nan` keeps its
/// fp32 copy, `isnan`, `isinf` and their `logical_or` alive while it makes the or's fp32 copy
/// (lines 2020-2025: 4 + 1 + 1 + 1 + 4 bytes per element); before it, `x.float().sum()` (4). The
/// busiest rank holds the largest trained parameter (each parameter lies in some rank's
/// partition), and, for a parameter over `reduce_bucket_size` elements, its gradient as its own
/// tensor in the module dtype (`extra_large_param_to_reduce`, 944-950; a smaller one's is in the
/// IPG bucket); both are alive during the check. Returns those bytes (none without offload).
fn zero_offload_overflow_check(workload: &Workload, inputs: &ShardingInputs) -> f64 {
    if !workload.layout.offload.optimizer() || workload.optimizer == Optimizer::None {
        return 0.0;
    }
    let largest = inputs.largest_trainable;
    let per_element = if workload
        .deepspeed
        .is_some_and(|release| release < DEEPSPEED_OVERFLOW_CHECK_MASKS_SINCE)
    {
        Dtype::Fp32.bytes() as f64
    } else {
        // Two fp32 tensors and three torch.bool masks (one byte per element).
        (2 * Dtype::Fp32.bytes() + 3) as f64
    };
    let own_gradient = if largest > inputs.zero.reduce_bucket as f64 {
        largest * inputs.bucket_bytes
    } else {
        0.0
    };
    largest * per_element + own_gradient
}

/// DeepSpeed ZeRO-1/2's optimizer step flattens this rank's gradient partition and converts it to
/// the fp32 of its master partition (`stage_1_and_2.py` `step`: `flatten(averaged_gradients)
/// .to(fp32)`, assigned as the master's `.grad` for the base optimizer): `trainable_local / dp`
/// fp32 elements alive through the step on the GPU. With optimizer offload the step runs on the
/// CPU, and each parameter group's updated fp32 partition comes back to the GPU as an fp32 copy
/// before it is cast into the module-dtype partition (`bit16_partitions[partition_id].data.copy_(
/// fp32_partition.to(current_device).data)`, v0.14.2 lines 1869-1871): `trainable_local / dp`
/// fp32 elements at the end of the step.
///
/// ZeRO-3 does the same one sub-group at a time (`stage3.py` `step` →
/// `_prepare_fp32_grad_for_sub_group`: `self.flatten(self.averaged_gradients[i]).to(fp32)`,
/// DeepSpeed v0.14.2 lines 1847-1858, freed by `_release_sub_group`, 1895-1899): the flattened
/// copy in the gradients' dtype (the dtype the engine cast the module to) and its fp32
/// conversion exist together, over the largest sub-group. `sub_group_size` (1e9 elements,
/// `runtime/zero/config.py`) closes a sub-group once its partitions reach it
/// (`_create_fp16_sub_groups`), so the largest holds at most that plus one parameter's
/// partition, and all of this rank's partitions below it. fp32 gradients are not converted
/// (`.to` of the same dtype returns the tensor): the flattened copy alone.
pub(crate) fn zero_step_gradients(
    workload: &Workload,
    trainable_local: f64,
    largest_trainable: f64,
) -> f64 {
    let layout = &workload.layout;
    let dp = layout.dp() as f64;
    let fp32 = Dtype::Fp32.bytes() as f64;
    if workload.optimizer == Optimizer::None {
        return 0.0;
    }
    match layout.sharding {
        Sharding::Zero1 | Sharding::Zero2 => trainable_local / dp * fp32,
        Sharding::Zero3 if !layout.offload.optimizer() => {
            let partition = trainable_local / dp;
            let sub_group = partition.min(ZERO3_SUB_GROUP_ELEMENTS as f64 + largest_trainable / dp);
            let grad = workload.dtype.bytes() as f64;
            let converted = if workload.dtype == Dtype::Fp32 {
                0.0
            } else {
                fp32
            };
            sub_group * (grad + converted)
        }
        _ => 0.0,
    }
}

/// DeepSpeed ZeRO-3 keeps its reduced gradient partitions in one flat buffer of this rank's
/// partitions, allocated once when the optimizer is built and never freed (`stage3.py`
/// `_setup_for_real_optimizer`: `grad_partitions_flat_buffer = torch.zeros(…, device=
/// self.device)`, v0.14.2 lines 494-508; `partition_grads` copies each reduced partition into its
/// view, 1418-1435; the step's `zero_grad(set_to_none=True)` drops only `param.grad`). So every
/// gradient partition is on the GPU from the first backward on, through forward and backward, as
/// accumulated gradients are. With optimizer offload the buffer is on the host (`self.device`
/// is the CPU), and without an optimizer there is no ZeRO-3 optimizer to allocate it.
pub(crate) fn zero3_keeps_gradient_partitions(workload: &Workload) -> bool {
    workload.layout.sharding == Sharding::Zero3
        && !workload.layout.offload.optimizer()
        && workload.optimizer != Optimizer::None
}

/// transformers model types whose block linears are `Conv1D` (`pytorch_utils.py`:
/// `torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)`): the matmul saves the weight
/// parameter itself for backward, not a view of it, so ZeRO-3's release (which empties
/// `param.data`) frees the gathered storage whichever linear DeepSpeed installed.
const CONV1D_MODEL_TYPES: &[&str] = &["gpt2", "openai-gpt", "imagegpt", "decision_transformer"];

/// Bytes per block parameter of the gathered weights a block keeps from its forward to its
/// backward on this GPU when [`Workload::zero3_keeps_gathered_linears`]: DeepSpeed's releases
/// before 0.19.4 install their ZeRO-3 linear only inside a `zero.Init` context, and PyTorch's
/// `F.linear` (`matmul(input, weight.t())`, whose `MmBackward0` saves `weight.t()` for the
/// input's gradient) holds the storage the all-gather made after ZeRO-3 releases the parameter,
/// until that matmul's backward runs. So every block's linear weights, as gathered (the module
/// dtype, split over tensor-parallel ranks), stay allocated from the block's forward until its
/// backward; the pre-backward hook gathers a second copy for the backward itself (the parameter
/// was released), which the planned gathered block already is. Only the blocks: the embeddings'
/// backward keeps only the indices, and ZeRO-3 keeps the LM head gathered from its forward
/// through its backward anyway (`sharding_buffers`). Zero for a `Conv1D` family
/// ([`CONV1D_MODEL_TYPES`]), a quantised base (bitsandbytes' matmuls, not `F.linear`) and models
/// other than transformers. DeepSpeed's own linear (`linear.py` `LinearFunctionForZeroStage3`:
/// `ctx.save_for_backward(input, weight, bias)`, the parameter itself) keeps nothing.
pub(crate) fn zero3_saved_linear_bytes(
    model: &ModelSpec,
    workload: &Workload,
    counts: &ParamCounts,
) -> f64 {
    match &model.arch {
        Architecture::Transformer(spec)
            if workload.zero3_keeps_gathered_linears()
                && !CONV1D_MODEL_TYPES.contains(&spec.model_type.as_str())
                && workload.lora.is_none_or(|l| l.base == BaseQuant::None)
                && counts.body > 0 =>
        {
            counts.block_linear as f64 / counts.body as f64 * workload.module_dtype().bytes() as f64
                / workload.layout.tp as f64
        }
        _ => 0.0,
    }
}

/// Whether `unit`'s sharded gradients appear only when the backward ends: FSDP's root (every
/// unit but the blocks) reduce-scatters once all its parameters have gradients.
pub(crate) fn reduced_at_backward_end(workload: &Workload, unit: &Unit) -> bool {
    workload.layout.sharding == Sharding::Fsdp
        && workload.layout.fsdp_sharding != FsdpSharding::NoShard
        && unit.name != "block"
}

/// The ranks of each NCCL communicator one rank of `layout` holds: one per parallel group of
/// more than one rank (data, tensor, pipeline); a hybrid FSDP strategy's data-parallel ranks
/// form two groups, the machine's shard group and the replicas across machines. DeepSpeed's
/// ZeRO runs its collectives on a clone of the world group (`deepspeed/utils/groups.py`
/// `_clone_world_group`: `dist.new_group(ranks=range(world_size))`, for
/// `dist.get_global_rank`, which the world group does not answer) and the world group gets a
/// communicator of its own from the launchers' barriers (accelerate's `wait_for_everyone`, the
/// Trainer's `main_process_first`): one more, of every rank.
pub fn nccl_groups(layout: &Layout) -> Vec<u64> {
    let hybrid = layout.sharding == Sharding::Fsdp && layout.fsdp_sharding.hybrid();
    let data = if hybrid {
        let shard = layout.shard_ranks();
        vec![shard, layout.dp() / shard]
    } else {
        vec![layout.dp()]
    };
    let zero = matches!(
        layout.sharding,
        Sharding::Zero1 | Sharding::Zero2 | Sharding::Zero3
    );
    let world = if zero { layout.gpus } else { 1 };
    data.into_iter()
        .chain([layout.tp, layout.pp, world])
        .filter(|&size| size > 1)
        .collect()
}

/// What a communicator of `ranks` holds on the GPU beyond the Simple, LL and LL128 buffers
/// planned at the default `NCCL_BUFFSIZE` (NCCL's kernels, proxy and work queues, and the
/// connections of more peers): NVIDIA/nccl#964 measured what `nvidia-smi` gains as a
/// communicator is made and runs its first all-reduce, on 4 × A100 with NVLink under NCCL
/// 2.18 — 544 MiB for 2 ranks, 688 MiB for more — of which the buffers are 294 MiB.
pub fn nccl_beyond_buffers(ranks: u64) -> u64 {
    let measured: u64 = if ranks > 2 { 688 << 20 } else { 544 << 20 };
    measured - NCCL_DEFAULT_BUFFERS
}

/// Bytes of one communicator's buffers at the default `NCCL_BUFFSIZE`: 294 MiB.
const NCCL_DEFAULT_BUFFERS: u64 = NCCL_CHANNELS
    * NCCL_CONNECTIONS_PER_CHANNEL
    * (DEFAULT_NCCL_BUFFSIZE + NCCL_LL128_BYTES + NCCL_LL_BYTES);

/// Device bytes NCCL allocates for one rank of `layout` with cudaMalloc/cuMem, outside
/// PyTorch's caching allocator: in `nvidia-smi` and NVML, never in `memory_allocated` or
/// `memory_reserved`. Per communicator: channels × connections × (Simple + LL128 + LL buffers),
/// and what it holds beyond them ([`nccl_beyond_buffers`]).
pub fn nccl_bytes(layout: &Layout) -> u64 {
    let per_connection = layout.nccl_buffsize + NCCL_LL128_BYTES + NCCL_LL_BYTES;
    let buffers = NCCL_CHANNELS * NCCL_CONNECTIONS_PER_CHANNEL * per_connection;
    nccl_groups(layout)
        .into_iter()
        .map(|ranks| buffers + nccl_beyond_buffers(ranks))
        .sum()
}

#[cfg(test)]
mod tests;
