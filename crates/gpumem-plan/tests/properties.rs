//! Metamorphic properties of the planner: relations between plans that hold whatever the
//! model's numbers are (a larger batch never needs less, sharding over more ranks never holds
//! more, the components add up), and the fixed inconsistencies pinned. Each case is a handful
//! of estimates, so the file runs in a fraction of a second, debug or release.

use gpumem_plan::sequence::peak_live_bytes;
use gpumem_plan::{
    allocation_sequence, estimate, find_model, Estimate, ModelSpec, Overheads, Settings, Workload,
};

/// `settings` resolved for `model`.
fn workload(model: &ModelSpec, settings: &Settings) -> Workload {
    settings.resolve(model).unwrap().workload
}

/// The estimate of `settings` on the catalogue model `name`.
fn planned(name: &str, settings: &Settings) -> Estimate {
    let model = find_model(name).unwrap();
    estimate(&model, &workload(&model, settings), &Overheads::default()).unwrap()
}

/// A training step of `batch` × `seq` in bf16.
fn training(batch: u64, seq: u64) -> Settings {
    Settings {
        batch: Some(batch),
        seq: Some(seq),
        dtype: Some("bf16".into()),
        ..Settings::default()
    }
}

/// The planned allocation sequence's live peak and the estimate's allocated peak of `settings`
/// on `name`.
fn sequence_and_estimate(name: &str, settings: &Settings) -> (f64, f64) {
    let model = find_model(name).unwrap();
    let workload = workload(&model, settings);
    let events = allocation_sequence(&model, &workload).unwrap();
    let planned = estimate(&model, &workload, &Overheads::default()).unwrap();
    (
        peak_live_bytes(&events) as f64,
        planned.peak_allocated_bytes as f64,
    )
}

/// The sequence replayed for reserved memory is the busiest pipeline stage's, as the estimate
/// is: under `--pp` it once allocated the whole model's weights, gradients and optimizer states
/// (twice the stage's, reserved memory twice allocated), and never the first stage's
/// micro-batches in flight.
#[test]
fn the_allocation_sequence_plans_the_busiest_pipeline_stage() {
    // Eager attention's saved scores make the first stage's micro-batches in flight (up to
    // `pp` of the accumulated ones) the busiest GPU's memory.
    for (name, batch, pp, accumulation) in [
        ("llama-3.2-1b", 2, 2, 1),
        ("llama-3.2-1b", 2, 4, 8),
        ("gpt2", 8, 2, 4),
    ] {
        let settings = Settings {
            gpus: Some(pp),
            pp: Some(pp),
            grad_accum: Some(accumulation),
            attn: Some("eager".into()),
            ..training(batch, 1024)
        };
        let (sequence, estimated) = sequence_and_estimate(name, &settings);
        assert!(
            ((sequence - estimated) / estimated).abs() < 0.05,
            "{name} pp {pp}, accumulation {accumulation}: sequence {sequence}, estimate {estimated}"
        );
    }
}

/// LoRA trains adapters on a vision-language model's language model only (the trainable count
/// leaves the tower out): the tower and projector are frozen with the base, so they record
/// nothing for backward, as under `--freeze-vision-tower`. They once kept every tower
/// activation through the step, with each linear's fp32 adapter copy besides (Gemma 3 4B at
/// 8 × 128: 60 GiB of activations where full fine-tuning keeps 37).
#[test]
fn lora_on_a_vision_language_model_leaves_the_tower_frozen() {
    for name in ["llava-1.5-7b", "gemma-3-4b"] {
        let lora = Settings {
            lora_rank: Some(16),
            ..training(8, 128)
        };
        let adapters = planned(name, &lora);
        let frozen_tower = planned(
            name,
            &Settings {
                freeze_vision_tower: true,
                ..lora.clone()
            },
        );
        let full = planned(name, &training(8, 128));
        assert_eq!(
            adapters.peak_allocated_bytes, frozen_tower.peak_allocated_bytes,
            "{name}"
        );
        assert_eq!(adapters.trainable_params, frozen_tower.trainable_params);
        assert!(
            adapters.peak_allocated_bytes < full.peak_allocated_bytes,
            "{name}: LoRA {} above full fine-tuning {}",
            adapters.peak_allocated_bytes,
            full.peak_allocated_bytes
        );
    }
}

/// Inference with adapters over a quantised checkpoint (`--lora-rank` with `--quant`) holds
/// the quantised base and the adapters: the adapters add what they add over unquantised
/// weights. The base was once planned unquantised whenever adapters were given.
#[test]
fn adapters_over_a_quantised_checkpoint_keep_it_quantised() {
    for quant in ["nf4", "int8", "gptq", "awq"] {
        let weights = |lora: bool, quant: Option<&str>| {
            let settings = Settings {
                mode: Some("infer".into()),
                lora_rank: lora.then_some(16),
                quant: quant.map(Into::into),
                ..training(1, 128)
            };
            planned("llama-3.2-1b", &settings).breakdown.weights as i64
        };
        let adapters = weights(true, None) - weights(false, None);
        assert!(adapters > 0);
        assert_eq!(
            weights(true, Some(quant)) - weights(false, Some(quant)),
            adapters,
            "{quant}"
        );
    }
}

