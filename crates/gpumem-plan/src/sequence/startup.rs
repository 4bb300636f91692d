//! The start-up before a run's first step, where a framework puts memory on the GPU that the
//! step itself does not hold: DeepSpeed ZeRO-3 without `zero.Init`, as its own allocation
//! sequence (the cache is emptied after it), and FSDP1's wrapping of a host-loaded model, whose
//! events open the steps' own sequence (the cache it leaves is the steps').

use super::{peak_live_bytes, Emitter, PlannedEvent, Shapes};
use crate::error::Result;
use crate::graph::build_units;
use crate::lora::adapter_matrices;
use crate::model::{Architecture, LayerKind, ModelSpec};
use crate::releases::OldRelease;
use crate::states::{base_packed_bytes, four_bit_head_params, model_states, trainable_params};
use crate::unit::Unit;
use crate::workload::{BaseQuant, FsdpSharding, FsdpVersion, Mode, Sharding, Workload};

/// Whether `workload` puts memory on the GPU before its first step that the step itself does
/// not hold: DeepSpeed ZeRO-3 training on a model loaded without `deepspeed.zero.Init`.
pub fn has_startup(workload: &Workload) -> bool {
    workload.mode == Mode::Train
        && workload.layout.sharding == Sharding::Zero3
        && !workload.layout.zero_init
}

/// The allocation sequence of the start-up before the first step, on one GPU: empty unless
/// [`has_startup`]. DeepSpeed ZeRO-3 on a model built without `zero.Init` (DeepSpeed v0.14.2;
/// the same in v0.19.2):
///
/// - `deepspeed.initialize` casts the module to the engine's dtype on the host and moves it
///   to the GPU whole (`engine.py` `_configure_distributed_model`, lines 1094-1112: `half()` /
///   `bfloat16()`, then `module.to(self.device)` unless `is_zero_init_model`): every parameter
///   one tensor in module order;
/// - the ZeRO-3 optimizer's `DeepSpeedZeRoOffload._convert_to_zero_parameters`
///   (`parameter_offload.py` 186-205) partitions the module through `Init(module=…)`
///   (`partition_parameters.py` 998-1001, 1020-1025), one parameter at a time:
///   `_partition_param` (1486-1595) allocates the rank's partition (the element count rounded
///   up to a multiple of the data-parallel size, divided by it; on the host with parameter
///   offload) and copies into it, then `free_param` (279-289) frees the whole parameter;
/// - `_create_fp16_partitions_with_defragmentation` (`stage3.py` 661-735) copies every trained
///   partition to the host, frees it, and calls `empty_cache()` (`defragment`, 526-557) before
///   the flat buffer of all partitions comes back to the GPU: what start-up cached is
///   released, and the step starts from the flat buffer (the first event of
///   [`allocation_sequence`](super::allocation_sequence)).
///
/// So the start-up's own peak (the whole module-dtype model plus the first partitions) is a
/// separate peak of the process: replayed on its own, its reserved memory is what the
/// allocator holds at that moment. Frozen parameters (LoRA bases) are not defragmented and
/// their partitions would stay where they were placed; they are freed here with the rest.
pub fn startup_sequence(model: &ModelSpec, workload: &Workload) -> Result<Vec<PlannedEvent>> {
    // Asked by every estimate: the cheap test first.
    if !has_startup(workload) {
        return Ok(Vec::new());
    }
    crate::check(model, workload)?;
    let mut out = Emitter::default();
    let counts = model.params();
    let trainable = trainable_params(model, workload, &counts);
    let units = build_units(model, workload, workload.batch);
    let states = model_states(model, workload, &counts, &units, trainable);
    let shapes = Shapes::of(model, workload, &units, &states);
    let layout = &workload.layout;
    let module = workload.dtype.bytes() as f64;
    let (tp, dp) = (layout.tp as f64, layout.dp());
    // Each parameter's elements on this rank, in module order: a unit's known matrices, then
    // the rest of its parameters (norms, biases) as one.
    let params: Vec<u64> = units
        .iter()
        .flat_map(|u| {
            let matrices: Vec<u64> = shapes.matrices(u).collect();
            let rest = u.params.saturating_sub(matrices.iter().sum());
            matrices.into_iter().chain((rest > 0).then_some(rest))
        })
        .map(|elements| (elements as f64 / tp).ceil() as u64)
        .collect();
    let whole: Vec<Option<u64>> = params
        .iter()
        .map(|&elements| out.alloc(elements as f64 * module))
        .collect();
    let mut partitions = Vec::new();
    for (&elements, whole) in params.iter().zip(whole) {
        if !layout.offload.params() {
            partitions.extend(out.alloc(elements.div_ceil(dp) as f64 * module));
        }
        out.free(whole);
    }
    out.free_all(partitions);
    Ok(out.events)
}

