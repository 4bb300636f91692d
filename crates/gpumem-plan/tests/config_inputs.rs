//! Model inputs as users give them: config files of every family (with the variations real
//! producers write), and the nonsense a hand-edited or wrong file holds, which must be a typed
//! error naming the file, the field and what is accepted — never a silent default, a panic or
//! a hang.

use gpumem_plan::{
    allocation_sequence, find_model, load_config, parse_config, ModelSpec, PlanError, Settings,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// A config of `testdata/plan/configs/`.
fn testdata(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/plan/configs")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn parse(config: &Value) -> gpumem_plan::Result<ModelSpec> {
    parse_config("config.json", &config.to_string())
}

/// `config` with `value` at `path` (`"text_config.hidden_act"`); `None` removes the field.
fn with(config: &Value, path: &str, value: Option<Value>) -> Value {
    let mut config = config.clone();
    let (parents, last) = path.rsplit_once('.').map_or(("", path), |(p, l)| (p, l));
    let mut object = &mut config;
    for key in parents.split('.').filter(|k| !k.is_empty()) {
        object = &mut object[key];
    }
    let object = object.as_object_mut().unwrap();
    match value {
        Some(value) => object.insert(last.into(), value),
        None => object.remove(last),
    };
    config
}

/// The field an `InvalidValue` error names, and the message.
fn invalid(result: gpumem_plan::Result<ModelSpec>) -> (String, String) {
    match result {
        Err(err @ PlanError::InvalidValue { .. }) => {
            let PlanError::InvalidValue { name, .. } = &err else {
                unreachable!()
            };
            (name.clone(), err.to_string())
        }
        other => panic!("expected InvalidValue, got {other:?}"),
    }
}

/// A file in a directory of this test's own, removed at the end.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, contents: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!("gpumem-config-inputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `f` on another thread and fails if it takes longer than `seconds` (a hang fails the
/// test instead of stalling it).
fn within<T: Send + 'static>(seconds: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(seconds))
        .unwrap_or_else(|_| panic!("did not finish within {seconds} s"))
}

#[test]
fn an_error_in_a_config_file_names_the_file() {
    let config = with(
        &testdata("llama-8l.json"),
        "num_hidden_layers",
        Some(json!(0)),
    );
    let file = TempFile::new("zero-layers.json", config.to_string().as_bytes());
    let err = load_config(&file.0).unwrap_err();
    let message = err.to_string();
    match err {
        PlanError::InConfig { path, error } => {
            assert_eq!(path, file.0.display().to_string());
            assert!(
                matches!(*error, PlanError::InvalidValue { ref name, .. } if name == "num_hidden_layers"),
                "{error:?}"
            );
        }
        other => panic!("expected InConfig, got {other:?}"),
    }
    assert!(
        message.starts_with(&format!(
            "{}: invalid num_hidden_layers = 0",
            file.0.display()
        )),
        "{message}"
    );
}

#[test]
fn a_huge_file_is_refused_without_reading_it_whole() {
    // A valid config padded past 64 MiB (a wrong path to a weights file, or /dev/zero, would
    // otherwise be read whole into memory).
    let mut text = testdata("llama-8l.json").to_string().into_bytes();
    text.resize(65 << 20, b' ');
    let file = TempFile::new("huge.json", &text);
    let err = load_config(&file.0).unwrap_err();
    assert!(
        matches!(&err, PlanError::Unreadable { reason, .. } if reason.contains("64 MiB")),
        "{err:?}"
    );
}

