//! Arguments users get wrong: what no real run can do is a typed error naming the setting and
//! what is accepted; what a run would do but probably not as meant is a warning in the result.

use gpumem_plan::estimate::MAX_BYTES;
use gpumem_plan::limits;
use gpumem_plan::{
    advise, estimate, find_model, fit, parse_config, Dtype, Estimate, Estimated, FitTarget,
    ModelSpec, Overheads, PlanError, Settings, Sharding, Warning,
};
use std::sync::mpsc;
use std::time::Duration;

fn model(name: &str) -> ModelSpec {
    find_model(name).unwrap()
}

fn plan(model: &ModelSpec, settings: Settings) -> gpumem_plan::Result<Estimate> {
    estimate(model, &settings.to_workload()?, &Overheads::default())
}

/// The setting an `InvalidValue` error names, and its message.
fn invalid(result: gpumem_plan::Result<Estimate>) -> (String, String) {
    let err = result.expect_err("an error");
    match &err {
        PlanError::InvalidValue { name, .. } => (name.clone(), err.to_string()),
        other => panic!("expected InvalidValue, got {other:?}"),
    }
}

#[test]
fn tensor_parallel_must_divide_the_heads() {
    let gpt2 = model("gpt2");
    let (name, message) = invalid(plan(
        &gpt2,
        Settings {
            tp: Some(5),
            gpus: Some(5),
            ..Settings::default()
        },
    ));
    assert_eq!(name, "tp");
    assert!(
        message.contains("12 attention heads") && message.contains("accepted: 1, 2, 3, 4, 6, 12"),
        "{message}"
    );
    let four = Settings {
        tp: Some(4),
        gpus: Some(4),
        ..Settings::default()
    };
    assert!(plan(&gpt2, four).is_ok());
}

#[test]
fn zero_with_fsdp_is_a_conflict() {
    let err = Settings {
        zero: Some("2".into()),
        fsdp: true,
        gpus: Some(4),
        ..Settings::default()
    }
    .to_workload()
    .unwrap_err();
    let PlanError::Conflict { first, second, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!((first.as_str(), second.as_str()), ("--zero 2", "--fsdp"));
    assert!(err.to_string().contains("keep one"), "{err}");
    let zero_stage_0 = Settings {
        zero: Some("0".into()),
        fsdp: true,
        gpus: Some(4),
        ..Settings::default()
    };
    assert_eq!(
        zero_stage_0.to_workload().unwrap().layout.sharding,
        Sharding::Fsdp
    );
}

#[test]
fn flash_attention_needs_half_precision() {
    let flash = |dtype: Option<&str>, amp: Option<&str>| Settings {
        attn: Some("flash".into()),
        dtype: dtype.map(Into::into),
        amp: amp.map(Into::into),
        ..Settings::default()
    };
    let err = flash(None, None).to_workload().unwrap_err();
    assert!(
        matches!(&err, PlanError::Conflict { first, .. } if first == "--attn flash"),
        "{err:?}"
    );
    assert!(err.to_string().contains("--amp bf16"), "{err}");
    assert!(flash(None, Some("bf16")).to_workload().is_ok());
    assert!(flash(Some("bf16"), None).to_workload().is_ok());
    // Inference of a bf16 checkpoint computes in bf16 by default: flash is fine there.
    let infer = Settings {
        mode: Some("infer".into()),
        ..flash(None, None)
    };
    assert!(infer.resolve(&model("llama-3-8b")).is_ok());
}

#[test]
fn sharding_over_one_rank_warns() {
    let gpt2 = model("gpt2");
    let warnings = |settings: Settings| plan(&gpt2, settings).unwrap().warnings;
    let zero2 = |gpus: u64, offload: bool| Settings {
        zero: Some("2".into()),
        gpus: Some(gpus),
        offload: offload.then(|| "all".into()),
        ..Settings::default()
    };
    assert_eq!(
        warnings(zero2(1, false)),
        [Warning::ShardingOverOneRank {
            sharding: Sharding::Zero2
        }]
    );
    assert!(warnings(zero2(1, false))[0]
        .to_string()
        .contains("saves no memory"));
    assert!(warnings(zero2(2, false)).is_empty());
    // ZeRO-Offload on one GPU does save: the states leave the GPU.
    assert!(warnings(zero2(1, true)).is_empty());
    let fsdp_over_tp = Settings {
        fsdp: true,
        tp: Some(2),
        gpus: Some(2),
        ..Settings::default()
    };
    assert_eq!(
        warnings(fsdp_over_tp),
        [Warning::ShardingOverOneRank {
            sharding: Sharding::Fsdp
        }]
    );
}

#[test]
fn autocast_to_the_other_half_type_warns() {
    let gpt2 = model("gpt2");
    let warnings = |dtype: &str, amp: &str| {
        plan(
            &gpt2,
            Settings {
                dtype: Some(dtype.into()),
                amp: Some(amp.into()),
                ..Settings::default()
            },
        )
        .unwrap()
        .warnings
    };
    let mixed = warnings("bf16", "fp16");
    assert_eq!(
        mixed,
        [Warning::MixedHalfTypes {
            dtype: Dtype::Bf16,
            amp: Dtype::Fp16
        }]
    );
    assert!(
        mixed[0].to_string().contains("use --amp bf16"),
        "{}",
        mixed[0]
    );
    assert!(warnings("bf16", "bf16").is_empty());
    assert!(warnings("fp32", "fp16").is_empty());
}

/// The flags of the warnings in `warnings` that say a flag is ignored.
fn ignored(warnings: &[Warning]) -> Vec<&'static str> {
    warnings
        .iter()
        .filter_map(|w| match w {
            Warning::Ignored { flag, .. } => Some(*flag),
            _ => None,
        })
        .collect()
}