/// Peak allocated bytes of the start-up: [`startup_sequence`]'s, or FSDP1's set-up
/// ([`has_fsdp_setup`]) up to the first step; 0 without one.
pub(crate) fn startup_peak(model: &ModelSpec, workload: &Workload) -> Result<u64> {
    if !has_fsdp_setup(workload) {
        return Ok(peak_live_bytes(&startup_sequence(model, workload)?));
    }
    Ok(peak_live_bytes(&fsdp1_setup_alone(model, workload)?.0))
}

/// FSDP1's set-up ([`fsdp1_setup`]) after the 4-bit loading before it ([`four_bit_loading`],
/// freed at the end) as a sequence of its own, with the shards it leaves.
fn fsdp1_setup_alone(
    model: &ModelSpec,
    workload: &Workload,
) -> Result<(Vec<PlannedEvent>, Vec<u64>)> {
    crate::check(model, workload)?;
    let counts = model.params();
    let trainable = trainable_params(model, workload, &counts);
    let units = build_units(model, workload, workload.batch);
    let states = model_states(model, workload, &counts, &units, trainable);
    let shapes = Shapes::of(model, workload, &units, &states);
    let mut out = Emitter::default();
    let (loaded, _) = four_bit_loading(&mut out, model, workload, &units, &shapes);
    let (shards, _) = fsdp1_setup(&mut out, model, workload, &units, &shapes);
    out.free_all(loaded);
    Ok((out.events, shards))
}

/// PyTorch's `PARAM_BROADCAST_BUCKET_SIZE` (250 MiB, `torch/distributed/fsdp/_init_utils.py`):
/// the bucket size `sync_module_states` broadcasts a unit's parameters in.
const BROADCAST_BUCKET_BYTES: f64 = 250.0 * 1024.0 * 1024.0;

/// Whether `workload` is FSDP1 training over a model rank 0 loaded on the host, which
/// `FullyShardedDataParallel(device_id=…, sync_module_states=True)` moves to the GPU and
/// shards there unit by unit before the first step, ahead of the steps in
/// [`allocation_sequence`](super::allocation_sequence).
pub fn has_fsdp_setup(workload: &Workload) -> bool {
    is_fsdp1_training(workload) && workload.layout.fsdp_cpu_loading
}

/// Whether `workload` trains under FSDP1, whose weights are each unit's flat parameter.
pub(super) fn is_fsdp1_training(workload: &Workload) -> bool {
    let layout = &workload.layout;
    workload.mode == Mode::Train
        && layout.sharding == Sharding::Fsdp
        && layout.fsdp_version == FsdpVersion::V1
}

