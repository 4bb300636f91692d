//! Tests of the multi-GPU buffers: NCCL, the sharding settings, offload and ZeRO's step.

use super::*;

#[test]
fn nccl_counts_one_communicator_per_parallel_group() {
    let single = Layout::single();
    assert_eq!(nccl_bytes(&single), 0);
    let data = Layout {
        gpus: 8,
        ..Layout::single()
    };
    assert_eq!(nccl_groups(&data), vec![8]);
    // 16 channels × 2 connections × (4 MiB + 4.6875 MiB + 0.5 MiB) = 294 MiB of buffers, and
    // what a communicator of more than two ranks holds beyond them: 688 MiB in all.
    assert_eq!(32 * (4_194_304 + 4_915_200 + 524_288), 294 << 20);
    assert_eq!(nccl_bytes(&data), 688 << 20);
    let pair = Layout {
        gpus: 2,
        ..Layout::single()
    };
    assert_eq!(nccl_bytes(&pair), 544 << 20);
    let hybrid = Layout {
        gpus: 16,
        tp: 4,
        pp: 2,
        ..Layout::single()
    };
    assert_eq!(nccl_groups(&hybrid), vec![2, 4, 2]);
    // DeepSpeed's clone of the world group beside the world group's own.
    let zero = Layout {
        sharding: Sharding::Zero3,
        ..pair
    };
    assert_eq!(nccl_groups(&zero), vec![2, 2]);
    assert_eq!(nccl_bytes(&zero), 2 * (544 << 20));
    let smaller = Layout {
        nccl_buffsize: 1 << 20,
        ..data
    };
    assert!(nccl_bytes(&smaller) < nccl_bytes(&data));
}

#[cfg(test)]
mod settings_tests {
    use crate::{estimate, find_model, Overheads, PlanError, Settings, Warning};

    fn fsdp(version: Option<&str>, mp: Option<&str>) -> Settings {
        Settings {
            batch: Some(2),
            seq: Some(1024),
            gpus: Some(8),
            fsdp: true,
            fsdp_version: version.map(Into::into),
            fsdp_mp: mp.map(Into::into),
            ..Settings::default()
        }
    }

    #[test]
    fn fsdp_flags_are_validated_and_change_the_plan() {
        let model = find_model("llama-3.2-1b").unwrap();
        let plan = |s: Settings| {
            let workload = s.resolve(&model).unwrap().workload;
            estimate(&model, &workload, &Overheads::default()).unwrap()
        };
        let err = fsdp(Some("3"), None).resolve(&model).unwrap_err();
        assert!(matches!(err, PlanError::UnknownName { .. }), "{err}");
        assert!(fsdp(None, Some("fp32")).resolve(&model).is_err());
        let fp32 = plan(fsdp(None, None));
        let bf16 = plan(fsdp(None, Some("bf16")));
        // Half-precision gathered units and activations; fp32 shards and states either way.
        assert!(bf16.peak_allocated_bytes < fp32.peak_allocated_bytes);
        assert_eq!(
            bf16.breakdown.optimizer_states,
            fp32.breakdown.optimizer_states
        );
        // FSDP1 holds more of the root's gradients at the end of backward, never less.
        let v1 = plan(fsdp(Some("1"), Some("bf16")));
        assert!(v1.peak_allocated_bytes >= bf16.peak_allocated_bytes);
        // NCCL is in the total only.
        assert!(bf16.breakdown.communication > 0);
        assert_eq!(
            bf16.peak_total_bytes - bf16.peak_reserved_bytes,
            bf16.breakdown.framework + bf16.breakdown.communication
        );
    }

