//! Reading Hugging Face `config.json` files (and a small ResNet JSON) into [`ModelSpec`].

use crate::error::{PlanError, Result};
use crate::limits::{self, Bound};
use crate::model::{
    Activation, Architecture, AudioStem, ContrastiveLoss, DualEncoder, Head, HeldHidden,
    LatentAttention, ModelSpec, MoeLayout, Norm, Patches, ResnetSpec, SlidingWindow,
    TransformerSpec, VisionAdapter,
};
use crate::names::nearest;
use crate::workload::{choices, Dtype};
use serde_json::Value;

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

/// Parses a config.json text.
pub fn parse_config(name: &str, text: &str) -> Result<ModelSpec> {
    let json: Value = serde_json::from_str(text).map_err(|e| PlanError::Unreadable {
        path: name.to_string(),
        reason: format!("not JSON: {e}"),
    })?;
    spec_from_json(name, &json)
}

/// Builds a model from an already-parsed config object, with its `quantization_config`.
pub fn spec_from_json(name: &str, json: &Value) -> Result<ModelSpec> {
    let mut spec = architecture_from_json(name, json)?;
    spec.quantization = crate::quant::from_config(json)?;
    Ok(spec)
}

/// The architecture a config object describes.
fn architecture_from_json(name: &str, json: &Value) -> Result<ModelSpec> {
    // diffusers configs name their class instead of a model_type.
    if let Some(class) = json.get("_class_name").and_then(Value::as_str) {
        if json.get("model_type").is_none() {
            return Ok(ModelSpec {
                name: name.to_string(),
                arch: Architecture::Diffusion(Box::new(crate::diffusion::parse(class, json)?)),
                torch_dtype: ConfigFields {
                    json,
                    model_type: class.to_string(),
                }
                .torch_dtype(),
                quantization: None,
            });
        }
    }
    let model_type = json
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| PlanError::MissingField {
            model_type: "?".into(),
            field: "model_type",
            spellings: vec!["model_type"],
        })?
        .to_string();
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
            torch_dtype: fields.torch_dtype(),
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
        torch_dtype: fields.torch_dtype(),
        quantization: None,
    })
}