/// FSDP1's wrapping of a model rank 0 holds on the host, on rank 0's GPU, emitted into `out`
/// ahead of the steps: returns the ids of what it leaves on the GPU, the sharded flat
/// parameters (none with parameter offload) and the buffers it moved there, and their bytes.
/// Nothing empties the cache between the wrapping and the first step (fsdp_qlora `train.py`
/// at 05ed9f2, lines 753-838: `FSDP(…)`, then checkpointing, the optimizer and
/// `reset_peak_memory_stats`; its one `empty_cache`, line 663, comes before, after the 4-bit
/// loading), so the blocks it frees stay cached under the steps, in the sizes of the set-up's
/// tensors. PyTorch 2.2-2.15 FSDP1, for each unit in
/// wrapping order ([`fsdp1_units`]), `_init_utils.py` `_init_param_handle_from_module`:
///
/// - `_move_module_to_device` → `_move_states_to_device`: `param.data = param.to(device)`, one
///   tensor per parameter still on the host (a quantised `Params4bit` moves its packed data),
///   then `buffer.data = buffer.to(device)` for its buffers, which stay whole;
/// - `_sync_module_params_and_buffers` → `dist._broadcast_coalesced(…, 250 MiB, src=0)`
///   (c10d `comm.cpp` `broadcast_coalesced`): buckets closed once they reach the size
///   (`compute_bucket_assignment_by_size`, the buffers first, one bucket per dtype), each
///   flattened into one new tensor unless it holds a single one (`flatten_dense_tensors`).
///   NCCL records each on its stream, so its block returns to the pool only once the host has
///   waited for the broadcast: at its next synchronising copy, the shard's copy to the host
///   with parameter offload, else the next unit's first parameter copy (a pageable
///   host-to-device copy synchronises the stream);
/// - `FlatParamHandle.flatten_tensors`: `torch.cat` of the unit's parameters into the flat
///   parameter; `shard` → `_get_shard`: a clone of this rank's chunk (`1/dp` of the ranks it
///   shards over, rounded up), then the flat parameter's storage is freed
///   (`_typed_storage()._resize_(0)`); under `NO_SHARD` the flat parameter stays whole;
/// - with `CPUOffload(offload_params=True)`, `_init_param_handle_from_params` copies the shard
///   to the host (`flat_param_to(cpu)`) and frees it;
/// - the moved parameters are freed when the function returns (`managed_params` held them).
pub(super) fn fsdp1_setup(
    out: &mut Emitter,
    model: &ModelSpec,
    workload: &Workload,
    units: &[Unit],
    shapes: &Shapes,
) -> (Vec<u64>, f64) {
    // NO_SHARD keeps the flat parameter itself (`FlatParamHandle.shard` records whole-tensor
    // metadata and copies nothing).
    let whole = workload.layout.fsdp_sharding == FsdpSharding::NoShard;
    let offload = workload.layout.offload.params();
    let (mut shards, mut kept) = (Vec::new(), 0.0);
    let mut broadcast = Vec::new();
    for FsdpUnit { params, buffers } in fsdp1_units(model, workload, units, shapes) {
        let mut moved = Vec::with_capacity(params.len());
        for (index, &bytes) in params.iter().enumerate() {
            moved.push(out.alloc(bytes));
            if index == 0 {
                out.free_all(std::mem::take(&mut broadcast));
            }
        }
        // The buffers move after the parameters and stay: FSDP shards parameters only.
        for &bytes in buffers.layer.iter().chain(&buffers.model) {
            shards.extend(out.alloc(bytes));
            kept += bytes;
        }
        // `_sync_module_params_and_buffers` broadcasts the buffers first; the model's own
        // (a mask of another dtype) go in a bucket of their own, whole.
        broadcast = broadcast_buckets(&[buffers.layer.as_slice(), &params].concat())
            .into_iter()
            .filter_map(|bucket| out.alloc(bucket))
            .collect();
        let total: f64 = params.iter().sum();
        let flat = out.alloc(total);
        let shard_bytes = flat_shard_bytes(total, workload);
        let shard = if whole {
            flat
        } else {
            let shard = out.alloc(shard_bytes);
            out.free(flat);
            shard
        };
        if offload {
            out.free(shard);
            out.free_all(std::mem::take(&mut broadcast));
        } else if let Some(id) = shard {
            shards.push(id);
            kept += shard_bytes;
        }
        moved.into_iter().for_each(|m| out.free(m));
    }
    out.free_all(broadcast);
    (shards, kept)
}