    #[test]
    fn zero_buckets_are_validated_and_auto_follows_the_hidden_size() {
        let model = find_model("llama-3.2-1b").unwrap();
        let zero3 = |buckets: Option<&str>| Settings {
            batch: Some(1),
            seq: Some(256),
            gpus: Some(8),
            zero: Some("3".into()),
            zero_buckets: buckets.map(Into::into),
            ..Settings::default()
        };
        let err = zero3(Some("large")).resolve(&model).unwrap_err();
        assert!(matches!(err, PlanError::UnknownName { .. }), "{err}");
        let plan = |s: Settings| {
            let workload = s.resolve(&model).unwrap().workload;
            let bytes = workload.dtype.bytes() as f64;
            let e = estimate(&model, &workload, &Overheads::default()).unwrap();
            (e.peak_allocated_bytes as f64, bytes)
        };
        let (default, bytes) = plan(zero3(None));
        let (auto, _) = plan(zero3(Some("auto")));
        // accelerate's "auto": a reduce bucket of h² and a prefetch bucket of 0.9·h² elements
        // (h = 2048) instead of DeepSpeed's 5e8 and 5e7 (a block has more than 5e7).
        let h2: f64 = 2048.0 * 2048.0;
        let expected = (5e8 - h2 + 5e7 - (0.9 * h2).floor()) * bytes;
        let ratio = (default - auto) / expected;
        assert!((ratio - 1.0).abs() < 1e-6, "{ratio}");
        // Without ZeRO the flag changes nothing and says so.
        let loose = Settings {
            zero_buckets: Some("auto".into()),
            ..Settings::default()
        };
        let resolved = loose.resolve(&model).unwrap();
        assert!(resolved.warnings.iter().any(|w| matches!(
            w,
            Warning::Ignored {
                flag: "--zero-buckets",
                ..
            }
        )));
    }

    #[test]
    fn fsdp_flags_without_fsdp_warn_and_bad_buffsize_fails() {
        let model = find_model("gpt2").unwrap();
        let loose = Settings {
            fsdp_mp: Some("bf16".into()),
            fsdp_version: Some("1".into()),
            ..Settings::default()
        };
        let resolved = loose.resolve(&model).unwrap();
        let flags: Vec<&str> = resolved
            .warnings
            .iter()
            .filter_map(|w| match w {
                Warning::Ignored { flag, .. } => Some(*flag),
                _ => None,
            })
            .collect();
        assert_eq!(flags, ["--fsdp-version", "--fsdp-mp"]);
        // Without --fsdp the flag changes nothing.
        assert_eq!(resolved.workload.module_dtype(), resolved.workload.dtype);
        let zero = Settings {
            gpus: Some(2),
            nccl_buffsize: Some(0),
            ..Settings::default()
        };
        assert!(matches!(
            zero.resolve(&model),
            Err(PlanError::InvalidValue { .. })
        ));
        // --deepspeed names the release of a ZeRO run: ignored without one, a typed error when
        // it is not a release.
        let release = |zero: Option<&str>, version: &str| Settings {
            zero: zero.map(Into::into),
            deepspeed: Some(version.into()),
            ..Settings::default()
        };
        let ignored = release(None, "0.14.2").resolve(&model).unwrap().warnings;
        assert!(ignored.iter().any(|w| matches!(
            w,
            Warning::Ignored {
                flag: "--deepspeed",
                ..
            }
        )));
        let used = release(Some("3"), "0.14.2").resolve(&model).unwrap();
        assert!(used.warnings.is_empty(), "{:?}", used.warnings);
        assert!(matches!(
            release(Some("3"), "0.14.2rc1").resolve(&model),
            Err(PlanError::InvalidValue { .. })
        ));
    }
}

#[cfg(test)]
mod offload_tests {
    use crate::{estimate, find_model, Estimate, Overheads, Settings};

    fn plan(model: &str, f: impl FnOnce(&mut Settings)) -> Estimate {
        let model = find_model(model).unwrap();
        let mut s = Settings {
            batch: Some(1),
            seq: Some(256),
            gpus: Some(2),
            fsdp: true,
            fsdp_version: Some("1".into()),
            dtype: Some("bf16".into()),
            offload: Some("all".into()),
            ..Settings::default()
        };
        f(&mut s);
        let workload = s.resolve(&model).unwrap().workload;
        estimate(&model, &workload, &Overheads::default()).unwrap()
    }