/// The object `key` of a composite config, with `model_type` set to `default_type` where it
/// has none.
fn sub_config(json: &Value, key: &'static str, default_type: &str) -> Result<Value> {
    let mut sub = json
        .get(key)
        .filter(|v| v.is_object())
        .cloned()
        .ok_or_else(|| PlanError::MissingField {
            model_type: json
                .get("model_type")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
            field: key,
            spellings: vec![key],
        })?;
    if let Some(object) = sub.as_object_mut() {
        object
            .entry("model_type")
            .or_insert_with(|| Value::from(default_type));
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

/// The sizes every transformer config gives (or has defaults for).
struct TransformerSizes {
    /// Hidden width.
    hidden: u64,
    /// Blocks (a decoder's, before a family changes them).
    layers: u64,
    /// Query heads.
    heads: u64,
    /// Key and value heads.
    kv_heads: u64,
    /// Width of one head.
    head_dim: u64,
    /// MLP (or expert) width.
    intermediate: u64,
    /// Vocabulary (none for a vision tower).
    vocab: u64,
    /// Multi-head latent attention (DeepSeek-V2/V3).
    latent: Option<LatentAttention>,
    /// `max_position_embeddings` and its spellings, if given.
    positions: Option<u64>,
    /// A vision tower (no vocabulary, not a decoder).
    vision: bool,
}

struct ConfigFields<'a> {
    json: &'a Value,
    model_type: String,
}

impl ConfigFields<'_> {
    fn find(&self, spellings: &[&str]) -> Option<&Value> {
        spellings
            .iter()
            .find_map(|key| self.json.get(*key).filter(|v| !v.is_null()))
    }

    /// A positive integer within `bound`, under any of its spellings; None when absent.
    fn optional_u64(
        &self,
        field: &'static str,
        spellings: &[&'static str],
        bound: Bound,
    ) -> Result<Option<u64>> {
        match self.find(spellings) {
            None => Ok(None),
            Some(value) => match value.as_u64() {
                Some(n) => bound.check(field, n).map(Some),
                None => Err(PlanError::InvalidValue {
                    name: field.to_string(),
                    value: value.to_string(),
                    reason: "must be a positive integer".into(),
                }),
            },
        }
    }

    /// Like [`ConfigFields::optional_u64`], but absence is a [`PlanError::MissingField`].
    fn required_u64(
        &self,
        field: &'static str,
        spellings: &[&'static str],
        bound: Bound,
    ) -> Result<u64> {
        self.optional_u64(field, spellings, bound)?
            .ok_or_else(|| PlanError::MissingField {
                model_type: self.model_type.clone(),
                field,
                spellings: spellings.to_vec(),
            })
    }

    fn f64_or(&self, spellings: &[&str], default: f64) -> f64 {
        self.find(spellings)
            .and_then(Value::as_f64)
            .unwrap_or(default)
    }

    fn bool_or(&self, spellings: &[&str], default: bool) -> bool {
        self.find(spellings)
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }

    fn str_or<'b>(&'b self, spellings: &[&str], default: &'b str) -> &'b str {
        self.find(spellings)
            .and_then(Value::as_str)
            .unwrap_or(default)
    }

    /// Classifier outputs: `num_labels`, else the size of `id2label`, else `default`.
    fn labels(&self, default: u64) -> Result<u64> {
        let labels = match self.optional_u64("num_labels", &["num_labels"], limits::VOCAB)? {
            Some(n) => n,
            None => self
                .json
                .get("id2label")
                .and_then(Value::as_object)
                .map_or(default, |m| m.len() as u64),
        };
        limits::VOCAB.check("num_labels", labels)
    }

    /// The config's `torch_dtype` (newer transformers write `dtype`); None when absent or not
    /// one of the planner's dtypes (`"auto"`).
    fn torch_dtype(&self) -> Option<Dtype> {
        let name = self.find(&["torch_dtype", "dtype"])?.as_str()?;
        choices::parse("dtype", name, choices::DTYPES).ok()
    }

    fn architecture_name(&self) -> &str {
        self.json
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    fn activation(&self, spellings: &[&str], default: &str) -> Result<Activation> {
        let name = self.str_or(spellings, default);
        // T5 spells it "gated-gelu" / "relu" in feed_forward_proj.
        let base = name.trim_start_matches("gated-");
        match base {
            "gelu" => Ok(Activation::Gelu),
            "gelu_new" | "gelu_fast" => Ok(Activation::GeluTanhPython),
            "quick_gelu" => Ok(Activation::QuickGelu),
            "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            "relu" => Ok(Activation::Relu),
            "silu" | "swish" => Ok(Activation::Silu),
            other => Err(PlanError::InvalidValue {
                name: "hidden_act".into(),
                value: other.into(),
                reason:
                    "supported: gelu, gelu_new, gelu_fast, gelu_pytorch_tanh, quick_gelu, relu, silu"
                        .into(),
            }),
        }
    }

    fn resnet(&self) -> Result<ResnetSpec> {
        let num_classes = self
            .optional_u64("num_classes", &["num_classes", "num_labels"], limits::VOCAB)?
            .unwrap_or(1000);
        if let Some(depth) = self.optional_u64("depth", &["depth"], limits::LAYERS)? {
            let (blocks, bottleneck) = match depth {
                18 => ([2, 2, 2, 2], false),
                34 => ([3, 4, 6, 3], false),
                50 => ([3, 4, 6, 3], true),
                101 => ([3, 4, 23, 3], true),
                152 => ([3, 8, 36, 3], true),
                other => {
                    return Err(PlanError::InvalidValue {
                        name: "depth".into(),
                        value: other.to_string(),
                        reason: "ResNet depth must be one of 18, 34, 50, 101, 152".into(),
                    })
                }
            };
            return Ok(ResnetSpec {
                blocks,
                bottleneck,
                num_classes,
            });
        }
        // Hugging Face ResNetConfig: "depths": [3,4,6,3], "layer_type": "bottleneck".
        let depths: Vec<u64> = self
            .find(&["depths"])
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let blocks: [u64; 4] = depths.try_into().map_err(|_| PlanError::MissingField {
            model_type: self.model_type.clone(),
            field: "depth",
            spellings: vec!["depth", "depths (4 stages)"],
        })?;
        for stage in blocks {
            limits::LAYERS.check("depths", stage)?;
        }
        limits::LAYERS.check("depths (all stages)", blocks.iter().sum())?;
        let bottleneck = self.str_or(&["layer_type"], "bottleneck") == "bottleneck";
        Ok(ResnetSpec {
            blocks,
            bottleneck,
            num_classes,
        })
    }

    /// A transformer from its config: the sizes every family has, the defaults, the family's
    /// own settings (one function per `model_type`), then what follows from them all.
    fn transformer(&self) -> Result<TransformerSpec> {
        let mt = self.model_type.as_str();
        let sizes = self.transformer_sizes()?;
        let positions = sizes.positions;
        let mut spec = self.default_transformer(&sizes);
        match mt {
            "gpt2" | "gpt_bigcode" => self.gpt2(&mut spec, positions)?,
            "gpt_neox" => self.gpt_neox(&mut spec)?,
            "opt" => self.opt(&mut spec, positions)?,
            "llama" | "mistral" | "qwen2" | "qwen3" | "qwen3_moe" | "mixtral" | "gemma"
            | "gemma2" | "gemma3_text" | "phi3" | "deepseek_v2" | "deepseek_v3" => {
                self.llama_family(&mut spec)?
            }
            "phi" => self.phi(&mut spec)?,
            "bert" | "roberta" => self.bert(&mut spec, positions)?,
            "t5" => self.t5(&mut spec)?,
            "whisper" => self.whisper(&mut spec, self.need_positions(positions)?)?,
            "clip_text_model" | "siglip_text_model" => self.text_tower(&mut spec, positions)?,
            "clip_vision_model" | "siglip_vision_model" => self.vision_tower(&mut spec)?,
            "vit" => self.vit(&mut spec)?,
            other => return Err(unsupported(other)),
        }
        let arch = self.architecture_name();
        let base_model =
            arch.ends_with("Model") && !arch.contains("For") && !arch.contains("LMHead");
        if spec.head == Head::CausalLm && base_model {
            spec.head = Head::None;
        }
        spec.max_positions = match mt {
            // Relative position buckets, and positions per patch: no token limit.
            "t5" | "vit" | "clip_vision_model" | "siglip_vision_model" => None,
            // RoBERTa's position ids start after the padding index: two rows are never reached.
            "roberta" => positions.map(|p| p.saturating_sub(2).max(1)),
            _ => positions,
        };
        if mt != "whisper" {
            spec.key_bias = spec.qkv_bias;
        }
        limits::check_parameters(&spec)?;
        Ok(spec)
    }

    /// The config's position limit, which `model_type` needs.
    fn need_positions(&self, positions: Option<u64>) -> Result<u64> {
        positions.ok_or_else(|| PlanError::MissingField {
            model_type: self.model_type.clone(),
            field: "max_position_embeddings",
            spellings: vec!["max_position_embeddings", "n_positions"],
        })
    }

    /// The sizes every transformer config gives (or has defaults for), checked.
    fn transformer_sizes(&self) -> Result<TransformerSizes> {
        let mt = self.model_type.as_str();
        let hidden = self.required_u64(
            "hidden_size",
            &["hidden_size", "n_embd", "d_model"],
            limits::WIDTH,
        )?;
        let layers = self.required_u64(
            "num_hidden_layers",
            &[
                "num_hidden_layers",
                "n_layer",
                "num_layers",
                "decoder_layers",
            ],
            limits::LAYERS,
        )?;
        let heads = self.required_u64(
            "num_attention_heads",
            &[
                "num_attention_heads",
                "n_head",
                "num_heads",
                "decoder_attention_heads",
            ],
            limits::WIDTH,
        )?;
        let vision = VISION_TYPES.contains(&mt);
        let vocab = if vision {
            0
        } else {
            self.required_u64("vocab_size", &["vocab_size"], limits::VOCAB)?
        };
        let (kv_heads, latent, head_dim) = self.attention_widths(hidden, heads)?;
        let intermediate = self
            .optional_u64(
                "intermediate_size",
                &[
                    "moe_intermediate_size",
                    "intermediate_size",
                    "n_inner",
                    "ffn_dim",
                    "d_ff",
                    "decoder_ffn_dim",
                ],
                limits::WIDTH,
            )?
            .unwrap_or(4 * hidden);
        let positions = self.optional_u64(
            "max_position_embeddings",
            &[
                "max_position_embeddings",
                "n_positions",
                "max_target_positions",
            ],
            limits::POSITIONS,
        )?;
        Ok(TransformerSizes {
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            latent,
            positions,
            vision,
        })
    }

    /// Key heads, latent attention and head width of a transformer with `hidden` and `heads`,
    /// checked against them.
    fn attention_widths(
        &self,
        hidden: u64,
        heads: u64,
    ) -> Result<(u64, Option<LatentAttention>, u64)> {
        let mt = self.model_type.as_str();
        let kv_heads = self
            .optional_u64(
                "num_key_value_heads",
                &["num_key_value_heads"],
                limits::WIDTH,
            )?
            .unwrap_or(heads);
        let latent = self.latent_attention()?;
        let head_dim = match latent {
            Some(l) => l.nope_dim + l.rope_dim,
            None => self
                .optional_u64("head_dim", &["head_dim", "d_kv"], limits::WIDTH)?
                .unwrap_or(hidden / heads),
        };
        limits::WIDTH.check("head_dim", head_dim)?;
        if mt != "t5" && !hidden.is_multiple_of(heads) && self.find(&["head_dim"]).is_none() {
            return Err(PlanError::InvalidValue {
                name: "hidden_size".into(),
                value: hidden.to_string(),
                reason: format!("must be divisible by num_attention_heads = {heads}"),
            });
        }
        if !heads.is_multiple_of(kv_heads) {
            return Err(PlanError::InvalidValue {
                name: "num_key_value_heads".into(),
                value: kv_heads.to_string(),
                reason: format!("must divide num_attention_heads = {heads}"),
            });
        }
        Ok((kv_heads, latent, head_dim))
    }

    /// The transformer of `sizes` with every other field at its default (a pre-norm GPT
    /// block), which the family's function then changes.
    fn default_transformer(&self, sizes: &TransformerSizes) -> TransformerSpec {
        let mt = self.model_type.as_str();
        let vision = sizes.vision;
        TransformerSpec {
            model_type: mt.to_string(),
            hidden: sizes.hidden,
            layers: sizes.layers,
            encoder_layers: 0,
            heads: sizes.heads,
            kv_heads: sizes.kv_heads,
            head_dim: sizes.head_dim,
            intermediate: sizes.intermediate,
            vocab: sizes.vocab,
            learned_positions: 0,
            token_types: 0,
            max_positions: None,
            activation: Activation::Gelu,
            gated_mlp: false,
            norm: Norm::LayerNorm,
            norm_bias: true,
            post_norm: false,
            parallel_residual: false,
            shared_block_norm: false,
            fused_qkv: false,
            qkv_bias: true,
            out_bias: true,
            mlp_bias: true,
            rotary_fraction: 0.0,
            softmax_fp32: false,
            tied_embeddings: self.bool_or(&["tie_word_embeddings"], true),
            lm_head_bias: false,
            embedding_norm: false,
            final_norm: true,
            experts: 1,
            experts_per_token: 1,
            relative_attention_buckets: 0,
            embed_projection: 0,
            attention_dropout: 0.0,
            hidden_dropout: 0.0,
            activation_dropout: 0.0,
            embedding_dropout: 0.0,
            head: Head::CausalLm,
            use_cache: self.bool_or(&["use_cache"], true),
            decoder: !vision
                && !matches!(
                    mt,
                    "bert" | "roberta" | "clip_text_model" | "siglip_text_model"
                ),
            // A pre-norm block as Llama writes it (transformers 5.x): the model holds
            // `inputs_embeds` through the body; attention reads the norm output while the caller
            // holds the block input; the MLP runs on the norm output of the residual sum.
            held: HeldHidden {
                embeddings: 1,
                positions: false,
                at_attention: 2,
                at_mlp: 3,
            },
            patches: None,
            key_bias: true,
            qk_norm: false,
            sandwich_norms: false,
            sliding: None,
            attention_softcap: false,
            eager_only: false,
            fused_gate_up: false,
            logit_softcap: false,
            latent: sizes.latent,
            moe: MoeLayout::default(),
            rescaled_output: false,
            audio: None,
            head_layout_queries: false,
            vision: None,
            dual: None,
        }
    }

    /// GPT-2 and StarCoder (`gpt_bigcode`): learned positions, a fused qkv projection.
    fn gpt2(&self, spec: &mut TransformerSpec, positions: Option<u64>) -> Result<()> {
        let mt = self.model_type.as_str();
        spec.learned_positions = self.need_positions(positions)?;
        spec.fused_qkv = true;
        let bigcode = mt == "gpt_bigcode";
        spec.activation = self.activation(
            &["activation_function"],
            if bigcode {
                "gelu_pytorch_tanh"
            } else {
                "gelu_new"
            },
        )?;
        if bigcode {
            // Multi-query attention: one key/value head; the softmax runs in fp32
            // (`attention_softmax_in_fp32`, on by default).
            if self.bool_or(&["multi_query"], true) {
                spec.kv_heads = 1;
            }
            spec.softmax_fp32 = self.bool_or(&["attention_softmax_in_fp32"], true);
        }
        spec.attention_dropout = self.f64_or(&["attn_pdrop"], 0.1);
        spec.hidden_dropout = self.f64_or(&["resid_pdrop"], 0.1);
        spec.embedding_dropout = self.f64_or(&["embd_pdrop"], 0.1);
        // The model holds `position_embeds` (batch 1) too; the block keeps
        // `attn_output` named while its MLP runs.
        spec.held.positions = true;
        spec.held.at_mlp = 4;
        Ok(())
    }

    /// GPT-NeoX (Pythia): partial rotary, a parallel residual.
    fn gpt_neox(&self, spec: &mut TransformerSpec) -> Result<()> {
        spec.fused_qkv = true;
        // The rotated queries are `torch.cat([rotated, passed], dim=-1)`: contiguous
        // per head.
        spec.head_layout_queries = true;
        spec.parallel_residual = self.bool_or(&["use_parallel_residual"], true);
        spec.rotary_fraction = self.f64_or(&["rotary_pct", "partial_rotary_factor"], 0.25);
        spec.activation = self.activation(&["hidden_act"], "gelu")?;
        spec.qkv_bias = self.bool_or(&["attention_bias"], true);
        spec.out_bias = spec.qkv_bias;
        spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], false);
        spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
        spec.hidden_dropout = self.f64_or(&["hidden_dropout"], 0.0);
        spec.softmax_fp32 = true;
        Ok(())
    }

    /// OPT: learned positions with an offset, pre- or post-norm, an optional embedding projection.
    fn opt(&self, spec: &mut TransformerSpec, positions: Option<u64>) -> Result<()> {
        let hidden = spec.hidden;
        // OPT's learned positions carry an offset of 2 rows.
        spec.learned_positions = self.need_positions(positions)? + 2;
        spec.activation = self.activation(&["activation_function"], "relu")?;
        let bias = self.bool_or(&["enable_bias"], true);
        (spec.qkv_bias, spec.out_bias, spec.mlp_bias) = (bias, bias, bias);
        let pre_norm = self.bool_or(&["do_layer_norm_before"], true);
        spec.post_norm = !pre_norm;
        spec.final_norm = pre_norm && !self.bool_or(&["_remove_final_layer_norm"], false);
        let projection = self
            .optional_u64(
                "word_embed_proj_dim",
                &["word_embed_proj_dim"],
                limits::WIDTH,
            )?
            .unwrap_or(hidden);
        spec.embed_projection = if projection == hidden { 0 } else { projection };
        spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
        spec.hidden_dropout = self.f64_or(&["dropout"], 0.1);
        spec.embedding_dropout = spec.hidden_dropout;
        spec.activation_dropout = self.f64_or(&["activation_dropout"], 0.0);
        spec.softmax_fp32 = true;
        // The model holds `pos_embeds` (per token) too; the block's fc1 rebinds the norm
        // output, so its MLP runs beside the block input and the residual sum only.
        spec.held.embeddings = 2;
        spec.held.at_mlp = 2;
        Ok(())
    }

    /// The Llama-style decoders (Llama, Mistral, Qwen, Mixtral, Gemma, Phi-3, DeepSeek): RMSNorm, a
    /// gated MLP, rotary; Mixtral's experts.
    fn llama_family(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        spec.norm = Norm::RmsNorm;
        spec.norm_bias = false;
        spec.gated_mlp = true;
        spec.activation = self.activation(&["hidden_activation", "hidden_act"], "silu")?;
        spec.qkv_bias = self.bool_or(&["attention_bias"], mt == "qwen2");
        spec.out_bias = mt != "qwen2" && spec.qkv_bias;
        spec.mlp_bias = self.bool_or(&["mlp_bias"], false);
        spec.rotary_fraction = self.f64_or(&["partial_rotary_factor"], 1.0);
        spec.softmax_fp32 = true;
        let gemma = matches!(mt, "gemma" | "gemma2" | "gemma3_text");
        spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], gemma);
        spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
        self.newer_decoder(spec)?;
        if mt == "mixtral" {
            spec.experts =
                self.required_u64("num_local_experts", &["num_local_experts"], limits::EXPERTS)?;
            spec.experts_per_token = self
                .optional_u64(
                    "num_experts_per_tok",
                    &["num_experts_per_tok"],
                    limits::EXPERTS,
                )?
                .unwrap_or(2);
            check_routed_experts(spec, format!("num_local_experts = {}", spec.experts))?;
        }
        Ok(())
    }

    /// Phi-1/2: a parallel residual with one shared norm, partial rotary, a biased LM head.
    fn phi(&self, spec: &mut TransformerSpec) -> Result<()> {
        spec.parallel_residual = true;
        // `torch.cat((query_rot, query_pass), dim=-1)`: queries contiguous per head.
        spec.head_layout_queries = true;
        spec.shared_block_norm = true;
        spec.rotary_fraction = self.f64_or(&["partial_rotary_factor"], 0.5);
        spec.activation = self.activation(&["hidden_act"], "gelu_new")?;
        spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], false);
        spec.lm_head_bias = true;
        spec.softmax_fp32 = true;
        spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
        spec.hidden_dropout = self.f64_or(&["resid_pdrop"], 0.0);
        spec.embedding_dropout = self.f64_or(&["embd_pdrop"], 0.0);
        Ok(())
    }

    /// BERT and RoBERTa: post-norm encoders with token types and a masked-LM, classification or
    /// pooler head.
    fn bert(&self, spec: &mut TransformerSpec, positions: Option<u64>) -> Result<()> {
        spec.learned_positions = self.need_positions(positions)?;
        spec.token_types = self
            .optional_u64("type_vocab_size", &["type_vocab_size"], limits::VOCAB)?
            .unwrap_or(2);
        spec.post_norm = true;
        spec.embedding_norm = true;
        spec.final_norm = false;
        spec.activation = self.activation(&["hidden_act"], "gelu")?;
        spec.attention_dropout = self.f64_or(&["attention_probs_dropout_prob"], 0.1);
        spec.hidden_dropout = self.f64_or(&["hidden_dropout_prob"], 0.1);
        spec.embedding_dropout = spec.hidden_dropout;
        // Post-norm: q, k, v read the block input itself; the MLP reads the attention
        // output (its LayerNorm) beside the block input.
        spec.held.at_attention = 1;
        spec.held.at_mlp = 2;
        let arch = self.architecture_name();
        spec.head = if arch.ends_with("ForMaskedLM") {
            Head::MaskedLm
        } else if arch.ends_with("ForSequenceClassification") {
            Head::SequenceClassification {
                labels: self.labels(2)?,
            }
        } else {
            Head::Pooler
        };
        Ok(())
    }

    /// T5: an encoder-decoder with relative position buckets and a scaled-input RMSNorm.
    fn t5(&self, spec: &mut TransformerSpec) -> Result<()> {
        let layers = spec.layers;
        spec.encoder_layers = layers;
        spec.layers = self
            .optional_u64(
                "num_decoder_layers",
                &["num_decoder_layers"],
                limits::LAYERS,
            )?
            .unwrap_or(layers);
        spec.norm = Norm::RmsNormScaledInput;
        spec.norm_bias = false;
        (spec.qkv_bias, spec.out_bias, spec.mlp_bias) = (false, false, false);
        let proj = self.str_or(&["feed_forward_proj"], "relu");
        spec.gated_mlp = proj.starts_with("gated-");
        // `T5Config` takes the activation from `feed_forward_proj` (any `dense_act_fn`
        // in the file is overwritten) and, for compatibility, runs "gated-gelu" with
        // `gelu_new` (T5 v1.1, FLAN-T5): the tanh approximation in Python ops.
        spec.activation = if proj == "gated-gelu" {
            Activation::GeluTanhPython
        } else {
            self.activation(&["feed_forward_proj"], "relu")?
        };
        spec.relative_attention_buckets = self
            .optional_u64(
                "relative_attention_num_buckets",
                &["relative_attention_num_buckets"],
                limits::VOCAB,
            )?
            .unwrap_or(32);
        // transformers 5.x keeps T5's attention softmax in the activation dtype (measured).
        spec.softmax_fp32 = false;
        let dropout = self.f64_or(&["dropout_rate"], 0.1);
        (
            spec.attention_dropout,
            spec.hidden_dropout,
            spec.activation_dropout,
            spec.embedding_dropout,
        ) = (dropout, dropout, dropout, dropout);
        spec.head = Head::Seq2SeqLm;
        // A T5 v1.1 / FLAN-T5 config says `tie_word_embeddings: false`: its checkpoint
        // stores its own LM head, which `from_pretrained` keeps untied (transformers
        // 5.x's T5Config forces the flag on, but loading finds both weights present and
        // different), and its decoder output is not rescaled.
        spec.rescaled_output = spec.tied_embeddings;
        Ok(())
    }

    /// The text tower of CLIP or SigLIP.
    fn text_tower(&self, spec: &mut TransformerSpec, positions: Option<u64>) -> Result<()> {
        let mt = self.model_type.as_str();
        // The text tower of a dual encoder: pre-norm blocks over learned positions
        // (CLIP's attention is causal, SigLIP's is not; neither caches keys), a final
        // LayerNorm, and the pooled token (CLIP's end-of-text, SigLIP's last) that the
        // dual encoder projects.
        let clip = mt == "clip_text_model";
        spec.learned_positions = self.need_positions(positions)?;
        self.tower_blocks(spec, clip)?;
        spec.tied_embeddings = false;
        spec.head = Head::None;
        Ok(())
    }

    /// What both towers of CLIP (`clip`) or SigLIP share: the MLP's activation (QuickGELU or
    /// tanh GELU), an fp32 softmax, attention dropout.
    fn tower_blocks(&self, spec: &mut TransformerSpec, clip: bool) -> Result<()> {
        spec.activation = self.activation(
            &["hidden_act"],
            if clip {
                "quick_gelu"
            } else {
                "gelu_pytorch_tanh"
            },
        )?;
        spec.softmax_fp32 = true;
        spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
        Ok(())
    }

    /// The vision tower of CLIP or SigLIP: patches, and SigLIP's attention-pool head.
    fn vision_tower(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        let clip = mt == "clip_vision_model";
        spec.patches = Some(Patches {
            patch: self.required_u64("patch_size", &["patch_size"], limits::POSITIONS)?,
            channels: self
                .optional_u64("num_channels", &["num_channels"], limits::WIDTH)?
                .unwrap_or(3),
            image_size: self.required_u64("image_size", &["image_size"], limits::POSITIONS)?,
            class_token: clip,
            bias: !clip,
        });
        self.tower_blocks(spec, clip)?;
        // CLIP: LayerNorm before the blocks (`pre_layrnorm`); both: `post_layernorm`.
        spec.embedding_norm = clip;
        spec.head = if !clip && self.bool_or(&["vision_use_head"], true) {
            Head::AttentionPool
        } else {
            Head::None
        };
        Ok(())
    }

    /// ViT: patches with a class token, a pooler or image-classification head.
    fn vit(&self, spec: &mut TransformerSpec) -> Result<()> {
        spec.patches = Some(Patches {
            patch: self
                .optional_u64("patch_size", &["patch_size"], limits::POSITIONS)?
                .unwrap_or(16),
            channels: self
                .optional_u64("num_channels", &["num_channels"], limits::WIDTH)?
                .unwrap_or(3),
            image_size: self
                .optional_u64("image_size", &["image_size"], limits::POSITIONS)?
                .unwrap_or(224),
            class_token: true,
            bias: true,
        });
        spec.activation = self.activation(&["hidden_act"], "gelu")?;
        spec.qkv_bias = self.bool_or(&["qkv_bias"], true);
        spec.softmax_fp32 = true;
        spec.attention_dropout = self.f64_or(&["attention_probs_dropout_prob"], 0.0);
        spec.hidden_dropout = self.f64_or(&["hidden_dropout_prob"], 0.0);
        spec.embedding_dropout = spec.hidden_dropout;
        spec.head = if self.architecture_name() == "ViTModel" {
            Head::Pooler
        } else {
            Head::ImageClassification {
                classes: self.labels(2)?,
            }
        };
        Ok(())
    }

    /// Multi-head latent attention of a DeepSeek-V2/V3 config; None for other families.
    fn latent_attention(&self) -> Result<Option<LatentAttention>> {
        if !matches!(self.model_type.as_str(), "deepseek_v2" | "deepseek_v3") {
            return Ok(None);
        }
        let width = |field: &'static str| self.required_u64(field, &[field], limits::WIDTH);
        Ok(Some(LatentAttention {
            query_rank: self
                .optional_u64("q_lora_rank", &["q_lora_rank"], limits::WIDTH)?
                .unwrap_or(0),
            kv_rank: width("kv_lora_rank")?,
            nope_dim: width("qk_nope_head_dim")?,
            rope_dim: width("qk_rope_head_dim")?,
            value_dim: width("v_head_dim")?,
        }))
    }

    /// What the families after Llama add to its block: Qwen3's and Gemma 3's query/key norms,
    /// Gemma 2/3's four norms per block, sliding windows and soft-capping, Phi-3's fused
    /// projections, the mixtures of experts of Qwen3-MoE and DeepSeek.
    fn newer_decoder(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        spec.qk_norm = matches!(mt, "qwen3" | "qwen3_moe" | "gemma3_text");
        if matches!(mt, "gemma" | "gemma2" | "gemma3_text") {
            spec.norm = Norm::RmsNormOffset;
        }
        if matches!(mt, "gemma2" | "gemma3_text") {
            self.gemma_attention(spec)?;
        }
        if mt == "phi3" {
            // One qkv_proj and one gate_up_proj, no biases; dropouts by Phi's names.
            spec.fused_qkv = true;
            spec.fused_gate_up = true;
            // Its rotary concatenates the rotated and passed parts (`torch.cat`, even when
            // nothing passes): queries contiguous per head.
            spec.head_layout_queries = true;
            spec.hidden_dropout = self.f64_or(&["resid_pdrop"], 0.0);
            spec.embedding_dropout = self.f64_or(&["embd_pdrop"], 0.0);
        }
        self.decoder_experts(spec)?;
        check_routed_experts(spec, format!("the {} experts", spec.experts))?;
        Ok(())
    }

    /// Gemma 2 and 3: sandwich norms, sliding-window layers (every `full_every`-th attends to
    /// all keys), soft-capped scores and logits; Gemma 2 runs only eager attention.
    fn gemma_attention(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        spec.sandwich_norms = true;
        let default_every = if mt == "gemma2" { 2 } else { 6 };
        if let Some(window) =
            self.optional_u64("sliding_window", &["sliding_window"], limits::POSITIONS)?
        {
            let full_every = match self.find(&["layer_types"]).and_then(Value::as_array) {
                Some(types) => types
                    .iter()
                    .position(|t| t.as_str() == Some("full_attention"))
                    .map_or(0, |i| i as u64 + 1),
                None => self
                    .optional_u64(
                        "sliding_window_pattern",
                        &["sliding_window_pattern"],
                        limits::LAYERS,
                    )?
                    .unwrap_or(default_every),
            };
            spec.sliding = Some(SlidingWindow { window, full_every });
        }
        spec.attention_softcap = self.find(&["attn_logit_softcapping"]).is_some();
        spec.eager_only = mt == "gemma2";
        spec.logit_softcap = self.find(&["final_logit_softcapping"]).is_some();
        Ok(())
    }

    /// The experts of Qwen3-MoE (in every block) and DeepSeek-V2/V3 (after the dense blocks,
    /// with shared experts and an fp32 router).
    fn decoder_experts(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        let experts = |field: &'static str| self.optional_u64(field, &[field], limits::EXPERTS);
        match mt {
            "qwen3_moe" => {
                spec.experts = experts("num_experts")?.unwrap_or(1);
                spec.experts_per_token = experts("num_experts_per_tok")?.unwrap_or(1);
                spec.moe.dense_intermediate = self
                    .optional_u64("intermediate_size", &["intermediate_size"], limits::WIDTH)?
                    .unwrap_or(spec.intermediate);
                let step = self
                    .optional_u64(
                        "decoder_sparse_step",
                        &["decoder_sparse_step"],
                        limits::LAYERS,
                    )?
                    .unwrap_or(1);
                let dense_listed = self
                    .find(&["mlp_only_layers"])
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty());
                if step != 1 || dense_listed {
                    return Err(PlanError::InvalidValue {
                        name: "decoder_sparse_step / mlp_only_layers".into(),
                        value: format!("{step} / non-empty"),
                        reason: "the planner supports a mixture of experts in every block                                  (decoder_sparse_step 1, mlp_only_layers [])"
                            .into(),
                    });
                }
            }
            "deepseek_v2" | "deepseek_v3" => {
                spec.experts = experts("n_routed_experts")?.unwrap_or(1);
                spec.experts_per_token = experts("num_experts_per_tok")?.unwrap_or(1);
                let freq = experts("moe_layer_freq")?.unwrap_or(1);
                if freq != 1 {
                    return Err(PlanError::InvalidValue {
                        name: "moe_layer_freq".into(),
                        value: freq.to_string(),
                        reason: "the planner supports 1 (every block after the dense ones)".into(),
                    });
                }
                spec.moe = MoeLayout {
                    dense_layers: self
                        .optional_u64(
                            "first_k_dense_replace",
                            &["first_k_dense_replace"],
                            limits::LAYERS,
                        )?
                        .unwrap_or(0),
                    dense_intermediate: self.required_u64(
                        "intermediate_size",
                        &["intermediate_size"],
                        limits::WIDTH,
                    )?,
                    shared_intermediate: experts("n_shared_experts")?.unwrap_or(0)
                        * spec.intermediate,
                    fp32_router: true,
                };
                // attention_bias covers q_a, kv_a and o.
                spec.out_bias = spec.qkv_bias;
            }
            _ => {}
        }
        Ok(())
    }

    /// Whisper: an audio encoder (two convolutions over log-mel frames, sinusoidal positions
    /// stored as a table) and a text decoder with cross-attention; k has no bias.
    fn whisper(&self, spec: &mut TransformerSpec, positions: u64) -> Result<()> {
        spec.layers = self.required_u64("decoder_layers", &["decoder_layers"], limits::LAYERS)?;
        spec.encoder_layers =
            self.required_u64("encoder_layers", &["encoder_layers"], limits::LAYERS)?;
        for (encoder, decoder) in [
            ("encoder_attention_heads", "decoder_attention_heads"),
            ("encoder_ffn_dim", "decoder_ffn_dim"),
        ] {
            let (e, d) = (
                self.optional_u64(encoder, &[encoder], limits::WIDTH)?,
                self.optional_u64(decoder, &[decoder], limits::WIDTH)?,
            );
            if let (Some(e), Some(d)) = (e, d) {
                if e != d {
                    return Err(PlanError::InvalidValue {
                        name: encoder.into(),
                        value: e.to_string(),
                        reason: format!(
                            "must equal {decoder} = {d}: the planner gives both stacks one width"
                        ),
                    });
                }
            }
        }
        spec.learned_positions = positions;
        spec.key_bias = false;
        spec.head_layout_queries = true;
        spec.activation = self.activation(&["activation_function"], "gelu")?;
        let dropout = self.f64_or(&["dropout"], 0.0);
        spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
        spec.activation_dropout = self.f64_or(&["activation_dropout"], 0.0);
        (spec.hidden_dropout, spec.embedding_dropout) = (dropout, dropout);
        spec.head = Head::Seq2SeqLm;
        spec.audio = Some(AudioStem {
            mel_bins: self
                .optional_u64("num_mel_bins", &["num_mel_bins"], limits::WIDTH)?
                .unwrap_or(80),
            frames: self
                .optional_u64(
                    "max_source_positions",
                    &["max_source_positions"],
                    limits::POSITIONS,
                )?
                .unwrap_or(1500),
        });
        Ok(())
    }

    /// Tower layers up to the deepest `vision_feature_layer` (an index into the tower's hidden
    /// states: 0 is the patch embeddings, -1 the last layer; default -2; a list concatenates
    /// several) out of `layers`.
    fn feature_layers(&self, layers: u64) -> Result<u64> {
        let invalid = |value: &Value| PlanError::InvalidValue {
            name: "vision_feature_layer".into(),
            value: value.to_string(),
            reason: format!(
                "must be an index into the vision tower's {} hidden states ({} to {layers}), \
                 or a list of them",
                layers + 1,
                -(layers as i64 + 1)
            ),
        };
        let index = |value: &Value| {
            let n = value.as_i64().ok_or_else(|| invalid(value))?;
            let from_end = layers as i64 + 1 + n;
            match n {
                0.. if n <= layers as i64 => Ok(n as u64),
                ..0 if from_end >= 0 => Ok(from_end as u64),
                _ => Err(invalid(value)),
            }
        };
        match self.find(&["vision_feature_layer"]) {
            None => Ok(layers.saturating_sub(1)),
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(index)
                .try_fold(0, |deepest, n| Ok(deepest.max(n?))),
            Some(value) => index(value),
        }
    }

    /// A CLIP or SigLIP dual encoder (`CLIPModel`, `SiglipModel`): the text tower
    /// (`text_config`) with the vision tower (`vision_config`) beside it, each tower's size
    /// defaults filled in as transformers does.
    fn dual_encoder(&self, name: &str) -> Result<ModelSpec> {
        let clip = self.model_type == "clip";
        let mt = &self.model_type;
        // Configs written before transformers 4.22 carry the towers as `text_config_dict` /
        // `vision_config_dict` (with `text_config: null`); a tower left out takes its defaults.
        let tower_config = |key: &'static str, kind: &str| {
            let given = [key, &format!("{key}_dict")]
                .into_iter()
                .find_map(|k| self.json.get(k).filter(|v| v.is_object()).cloned());
            let mut sub = given.unwrap_or_else(|| Value::Object(Default::default()));
            let tower_type = format!("{mt}_{kind}_model");
            if let Some(object) = sub.as_object_mut() {
                let declared = object.get("model_type").and_then(Value::as_str);
                if declared.is_some_and(|t| t != tower_type) {
                    return Err(PlanError::InvalidValue {
                        name: format!("{key}.model_type"),
                        value: declared.unwrap_or_default().to_string(),
                        reason: format!("a {mt} model's {key} must describe a {tower_type}"),
                    });
                }
                object.insert("model_type".into(), Value::from(tower_type));
            }
            Ok(sub)
        };
        let text_config = tower_config("text_config", "text")?;
        let text = spec_from_json(name, &text_config)?;
        let vision = spec_from_json(name, &tower_config("vision_config", "vision")?)?;
        let torch_dtype = self
            .torch_dtype()
            .or(text.torch_dtype)
            .or(vision.torch_dtype);
        let mut text = transformer_of(text, "text_config", "a text transformer")?;
        let tower = transformer_of(vision, "vision_config", "a vision transformer")?;
        let (embed_dim, joint_params, loss) = if clip {
            // Two bias-free projections into the shared space and the logit scale.
            let dim = self
                .optional_u64("projection_dim", &["projection_dim"], limits::WIDTH)?
                .unwrap_or(CLIP_PROJECTION_DIM);
            let params = (text.hidden + tower.hidden) * dim + 1;
            (dim, params, ContrastiveLoss::Softmax)
        } else {
            // The text tower's head (a linear with bias to `projection_size`, the text width by
            // default) maps into the vision tower's pooled space; the logit scale and bias.
            let width = ConfigFields {
                json: &text_config,
                model_type: "siglip_text_model".into(),
            }
            .optional_u64("projection_size", &["projection_size"], limits::WIDTH)?
            .unwrap_or(text.hidden);
            (
                width,
                text.hidden * width + width + 2,
                ContrastiveLoss::Sigmoid,
            )
        };
        text.dual = Some(Box::new(DualEncoder {
            tower,
            joint_params,
            embed_dim,
            loss,
        }));
        Ok(ModelSpec {
            name: name.to_string(),
            arch: Architecture::Transformer(Box::new(text)),
            torch_dtype,
            quantization: None,
        })
    }

    /// A vision-language model: a language model (`text_config`, the family's defaults where
    /// left out: Llama's for LLaVA, Gemma 3's), a vision tower (`vision_config`) and the
    /// family's projector.
    fn vision_language(&self, name: &str, family: VisionLanguage) -> Result<ModelSpec> {
        let (text_type, text_defaults, tower_type) = match family {
            VisionLanguage::Llava => ("llama", LLAMA_DEFAULTS, "clip_vision_model"),
            VisionLanguage::Gemma3 => ("gemma3_text", GEMMA3_TEXT_DEFAULTS, "siglip_vision_model"),
        };
        let mut text = sub_config(self.json, "text_config", text_type)?;
        if let Some(object) = text.as_object_mut() {
            for (key, value) in text_defaults {
                object.entry(*key).or_insert_with(|| Value::from(*value));
            }
        }
        let language = spec_from_json(name, &text)?;
        let vision = spec_from_json(name, &sub_config(self.json, "vision_config", tower_type)?)?;
        let mut lm = transformer_of(language.clone(), "text_config", "a language model")?;
        let tower = transformer_of(vision, "vision_config", "a vision transformer")?;
        let patches = tower.patches.ok_or_else(|| PlanError::InvalidValue {
            name: "vision_config".into(),
            value: tower.model_type.clone(),
            reason: "must describe a vision transformer (clip_vision_model, siglip_vision_model)"
                .into(),
        })?;
        let (v, t) = (tower.hidden, lm.hidden);
        let per_side = patches.image_size / patches.patch;
        let (projector, image_tokens, feature_layers) = match family {
            VisionLanguage::Llava => {
                let bias = self.bool_or(&["multimodal_projector_bias"], true);
                let tokens = self
                    .optional_u64("image_seq_length", &["image_seq_length"], limits::POSITIONS)?
                    .unwrap_or(per_side.pow(2));
                let projector = v * t + t * t + if bias { 2 * t } else { 0 };
                (projector, tokens, self.feature_layers(tower.layers)?)
            }
            VisionLanguage::Gemma3 => {
                let tokens = self
                    .optional_u64(
                        "mm_tokens_per_image",
                        &["mm_tokens_per_image"],
                        limits::POSITIONS,
                    )?
                    .unwrap_or(256);
                let side = (tokens as f64).sqrt() as u64;
                if side * side != tokens || side == 0 || per_side % side != 0 {
                    return Err(PlanError::InvalidValue {
                        name: "mm_tokens_per_image".into(),
                        value: tokens.to_string(),
                        reason: format!(
                            "must be the square of a divisor of the {per_side} patches per \
                             side: the projector average-pools the patch grid to it"
                        ),
                    });
                }
                // The projection matrix and the RMSNorm's weight; the features are the tower's
                // last hidden state, after its final norm (every layer).
                (v * t + v, tokens, tower.layers)
            }
        };
        lm.vision = Some(Box::new(VisionAdapter {
            tower,
            projector,
            image_tokens,
            feature_layers,
        }));
        Ok(ModelSpec {
            name: name.to_string(),
            arch: Architecture::Transformer(Box::new(lm)),
            torch_dtype: self.torch_dtype().or(language.torch_dtype),
            quantization: None,
        })
    }
}