#[test]
fn training_flags_in_inference_warn() {
    let llama = model("llama-3-8b");
    let settings = |mode: &str| Settings {
        mode: Some(mode.into()),
        optimizer: Some("sgd".into()),
        optimizer_impl: Some("fused".into()),
        grad_ckpt: true,
        grad_accum: Some(4),
        keep_grads: true,
        zero: Some("3".into()),
        gpus: Some(8),
        offload: Some("all".into()),
        ..Settings::default()
    };
    let resolved = settings("infer").resolve(&llama).unwrap();
    assert_eq!(
        ignored(&resolved.warnings),
        [
            "--optimizer",
            "--optimizer-impl",
            "--grad-ckpt",
            "--grad-accum",
            "--keep-grads",
            "--zero",
            "--offload"
        ]
    );
    assert!(resolved.warnings[0].to_string().contains("infer mode"));
    assert!(settings("train")
        .resolve(&llama)
        .unwrap()
        .warnings
        .is_empty());
    let new_tokens = Settings {
        new_tokens: Some(64),
        ..Settings::default()
    };
    assert_eq!(
        ignored(&new_tokens.resolve(&llama).unwrap().warnings),
        ["--new-tokens"]
    );
}

#[test]
fn fsdp_cpu_loading_warns_outside_fsdp1_training() {
    let llama = model("llama-3-8b");
    let warned = |fsdp: bool, version: Option<&str>| {
        let settings = Settings {
            gpus: Some(2),
            fsdp,
            fsdp_version: version.map(Into::into),
            fsdp_cpu_ram_efficient_loading: true,
            ..Settings::default()
        };
        ignored(&settings.resolve(&llama).unwrap().warnings)
    };
    assert!(warned(true, Some("1")).is_empty());
    // FSDP2 (the default) and no FSDP have no FullyShardedDataParallel wrapping to plan.
    assert_eq!(warned(true, None), ["--fsdp-cpu-ram-efficient-loading"]);
    assert_eq!(
        warned(false, Some("1")).last(),
        Some(&"--fsdp-cpu-ram-efficient-loading")
    );
}