#[test]
fn a_byte_order_mark_is_skipped_and_a_non_object_is_refused() {
    let config = testdata("llama-8l.json").to_string();
    assert!(parse_config("bom.json", &format!("\u{feff}{config}")).is_ok());
    for text in ["[1, 2]", "null", "\"llama\"", "42"] {
        let err = parse_config("x.json", text).unwrap_err();
        assert!(
            matches!(&err, PlanError::Unreadable { reason, .. } if reason.contains("not a JSON object")),
            "{text}: {err:?}"
        );
    }
    // A model_type that is not a string is no family, not a missing field.
    let err = parse(&json!({"model_type": 5})).unwrap_err();
    assert!(
        matches!(&err, PlanError::UnsupportedModelType { given, .. } if given == "5"),
        "{err:?}"
    );
    let err = parse(&json!({"_class_name": "FluxTransformer2DModel"})).unwrap_err();
    assert!(
        matches!(
            &err,
            PlanError::UnknownName {
                kind: "_class_name",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn fields_of_the_wrong_type_or_range_are_errors_not_defaults() {
    for (file, field, value) in [
        ("llama-8l.json", "tie_word_embeddings", json!("false")),
        ("llama-8l.json", "use_cache", json!(0)),
        ("llama-8l.json", "attention_bias", json!("x")),
        ("llama-8l.json", "attention_dropout", json!(-0.1)),
        ("llama-8l.json", "attention_dropout", json!(1.5)),
        ("llama-8l.json", "attention_dropout", json!("0.1")),
        ("llama-8l.json", "hidden_act", json!(5)),
        ("llama-8l.json", "architectures", json!("LlamaForCausalLM")),
        ("llama-8l.json", "torch_dtype", json!("bfloat61")),
        ("llama-8l.json", "torch_dtype", json!(16)),
        ("gpt2-2l.json", "resid_pdrop", json!([0.1])),
        (
            "gpt2-2l.json",
            "activation_function",
            json!(null).to_string().into(),
        ),
        ("pythia-2l.json", "rotary_pct", json!(2)),
        ("pythia-2l.json", "use_parallel_residual", json!("true")),
        ("opt-2l.json", "do_layer_norm_before", json!(1)),
        ("starcoder-4l.json", "multi_query", json!("yes")),
        (
            "t5-small-2l.json",
            "feed_forward_proj",
            json!(["gated-gelu"]),
        ),
        ("gemma2-4l.json", "attn_logit_softcapping", json!(0)),
        ("gemma2-4l.json", "final_logit_softcapping", json!("30")),
        (
            "gemma3-6l.json",
            "layer_types",
            json!(["sliding_attention", 1]),
        ),
        ("qwen3moe-4l.json", "mlp_only_layers", json!("none")),
        ("vit-2l.json", "id2label", json!(["cat", "dog"])),
        ("vit-2l.json", "qkv_bias", json!(1)),
        ("siglip-vision-4l.json", "vision_use_head", json!("false")),
        ("llava-4l.json", "multimodal_projector_bias", json!(0)),
        ("resnet50.json", "depth", json!(null)),
    ] {
        let config = with(&testdata(file), field, Some(value.clone()));
        let result = parse(&config);
        if field == "depth" {
            // A ResNet without depth reads Hugging Face's `depths`: absent, it is missing.
            assert!(
                matches!(result, Err(PlanError::MissingField { .. })),
                "{result:?}"
            );
            continue;
        }
        let (name, message) = invalid(result);
        assert_eq!(name, field, "{file}: {field} = {value}: {message}");
    }
    // Hugging Face's ResNet form: four stages of block counts, a known block type.
    let resnet = json!({"model_type": "resnet", "depths": [3, 4, 6, 3], "layer_type": "basic"});
    assert!(parse(&resnet).is_ok());
    for (field, value) in [
        ("depths", json!([3, "4", 6, 3])),
        ("depths", json!([3, 4, 6])),
        ("layer_type", json!("bottlenek")),
    ] {
        let (name, _) = invalid(parse(&with(&resnet, field, Some(value))));
        assert_eq!(name, field);
    }
}

#[test]
fn the_variations_real_configs_write_are_accepted() {
    let llama = testdata("llama-8l.json");
    let planned = |config: &Value| parse(config).unwrap_or_else(|e| panic!("{config}: {e}"));
    let base = planned(&llama);
    // Fields transformers reads as absent when null, `dtype` for `torch_dtype` (transformers
    // 5.x), "auto", integer dropouts, a dropout of 1.
    for (field, value) in [
        ("rope_scaling", json!(null)),
        ("sliding_window", json!(null)),
        ("head_dim", json!(null)),
        ("architectures", json!(null)),
        ("architectures", json!([])),
        ("torch_dtype", json!("auto")),
        ("attention_dropout", json!(0)),
        ("attention_dropout", json!(1)),
        ("some_future_field", json!({"nested": [1, "x", null]})),
    ] {
        let config = with(&llama, field, Some(value));
        assert_eq!(planned(&config).params(), base.params(), "{field}");
    }
    let renamed = with(
        &with(&llama, "torch_dtype", None),
        "dtype",
        Some(json!("float16")),
    );
    assert_eq!(
        planned(&renamed).torch_dtype,
        Some(gpumem_plan::Dtype::Fp16)
    );
    // Gemma 3 writes null soft-capping; Gemma 2 a number.
    let gemma3 = with(
        &testdata("gemma3-6l.json"),
        "attn_logit_softcapping",
        Some(json!(null)),
    );
    planned(&gemma3);
    // DeepSeek: no dense layers before the experts (`DeepseekV2Config`'s default), no shared
    // experts.
    let deepseek = testdata("deepseekv3-4l.json");
    for field in ["first_k_dense_replace", "n_shared_experts"] {
        planned(&with(&deepseek, field, Some(json!(0))));
    }
    // CLIP configs written before transformers 4.22: `text_config: null` beside the dict.
    let clip = testdata("clip-4l.json");
    let old = with(
        &with(&clip, "text_config_dict", Some(clip["text_config"].clone())),
        "text_config",
        Some(json!(null)),
    );
    assert_eq!(planned(&old).params(), planned(&clip).params());
    // A diffusers UNet's `only_cross_attention` per stage, all false.
    let unet = testdata("sd15-unet-small.json");
    planned(&with(
        &unet,
        "only_cross_attention",
        Some(json!([false, false, false, false])),
    ));
}

#[test]
fn a_mixture_of_experts_names_its_experts() {
    for (file, field) in [
        ("qwen3moe-4l.json", "num_experts"),
        ("qwen3moe-4l.json", "num_experts_per_tok"),
        ("deepseekv3-4l.json", "n_routed_experts"),
        ("deepseekv3-4l.json", "num_experts_per_tok"),
    ] {
        let err = parse(&with(&testdata(file), field, None)).unwrap_err();
        assert!(
            matches!(&err, PlanError::MissingField { field: f, .. } if *f == field),
            "{file} without {field}: {err:?}"
        );
    }
}

#[test]
fn a_hidden_size_below_the_heads_is_named() {
    let config = with(&testdata("llama-8l.json"), "hidden_size", Some(json!(1)));
    let (name, message) = invalid(parse(&config));
    assert_eq!(name, "hidden_size", "{message}");
}

#[test]
fn images_smaller_than_a_patch_are_errors() {
    for (file, field) in [
        ("vit-2l.json", "image_size"),
        ("clip-vision-4l.json", "image_size"),
        ("llava-4l.json", "vision_config.image_size"),
    ] {
        let (name, message) = invalid(parse(&with(&testdata(file), field, Some(json!(8)))));
        assert_eq!(name, field, "{message}");
        assert!(message.contains("patch_size"), "{message}");
    }
}

#[test]
fn composite_configs_check_their_parts() {
    let llava = testdata("llava-4l.json");
    // The language model must be a decoder-only language model.
    for part in [
        llava.clone(),
        testdata("clip-4l.json"),
        testdata("bert-2l.json"),
        testdata("t5-small-2l.json"),
        testdata("whisper-4l.json"),
    ] {
        let (name, _) = invalid(parse(&with(&llava, "text_config", Some(part))));
        assert_eq!(name, "text_config");
    }
    // One image token per patch feature (and the class token's).
    for tokens in [1, 255, 10_000_000] {
        let (name, _) = invalid(parse(&with(
            &llava,
            "image_seq_length",
            Some(json!(tokens)),
        )));
        assert_eq!(name, "image_seq_length");
    }
    assert!(parse(&with(&llava, "image_seq_length", Some(json!(257)))).is_ok());
    // A part that is not an object, and a field of a part, are named.
    let clip = testdata("clip-4l.json");
    for (config, field, value) in [
        (&clip, "text_config", json!("x")),
        (&clip, "vision_config", json!([])),
        (&clip, "text_config.model_type", json!(5)),
        (&clip, "vision_config.attention_dropout", json!(2)),
        (&llava, "text_config", json!(true)),
        (&llava, "text_config.tie_word_embeddings", json!("no")),
        (&llava, "vision_config.hidden_act", json!(1)),
    ] {
        let (name, message) = invalid(parse(&with(config, field, Some(value))));
        assert_eq!(name, field, "{message}");
    }
}

#[test]
fn diffusers_configs_refuse_what_they_cannot_plan() {
    let unet = testdata("sd15-unet-small.json");
    for (field, value) in [
        // More heads than channels: a head of no width.
        ("attention_head_dim", json!(100_000)),
        // Widths and kernels whose parameters overflow 64 bits.
        ("conv_in_kernel", json!(1_000_000)),
        (
            "block_out_channels",
            json!([1_000_000, 1_000_000, 1_000_000, 1_000_000]),
        ),
        ("only_cross_attention", json!([false, true, false, false])),
        ("only_cross_attention", json!("no")),
        ("dual_cross_attention", json!(1)),
        ("mid_block_type", json!(7)),
    ] {
        let (name, message) = invalid(parse(&with(&unet, field, Some(value.clone()))));
        let expected = if name == "model size" {
            name.clone()
        } else {
            field.to_string()
        };
        assert_eq!(name, expected, "{field} = {value}: {message}");
    }
    // The up path's transformer blocks count against the bound on modules: here the first
    // stage's 2001 up resnets each run 500 blocks (10⁶ modules, an estimate of minutes).
    let sdxl = testdata("sdxl-unet-small.json");
    let stacked = with(
        &with(
            &with(&sdxl, "layers_per_block", Some(json!([2000, 1, 1]))),
            "up_block_types",
            Some(json!([
                "CrossAttnUpBlock2D",
                "CrossAttnUpBlock2D",
                "CrossAttnUpBlock2D"
            ])),
        ),
        "reverse_transformer_layers_per_block",
        Some(json!([[1], [1], [500]])),
    );
    let (name, _) = invalid(parse(&stacked));
    assert_eq!(name, "resnets and transformer blocks (all stages)");
    // A DiT whose patches and width overflow the counts.
    let dit = testdata("dit-4l.json");
    let wide = [
        ("patch_size", 1_000_000),
        ("sample_size", 1_000_000),
        ("out_channels", 1_000_000),
    ]
    .into_iter()
    .fold(dit, |c, (field, v)| with(&c, field, Some(json!(v))));
    let (name, _) = invalid(parse(&wide));
    assert_eq!(name, "model size");
}

#[test]
fn a_huge_diffusion_step_is_refused_without_overflow() {
    // The largest batch and image the workload accepts: the sequence's tensor sizes are
    // products of both, past the planner's bound on one GPU's memory.
    let model = parse(&testdata("sd15-unet-small.json")).unwrap();
    let settings = Settings {
        mode: Some("infer".into()),
        batch: Some(1 << 24),
        image_size: Some(1 << 24),
        ..Settings::default()
    };
    let workload = settings.resolve(&model).unwrap().workload;
    let err = allocation_sequence(&model, &workload).unwrap_err();
    assert!(
        matches!(&err, PlanError::InvalidValue { name, .. } if name == "workload"),
        "{err:?}"
    );
}

#[test]
fn a_long_unknown_model_name_is_answered_at_once() {
    let name = "x".repeat(1_000_000);
    let err = within(10, move || find_model(&name).unwrap_err());
    assert!(matches!(err, PlanError::UnknownName { .. }), "{err:?}");
}
