//! The start-up before a run's first step, where a framework puts memory on the GPU that the
//! step itself does not hold (DeepSpeed ZeRO-3 without `zero.Init`), as its own allocation
//! sequence.

use super::{peak_live_bytes, Emitter, PlannedEvent, Shapes};
use crate::error::Result;
use crate::graph::build_units;
use crate::model::ModelSpec;
use crate::states::{model_states, trainable_params};
use crate::workload::{Mode, Sharding, Workload};

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

/// Peak allocated bytes of the start-up ([`startup_sequence`]); 0 without one.
pub(crate) fn startup_peak(model: &ModelSpec, workload: &Workload) -> Result<u64> {
    Ok(peak_live_bytes(&startup_sequence(model, workload)?))
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
}