#[test]
fn cache_and_labels_flags_warn_where_they_do_nothing() {
    let flags = |mode: &str| Settings {
        mode: Some(mode.into()),
        no_cache: true,
        labels: true,
        ..Settings::default()
    };
    let warned =
        |name: &str, mode: &str| ignored(&flags(mode).resolve(&model(name)).unwrap().warnings);
    // A decoder's or an encoder-decoder's inference forward honours both.
    assert!(warned("llama-3-8b", "infer").is_empty());
    assert!(warned("t5-small", "infer").is_empty());
    // Generation decodes with its cache and computes no loss; training always has its loss.
    assert_eq!(warned("llama-3-8b", "generate"), ["--no-cache", "--labels"]);
    assert_eq!(warned("llama-3-8b", "train"), ["--labels"]);
    // An encoder has no KV cache; a pooler or classifier head no language-model loss.
    assert_eq!(
        warned("bert-base-uncased", "infer"),
        ["--no-cache", "--labels"]
    );
    assert_eq!(warned("resnet50", "infer"), ["--no-cache", "--labels"]);
}

#[test]
fn seq_on_a_cnn_warns() {
    let seq = Settings {
        seq: Some(128),
        ..Settings::default()
    };
    for name in ["resnet50", "vit-base"] {
        let warnings = seq.resolve(&model(name)).unwrap().warnings;
        assert_eq!(ignored(&warnings), ["--seq"], "{name}");
        assert!(warnings[0].to_string().contains("--image-size"), "{name}");
    }
    assert!(seq.resolve(&model("gpt2")).unwrap().warnings.is_empty());
    let image = Settings {
        image_size: Some(384),
        ..Settings::default()
    };
    assert_eq!(
        ignored(&image.resolve(&model("gpt2")).unwrap().warnings),
        ["--image-size"]
    );
    assert!(image
        .resolve(&model("resnet50"))
        .unwrap()
        .warnings
        .is_empty());
}

fn tokens(mode: &str, seq: u64, new_tokens: u64) -> Settings {
    Settings {
        mode: Some(mode.into()),
        seq: Some(seq),
        new_tokens: Some(new_tokens),
        dtype: Some("bf16".into()),
        ..Settings::default()
    }
}

#[test]
fn tokens_beyond_learned_positions_are_errors() {
    for (name, positions) in [
        ("gpt2", 1024),
        ("bert-base", 512),
        ("roberta-base", 512),
        ("opt-125m", 2048),
    ] {
        let m = model(name);
        assert!(plan(&m, tokens("infer", positions, 1)).is_ok(), "{name}");
        let (setting, message) = invalid(plan(&m, tokens("infer", positions + 1, 1)));
        assert_eq!(setting, "seq", "{name}");
        assert!(
            message.contains(&format!("{positions} learned positions")),
            "{message}"
        );
    }
    let gpt2 = model("gpt2");
    // The last generated token is never fed back: 1000 + 25 - 1 = 1024 positions fit.
    assert!(plan(&gpt2, tokens("generate", 1000, 25)).is_ok());
    let (setting, _) = invalid(plan(&gpt2, tokens("generate", 1000, 26)));
    assert_eq!(setting, "seq + new-tokens - 1");
}

#[test]
fn tokens_beyond_rotary_positions_warn() {
    let llama = model("llama-3-8b");
    let warnings = plan(&llama, tokens("train", 9000, 1)).unwrap().warnings;
    assert_eq!(
        warnings,
        [Warning::PastTrainedPositions {
            tokens: 9000,
            positions: 8192
        }]
    );
    assert!(warnings[0].to_string().contains("RoPE scaling"));
    assert!(plan(&llama, tokens("train", 8192, 1))
        .unwrap()
        .warnings
        .is_empty());
    // T5's relative positions have no limit.
    assert!(plan(&model("t5-small"), tokens("train", 4096, 1))
        .unwrap()
        .warnings
        .is_empty());
}