/// Pipeline stages split a vision-language model's language model evenly, its tower and
/// projector on the first stage: LLaVA-1.5-7B over two stages holds about half its weights on
/// the busiest GPU. Its tower's 24 blocks were once counted with the language model's 32, the
/// last stage holding 28 of them (82 % of the weights).
#[test]
fn pipeline_stages_split_a_vision_language_model_by_its_language_model() {
    let weights = |pp: u64| {
        let settings = Settings {
            gpus: Some(pp),
            pp: Some(pp),
            ..training(4, 512)
        };
        planned("llava-1.5-7b", &settings).breakdown.weights as f64
    };
    let share = weights(2) / weights(1);
    assert!((0.5..0.55).contains(&share), "{share}");
}

/// Every estimate's components add up to its allocated peak, which is its largest phase's,
/// below reserved, below total: across architectures, modes and precisions.
#[test]
fn components_add_up_and_peaks_are_ordered() {
    let models = [
        "gpt2",
        "llama-3.2-1b",
        "qwen3-30b-a3b",
        "t5-small",
        "whisper-tiny",
        "bert-base",
        "vit-base",
        "resnet18",
        "llava-1.5-7b",
    ];
    for name in models {
        for mode in ["train", "infer", "generate"] {
            for dtype in ["fp32", "bf16"] {
                let model = find_model(name).unwrap();
                let settings = Settings {
                    mode: Some(mode.into()),
                    dtype: Some(dtype.into()),
                    batch: Some(2),
                    ..Settings::default()
                };
                // Encoders and image models do not generate.
                let Ok(resolved) = settings.resolve(&model) else {
                    continue;
                };
                let Ok(e) = estimate(&model, &resolved.workload, &Overheads::default()) else {
                    continue;
                };
                let what = format!("{name} {mode} {dtype}");
                let b = &e.breakdown;
                assert_eq!(b.allocated(), e.peak_allocated_bytes, "{what}");
                assert_eq!(
                    e.phases.iter().map(|p| p.allocated_bytes).max(),
                    Some(e.peak_allocated_bytes),
                    "{what}"
                );
                assert!(e.peak_allocated_bytes <= e.peak_reserved_bytes, "{what}");
                assert!(e.peak_reserved_bytes <= e.peak_total_bytes, "{what}");
                assert_eq!(
                    e.peak_total_bytes,
                    e.peak_reserved_bytes + b.framework + b.communication,
                    "{what}"
                );
            }
        }
    }
}

/// The allocated peak of a model under `settings` with `change` applied, against without.
fn peaks(name: &str, settings: &Settings, change: impl Fn(&mut Settings)) -> (u64, u64) {
    let mut changed = settings.clone();
    change(&mut changed);
    (
        planned(name, settings).peak_allocated_bytes,
        planned(name, &changed).peak_allocated_bytes,
    )
}

/// A larger micro-batch or sequence never needs less, in training, inference and generation,
/// sharded or not.
#[test]
fn a_larger_batch_or_sequence_never_needs_less() {
    let layouts = [
        Settings::default(),
        Settings {
            zero: Some("3".into()),
            gpus: Some(4),
            ..Settings::default()
        },
        Settings {
            fsdp: true,
            gpus: Some(4),
            ..Settings::default()
        },
        Settings {
            lora_rank: Some(16),
            grad_ckpt: true,
            ..Settings::default()
        },
    ];
    for name in ["gpt2", "llama-3.2-1b", "t5-small"] {
        for mode in ["train", "infer", "generate"] {
            for layout in &layouts {
                let settings = Settings {
                    mode: Some(mode.into()),
                    ..layout.clone()
                };
                for batch in [1, 3] {
                    let base = Settings {
                        batch: Some(batch),
                        seq: Some(256),
                        ..settings.clone()
                    };
                    let what = format!("{name} {mode} {base:?}");
                    let (small, large) = peaks(name, &base, |s| s.batch = Some(batch + 1));
                    assert!(small <= large, "batch: {what}");
                    let (short, long) = peaks(name, &base, |s| s.seq = Some(257));
                    assert!(short <= long, "seq: {what}");
                }
            }
        }
    }
}

