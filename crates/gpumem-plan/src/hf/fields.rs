//! Reading a config's fields: spellings, bounds and defaults, the sizes every transformer
//! config gives, and the transformer every family starts from.

use crate::error::{PlanError, Result};
use crate::limits::{self, Bound};
use crate::model::{
    Activation, Head, HeldHidden, LatentAttention, MoeLayout, Norm, ResnetSpec, TransformerSpec,
};
use crate::workload::{choices, Dtype};
use serde_json::Value;

use super::{unsupported, VISION_TYPES};

/// The sizes every transformer config gives (or has defaults for).
pub(super) struct TransformerSizes {
    /// Hidden width.
    pub(super) hidden: u64,
    /// Blocks (a decoder's, before a family changes them).
    pub(super) layers: u64,
    /// Query heads.
    pub(super) heads: u64,
    /// Key and value heads.
    pub(super) kv_heads: u64,
    /// Width of one head.
    pub(super) head_dim: u64,
    /// MLP (or expert) width.
    pub(super) intermediate: u64,
    /// Vocabulary (none for a vision tower).
    pub(super) vocab: u64,
    /// Multi-head latent attention (DeepSeek-V2/V3).
    pub(super) latent: Option<LatentAttention>,
    /// `max_position_embeddings` and its spellings, if given.
    pub(super) positions: Option<u64>,
    /// A vision tower (no vocabulary, not a decoder).
    pub(super) vision: bool,
}

/// What a config's `torch_dtype` may be.
const TORCH_DTYPES: &str =
    "must be float32, bfloat16, float16 or auto (the checkpoint's weight dtype)";

/// What a config's `architectures` must be.
const CLASS_NAMES: &str = "must be a list of class names (\"LlamaForCausalLM\")";