#[test]
fn inference_defaults_to_the_config_torch_dtype() {
    let mode = |mode: &str| Settings {
        mode: Some(mode.into()),
        ..Settings::default()
    };
    let dtype =
        |settings: Settings, model: &ModelSpec| settings.resolve(model).unwrap().workload.dtype;
    let llama = model("llama-3-8b");
    assert_eq!(llama.torch_dtype, Some(Dtype::Bf16));
    assert_eq!(dtype(mode("infer"), &llama), Dtype::Bf16);
    assert_eq!(dtype(mode("generate"), &model("llama-2-7b")), Dtype::Fp16);
    // Training keeps fp32 unless asked; an explicit dtype always wins.
    assert_eq!(dtype(mode("train"), &llama), Dtype::Fp32);
    let fp32 = Settings {
        dtype: Some("fp32".into()),
        ..mode("infer")
    };
    assert_eq!(dtype(fp32, &llama), Dtype::Fp32);
    // A config without torch_dtype, and the model-less conversion: fp32.
    assert_eq!(dtype(mode("infer"), &model("gpt2")), Dtype::Fp32);
    assert_eq!(mode("infer").to_workload().unwrap().dtype, Dtype::Fp32);
    for key in ["torch_dtype", "dtype"] {
        let config = format!(
            r#"{{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "vocab_size": 100, "{key}": "float16"}}"#
        );
        let m = parse_config("x.json", &config).unwrap();
        assert_eq!(dtype(mode("infer"), &m), Dtype::Fp16, "{key}");
    }
}

/// Runs `f` on another thread and fails if it takes longer than `seconds` (a hang fails the test).
fn within<T: Send + 'static>(seconds: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(f());
    });
    receive
        .recv_timeout(Duration::from_secs(seconds))
        .expect("finished in time (no hang)")
}

#[test]
fn absurd_config_dimensions_are_errors_quickly() {
    let llama = |field: &str, value: &str| {
        format!(
            r#"{{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "vocab_size": 32000, "{field}": {value}}}"#
        )
    };
    let cases = [
        (llama("num_hidden_layers", "1000000000"), "num_hidden_layers", "10000"),
        (llama("hidden_size", "1000000000000000000"), "hidden_size", "1000000"),
        (llama("vocab_size", "100000000000"), "vocab_size", "10000000"),
        (llama("intermediate_size", "1000000000000000"), "intermediate_size", "1000000"),
        (llama("max_position_embeddings", "1000000000000"), "max_position_embeddings", "16777216"),
        (
            r#"{"model_type": "mixtral", "hidden_size": 1000000, "intermediate_size": 1000000,
                "num_hidden_layers": 10000, "num_attention_heads": 1000, "vocab_size": 10000000,
                "num_local_experts": 10000}"#
                .to_string(),
            "model size",
            "1000000000000000 parameters",
        ),
        (
            r#"{"model_type": "resnet", "depths": [3, 4, 1000000000, 3]}"#.to_string(),
            "depths",
            "10000",
        ),
        (
            r#"{"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "vocab_size": 100, "max_position_embeddings": 512,
                "architectures": ["BertForSequenceClassification"], "num_labels": 1000000000000}"#
                .to_string(),
            "num_labels",
            "10000000",
        ),
    ];
    for (config, field, bound) in cases {
        let result = within(20, move || {
            let m = parse_config("absurd.json", &config)?;
            estimate(
                &m,
                &Settings::default().to_workload()?,
                &Overheads::default(),
            )
        });
        let (name, message) = invalid(result);
        assert_eq!(name, field);
        assert!(message.contains(bound), "{message}");
    }
    assert_eq!(limits::LAYERS.max, 10_000);
}

#[test]
fn the_deepest_accepted_model_estimates_without_hanging() {
    let config = r#"{"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 10000,
                     "num_attention_heads": 8, "vocab_size": 32000}"#;
    let m = parse_config("deep.json", config).unwrap();
    let e = within(60, move || {
        let w = Settings::default().to_workload().unwrap();
        estimate(&m, &w, &Overheads::default()).unwrap()
    });
    assert!(e.total_params > 100_000_000_000);
}