    #[test]
    fn four_bit_statistics_stay_whole_on_every_rank_and_blocks_gather_packed() {
        let qlora = |gpus: u64, quant: &str| {
            plan("llama-3.2-1b", |s| {
                s.gpus = Some(gpus);
                s.quant = Some(quant.into());
                s.lora_rank = Some(8);
            })
        };
        let counts = find_model("llama-3.2-1b").unwrap().params();
        // Single against double quantisation: one fp32 absmax per 64 weights against an int8
        // one and an fp32 scale per 256 blocks, of every block linear, whole on every rank
        // although the parameters are sharded and offloaded.
        let difference = counts.block_linear as f64 * (4.0 / 64.0 - 1.0 / 64.0 - 4.0 / 16384.0);
        for gpus in [2, 8] {
            let single = qlora(gpus, "nf4").breakdown.weights as f64;
            let double = qlora(gpus, "nf4:double").breakdown.weights as f64;
            let ratio = (single - double) / difference;
            assert!((ratio - 1.0).abs() < 0.01, "{gpus} GPUs: {ratio}");
        }
        // Gathered blocks: 4-bit packed weights, a quarter of the bf16 base's (1.5 bytes less
        // per parameter). At the peak one block is gathered (FSDP1 gathers the block before
        // only as a block's backward ends, with its adapters units of their own) beside its
        // host shard's staging copy, half a block on 2 GPUs.
        let lora = plan("llama-3.2-1b", |s| s.lora_rank = Some(8));
        let block = counts.largest_block as f64;
        let statistics = counts.block_linear as f64 / 16.0;
        let saved = lora.breakdown.weights as f64 - qlora(2, "nf4").breakdown.weights as f64;
        let gathered_blocks = (saved + statistics) / (block * 1.5);
        assert!((gathered_blocks - 1.5).abs() < 0.01, "{gathered_blocks}");
    }

    #[test]
    fn fsdp1_offload_keeps_sharded_gradients_through_backward() {
        let v1 = plan("llama-3.2-1b", |_| {});
        let v2 = plan("llama-3.2-1b", |s| s.fsdp_version = Some("2".into()));
        let counts = find_model("llama-3.2-1b").unwrap().params();
        // FSDP1's `_saved_grad_shard`: every rank's bf16 sharded gradients on the GPU.
        assert!(v1.breakdown.gradients as f64 >= counts.body as f64 * 2.0 / 2.0);
        assert!(v2.breakdown.gradients < v1.breakdown.gradients);
        assert_eq!(v1.breakdown.optimizer_states, 0);
    }
}

#[cfg(test)]
mod zero_step_tests {
    use super::super::{
        sharding_buffers, zero_sizes, zero_step_gradients, Architecture, ShardingInputs,
        REDUCE_BUCKET_ELEMENTS,
    };
    use crate::workload::ZeroBuckets;
    use crate::{estimate, find_model, Estimate, Overheads, Phase, Settings};

    /// Sharding inputs for a ZeRO buffer test: one trained share, 2-byte gathered weights and
    /// buckets, the head's and the largest trained parameter's bytes as given, default buckets.
    fn zero_inputs(head: f64, largest_trainable: f64, hidden: Option<u64>) -> ShardingInputs {
        ShardingInputs {
            largest_block: 0.0,
            gradients_full: 0.0,
            trainable_share: 1.0,
            gathered: 2.0,
            bucket_bytes: 2.0,
            head,
            largest_trainable,
            trainable_local: 0.0,
            zero: zero_sizes(ZeroBuckets::Default, hidden),
        }
    }

    fn settings(zero: &str, gpus: u64, f: impl FnOnce(&mut Settings)) -> Settings {
        let mut s = Settings {
            batch: Some(1),
            seq: Some(128),
            gpus: Some(gpus),
            zero: Some(zero.into()),
            dtype: Some("fp16".into()),
            amp: Some("fp16".into()),
            optimizer_impl: Some("fused".into()),
            ..Settings::default()
        };
        f(&mut s);
        s
    }

    fn step_gradients(s: Settings, trainable: f64, largest: f64) -> f64 {
        let model = find_model("gpt2").unwrap();
        let workload = s.resolve(&model).unwrap().workload;
        zero_step_gradients(&workload, trainable, largest)
    }

    fn plan(model: &str, s: Settings) -> Estimate {
        let model = find_model(model).unwrap();
        let workload = s.resolve(&model).unwrap().workload;
        estimate(&model, &workload, &Overheads::default()).unwrap()
    }

    fn phase(e: &Estimate, phase: Phase) -> f64 {
        e.phases
            .iter()
            .find(|p| p.phase == phase)
            .map(|p| p.allocated_bytes as f64)
            .unwrap()
    }