/// The error for the config field `key`, whose `value` is not what `reason` says it must be.
pub(super) fn invalid(key: &str, value: &Value, reason: &str) -> PlanError {
    PlanError::InvalidValue {
        name: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

pub(super) struct ConfigFields<'a> {
    pub(super) json: &'a Value,
    pub(super) model_type: String,
}

impl ConfigFields<'_> {
    /// The first of `spellings` the config gives a value (not null) under, with that value.
    pub(super) fn find_key<'k>(&self, spellings: &[&'k str]) -> Option<(&'k str, &Value)> {
        spellings.iter().find_map(|key| {
            self.json
                .get(*key)
                .filter(|v| !v.is_null())
                .map(|v| (*key, v))
        })
    }

    pub(super) fn find(&self, spellings: &[&str]) -> Option<&Value> {
        self.find_key(spellings).map(|(_, value)| value)
    }

    /// A positive integer within `bound`, under any of its spellings; None when absent.
    pub(super) fn optional_u64(
        &self,
        field: &'static str,
        spellings: &[&'static str],
        bound: Bound,
    ) -> Result<Option<u64>> {
        match self.find(spellings) {
            None => Ok(None),
            Some(value) => match value.as_u64() {
                Some(n) => bound.check(field, n).map(Some),
                None => Err(invalid(field, value, "must be a positive integer")),
            },
        }
    }

    /// Like [`ConfigFields::optional_u64`], but absence is a [`PlanError::MissingField`].
    pub(super) fn required_u64(
        &self,
        field: &'static str,
        spellings: &[&'static str],
        bound: Bound,
    ) -> Result<u64> {
        self.optional_u64(field, spellings, bound)?
            .ok_or_else(|| self.missing(field, spellings))
    }

    /// A count that may be zero (dense layers before the experts), at most `bound`'s maximum;
    /// None when absent.
    pub(super) fn optional_count(&self, field: &'static str, bound: Bound) -> Result<Option<u64>> {
        match self.find(&[field]).map(|value| (value, value.as_u64())) {
            None => Ok(None),
            Some((_, Some(0))) => Ok(Some(0)),
            Some((_, Some(n))) => bound.check(field, n).map(Some),
            Some((value, None)) => Err(invalid(field, value, "must be a non-negative integer")),
        }
    }

    /// The error for a field the config must give.
    pub(super) fn missing(&self, field: &'static str, spellings: &[&'static str]) -> PlanError {
        PlanError::MissingField {
            model_type: self.model_type.clone(),
            field,
            spellings: spellings.to_vec(),
        }
    }

    /// A fraction from 0 to 1 (a dropout probability, the rotary share of a head), `default`
    /// when absent.
    pub(super) fn fraction_or(&self, spellings: &[&str], default: f64) -> Result<f64> {
        match self.find_key(spellings) {
            None => Ok(default),
            Some((key, value)) => value
                .as_f64()
                .filter(|f| (0.0..=1.0).contains(f))
                .ok_or_else(|| invalid(key, value, "must be a number from 0 to 1")),
        }
    }

    /// A flag, `default` when absent.
    pub(super) fn bool_or(&self, spellings: &[&str], default: bool) -> Result<bool> {
        match self.find_key(spellings) {
            None => Ok(default),
            Some((key, value)) => value
                .as_bool()
                .ok_or_else(|| invalid(key, value, "must be true or false")),
        }
    }

    /// The string under `key`, which must be one of `accepted`; `default` when absent.
    pub(super) fn choice<'b>(
        &'b self,
        key: &str,
        default: &'b str,
        accepted: &[&str],
    ) -> Result<&'b str> {
        match self.find_key(&[key]) {
            None => Ok(default),
            Some((_, value)) => value
                .as_str()
                .filter(|name| accepted.contains(name))
                .ok_or_else(|| invalid(key, value, &format!("supported: {}", accepted.join(", ")))),
        }
    }

    /// Whether a soft-capping value (`attn_logit_softcapping`, `final_logit_softcapping`) is
    /// set: a positive number, or null for none.
    pub(super) fn softcap(&self, key: &str) -> Result<bool> {
        match self.find_key(&[key]) {
            None => Ok(false),
            Some((_, value)) if value.as_f64().is_some_and(|cap| cap > 0.0) => Ok(true),
            Some((_, value)) => Err(invalid(key, value, "must be a positive number, or null")),
        }
    }

    /// Classifier outputs: `num_labels`, else the size of `id2label`, else `default`.
    pub(super) fn labels(&self, default: u64) -> Result<u64> {
        let labels = match self.optional_u64("num_labels", &["num_labels"], limits::VOCAB)? {
            Some(n) => n,
            None => match self.find_key(&["id2label"]) {
                None => default,
                Some((_, Value::Object(labels))) => labels.len() as u64,
                Some((key, value)) => {
                    return Err(invalid(key, value, "must be an object of label names"))
                }
            },
        };
        limits::VOCAB.check("num_labels", labels)
    }

    /// The config's `torch_dtype` (newer transformers write `dtype`): None when absent or
    /// `"auto"`.
    pub(super) fn torch_dtype(&self) -> Result<Option<Dtype>> {
        let Some((key, value)) = self.find_key(&["torch_dtype", "dtype"]) else {
            return Ok(None);
        };
        match value.as_str() {
            Some("auto") => Ok(None),
            Some(name) => match choices::parse("dtype", name, choices::DTYPES) {
                Ok(dtype) => Ok(Some(dtype)),
                Err(_) => Err(invalid(key, value, TORCH_DTYPES)),
            },
            None => Err(invalid(key, value, TORCH_DTYPES)),
        }
    }

    /// The class the config was saved from (its first `architectures` entry); empty when it
    /// names none.
    pub(super) fn architecture_name(&self) -> Result<&str> {
        match self.find_key(&["architectures"]) {
            None => Ok(""),
            Some((key, Value::Array(classes))) => match classes.first() {
                None => Ok(""),
                Some(Value::String(class)) => Ok(class),
                Some(_) => Err(invalid(key, &classes[0], CLASS_NAMES)),
            },
            Some((key, value)) => Err(invalid(key, value, CLASS_NAMES)),
        }
    }

    pub(super) fn activation(&self, spellings: &[&str], default: &str) -> Result<Activation> {
        let found = self.find_key(spellings);
        let name = match found {
            None => Some(default),
            Some((_, value)) => value.as_str(),
        };
        // T5 spells it "gated-gelu" / "relu" in feed_forward_proj.
        match name.map(|name| name.trim_start_matches("gated-")) {
            Some("gelu") => Ok(Activation::Gelu),
            Some("gelu_new" | "gelu_fast") => Ok(Activation::GeluTanhPython),
            Some("quick_gelu") => Ok(Activation::QuickGelu),
            Some("gelu_pytorch_tanh") => Ok(Activation::GeluTanh),
            Some("relu") => Ok(Activation::Relu),
            Some("silu" | "swish") => Ok(Activation::Silu),
            other => Err(PlanError::InvalidValue {
                name: found.map_or(spellings[0], |(key, _)| key).into(),
                // A name as given; anything else as its JSON.
                value: other.map_or_else(
                    || found.map(|(_, v)| v.to_string()).unwrap_or_default(),
                    str::to_string,
                ),
                reason:
                    "supported: gelu, gelu_new, gelu_fast, gelu_pytorch_tanh, quick_gelu, relu, silu"
                        .into(),
            }),
        }
    }

    pub(super) fn resnet(&self) -> Result<ResnetSpec> {
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
        let Some(depths) = self.find(&["depths"]) else {
            return Err(self.missing("depth", &["depth", "depths (4 stages)"]));
        };
        let blocks = depths
            .as_array()
            .and_then(|stages| {
                stages
                    .iter()
                    .map(Value::as_u64)
                    .collect::<Option<Vec<u64>>>()
            })
            .and_then(|stages| <[u64; 4]>::try_from(stages).ok())
            .ok_or_else(|| invalid("depths", depths, "must list the blocks of 4 stages"))?;
        for stage in blocks {
            limits::LAYERS.check("depths", stage)?;
        }
        limits::LAYERS.check("depths (all stages)", blocks.iter().sum())?;
        let bottleneck =
            self.choice("layer_type", "bottleneck", &["basic", "bottleneck"])? == "bottleneck";
        Ok(ResnetSpec {
            blocks,
            bottleneck,
            num_classes,
        })
    }

    /// A transformer from its config: the sizes every family has, the defaults, the family's
    /// own settings (one function per `model_type`), then what follows from them all.
    pub(super) fn transformer(&self) -> Result<TransformerSpec> {
        let mt = self.model_type.as_str();
        let sizes = self.transformer_sizes()?;
        let positions = sizes.positions;
        let mut spec = self.default_transformer(&sizes)?;
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
        let arch = self.architecture_name()?;
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
    pub(super) fn need_positions(&self, positions: Option<u64>) -> Result<u64> {
        positions.ok_or_else(|| PlanError::MissingField {
            model_type: self.model_type.clone(),
            field: "max_position_embeddings",
            spellings: vec!["max_position_embeddings", "n_positions"],
        })
    }

    /// The sizes every transformer config gives (or has defaults for), checked.
    pub(super) fn transformer_sizes(&self) -> Result<TransformerSizes> {
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
    pub(super) fn attention_widths(
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
        if mt != "t5" && !hidden.is_multiple_of(heads) && self.find(&["head_dim"]).is_none() {
            return Err(PlanError::InvalidValue {
                name: "hidden_size".into(),
                value: hidden.to_string(),
                reason: format!("must be divisible by num_attention_heads = {heads}"),
            });
        }
        let head_dim = match latent {
            Some(l) => l.nope_dim + l.rope_dim,
            None => self
                .optional_u64("head_dim", &["head_dim", "d_kv"], limits::WIDTH)?
                .unwrap_or(hidden / heads),
        };
        limits::WIDTH.check("head_dim", head_dim)?;
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
    pub(super) fn default_transformer(&self, sizes: &TransformerSizes) -> Result<TransformerSpec> {
        let mt = self.model_type.as_str();
        let vision = sizes.vision;
        Ok(TransformerSpec {
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
            tied_embeddings: self.bool_or(&["tie_word_embeddings"], true)?,
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
            use_cache: self.bool_or(&["use_cache"], true)?,
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
            sdpa_only: false,
            fused_gate_up: false,
            logit_softcap: false,
            latent: sizes.latent,
            moe: MoeLayout::default(),
            rescaled_output: false,
            audio: None,
            head_layout_queries: false,
            vision: None,
            dual: None,
        })
    }
}