/// A workload within every input bound whose plan reaches the planner's bound on one GPU
/// ([`MAX_BYTES`]) is an error naming its sizes, never a saturated figure.
#[test]
fn absurd_workloads_are_refused_instead_of_saturating() {
    let (name, message) = invalid(plan(
        &model("llama-3-8b"),
        Settings {
            seq: Some(1 << 24),
            batch: Some(1 << 24),
            attn: Some("eager".into()),
            ..Settings::default()
        },
    ));
    assert_eq!(name, "workload");
    assert!(
        message.contains("batch 16777216, seq 16777216")
            && message.contains(&MAX_BYTES.to_string()),
        "{message}"
    );
}

#[test]
fn lora_wider_than_the_model_and_more_stages_than_blocks_are_errors() {
    let gpt2 = model("gpt2");
    let (name, message) = invalid(plan(
        &gpt2,
        Settings {
            lora_rank: Some(1000),
            ..Settings::default()
        },
    ));
    assert_eq!(name, "lora-rank");
    assert!(message.contains("hidden size 768"), "{message}");
    let (name, message) = invalid(plan(
        &gpt2,
        Settings {
            pp: Some(13),
            gpus: Some(13),
            ..Settings::default()
        },
    ));
    assert_eq!(name, "pp");
    assert!(message.contains("12 blocks"), "{message}");
}

#[test]
fn advice_leaves_out_changes_the_model_cannot_run() {
    // Width 8: a rank-16 adapter is wider than the model, so LoRA is no advice. A large
    // vocabulary gives the other changes savings worth advising.
    let tiny = parse_config(
        "tiny.json",
        r#"{"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2,
            "num_attention_heads": 2, "vocab_size": 1000000}"#,
    )
    .unwrap();
    let workload = Settings::default().to_workload().unwrap();
    let advice = advise(&tiny, &workload, &Overheads::default(), None, &Estimated).unwrap();
    assert!(!advice.is_empty());
    assert!(
        advice.iter().all(|s| !s.change.contains("lora")),
        "{advice:?}"
    );
}

#[test]
fn fitting_a_sequence_stops_at_the_learned_positions() {
    let gpt2 = model("gpt2");
    let fitted = |mode: &str| {
        let workload = tokens(mode, 128, 100).to_workload().unwrap();
        let f = fit(
            &gpt2,
            &workload,
            &Overheads::default(),
            FitTarget::Seq,
            80 << 30,
            0.1,
            None,
        )
        .unwrap();
        f.value
    };
    assert_eq!(fitted("train"), 1024);
    assert_eq!(fitted("generate"), 1024 - 99);
}

#[test]
fn warnings_serialise_with_kind_and_message() {
    let w = Warning::ShardingOverOneRank {
        sharding: Sharding::Zero3,
    };
    let json = serde_json::to_value(&w).unwrap();
    assert_eq!(json["kind"], "sharding_over_one_rank");
    assert!(json["message"].as_str().unwrap().starts_with("--zero 3 "));
}

#[test]
fn generation_needs_a_decoder() {
    for name in ["bert-base", "vit-base", "resnet50", "clip-vit-base-patch32"] {
        let (setting, message) = invalid(plan(
            &model(name),
            Settings {
                mode: Some("generate".into()),
                ..Settings::default()
            },
        ));
        assert_eq!(setting, "mode", "{name}");
        assert!(message.contains("has no decoder"), "{name}: {message}");
    }
    for name in ["gpt2", "t5-small", "whisper-tiny", "llava-1.5-7b"] {
        let settings = Settings {
            mode: Some("generate".into()),
            seq: Some(16),
            ..Settings::default()
        };
        assert!(plan(&model(name), settings).is_ok(), "{name}");
    }
}