/// Bytes of this rank's shard of a flat parameter of `total` bytes: `1/dp` of the ranks it
/// shards over, rounded up (`_get_shard`); the whole of it under `NO_SHARD`.
fn flat_shard_bytes(total: f64, workload: &Workload) -> f64 {
    match workload.layout.fsdp_sharding {
        FsdpSharding::NoShard => total,
        _ => (total / workload.layout.shard_ranks() as f64).ceil(),
    }
}

/// FSDP1's units as its wrapping leaves them, emitted into `out` where the wrapping itself is
/// not planned ([`has_fsdp_setup`]): each unit's buffers and its flat parameter's shard, one
/// tensor per unit ([`fsdp1_units`]; none with parameter offload, whose shards live on the
/// host). Returns their ids and bytes, part of the model's weights.
pub(super) fn fsdp1_shards(
    out: &mut Emitter,
    model: &ModelSpec,
    workload: &Workload,
    units: &[Unit],
    shapes: &Shapes,
) -> (Vec<u64>, f64) {
    let offload = workload.layout.offload.params();
    let (mut ids, mut kept) = (Vec::new(), 0.0);
    for FsdpUnit { params, buffers } in fsdp1_units(model, workload, units, shapes) {
        let shard = flat_shard_bytes(params.iter().sum(), workload);
        let on_gpu = (!offload).then_some(shard);
        for bytes in buffers.layer.iter().chain(&buffers.model).chain(&on_gpu) {
            ids.extend(out.alloc(*bytes));
            kept += bytes;
        }
    }
    (ids, kept)
}

/// Weights per absmax of a bitsandbytes 4-bit weight (`Params4bit`'s default `blocksize=64`).
const FOUR_BIT_BLOCK: f64 = 64.0;

/// Absmax values per fp32 scale under double quantisation (`quantize_4bit` calls
/// `quantize_blockwise(absmax, blocksize=256)`).
const NESTED_BLOCK: f64 = 256.0;

/// Bytes of a 4-bit `QuantState`'s code: the 16 fp32 values of the NF4/FP4 table.
const FOUR_BIT_CODE_BYTES: f64 = 16.0 * 4.0;

/// Bytes of double quantisation's shared code: the 256 fp32 values of `create_dynamic_map`.
const DYNAMIC_MAP_BYTES: f64 = 256.0 * 4.0;

/// The 4-bit loading of a quantised base on rank 0's GPU before FSDP1's wrapping, emitted into
/// `out` ahead of [`fsdp1_setup`]: the `QuantState` tensors each weight leaves on the GPU, in
/// the order bitsandbytes makes them; returns their ids and bytes (they are the weights'
/// quantisation statistics, which the steps would otherwise allocate). fsdp_qlora `train.py`
/// at 05ed9f2, `load_and_quantize` (204-277) under `--low_memory`: each weight is copied to the
/// GPU, `Params4bit.cuda` quantises it there, and only its packed data goes to the host
/// (`type(param)(value.data.to("cpu"), **value.__dict__)`), the `quant_state` staying on the
/// GPU; then `torch.cuda.empty_cache()` (663) releases every segment nothing live is left in:
/// the bf16 copies, the packed data and the fp32 absmax temporaries, so they are not emitted.
/// bitsandbytes 0.43.0 `functional.py` `quantize_4bit` (936-1009) allocates per weight the
/// fp32 absmax (one per [`FOUR_BIT_BLOCK`] weights) and the packed output, then its code
/// (`get_4bit_type(…).to(device)`, 16 fp32); with `compress_statistics` (double
/// quantisation) the absmax's mean (`offset`, a 0-d fp32 tensor), and `quantize_blockwise`
/// (726-800) the shared dynamic map once (`name2qmap["dynamic"]`, 256 fp32), one fp32 scale
/// per [`NESTED_BLOCK`] absmax values and the int8 absmax, after which the fp32 absmax is
/// freed; without it the fp32 absmax stays. Live, these are small tensors that PyTorch's
/// allocator packs into its small-block segments, which the wrapping's large tensors cannot use.
pub(super) fn four_bit_loading(
    out: &mut Emitter,
    model: &ModelSpec,
    workload: &Workload,
    units: &[Unit],
    shapes: &Shapes,
) -> (Vec<u64>, f64) {
    let Some(BaseQuant::Nf4 { double_quant }) = workload.lora.map(|l| l.base) else {
        return (Vec::new(), 0.0);
    };
    let tp = workload.layout.tp as f64;
    let head = four_bit_head_params(model, workload);
    let matrices = units
        .iter()
        .filter(|u| u.whole.block_matrices)
        .flat_map(|u| shapes.matrices(u))
        .chain((head > 0).then_some(head))
        .map(|m| (m as f64 / tp).ceil());
    let mut sizes = Vec::new();
    let mut shared_map = double_quant;
    for elements in matrices {
        let blocks = (elements / FOUR_BIT_BLOCK).ceil();
        if !double_quant {
            sizes.extend([blocks * 4.0, FOUR_BIT_CODE_BYTES]);
            continue;
        }
        sizes.extend([FOUR_BIT_CODE_BYTES, 4.0]);
        if std::mem::take(&mut shared_map) {
            sizes.push(DYNAMIC_MAP_BYTES);
        }
        sizes.extend([(blocks / NESTED_BLOCK).ceil() * 4.0, blocks]);
    }
    let ids = sizes.iter().filter_map(|&bytes| out.alloc(bytes)).collect();
    (ids, sizes.iter().sum())
}

