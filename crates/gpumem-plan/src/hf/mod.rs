//! Reading Hugging Face `config.json` files (and a small ResNet JSON) into [`ModelSpec`].

use crate::error::{PlanError, Result};
use crate::model::{Architecture, ModelSpec, TransformerSpec};
use crate::names::nearest;
use fields::ConfigFields;
use serde_json::Value;

mod families;
mod fields;

/// `model_type` values the planner understands.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "gpt2",
    "gpt_bigcode",
    "gpt_neox",
    "opt",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi",
    "phi3",
    "deepseek_v2",
    "deepseek_v3",
    "bert",
    "roberta",
    "t5",
    "whisper",
    "vit",
    "clip",
    "clip_text_model",
    "clip_vision_model",
    "siglip",
    "siglip_text_model",
    "siglip_vision_model",
    "llava",
    "gemma3",
    "resnet",
];

/// The `architectures` entry of a torchvision Vision Transformer's config (its class name,
/// `torchvision.models.VisionTransformer`): a `vit` config planned as torchvision builds it.
pub(crate) const TORCHVISION_VIT: &str = "VisionTransformer";

/// Vision transformers: they read images, have no vocabulary and no decoder.
const VISION_TYPES: &[&str] = &["vit", "clip_vision_model", "siglip_vision_model"];

/// `LlamaConfig`'s defaults (Llama-2-7B), which LLaVA checkpoints leave out of their
/// `text_config`.
const LLAMA_DEFAULTS: &[(&str, u64)] = &[
    ("hidden_size", 4096),
    ("intermediate_size", 11008),
    ("num_hidden_layers", 32),
    ("num_attention_heads", 32),
    ("max_position_embeddings", 2048),
    ("vocab_size", 32000),
];

/// `Gemma3TextConfig`'s defaults (transformers 5.x), which Gemma 3 vision-language checkpoints
/// leave out of their `text_config` (google/gemma-3-4b-it names only four sizes).
const GEMMA3_TEXT_DEFAULTS: &[(&str, u64)] = &[
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
    ("head_dim", 256),
    ("max_position_embeddings", 131072),
    ("sliding_window", 4096),
    ("query_pre_attn_scalar", 256),
    ("vocab_size", 262208),
];

/// The size defaults of the CLIP and SigLIP tower configs (`CLIPTextConfig`,
/// `CLIPVisionConfig`, `SiglipTextConfig`, `SiglipVisionConfig`): Google's SigLIP checkpoints
/// name only what differs from them (google/siglip-base-patch16-224's `vision_config` is its
/// patch size).
const TOWER_DEFAULTS: &[(&str, &[(&str, u64)])] = &[
    (
        "clip_text_model",
        &[
            ("hidden_size", 512),
            ("intermediate_size", 2048),
            ("num_hidden_layers", 12),
            ("num_attention_heads", 8),
            ("max_position_embeddings", 77),
            ("vocab_size", 49408),
        ],
    ),
    (
        "clip_vision_model",
        &[
            ("hidden_size", 768),
            ("intermediate_size", 3072),
            ("num_hidden_layers", 12),
            ("num_attention_heads", 12),
            ("image_size", 224),
            ("patch_size", 32),
        ],
    ),
    (
        "siglip_text_model",
        &[
            ("hidden_size", 768),
            ("intermediate_size", 3072),
            ("num_hidden_layers", 12),
            ("num_attention_heads", 12),
            ("max_position_embeddings", 64),
            ("vocab_size", 32000),
        ],
    ),
    (
        "siglip_vision_model",
        &[
            ("hidden_size", 768),
            ("intermediate_size", 3072),
            ("num_hidden_layers", 12),
            ("num_attention_heads", 12),
            ("image_size", 224),
            ("patch_size", 16),
        ],
    ),
];

/// `CLIPConfig`'s default width of the shared image-text embedding space.
const CLIP_PROJECTION_DIM: u64 = 512;

/// The vision-language families: a vision tower whose patch features a projector maps into a
/// language model's embeddings as image tokens.
#[derive(Clone, Copy)]
enum VisionLanguage {
    /// LLaVA: a two-layer GELU projector per patch; one image token per patch.
    Llava,
    /// Gemma 3: patch features average-pooled to `mm_tokens_per_image`, RMS-normed and
    /// projected by one matrix without bias.
    Gemma3,
}

/// Parses a config.json text (a UTF-8 byte-order mark before it, as Windows editors write, is
/// skipped).
pub fn parse_config(name: &str, text: &str) -> Result<ModelSpec> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let unreadable = |reason: String| PlanError::Unreadable {
        path: name.to_string(),
        reason,
    };
    let json: Value =
        serde_json::from_str(text).map_err(|e| unreadable(format!("not JSON: {e}")))?;
    if !json.is_object() {
        return Err(unreadable(
            "not a JSON object: a config.json holds one object of fields".into(),
        ));
    }
    spec_from_json(name, &json)
}

/// Builds a model from an already-parsed config object, with its `quantization_config`.
pub fn spec_from_json(name: &str, json: &Value) -> Result<ModelSpec> {
    let mut spec = architecture_from_json(name, json)?;
    spec.quantization = crate::quant::from_config(json)?;
    Ok(spec)
}