    #[test]
    fn zero3_step_converts_one_sub_group_of_gradients_to_fp32() {
        // 8e9 trained elements over 8 ranks: a 1e9-element partition, one sub-group; its fp16
        // flattened copy and the fp32 conversion together (`_prepare_fp32_grad_for_sub_group`).
        let one_group = step_gradients(settings("3", 8, |_| {}), 8e9, 4e8);
        assert_eq!(one_group, 1e9 * (2.0 + 4.0));
        // A 2e9-element partition: sub-groups close at 1e9 elements plus one parameter's
        // partition (`_create_fp16_sub_groups`), not the whole partition.
        let two_groups = step_gradients(settings("3", 8, |_| {}), 16e9, 4e8);
        assert_eq!(two_groups, (1e9 + 4e8 / 8.0) * 6.0);
        // fp32 gradients are not converted: the flattened copy alone.
        let fp32 = step_gradients(
            settings("3", 8, |s| {
                s.dtype = Some("fp32".into());
                s.amp = None;
            }),
            8e9,
            4e8,
        );
        assert_eq!(fp32, 1e9 * 4.0);
        // With optimizer offload the step runs on the host: nothing on the GPU.
        let offload = step_gradients(
            settings("3", 8, |s| s.offload = Some("all".into())),
            8e9,
            4e8,
        );
        assert_eq!(offload, 0.0);
        // Nor without an optimizer step.
        let none = step_gradients(
            settings("3", 8, |s| s.optimizer = Some("none".into())),
            8e9,
            4e8,
        );
        assert_eq!(none, 0.0);
        // ZeRO-1/2: the whole partition's fp32 gradient, and with offload the updated fp32
        // partition copied back to the GPU before its cast (`stage_1_and_2.py` `step`).
        for offload in [false, true] {
            let z2 = step_gradients(
                settings("2", 8, |s| s.offload = offload.then(|| "all".into())),
                8e9,
                4e8,
            );
            assert_eq!(z2, 1e9 * 4.0, "offload {offload}");
        }
    }

    #[test]
    fn zero3_without_deepspeeds_linear_keeps_each_gathered_block_to_its_backward() {
        // A model loaded without zero.Init under DeepSpeed before 0.19.4 runs PyTorch's
        // F.linear, whose backward keeps `weight.t()`: at the end of the forward every block's
        // linear weights, as gathered (fp16, whole), are still allocated.
        let loaded = |version: &str, gpus: u64, f: fn(&mut Settings)| {
            settings("3", gpus, |s| {
                s.no_zero_init = true;
                s.deepspeed = (!version.is_empty()).then(|| version.into());
                f(s);
            })
        };
        let forward_end = |model: &str, s: Settings| phase(&plan(model, s), Phase::ForwardEnd);
        let spec = find_model("llama-3.2-1b").unwrap();
        let counts = spec.params();
        let kept = counts.block_linear as f64 * 2.0;
        let old = forward_end("llama-3.2-1b", loaded("0.14.2", 4, |_| {}));
        let new = forward_end("llama-3.2-1b", loaded("0.19.4", 4, |_| {}));
        assert!(
            ((old - new) - kept).abs() < 1e-6 * kept,
            "{old} - {new} != {kept}"
        );
        // Today's DeepSpeed (no --deepspeed) installs its linear for a loaded model too.
        assert_eq!(new, forward_end("llama-3.2-1b", loaded("", 4, |_| {})));
        let unchanged = |f: fn(&mut Settings), gpus: u64| {
            let with = forward_end("llama-3.2-1b", loaded("0.14.2", gpus, f));
            let without = forward_end("llama-3.2-1b", loaded("0.19.4", gpus, f));
            assert_eq!(with, without);
        };
        // zero.Init patched F.linear; one rank gathers nothing.
        unchanged(|s| s.no_zero_init = false, 4);
        unchanged(|_| {}, 1);
        // Full checkpointing saves nothing in the forward: the recomputation's copy of one
        // block lives from its recomputation to its backward, in backward only (where the
        // loss's vocabulary-wide tensors may still make the peak).
        unchanged(|s| s.grad_ckpt = true, 4);
        let backward = |version: &str| {
            let e = plan("llama-3.2-1b", loaded(version, 4, |s| s.grad_ckpt = true));
            phase(&e, Phase::Backward)
        };
        let layers = match &spec.arch {
            Architecture::Transformer(t) => t.layers,
            _ => unreachable!("llama-3.2-1b is a transformer"),
        };
        let block = kept / layers as f64;
        let grown = backward("0.14.2") - backward("0.19.4");
        assert!(
            (0.0..=block * 1.000_001).contains(&grown),
            "{grown} vs {block}"
        );
        // GPT-2's Conv1D saves the parameter itself, which the release empties.
        let gpt2 = |version: &str| forward_end("gpt2", loaded(version, 4, |_| {}));
        assert_eq!(gpt2("0.14.2"), gpt2("0.19.4"));
    }