/// The bytes of each flattened broadcast bucket over a unit's `params` (bytes each, in order):
/// a bucket closes once it reaches [`BROADCAST_BUCKET_BYTES`]; one of a single tensor is
/// broadcast in place.
fn broadcast_buckets(params: &[f64]) -> Vec<f64> {
    let mut buckets = Vec::new();
    let (mut bytes, mut count) = (0.0, 0);
    for &param in params {
        bytes += param;
        count += 1;
        if bytes >= BROADCAST_BUCKET_BYTES {
            buckets.push((bytes, count));
            (bytes, count) = (0.0, 0);
        }
    }
    if count > 0 {
        buckets.push((bytes, count));
    }
    buckets
        .into_iter()
        .filter(|&(_, count)| count > 1)
        .map(|(bytes, _)| bytes)
        .collect()
}

/// One FSDP1 unit's tensors on the host before the wrapping, in bytes: its parameters (which
/// it flattens and shards) and the module buffers it moves whole.
struct FsdpUnit {
    params: Vec<f64>,
    buffers: UnitBuffers,
}

/// A unit's buffers: its layer's (an older transformers release's rotary tables), and the
/// model's own outside the layers (the root's).
#[derive(Default)]
struct UnitBuffers {
    layer: Vec<f64>,
    model: Vec<f64>,
}