#[test]
fn a_default_sequence_past_the_learned_positions_is_lowered_with_a_warning() {
    let whisper = model("whisper-tiny");
    let lowered = |settings: Settings| {
        let resolved = settings.resolve(&whisper).unwrap();
        let warned = resolved
            .warnings
            .iter()
            .any(|w| w.kind() == "default_lowered");
        (resolved.workload.seq, warned)
    };
    // 448 decoder positions: train and infer plan 448 tokens, generate leaves room for the
    // new tokens (448 + 1 - 128).
    assert_eq!(lowered(Settings::default()), (448, true));
    let generate = Settings {
        mode: Some("generate".into()),
        ..Settings::default()
    };
    assert_eq!(lowered(generate), (321, true));
    // A sequence the user gives is never changed: too long is an error.
    let typed = Settings {
        seq: Some(512),
        ..Settings::default()
    };
    assert_eq!(lowered(typed.clone()), (512, false));
    let workload = typed.resolve(&whisper).unwrap().workload;
    assert!(estimate(&whisper, &workload, &Overheads::default()).is_err());
    // Models with room for the default keep it.
    let gpt2 = Settings::default().resolve(&model("gpt2")).unwrap();
    assert_eq!(gpt2.workload.seq, 512);
    assert!(gpt2.warnings.is_empty());
}

#[test]
fn a_dual_encoder_refuses_what_is_not_modelled_for_two_towers() {
    let clip = model("clip-vit-base-patch32");
    let refused = [
        (
            "tp",
            Settings {
                tp: Some(2),
                gpus: Some(2),
                ..Settings::default()
            },
        ),
        (
            "pp",
            Settings {
                pp: Some(2),
                gpus: Some(2),
                ..Settings::default()
            },
        ),
        (
            "lora-rank",
            Settings {
                lora_rank: Some(8),
                ..Settings::default()
            },
        ),
    ];
    for (flag, settings) in refused {
        let (setting, message) = invalid(plan(&clip, settings));
        assert_eq!(setting, flag);
        assert!(message.contains("dual encoder"), "{message}");
    }
    let sharded = Settings {
        fsdp: true,
        gpus: Some(4),
        seq: Some(77),
        ..Settings::default()
    };
    assert!(plan(&clip, sharded).is_ok());
}

#[test]
fn a_dual_encoder_reads_captions_and_images_at_its_own_size() {
    let siglip = model("siglip-so400m-patch14-384");
    let settings = Settings {
        seq: Some(64),
        batch: Some(32),
        ..Settings::default()
    };
    let resolved = settings.resolve(&siglip).unwrap();
    assert_eq!(resolved.workload.image_size, 384);
    assert!(resolved.warnings.is_empty(), "{:?}", resolved.warnings);
    let smaller = Settings {
        seq: Some(64),
        batch: Some(32),
        image_size: Some(224),
        ..Settings::default()
    }
    .resolve(&siglip)
    .unwrap();
    assert_eq!(smaller.workload.image_size, 224);
    assert!(smaller.warnings.is_empty(), "{:?}", smaller.warnings);
    let planned = |workload| {
        estimate(&siglip, &workload, &Overheads::default())
            .unwrap()
            .peak_allocated_bytes
    };
    assert!(planned(resolved.workload) > planned(smaller.workload));
}

#[test]
fn a_dual_encoder_config_names_its_towers() {
    let wrong = r#"{"model_type": "clip", "text_config": {"model_type": "clip_vision_model"}}"#;
    match parse_config("clip.json", wrong).expect_err("a vision tower as text_config") {
        PlanError::InvalidValue { name, .. } => assert_eq!(name, "text_config.model_type"),
        other => panic!("expected InvalidValue, got {other:?}"),
    }
}

/// A Llama-shaped config.json with a `quantization_config`.
fn quantised_llama(quantization: &str) -> ModelSpec {
    let text = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
        "num_key_value_heads": 4, "max_position_embeddings": 2048, "vocab_size": 32000,
        "torch_dtype": "bfloat16", "quantization_config": {quantization}}}"#
    );
    parse_config("config.json", &text).unwrap()
}

