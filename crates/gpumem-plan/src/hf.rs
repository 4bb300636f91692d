//! Reading Hugging Face `config.json` files (and a small ResNet JSON) into [`ModelSpec`].

use crate::error::{PlanError, Result};
use crate::limits::{self, Bound};
use crate::model::{
    Activation, Architecture, Head, HeldHidden, ModelSpec, Norm, Patches, ResnetSpec,
    TransformerSpec,
};
use crate::names::nearest;
use crate::workload::{choices, Dtype};
use serde_json::Value;

/// `model_type` values the planner understands.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "gpt2", "gpt_neox", "opt", "llama", "mistral", "qwen2", "mixtral", "gemma", "phi", "bert",
    "roberta", "t5", "vit", "resnet",
];

/// Parses a config.json text.
pub fn parse_config(name: &str, text: &str) -> Result<ModelSpec> {
    let json: Value = serde_json::from_str(text).map_err(|e| PlanError::Unreadable {
        path: name.to_string(),
        reason: format!("not JSON: {e}"),
    })?;
    spec_from_json(name, &json)
}

/// Builds a model from an already-parsed config object.
pub fn spec_from_json(name: &str, json: &Value) -> Result<ModelSpec> {
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
    let arch = match model_type.as_str() {
        "resnet" => Architecture::Resnet(fields.resnet()?),
        _ => Architecture::Transformer(Box::new(fields.transformer()?)),
    };
    Ok(ModelSpec {
        name: name.to_string(),
        arch,
        torch_dtype: fields.torch_dtype(),
    })
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
            "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            "relu" => Ok(Activation::Relu),
            "silu" | "swish" => Ok(Activation::Silu),
            other => Err(PlanError::InvalidValue {
                name: "hidden_act".into(),
                value: other.into(),
                reason: "supported: gelu, gelu_new, gelu_fast, gelu_pytorch_tanh, relu, silu"
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

    fn transformer(&self) -> Result<TransformerSpec> {
        let mt = self.model_type.as_str();
        let hidden = self.required_u64(
            "hidden_size",
            &["hidden_size", "n_embd", "d_model"],
            limits::WIDTH,
        )?;
        let layers = self.required_u64(
            "num_hidden_layers",
            &["num_hidden_layers", "n_layer", "num_layers"],
            limits::LAYERS,
        )?;
        let heads = self.required_u64(
            "num_attention_heads",
            &["num_attention_heads", "n_head", "num_heads"],
            limits::WIDTH,
        )?;
        let vocab = if mt == "vit" {
            0
        } else {
            self.required_u64("vocab_size", &["vocab_size"], limits::VOCAB)?
        };
        let kv_heads = self
            .optional_u64(
                "num_key_value_heads",
                &["num_key_value_heads"],
                limits::WIDTH,
            )?
            .unwrap_or(heads);
        let head_dim = self
            .optional_u64("head_dim", &["head_dim", "d_kv"], limits::WIDTH)?
            .unwrap_or(hidden / heads);
        limits::WIDTH.check("head_dim", head_dim)?;
        if mt != "t5" && hidden % heads != 0 && self.find(&["head_dim"]).is_none() {
            return Err(PlanError::InvalidValue {
                name: "hidden_size".into(),
                value: hidden.to_string(),
                reason: format!("must be divisible by num_attention_heads = {heads}"),
            });
        }
        if heads % kv_heads != 0 {
            return Err(PlanError::InvalidValue {
                name: "num_key_value_heads".into(),
                value: kv_heads.to_string(),
                reason: format!("must divide num_attention_heads = {heads}"),
            });
        }
        let intermediate = self
            .optional_u64(
                "intermediate_size",
                &["intermediate_size", "n_inner", "ffn_dim", "d_ff"],
                limits::WIDTH,
            )?
            .unwrap_or(4 * hidden);
        let positions = self.optional_u64(
            "max_position_embeddings",
            &["max_position_embeddings", "n_positions"],
            limits::POSITIONS,
        )?;
        let mut spec = TransformerSpec {
            model_type: mt.to_string(),
            hidden,
            layers,
            encoder_layers: 0,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
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
            decoder: !matches!(mt, "bert" | "roberta" | "vit"),
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
        };
        let need_positions = || {
            positions.ok_or_else(|| PlanError::MissingField {
                model_type: mt.to_string(),
                field: "max_position_embeddings",
                spellings: vec!["max_position_embeddings", "n_positions"],
            })
        };
        match mt {
            "gpt2" => {
                spec.learned_positions = need_positions()?;
                spec.fused_qkv = true;
                spec.activation = self.activation(&["activation_function"], "gelu_new")?;
                spec.attention_dropout = self.f64_or(&["attn_pdrop"], 0.1);
                spec.hidden_dropout = self.f64_or(&["resid_pdrop"], 0.1);
                spec.embedding_dropout = self.f64_or(&["embd_pdrop"], 0.1);
                // The model holds `position_embeds` (batch 1) too; the block keeps
                // `attn_output` named while its MLP runs.
                spec.held.positions = true;
                spec.held.at_mlp = 4;
            }
            "gpt_neox" => {
                spec.fused_qkv = true;
                spec.parallel_residual = self.bool_or(&["use_parallel_residual"], true);
                spec.rotary_fraction = self.f64_or(&["rotary_pct", "partial_rotary_factor"], 0.25);
                spec.activation = self.activation(&["hidden_act"], "gelu")?;
                spec.qkv_bias = self.bool_or(&["attention_bias"], true);
                spec.out_bias = spec.qkv_bias;
                spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], false);
                spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
                spec.hidden_dropout = self.f64_or(&["hidden_dropout"], 0.0);
                spec.softmax_fp32 = true;
            }
            "opt" => {
                // OPT's learned positions carry an offset of 2 rows.
                spec.learned_positions = need_positions()? + 2;
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
            }
            "llama" | "mistral" | "qwen2" | "mixtral" | "gemma" => {
                spec.norm = Norm::RmsNorm;
                spec.norm_bias = false;
                spec.gated_mlp = true;
                spec.activation = self.activation(&["hidden_activation", "hidden_act"], "silu")?;
                spec.qkv_bias = self.bool_or(&["attention_bias"], mt == "qwen2");
                spec.out_bias = mt != "qwen2" && spec.qkv_bias;
                spec.mlp_bias = self.bool_or(&["mlp_bias"], false);
                spec.rotary_fraction = self.f64_or(&["partial_rotary_factor"], 1.0);
                spec.softmax_fp32 = true;
                spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], mt == "gemma");
                spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
                if mt == "mixtral" {
                    spec.experts = self.required_u64(
                        "num_local_experts",
                        &["num_local_experts"],
                        limits::EXPERTS,
                    )?;
                    spec.experts_per_token = self
                        .optional_u64(
                            "num_experts_per_tok",
                            &["num_experts_per_tok"],
                            limits::EXPERTS,
                        )?
                        .unwrap_or(2);
                    if spec.experts_per_token > spec.experts {
                        return Err(PlanError::InvalidValue {
                            name: "num_experts_per_tok".into(),
                            value: spec.experts_per_token.to_string(),
                            reason: format!("must be at most num_local_experts = {}", spec.experts),
                        });
                    }
                }
            }
            "phi" => {
                spec.parallel_residual = true;
                spec.shared_block_norm = true;
                spec.rotary_fraction = self.f64_or(&["partial_rotary_factor"], 0.5);
                spec.activation = self.activation(&["hidden_act"], "gelu_new")?;
                spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], false);
                spec.lm_head_bias = true;
                spec.softmax_fp32 = true;
                spec.attention_dropout = self.f64_or(&["attention_dropout"], 0.0);
                spec.hidden_dropout = self.f64_or(&["resid_pdrop"], 0.0);
                spec.embedding_dropout = self.f64_or(&["embd_pdrop"], 0.0);
            }
            "bert" | "roberta" => {
                spec.learned_positions = need_positions()?;
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
            }
            "t5" => {
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
                spec.activation = self.activation(&["feed_forward_proj"], "relu")?;
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
            }
            "vit" => {
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
            }
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
            "t5" | "vit" => None,
            // RoBERTa's position ids start after the padding index: two rows are never reached.
            "roberta" => positions.map(|p| p.saturating_sub(2).max(1)),
            _ => positions,
        };
        limits::check_parameters(&spec)?;
        Ok(spec)
    }
}