/// FSDP1's units in wrapping order (the auto-wrap policy wraps children first), each as the
/// bytes of its parameters on the host: per block, each LoRA adapter matrix as its own unit
/// (fsdp_qlora's `lambda_policy_fn` and PEFT's `fsdp_auto_wrap_policy` wrap every leaf module
/// with a trainable weight), then the block's frozen weight matrices (the packed data of a
/// quantised base) and the rest of its parameters (norms) as one, with the buffers its layer
/// registers; last the root: the other units' parameters (embeddings, final norm, head) and
/// the model's own buffers. The module's parameters are in `--dtype` (FSDP's mixed precision
/// casts only what it gathers).
fn fsdp1_units(
    model: &ModelSpec,
    workload: &Workload,
    units: &[Unit],
    shapes: &Shapes,
) -> Vec<FsdpUnit> {
    let module = workload.dtype.bytes() as f64;
    let tp = workload.layout.tp as f64;
    let (adapters, matrix_bytes, adapter_bytes) = match (&model.arch, workload.lora) {
        (Architecture::Transformer(spec), Some(lora)) => (
            adapter_matrices(spec, LayerKind::default(), lora.rank, lora.targets),
            base_packed_bytes(lora.base, workload.dtype),
            if workload.fp32_adapters() {
                4.0
            } else {
                module
            },
        ),
        _ => (Vec::new(), module, module),
    };
    let old = OldRelease::of_model(model, workload);
    let layer_buffers = old.map_or_else(Vec::new, |o| o.layer_buffers(module));
    let elements = |n: u64| (n as f64 / tp).ceil();
    let whole = |params: Vec<f64>| FsdpUnit {
        params,
        buffers: UnitBuffers::default(),
    };
    let mut out = Vec::new();
    let mut root = Vec::new();
    for unit in units {
        let matrices: Vec<u64> = shapes.matrices(unit).collect();
        let rest = unit.params.saturating_sub(matrices.iter().sum());
        if unit.whole.block_matrices {
            out.extend(
                adapters
                    .iter()
                    .map(|&a| whole(vec![elements(a) * adapter_bytes])),
            );
            let mut block: Vec<f64> = matrices
                .iter()
                .map(|&m| elements(m) * matrix_bytes)
                .collect();
            block.extend((rest > 0).then(|| elements(rest) * module));
            out.push(FsdpUnit {
                params: block,
                buffers: UnitBuffers {
                    layer: layer_buffers.clone(),
                    model: Vec::new(),
                },
            });
        } else {
            root.extend(matrices.iter().map(|&m| elements(m) * module));
            root.extend((rest > 0).then(|| elements(rest) * module));
        }
    }
    if !root.is_empty() {
        out.push(FsdpUnit {
            params: root,
            buffers: UnitBuffers {
                layer: Vec::new(),
                model: old.map_or_else(Vec::new, |o| o.model_buffers()),
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{estimate, find_model, Overheads, Phase, Settings};

    #[test]
    fn zero3_without_zero_init_starts_with_the_whole_model_then_its_partitions() {
        let model = find_model("llama-3-8b").unwrap();
        let run = |no_zero_init: bool, offload: &str| {
            let settings = Settings {
                seq: Some(1024),
                gpus: Some(8),
                zero: Some("3".into()),
                dtype: Some("bf16".into()),
                offload: Some(offload.into()),
                no_zero_init,
                ..Settings::default()
            };
            let workload = settings.resolve(&model).unwrap().workload;
            let events = startup_sequence(&model, &workload).unwrap();
            let e = estimate(&model, &workload, &Overheads::default()).unwrap();
            (events, e)
        };
        // Under zero.Init (the default) nothing happens before the first step.
        let (events, e) = run(false, "optimizer");
        assert!(events.is_empty());
        assert!(e.phases.iter().all(|p| p.phase != Phase::Startup));
        // Without it: the whole bf16 model, then the first parameter's partition (the
        // embeddings', an eighth) before the whole parameter is freed; everything is freed.
        let (events, e) = run(true, "optimizer");
        let model_bytes = model.params().total() * 2;
        let embeddings = 128_256 * 4096 * 2 / 8;
        assert_eq!(e.phases[0].phase, Phase::Startup);
        let peak = e.phases[0].allocated_bytes;
        assert!(
            peak.abs_diff(model_bytes + embeddings) < model_bytes / 1000,
            "{peak}"
        );
        crate::sequence::tests::assert_all_freed(&events, "start-up");
        // With parameter offload the partitions are made on the host.
        let (_, e) = run(true, "all");
        assert!(e.phases[0].allocated_bytes.abs_diff(model_bytes) < model_bytes / 1000);
    }

    /// QLoRA (rank 64, bf16) under FSDP1 on 2 GPUs at 512 tokens, as fsdp_qlora's benchmark
    /// runs it: with or without the host-side loading, with the offload given.
    fn fsdp1_qlora(loading: bool, offload: Option<&str>) -> Settings {
        Settings {
            seq: Some(512),
            gpus: Some(2),
            fsdp: true,
            fsdp_version: Some("1".into()),
            dtype: Some("bf16".into()),
            lora_rank: Some(64),
            qlora: true,
            offload: offload.map(Into::into),
            fsdp_cpu_ram_efficient_loading: loading,
            ..Settings::default()
        }
    }

    #[test]
    fn fsdp1_host_loading_leaves_one_shard_per_unit_and_its_cache_to_the_steps() {
        let model = find_model("meta-llama/Llama-2-7b-hf").unwrap();
        let run = |loading: bool, offload: Option<&str>| {
            let workload = fsdp1_qlora(loading, offload)
                .resolve(&model)
                .unwrap()
                .workload;
            let events = crate::allocation_sequence(&model, &workload).unwrap();
            let e = estimate(&model, &workload, &Overheads::default()).unwrap();
            (events, e)
        };
        let (plain, before) = run(false, None);
        let (events, after) = run(true, None);
        // The set-up comes before the first step and adds no live bytes to the steps.
        let first_step = |events: &[PlannedEvent]| {
            events
                .iter()
                .position(|e| matches!(e, PlannedEvent::Step { .. }))
                .unwrap()
        };
        assert!(first_step(&events) > first_step(&plain) + 32 * 4);
        assert_eq!(before.peak_allocated_bytes, after.peak_allocated_bytes);
        assert_eq!(after.phases[0].phase, Phase::Startup);
        assert!(after.phases[0].allocated_bytes < after.peak_allocated_bytes);
        crate::sequence::tests::assert_all_freed(&events, "FSDP1 set-up and steps");
        // Each block's broadcast bucket and flat parameter: its packed 4-bit matrices and
        // norms, 202 M weights at half a byte and 8192 bf16 norm weights; its shard is half.
        let block = (4 * 4096 * 4096 + 3 * 4096 * 11008) / 2 + 2 * 4096 * 2;
        let allocs: Vec<u64> = events[..first_step(&events)]
            .iter()
            .filter_map(|e| match *e {
                PlannedEvent::Alloc { bytes, .. } => Some(bytes),
                _ => None,
            })
            .collect();
        assert_eq!(allocs.iter().filter(|&&b| b == block).count(), 2 * 32);
        assert_eq!(allocs.iter().filter(|&&b| b == block / 2).count(), 32);
        // Before the wrapping, the 4-bit loading's int8 absmax of each quantised matrix (one
        // per 64 weights) and its fp32 scales (one per 256 of those), ahead of every shard.
        let position = |bytes: u64| allocs.iter().position(|&b| b == bytes).unwrap();
        assert_eq!(
            allocs.iter().filter(|&&b| b == 4096 * 4096 / 64).count(),
            4 * 32
        );
        assert_eq!(
            allocs.iter().filter(|&&b| b == 4096 * 11008 / 64).count(),
            3 * 32
        );
        assert_eq!(
            allocs
                .iter()
                .filter(|&&b| b == 4096 * 11008 / 64 / 256 * 4)
                .count(),
            3 * 32
        );
        assert!(allocs.iter().rposition(|&b| b == 4096 * 11008 / 64) < Some(position(block)));
        // With parameter offload the shards go to the host: nothing stays for the steps.
        let settings =
            |offload: Option<&str>| fsdp1_qlora(true, offload).resolve(&model).unwrap().workload;
        // One shard per FSDP unit: per block each adapter matrix (A and B on all seven
        // linears) and the block, then the root.
        let (_, shards) = fsdp1_setup_alone(&model, &settings(None)).unwrap();
        assert_eq!(shards.len(), 32 * (7 * 2 + 1) + 1);
        let (setup, shards) = fsdp1_setup_alone(&model, &settings(Some("all"))).unwrap();
        assert!(shards.is_empty());
        crate::sequence::tests::assert_all_freed(&setup, "FSDP1 set-up with offload");
    }

    #[test]
    fn broadcast_buckets_close_at_250_mib_and_skip_single_tensors() {
        let mib = 1024.0 * 1024.0;
        // A Llama-2-70B block's packed matrices: q, k, v, o, gate, up, down.
        let block = [32.0, 4.0, 4.0, 32.0, 112.0, 112.0, 112.0].map(|m| m * mib);
        // q to up reach 296 MiB and close the bucket; down alone is broadcast in place.
        assert_eq!(broadcast_buckets(&block), vec![296.0 * mib]);
        assert!(broadcast_buckets(&[300.0 * mib]).is_empty());
    }
}