#[test]
fn a_quantised_checkpoint_is_planned_in_its_format_for_inference() {
    let infer = |quant: Option<&str>| Settings {
        mode: Some("infer".into()),
        seq: Some(256),
        quant: quant.map(String::from),
        ..Settings::default()
    };
    let weights = |model: &ModelSpec, settings: Settings| {
        let workload = settings.resolve(model).unwrap().workload;
        estimate(model, &workload, &Overheads::default())
            .unwrap()
            .breakdown
            .weights
    };
    let awq = quantised_llama(r#"{"quant_method": "awq", "bits": 4, "group_size": 128}"#);
    let plain = weights(&awq, infer(Some("none")));
    let packed = weights(&awq, infer(None));
    // TinyLlama: 968 M of its 1.1 B parameters are block linears, stored in 4.16 bits.
    assert!(packed * 10 < plain * 4, "{packed} of {plain}");
    assert_eq!(packed, weights(&awq, infer(Some("awq"))));
    // Training a quantised checkpoint needs adapters, as transformers requires.
    let (name, message) = invalid(plan_resolved(&awq, Settings::default()));
    assert_eq!(name, "quant");
    assert!(message.contains("--quant none"), "{message}");
    // An unknown method cannot be planned silently as unquantised.
    let other = quantised_llama(r#"{"quant_method": "compressed-tensors"}"#);
    let (name, message) = invalid(plan_resolved(&other, infer(None)));
    assert_eq!(name, "quantization_config.quant_method");
    assert!(message.contains("--quant"), "{message}");
    assert!(plan_resolved(&other, infer(Some("fp8"))).is_ok());
}

/// Plans as `gpumem plan` does: the settings resolved for the model first.
fn plan_resolved(model: &ModelSpec, settings: Settings) -> gpumem_plan::Result<Estimate> {
    let workload = settings.resolve(model)?.workload;
    estimate(model, &workload, &Overheads::default())
}

#[test]
fn a_frozen_vision_tower_trains_only_the_rest() {
    let frozen = |name: &str, freeze: bool| {
        let settings = Settings {
            seq: Some(77),
            batch: Some(16),
            freeze_vision_tower: freeze,
            ..Settings::default()
        };
        plan_resolved(&model(name), settings)
    };
    // CLIP ViT-L/14: the 303,179,776 parameters of its vision tower get no gradient.
    let clip = frozen("clip-vit-large-patch14", true).unwrap();
    assert_eq!(clip.trainable_params, 427_616_513 - 303_179_776);
    let trained = frozen("clip-vit-large-patch14", false).unwrap();
    assert!(clip.peak_allocated_bytes < trained.peak_allocated_bytes);
    let (name, message) = invalid(frozen("gpt2", true));
    assert_eq!(name, "freeze-vision-tower");
    assert!(message.contains("needs a vision tower"), "{message}");
}

#[test]
fn inference_that_does_not_fit_is_advised_to_load_quantised_weights() {
    let llama = model("llama-3-70b");
    let workload = Settings {
        mode: Some("generate".into()),
        seq: Some(1024),
        new_tokens: Some(128),
        ..Settings::default()
    }
    .resolve(&llama)
    .unwrap()
    .workload;
    let advice = advise(&llama, &workload, &Overheads::default(), None, &Estimated).unwrap();
    let changes: Vec<&str> = advice.iter().map(|s| s.change.as_str()).collect();
    // 4-bit weights save the most: about 0.53 of 2 bytes per block-linear weight.
    assert_eq!(
        changes.first(),
        Some(&"--quant nf4:double,compute=bf16"),
        "{changes:?}"
    );
    assert!(changes.contains(&"--quant int8"), "{changes:?}");
}

#[test]
fn offload_says_what_it_moves_and_takes_older_booleans() {
    let parse = |json: &str| serde_json::from_str::<Settings>(json).unwrap().offload;
    assert_eq!(parse(r#"{"offload": true}"#).as_deref(), Some("all"));
    assert_eq!(parse(r#"{"offload": false}"#), None);
    assert_eq!(
        parse(r#"{"offload": "optimizer"}"#).as_deref(),
        Some("optimizer")
    );
    let llama = model("llama-3-8b");
    let zero3 = |offload: &str| Settings {
        zero: Some("3".into()),
        gpus: Some(8),
        dtype: Some("bf16".into()),
        offload: Some(offload.into()),
        ..Settings::default()
    };
    match plan(&llama, zero3("params")) {
        Err(PlanError::UnknownName { kind, accepted, .. }) => {
            assert_eq!(kind, "offload");
            assert_eq!(accepted, ["none", "optimizer", "all"]);
        }
        other => panic!("expected UnknownName, got {other:?}"),
    }
    // offload_optimizer alone keeps ZeRO-3's bf16 partitions (an eighth of the model) on the
    // GPU; the optimizer states leave it either way.
    let weights = |offload: &str| plan(&llama, zero3(offload)).unwrap().breakdown.weights;
    let partitions = llama.params().total() as f64 * 2.0 / 8.0;
    let kept = weights("optimizer") as f64 - weights("all") as f64;
    assert!(
        (kept / partitions - 1.0).abs() < 0.05,
        "{kept} vs {partitions}"
    );
    let states = |offload: &str| {
        plan(&llama, zero3(offload))
            .unwrap()
            .breakdown
            .optimizer_states
    };
    assert_eq!((states("optimizer"), states("all")), (0, 0));
    let fsdp = Settings {
        zero: None,
        fsdp: true,
        ..zero3("optimizer")
    };
    assert!(matches!(
        plan(&llama, fsdp),
        Err(PlanError::Conflict { .. })
    ));
}

#[test]
fn torchvision_vision_transformers_run_sdpa_whatever_attn_says() {
    // nn.MultiheadAttention(need_weights=False) calls SDPA: `--attn eager` changes nothing but
    // warns, and the plan is the SDPA one.
    let vit = model("vit_l_16");
    let settings = |attn: Option<&str>| Settings {
        batch: Some(16),
        attn: attn.map(Into::into),
        ..Settings::default()
    };
    let eager = settings(Some("eager")).resolve(&vit).unwrap();
    assert_eq!(ignored(&eager.warnings), ["--attn"]);
    assert!(eager.warnings[0]
        .to_string()
        .contains("calls PyTorch's SDPA itself"));
    let sdpa = settings(None).resolve(&vit).unwrap();
    assert!(sdpa.warnings.is_empty());
    // Not even `--attn flash` in fp32, which FlashAttention-2 could not run, is an error.
    let flash = settings(Some("flash")).resolve(&vit).unwrap();
    assert_eq!(ignored(&flash.warnings), ["--attn"]);
    assert_eq!(flash.workload.attention, sdpa.workload.attention);
    let peak = |w| {
        estimate(&vit, &w, &Overheads::default())
            .unwrap()
            .peak_allocated_bytes
    };
    assert_eq!(peak(eager.workload), peak(sdpa.workload));
    // Hugging Face's ViT of the same sizes takes --attn eager (its scores materialised).
    let hf = model("vit-large");
    let hf_eager = settings(Some("eager")).resolve(&hf).unwrap();
    assert!(hf_eager.warnings.is_empty());
    let hf_sdpa = settings(None).resolve(&hf).unwrap();
    let hf_peak = |w| {
        estimate(&hf, &w, &Overheads::default())
            .unwrap()
            .peak_allocated_bytes
    };
    assert!(hf_peak(hf_eager.workload) > hf_peak(hf_sdpa.workload));
}

#[test]
fn lora_or_a_frozen_tower_on_a_model_without_them_is_a_conflict_naming_the_model() {
    let resnet = model("resnet50");
    for settings in [
        Settings {
            lora_rank: Some(8),
            ..Settings::default()
        },
        Settings {
            freeze_vision_tower: true,
            ..Settings::default()
        },
    ] {
        match plan(&resnet, settings) {
            Err(PlanError::Conflict { second, .. }) => assert_eq!(second, "model resnet50"),
            other => panic!("expected a conflict, got {other:?}"),
        }
    }
}