    #[test]
    fn zero3_keeps_its_gradient_partitions_from_step_to_step() {
        // The flat buffer of gradient partitions is allocated once and never freed: the
        // forward of every step after the first has it, as accumulated gradients are had.
        let grads = |s: Settings| plan("llama-3.2-1b", s).breakdown.gradients as f64;
        let z3 = plan("llama-3.2-1b", settings("3", 4, |_| {}));
        let accumulating = plan("llama-3.2-1b", settings("3", 4, |s| s.grad_accum = Some(2)));
        assert_eq!(
            phase(&z3, Phase::Forward),
            phase(&accumulating, Phase::Forward)
        );
        // And more than one step's backward frees: the forward holds this rank's gradient
        // partitions (fp16, a quarter of the model on 4 ranks). Not with optimizer offload
        // (the buffer is on the host).
        let counts = find_model("llama-3.2-1b").unwrap().params();
        let partition = counts.total() as f64 / 4.0 * 2.0;
        assert!(grads(settings("3", 4, |_| {})) >= partition);
        let model = find_model("llama-3.2-1b").unwrap();
        let keeps = |s: Settings| {
            super::zero3_keeps_gradient_partitions(&s.resolve(&model).unwrap().workload)
        };
        assert!(keeps(settings("3", 4, |_| {})));
        assert!(!keeps(settings("3", 4, |s| s.offload = Some("all".into()))));
        assert!(!keeps(settings("2", 4, |_| {})));
        assert!(!keeps(
            settings("3", 4, |s| s.optimizer = Some("none".into()))
        ));
    }

    #[test]
    fn zero2_offload_keeps_a_gpu_buffer_of_the_largest_parameter() {
        // `temp_grad_buffer_for_gpu_offload`: the largest trained parameter in the module
        // dtype, on top of the IPG bucket, only with optimizer offload.
        let model = find_model("gpt2").unwrap();
        let buffers = |offload: bool| {
            let workload = settings("2", 4, |s| s.offload = offload.then(|| "all".into()))
                .resolve(&model)
                .unwrap()
                .workload;
            let inputs = zero_inputs(0.0, 3e8, None);
            sharding_buffers(&[], &workload, &inputs).step_gradients
        };
        let bucket = REDUCE_BUCKET_ELEMENTS as f64 * 2.0;
        assert_eq!(buffers(false), bucket);
        assert_eq!(buffers(true), bucket + 3e8 * 2.0);
    }

    #[test]
    fn zero2_offload_checks_the_largest_gradient_for_overflow() {
        // `_has_inf_or_nan` over the largest parameter's gradient: since v0.14.0 its fp32 copy,
        // three masks and the or's fp32 copy (11 bytes per element), before it the fp32 copy;
        // over `reduce_bucket_size`, the gradient itself too. At the head's backward when the
        // head is the largest, else at the backward's end; none without offload.
        let model = find_model("llama-3-8b").unwrap();
        let head_params = 128256.0 * 4096.0;
        let buffers = |head: f64, f: fn(&mut Settings)| {
            let workload = settings("2", 8, f).resolve(&model).unwrap().workload;
            let inputs = zero_inputs(head * 2.0, head_params, None);
            let b = sharding_buffers(&[], &workload, &inputs);
            (b.head_gradients, b.backward_end_gradients)
        };
        let offload = |s: &mut Settings| s.offload = Some("all".into());
        assert_eq!(buffers(head_params, offload), (head_params * 13.0, 0.0));
        assert_eq!(buffers(0.0, offload), (0.0, head_params * 13.0));
        assert_eq!(
            buffers(head_params, |s| {
                s.offload = Some("all".into());
                s.deepspeed = Some("0.13.5".into());
            }),
            (head_params * 6.0, 0.0)
        );
        assert_eq!(buffers(head_params, |_| {}), (0.0, 0.0));
    }

