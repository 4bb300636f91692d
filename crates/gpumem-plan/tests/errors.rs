//! Bad input gives a typed error naming what is accepted and the nearest names; never a panic.

use gpumem_plan::{
    estimate, find_gpu, find_model, fit, parse_config, FitTarget, Overheads, PlanError, Settings,
};

#[test]
fn unknown_model_name_suggests_nearest() {
    let err = find_model("lama-3-8b").unwrap_err();
    match &err {
        PlanError::UnknownName {
            kind,
            nearest,
            accepted,
            ..
        } => {
            assert_eq!(*kind, "model");
            assert!(nearest.iter().any(|n| n == "llama-3-8b"), "{nearest:?}");
            assert!(accepted.iter().any(|n| n == "gpt2"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("did you mean"));
}

#[test]
fn unknown_model_type_lists_supported() {
    let err = parse_config("x.json", r#"{"model_type": "llamaa", "hidden_size": 8}"#).unwrap_err();
    let PlanError::UnsupportedModelType {
        nearest, accepted, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(nearest[0], "llama");
    assert!(accepted.iter().any(|t| t == "t5"));
}

#[test]
fn missing_and_invalid_config_fields() {
    let err = parse_config(
        "x.json",
        r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}"#,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::MissingField {
                field: "num_hidden_layers",
                ..
            }
        ),
        "{err:?}"
    );
    let err = parse_config(
        "x.json",
        r#"{"model_type": "gpt2", "n_embd": -5, "n_layer": 2, "n_head": 1}"#,
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::InvalidValue { .. }), "{err:?}");
    let err = parse_config("x.json", r#"{"hidden_size": 8}"#).unwrap_err();
    assert!(matches!(
        err,
        PlanError::MissingField {
            field: "model_type",
            ..
        }
    ));
    assert!(matches!(
        parse_config("x.json", "not json").unwrap_err(),
        PlanError::Unreadable { .. }
    ));
    let err = parse_config("x.json", r#"{"model_type": "resnet", "depth": 42}"#).unwrap_err();
    assert!(err.to_string().contains("18, 34, 50, 101, 152"));
    // torchvision's VisionTransformer has no default patch or image size (HF's ViTConfig has).
    let torchvision_vit = r#"{"model_type": "vit", "architectures": ["VisionTransformer"],
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 256, "image_size": 32}"#;
    let err = parse_config("x.json", torchvision_vit).unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::MissingField {
                field: "patch_size",
                ..
            }
        ),
        "{err:?}"
    );
    let hf_vit = torchvision_vit.replace("VisionTransformer", "ViTForImageClassification");
    assert!(parse_config("x.json", &hf_vit).is_ok());
    let gqa = r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 3, "vocab_size": 10}"#;
    assert!(parse_config("x.json", gqa).is_err());
}

#[test]
fn nonsense_sizes_are_rejected() {
    for settings in [
        Settings {
            batch: Some(0),
            ..Settings::default()
        },
        Settings {
            seq: Some(1 << 40),
            ..Settings::default()
        },
        Settings {
            gpus: Some(0),
            ..Settings::default()
        },
        Settings {
            gpus: Some(6),
            tp: Some(4),
            ..Settings::default()
        },
        Settings {
            mode: Some("generate".into()),
            new_tokens: Some(0),
            ..Settings::default()
        },
        Settings {
            amp: Some("fp32".into()),
            ..Settings::default()
        },
    ] {
        assert!(
            matches!(settings.to_workload(), Err(PlanError::InvalidValue { .. })),
            "{settings:?}"
        );
    }
}

#[test]
fn unknown_choices_name_the_accepted_values() {
    let err = Settings {
        optimizer: Some("adamm".into()),
        ..Settings::default()
    }
    .to_workload()
    .unwrap_err();
    assert!(err.to_string().contains("adamw"), "{err}");
    let err = Settings {
        attn: Some("flashh".into()),
        ..Settings::default()
    }
    .to_workload()
    .unwrap_err();
    assert!(err.to_string().contains("did you mean flash"), "{err}");
    let err = Settings {
        zero: Some("4".into()),
        ..Settings::default()
    }
    .to_workload()
    .unwrap_err();
    assert!(err.to_string().contains("0, 1, 2, 3"), "{err}");
}