/// Sharding over more data-parallel ranks (ZeRO-3, FSDP full sharding) never holds more on a
/// GPU, offloaded or not.
#[test]
fn more_ranks_never_hold_more() {
    for name in ["gpt2", "llama-3.2-1b"] {
        for offload in [None, Some("all")] {
            for fsdp in [false, true] {
                let at = |gpus: u64| Settings {
                    gpus: Some(gpus),
                    fsdp,
                    zero: (!fsdp).then(|| "3".into()),
                    offload: offload.map(Into::into),
                    ..training(2, 512)
                };
                let held: Vec<u64> = [2, 4, 8, 64]
                    .into_iter()
                    .map(|gpus| planned(name, &at(gpus)).peak_allocated_bytes)
                    .collect();
                assert!(
                    held.windows(2).all(|w| w[1] <= w[0]),
                    "{name} fsdp {fsdp} offload {offload:?}: {held:?}"
                );
            }
        }
    }
}

/// Cheaper settings never need more: checkpointing (every policy), fp32 over bf16 the other way
/// round, no optimizer or a leaner one against AdamW, offloading the states of ZeRO-3 or FSDP.
#[test]
fn cheaper_settings_never_need_more() {
    type Change = fn(&mut Settings);
    let cheaper: [(&str, Change); 10] = [
        ("grad-ckpt", |s| s.grad_ckpt = true),
        ("grad-ckpt-selective", |s| s.grad_ckpt_selective = true),
        ("grad-ckpt-every 2", |s| s.grad_ckpt_every = Some(2)),
        ("grad-ckpt-per-op", |s| s.grad_ckpt_per_op = true),
        ("dtype bf16", |s| s.dtype = Some("bf16".into())),
        ("optimizer none", |s| s.optimizer = Some("none".into())),
        ("optimizer sgd", |s| s.optimizer = Some("sgd".into())),
        ("optimizer adam8bit", |s| {
            s.optimizer = Some("adam8bit".into())
        }),
        ("optimizer adafactor", |s| {
            s.optimizer = Some("adafactor".into())
        }),
        ("optimizer-impl fused", |s| {
            s.optimizer_impl = Some("fused".into())
        }),
    ];
    for name in ["gpt2", "llama-3.2-1b", "qwen3-30b-a3b"] {
        for (batch, seq) in [(1, 128), (4, 1024)] {
            let base = Settings {
                dtype: Some("fp32".into()),
                ..training(batch, seq)
            };
            for (what, change) in cheaper {
                let (before, after) = peaks(name, &base, change);
                assert!(after <= before, "{name} {batch}x{seq} --{what}");
            }
            for fsdp in [false, true] {
                let sharded = Settings {
                    gpus: Some(4),
                    fsdp,
                    zero: (!fsdp).then(|| "3".into()),
                    ..base.clone()
                };
                let (before, after) = peaks(name, &sharded, |s| s.offload = Some("all".into()));
                assert!(
                    after <= before,
                    "{name} {batch}x{seq} fsdp {fsdp} --offload"
                );
            }
        }
    }
}

/// An image model's allocation sequence (what the allocator replay sees) is planned over its
/// own tokens: a vision transformer's or vision tower's patches, a diffusion model's latent.
/// It once sized a vision transformer's activation tensors by `--seq`, which the model never
/// reads, so that its replayed reserved memory changed with it. The sequence's live peak
/// follows the estimate for these models and for the dual encoders and vision-language models
/// whose towers run beside a text stack.
#[test]
fn image_models_plan_their_own_tokens() {
    let image_models = [
        "vit-b-16",
        "vit-base",
        "clip-vit-base-patch32-vision",
        "siglip-base-patch16-224-vision",
        "dit-xl-2-256",
        "sd-1.5-unet",
    ];
    let with_text = [
        "clip-vit-base-patch32",
        "siglip-base-patch16-224",
        "llava-1.5-7b",
    ];
    for name in image_models.into_iter().chain(with_text) {
        let model = find_model(name).unwrap();
        for mode in ["train", "infer"] {
            let settings = Settings {
                mode: Some(mode.into()),
                batch: Some(4),
                ..Settings::default()
            };
            let at = |seq: u64| Workload {
                seq,
                ..workload(&model, &settings)
            };
            let planned = at(64);
            let what = format!("{name} {mode}");
            if image_models.contains(&name) {
                assert_eq!(
                    allocation_sequence(&model, &planned).unwrap(),
                    allocation_sequence(&model, &at(4096)).unwrap(),
                    "{what}: the sequence depends on --seq"
                );
            }
            let events = allocation_sequence(&model, &planned).unwrap();
            let sequence = peak_live_bytes(&events) as f64;
            let estimated = estimate(&model, &planned, &Overheads::default())
                .unwrap()
                .peak_allocated_bytes as f64;
            assert!(
                ((sequence - estimated) / estimated).abs() < 0.05,
                "{what}: sequence {sequence}, estimate {estimated}"
            );
        }
    }
}