    #[test]
    fn zero3_head_gradient_is_whole_while_the_heads_backward_finishes() {
        // The head's matmul makes its weight gradient whole before the hook moves it into the
        // IPG bucket (or, above the bucket's size, reduces it from its own tensor); a frozen
        // head under LoRA has none.
        let model = find_model("llama-3-8b").unwrap();
        let head = |f: fn(&mut Settings)| {
            let workload = settings("3", 8, f).resolve(&model).unwrap().workload;
            let inputs = zero_inputs(128256.0 * 4096.0 * 2.0, 0.0, Some(4096));
            sharding_buffers(&[], &workload, &inputs).head_gradients
        };
        assert_eq!(head(|_| {}), 128256.0 * 4096.0 * 2.0);
        assert_eq!(head(|s| s.lora_rank = Some(8)), 0.0);
    }
}

#[cfg(test)]
mod fsdp_sharding_tests {
    use crate::{
        allocation_sequence, estimate, find_model, Estimate, Overheads, Phase, PlanError,
        PlannedEvent, Settings,
    };

    /// Settings of an FSDP1 training run of Llama-3.2-1B over `gpus` GPUs on `nodes` machines
    /// with the given `--fsdp-sharding`.
    fn settings(sharding: Option<&str>, gpus: u64, nodes: u64) -> Settings {
        Settings {
            batch: Some(1),
            seq: Some(512),
            gpus: Some(gpus),
            nodes: Some(nodes),
            fsdp: true,
            fsdp_version: Some("1".into()),
            fsdp_sharding: sharding.map(Into::into),
            ..Settings::default()
        }
    }

    fn plan(s: Settings) -> Estimate {
        let model = find_model("llama-3.2-1b").unwrap();
        let workload = s.resolve(&model).unwrap().workload;
        estimate(&model, &workload, &Overheads::default()).unwrap()
    }

    /// The largest live bytes of `s`'s planned allocation sequence.
    fn sequence_peak(s: Settings) -> u64 {
        let model = find_model("llama-3.2-1b").unwrap();
        let workload = s.resolve(&model).unwrap().workload;
        let (mut live, mut peak) = (std::collections::HashMap::new(), 0u64);
        for event in allocation_sequence(&model, &workload).unwrap() {
            match event {
                PlannedEvent::Alloc { id, bytes, .. } => {
                    live.insert(id, bytes);
                }
                PlannedEvent::Free { id } => {
                    live.remove(&id);
                }
                _ => {}
            }
            peak = peak.max(live.values().sum());
        }
        peak
    }

    #[test]
    fn no_shard_keeps_whole_states_on_every_gpu() {
        let whole = plan(settings(Some("no_shard"), 8, 1));
        let single = plan(settings(None, 1, 1));
        // NO_SHARD's states are one GPU's: weights, gradients and optimizer states whole.
        assert_eq!(whole.breakdown.weights, single.breakdown.weights);
        assert_eq!(
            whole.breakdown.optimizer_states,
            single.breakdown.optimizer_states
        );
        let sharded = plan(settings(None, 8, 1));
        assert!(sharded.breakdown.optimizer_states * 7 < whole.breakdown.optimizer_states);
    }