#[test]
fn unknown_gpu_suggests_nearest() {
    let err = find_gpu("rtx-4900").unwrap_err();
    let PlanError::UnknownName { kind, nearest, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*kind, "GPU");
    assert!(nearest.iter().any(|n| n == "rtx-4090"), "{nearest:?}");
    assert!(find_gpu("-3GB").is_err());
}

#[test]
fn fit_errors_are_typed() {
    let model = find_model("llama-2-70b").unwrap();
    let workload = Settings::default().to_workload().unwrap();
    let overheads = Overheads::default();
    let err = fit(
        &model,
        &workload,
        &overheads,
        FitTarget::Batch,
        24 << 30,
        0.1,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(err, PlanError::NothingFits { what: "batch", .. }),
        "{err:?}"
    );
    let err = fit(
        &model,
        &workload,
        &overheads,
        FitTarget::Batch,
        24 << 30,
        1.5,
        None,
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::InvalidValue { .. }));
    let lora_on_cnn = Settings {
        lora_rank: Some(8),
        ..Settings::default()
    }
    .to_workload()
    .unwrap();
    assert!(estimate(&find_model("resnet50").unwrap(), &lora_on_cnn, &overheads).is_err());
}

#[test]
fn fitting_a_sequence_needs_a_sequence_model() {
    let workload = Settings::default().to_workload().unwrap();
    for name in ["resnet50", "vit-base"] {
        let err = fit(
            &find_model(name).unwrap(),
            &workload,
            &Overheads::default(),
            FitTarget::Seq,
            80 << 30,
            0.1,
            None,
        )
        .unwrap_err();
        assert!(
            matches!(err, PlanError::InvalidValue { .. }),
            "{name}: {err:?}"
        );
    }
}

#[test]
fn llava_feature_layer_must_index_the_tower() {
    let config = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/plan/configs/llava-4l.json"),
    )
    .unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&config).unwrap();
    let plan = |json: &serde_json::Value| parse_config("llava.json", &json.to_string());
    // The measured config reads layer -2 of 4: the last tower layer is untrained.
    assert!(plan(&json).is_ok());
    for bad in [
        serde_json::json!(5),
        serde_json::json!(-6),
        serde_json::json!("x"),
    ] {
        json["vision_feature_layer"] = bad.clone();
        match plan(&json).unwrap_err() {
            PlanError::InvalidValue { name, reason, .. } => {
                assert_eq!(name, "vision_feature_layer", "{bad}");
                assert!(reason.contains("-5 to 4"), "{reason}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    // A list reads several layers; the deepest decides what is trained.
    json["vision_feature_layer"] = serde_json::json!([-3, -1]);
    assert!(plan(&json).is_ok());
}

#[test]
fn a_static_cache_too_short_and_gpt_fast_outside_generation_are_errors() {
    let generate = Settings {
        mode: Some("generate".into()),
        seq: Some(100),
        new_tokens: Some(50),
        ..Settings::default()
    };
    let short = Settings {
        cache_len: Some(148),
        ..generate.clone()
    };
    let message = short.to_workload().unwrap_err().to_string();
    assert!(
        message.contains("cache-len") && message.contains("149"),
        "{message}"
    );
    let enough = Settings {
        cache_len: Some(149),
        ..generate
    };
    assert!(enough.to_workload().is_ok());
    let training = Settings {
        framework: Some("gpt-fast".into()),
        ..Settings::default()
    };
    let message = training.to_workload().unwrap_err().to_string();
    assert!(message.contains("--mode generate"), "{message}");
    // gpt-fast calls SDPA itself: --attn is ignored with a warning.
    let eager = Settings {
        mode: Some("generate".into()),
        attn: Some("eager".into()),
        ..training
    };
    let resolved = eager.resolve(&find_model("llama-3-8b").unwrap()).unwrap();
    assert_eq!(resolved.workload.attention, gpumem_plan::Attention::Sdpa);
    assert!(
        format!("{:?}", resolved.warnings).contains("--attn"),
        "{:?}",
        resolved.warnings
    );
}