/// The model of the sub-config `key` of a composite config, its errors naming fields as
/// `key.field`.
fn sub_spec(name: &str, key: &str, json: &Value) -> Result<ModelSpec> {
    spec_from_json(name, json).map_err(|error| match error {
        PlanError::InvalidValue {
            name,
            value,
            reason,
        } => PlanError::InvalidValue {
            name: format!("{key}.{name}"),
            value,
            reason,
        },
        other => other,
    })
}

/// The architecture a config object describes.
fn architecture_from_json(name: &str, json: &Value) -> Result<ModelSpec> {
    let given = |key: &str| json.get(key).filter(|v| !v.is_null());
    // diffusers configs name their class instead of a model_type.
    if let (Some(class), None) = (given("_class_name"), given("model_type")) {
        let class = class
            .as_str()
            .map_or_else(|| class.to_string(), str::to_string);
        let fields = ConfigFields {
            json,
            model_type: class.clone(),
        };
        return Ok(ModelSpec {
            name: name.to_string(),
            arch: Architecture::Diffusion(Box::new(crate::diffusion::parse(&class, json)?)),
            torch_dtype: fields.torch_dtype()?,
            quantization: None,
        });
    }
    let model_type = match given("model_type") {
        None => {
            return Err(PlanError::MissingField {
                model_type: "?".into(),
                field: "model_type",
                spellings: vec!["model_type", "_class_name (diffusers)"],
            })
        }
        Some(Value::String(model_type)) => model_type.clone(),
        Some(other) => return Err(unsupported(&other.to_string())),
    };
    let fields = ConfigFields {
        json,
        model_type: model_type.clone(),
    };
    if !SUPPORTED_MODEL_TYPES.contains(&model_type.as_str()) {
        return Err(unsupported(&model_type));
    }
    match model_type.as_str() {
        "clip" | "siglip" => return fields.dual_encoder(name),
        "llava" => return fields.vision_language(name, VisionLanguage::Llava),
        "gemma3" => return fields.vision_language(name, VisionLanguage::Gemma3),
        _ => {}
    }
    if let Some((_, defaults)) = TOWER_DEFAULTS.iter().find(|(t, _)| *t == model_type) {
        let mut json = json.clone();
        if let Some(object) = json.as_object_mut() {
            for (key, value) in defaults.iter() {
                object.entry(*key).or_insert_with(|| Value::from(*value));
            }
        }
        let fields = ConfigFields {
            json: &json,
            model_type,
        };
        return Ok(ModelSpec {
            name: name.to_string(),
            arch: Architecture::Transformer(Box::new(fields.transformer()?)),
            torch_dtype: fields.torch_dtype()?,
            quantization: None,
        });
    }
    let arch = match model_type.as_str() {
        "resnet" => Architecture::Resnet(fields.resnet()?),
        _ => Architecture::Transformer(Box::new(fields.transformer()?)),
    };
    Ok(ModelSpec {
        name: name.to_string(),
        arch,
        torch_dtype: fields.torch_dtype()?,
        quantization: None,
    })
}

/// The object `key` of a composite config, with `model_type` set to `default_type` where it
/// has none.
fn sub_config(json: &Value, key: &'static str, default_type: &str) -> Result<Value> {
    let mut sub = match json.get(key).filter(|v| !v.is_null()) {
        Some(sub) if sub.is_object() => sub.clone(),
        Some(other) => {
            return Err(fields::invalid(
                key,
                other,
                "must be an object: the config of the model's part",
            ))
        }
        None => {
            return Err(PlanError::MissingField {
                model_type: json
                    .get("model_type")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string(),
                field: key,
                spellings: vec![key],
            })
        }
    };
    if let Some(object) = sub.as_object_mut() {
        if object.get("model_type").is_none_or(Value::is_null) {
            object.insert("model_type".into(), Value::from(default_type));
        }
    }
    Ok(sub)
}

/// The transformer of a parsed sub-config, or an error naming what it should have been.
fn transformer_of(spec: ModelSpec, key: &str, expected: &str) -> Result<TransformerSpec> {
    match spec.arch {
        Architecture::Transformer(t) => Ok(*t),
        Architecture::Resnet(_) | Architecture::Diffusion(_) => Err(PlanError::InvalidValue {
            name: key.to_string(),
            value: spec.name,
            reason: format!("must describe {expected}"),
        }),
    }
}

/// Fails where more experts are routed per token than `spec` has (`limit`: how the error
/// names the number of experts).
fn check_routed_experts(spec: &TransformerSpec, limit: String) -> Result<()> {
    if spec.experts_per_token > spec.experts {
        return Err(PlanError::InvalidValue {
            name: "num_experts_per_tok".into(),
            value: spec.experts_per_token.to_string(),
            reason: format!("must be at most {limit}"),
        });
    }
    Ok(())
}

/// The error for a `model_type` outside [`SUPPORTED_MODEL_TYPES`].
fn unsupported(model_type: &str) -> PlanError {
    PlanError::UnsupportedModelType {
        given: model_type.to_string(),
        nearest: nearest(model_type, SUPPORTED_MODEL_TYPES.iter().copied()),
        accepted: SUPPORTED_MODEL_TYPES
            .iter()
            .map(|s| s.to_string())
            .collect(),
    }
}