    #[test]
    fn shard_grad_op_keeps_every_block_gathered_into_the_backward() {
        let model = find_model("llama-3.2-1b").unwrap();
        let counts = model.params();
        let full = plan(settings(None, 8, 1));
        let grad_op = plan(settings(Some("SHARD_GRAD_OP"), 8, 1));
        // Same sharded states; at the backward's start every block is gathered (fp32), where
        // FULL_SHARD gathers one and prefetches another.
        assert_eq!(
            full.breakdown.optimizer_states,
            grad_op.breakdown.optimizer_states
        );
        let blocks = counts.body as f64 * 4.0;
        let more = grad_op.peak_allocated_bytes as f64 - full.peak_allocated_bytes as f64;
        let block = counts.largest_block as f64 * 4.0;
        assert!(
            more > blocks - 3.0 * block && more < blocks,
            "{more} vs {blocks}"
        );
        // Accumulating under no_sync, every block stays gathered through the micro-batches:
        // all of them in the weights at the peak, whatever the phase.
        let accumulating = plan(Settings {
            grad_accum: Some(2),
            ..settings(Some("shard-grad-op"), 8, 1)
        });
        let kept = accumulating.breakdown.weights as f64 - grad_op.breakdown.weights as f64;
        assert!(kept.abs() < 2.0 * block, "{kept}");
        // Kept between micro-batches: the step's other phases hold them too (the optimizer
        // step stands for the micro-batches before the last, which free nothing).
        let optimizer_step = |e: &Estimate| {
            e.phases
                .iter()
                .find(|p| p.phase == Phase::OptimizerStep)
                .map(|p| p.allocated_bytes as f64)
                .unwrap()
        };
        let resharding = plan(Settings {
            grad_accum: Some(2),
            ..settings(None, 8, 1)
        });
        let held = optimizer_step(&accumulating) - optimizer_step(&resharding);
        assert!((held - blocks).abs() < block, "{held} vs {blocks}");
        // FSDP2 reshards after backward whether it synchronises or not.
        let fsdp2 = |sharding: Option<&str>| {
            plan(Settings {
                grad_accum: Some(2),
                fsdp_version: Some("2".into()),
                ..settings(sharding, 8, 1)
            })
        };
        let held = optimizer_step(&fsdp2(Some("shard-grad-op"))) - optimizer_step(&fsdp2(None));
        assert!(held.abs() < block, "{held}");
        // The planned sequence holds the same blocks, unit by unit.
        let sequence = sequence_peak(settings(Some("shard-grad-op"), 8, 1)) as f64;
        let full_sequence = sequence_peak(settings(None, 8, 1)) as f64;
        assert!(
            (sequence - full_sequence - more).abs() < 2.0 * block,
            "{sequence}"
        );
    }

    #[test]
    fn hybrid_strategies_shard_within_one_machine() {
        // 16 GPUs on 2 machines: HYBRID_SHARD shards over 8 ranks, as FULL_SHARD on 8 GPUs.
        let hybrid = plan(settings(Some("hybrid_shard"), 16, 2));
        let machine = plan(settings(None, 8, 1));
        assert_eq!(hybrid.breakdown.weights, machine.breakdown.weights);
        assert_eq!(
            hybrid.breakdown.optimizer_states,
            machine.breakdown.optimizer_states
        );
        let zero2 = plan(settings(Some("hybrid_shard_zero2"), 16, 2));
        let grad_op = plan(settings(Some("shard_grad_op"), 8, 1));
        assert_eq!(zero2.peak_allocated_bytes, grad_op.peak_allocated_bytes);
        // The shard group and the replicas across machines are two communicators.
        assert!(hybrid.breakdown.communication > machine.breakdown.communication);
    }

    #[test]
    fn sharding_strategies_are_validated() {
        let model = find_model("llama-3.2-1b").unwrap();
        let err = settings(Some("zero2"), 8, 1).resolve(&model).unwrap_err();
        assert!(
            matches!(&err, PlanError::UnknownName { accepted, .. } if accepted.len() == 5),
            "{err}"
        );
        let fsdp2 = Settings {
            fsdp_version: Some("2".into()),
            ..settings(Some("no_shard"), 8, 1)
        };
        assert!(matches!(
            fsdp2.resolve(&model),
            Err(PlanError::Conflict { .. })
        ));
        // Hybrid sharding needs the machines to divide the data-parallel ranks.
        let uneven = Settings {
            tp: Some(2),
            ..settings(Some("hybrid_shard"), 12, 4)
        };
        assert!(matches!(
            uneven.resolve(&model),
            Err(PlanError::InvalidValue { .. })
        ));
        // Without --fsdp the flag is ignored with a warning.
        let ignored = Settings {
            fsdp: false,
            ..settings(Some("no_shard"), 8, 1)
        };
        let resolved = ignored.resolve(&model).unwrap();
        assert!(
            resolved
                .warnings
                .iter()
                .any(|w| w.to_string().contains("--fsdp-sharding")),
            "{:?}",
            resolved.warnings
        );
    }
}
