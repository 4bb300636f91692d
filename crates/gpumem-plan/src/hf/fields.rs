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

pub(super) struct ConfigFields<'a> {
    pub(super) json: &'a Value,
    pub(super) model_type: String,
}

impl ConfigFields<'_> {
    pub(super) fn find(&self, spellings: &[&str]) -> Option<&Value> {
        spellings
            .iter()
            .find_map(|key| self.json.get(*key).filter(|v| !v.is_null()))
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
                None => Err(PlanError::InvalidValue {
                    name: field.to_string(),
                    value: value.to_string(),
                    reason: "must be a positive integer".into(),
                }),
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
            .ok_or_else(|| PlanError::MissingField {
                model_type: self.model_type.clone(),
                field,
                spellings: spellings.to_vec(),
            })
    }

    pub(super) fn f64_or(&self, spellings: &[&str], default: f64) -> f64 {
        self.find(spellings)
            .and_then(Value::as_f64)
            .unwrap_or(default)
    }

    pub(super) fn bool_or(&self, spellings: &[&str], default: bool) -> bool {
        self.find(spellings)
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }

    pub(super) fn str_or<'b>(&'b self, spellings: &[&str], default: &'b str) -> &'b str {
        self.find(spellings)
            .and_then(Value::as_str)
            .unwrap_or(default)
    }

    /// Classifier outputs: `num_labels`, else the size of `id2label`, else `default`.
    pub(super) fn labels(&self, default: u64) -> Result<u64> {
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
    pub(super) fn torch_dtype(&self) -> Option<Dtype> {
        let name = self.find(&["torch_dtype", "dtype"])?.as_str()?;
        choices::parse("dtype", name, choices::DTYPES).ok()
    }

    pub(super) fn architecture_name(&self) -> &str {
        self.json
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    pub(super) fn activation(&self, spellings: &[&str], default: &str) -> Result<Activation> {
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
    pub(super) fn transformer(&self) -> Result<TransformerSpec> {
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
    pub(super) fn default_transformer(&self, sizes: &TransformerSizes) -> TransformerSpec {
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
        }
    }
}
