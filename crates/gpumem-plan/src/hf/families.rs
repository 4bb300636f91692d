//! One function per `model_type` family, each changing the default transformer of
//! [`ConfigFields::transformer`]; and the composite configs (dual encoders, vision-language).

use crate::error::{PlanError, Result};
use crate::limits;
use crate::model::{
    Activation, Architecture, AudioStem, ContrastiveLoss, DualEncoder, Head, LatentAttention,
    ModelSpec, MoeLayout, Norm, Patches, SlidingWindow, TransformerSpec, VisionAdapter,
};
use serde_json::Value;

use super::fields::{invalid, ConfigFields};
use super::{
    check_routed_experts, sub_config, sub_spec, transformer_of, VisionLanguage,
    CLIP_PROJECTION_DIM, GEMMA3_TEXT_DEFAULTS, LLAMA_DEFAULTS, TORCHVISION_VIT,
};

impl ConfigFields<'_> {
    /// GPT-2 and StarCoder (`gpt_bigcode`): learned positions, a fused qkv projection.
    pub(super) fn gpt2(&self, spec: &mut TransformerSpec, positions: Option<u64>) -> Result<()> {
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
            if self.bool_or(&["multi_query"], true)? {
                spec.kv_heads = 1;
            }
            spec.softmax_fp32 = self.bool_or(&["attention_softmax_in_fp32"], true)?;
        }
        spec.attention_dropout = self.fraction_or(&["attn_pdrop"], 0.1)?;
        spec.hidden_dropout = self.fraction_or(&["resid_pdrop"], 0.1)?;
        spec.embedding_dropout = self.fraction_or(&["embd_pdrop"], 0.1)?;
        // The model holds `position_embeds` (batch 1) too; the block keeps
        // `attn_output` named while its MLP runs.
        spec.held.positions = true;
        spec.held.at_mlp = 4;
        Ok(())
    }

    /// GPT-NeoX (Pythia): partial rotary, a parallel residual.
    pub(super) fn gpt_neox(&self, spec: &mut TransformerSpec) -> Result<()> {
        spec.fused_qkv = true;
        // The rotated queries are `torch.cat([rotated, passed], dim=-1)`: contiguous
        // per head.
        spec.head_layout_queries = true;
        spec.parallel_residual = self.bool_or(&["use_parallel_residual"], true)?;
        spec.rotary_fraction = self.fraction_or(&["rotary_pct", "partial_rotary_factor"], 0.25)?;
        spec.activation = self.activation(&["hidden_act"], "gelu")?;
        spec.qkv_bias = self.bool_or(&["attention_bias"], true)?;
        spec.out_bias = spec.qkv_bias;
        spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], false)?;
        spec.attention_dropout = self.fraction_or(&["attention_dropout"], 0.0)?;
        spec.hidden_dropout = self.fraction_or(&["hidden_dropout"], 0.0)?;
        spec.softmax_fp32 = true;
        Ok(())
    }

    /// OPT: learned positions with an offset, pre- or post-norm, an optional embedding projection.
    pub(super) fn opt(&self, spec: &mut TransformerSpec, positions: Option<u64>) -> Result<()> {
        let hidden = spec.hidden;
        // OPT's learned positions carry an offset of 2 rows.
        spec.learned_positions = self.need_positions(positions)? + 2;
        spec.activation = self.activation(&["activation_function"], "relu")?;
        let bias = self.bool_or(&["enable_bias"], true)?;
        (spec.qkv_bias, spec.out_bias, spec.mlp_bias) = (bias, bias, bias);
        let pre_norm = self.bool_or(&["do_layer_norm_before"], true)?;
        spec.post_norm = !pre_norm;
        spec.final_norm = pre_norm && !self.bool_or(&["_remove_final_layer_norm"], false)?;
        let projection = self
            .optional_u64(
                "word_embed_proj_dim",
                &["word_embed_proj_dim"],
                limits::WIDTH,
            )?
            .unwrap_or(hidden);
        spec.embed_projection = if projection == hidden { 0 } else { projection };
        spec.attention_dropout = self.fraction_or(&["attention_dropout"], 0.0)?;
        spec.hidden_dropout = self.fraction_or(&["dropout"], 0.1)?;
        spec.embedding_dropout = spec.hidden_dropout;
        spec.activation_dropout = self.fraction_or(&["activation_dropout"], 0.0)?;
        spec.softmax_fp32 = true;
        // The model holds `pos_embeds` (per token) too; the block's fc1 rebinds the norm
        // output, so its MLP runs beside the block input and the residual sum only.
        spec.held.embeddings = 2;
        spec.held.at_mlp = 2;
        Ok(())
    }

    /// The Llama-style decoders (Llama, Mistral, Qwen, Mixtral, Gemma, Phi-3, DeepSeek): RMSNorm, a
    /// gated MLP, rotary; Mixtral's experts.
    pub(super) fn llama_family(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        spec.norm = Norm::RmsNorm;
        spec.norm_bias = false;
        spec.gated_mlp = true;
        spec.activation = self.activation(&["hidden_activation", "hidden_act"], "silu")?;
        spec.qkv_bias = self.bool_or(&["attention_bias"], mt == "qwen2")?;
        spec.out_bias = mt != "qwen2" && spec.qkv_bias;
        spec.mlp_bias = self.bool_or(&["mlp_bias"], false)?;
        spec.rotary_fraction = self.fraction_or(&["partial_rotary_factor"], 1.0)?;
        spec.softmax_fp32 = true;
        let gemma = matches!(mt, "gemma" | "gemma2" | "gemma3_text");
        spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], gemma)?;
        spec.attention_dropout = self.fraction_or(&["attention_dropout"], 0.0)?;
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
    pub(super) fn phi(&self, spec: &mut TransformerSpec) -> Result<()> {
        spec.parallel_residual = true;
        // `torch.cat((query_rot, query_pass), dim=-1)`: queries contiguous per head.
        spec.head_layout_queries = true;
        spec.shared_block_norm = true;
        spec.rotary_fraction = self.fraction_or(&["partial_rotary_factor"], 0.5)?;
        spec.activation = self.activation(&["hidden_act"], "gelu_new")?;
        spec.tied_embeddings = self.bool_or(&["tie_word_embeddings"], false)?;
        spec.lm_head_bias = true;
        spec.softmax_fp32 = true;
        spec.attention_dropout = self.fraction_or(&["attention_dropout"], 0.0)?;
        spec.hidden_dropout = self.fraction_or(&["resid_pdrop"], 0.0)?;
        spec.embedding_dropout = self.fraction_or(&["embd_pdrop"], 0.0)?;
        Ok(())
    }

    /// BERT and RoBERTa: post-norm encoders with token types and a masked-LM, classification or
    /// pooler head.
    pub(super) fn bert(&self, spec: &mut TransformerSpec, positions: Option<u64>) -> Result<()> {
        spec.learned_positions = self.need_positions(positions)?;
        spec.token_types = self
            .optional_u64("type_vocab_size", &["type_vocab_size"], limits::VOCAB)?
            .unwrap_or(2);
        spec.post_norm = true;
        spec.embedding_norm = true;
        spec.final_norm = false;
        spec.activation = self.activation(&["hidden_act"], "gelu")?;
        spec.attention_dropout = self.fraction_or(&["attention_probs_dropout_prob"], 0.1)?;
        spec.hidden_dropout = self.fraction_or(&["hidden_dropout_prob"], 0.1)?;
        spec.embedding_dropout = spec.hidden_dropout;
        // Post-norm: q, k, v read the block input itself; the MLP reads the attention
        // output (its LayerNorm) beside the block input.
        spec.held.at_attention = 1;
        spec.held.at_mlp = 2;
        let arch = self.architecture_name()?;
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
    pub(super) fn t5(&self, spec: &mut TransformerSpec) -> Result<()> {
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
        let proj = self
            .find(&["feed_forward_proj"])
            .map_or(Some("relu"), Value::as_str);
        spec.gated_mlp = proj.is_some_and(|proj| proj.starts_with("gated-"));
        // `T5Config` takes the activation from `feed_forward_proj` (any `dense_act_fn`
        // in the file is overwritten) and, for compatibility, runs "gated-gelu" with
        // `gelu_new` (T5 v1.1, FLAN-T5): the tanh approximation in Python ops.
        spec.activation = if proj == Some("gated-gelu") {
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
        let dropout = self.fraction_or(&["dropout_rate"], 0.1)?;
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
    pub(super) fn text_tower(
        &self,
        spec: &mut TransformerSpec,
        positions: Option<u64>,
    ) -> Result<()> {
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
    pub(super) fn tower_blocks(&self, spec: &mut TransformerSpec, clip: bool) -> Result<()> {
        spec.activation = self.activation(
            &["hidden_act"],
            if clip {
                "quick_gelu"
            } else {
                "gelu_pytorch_tanh"
            },
        )?;
        spec.softmax_fp32 = true;
        spec.attention_dropout = self.fraction_or(&["attention_dropout"], 0.0)?;
        Ok(())
    }

    /// The vision tower of CLIP or SigLIP: patches, and SigLIP's attention-pool head.
    pub(super) fn vision_tower(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        let clip = mt == "clip_vision_model";
        spec.patches = Some(self.patches(
            self.required_u64("patch_size", &["patch_size"], limits::POSITIONS)?,
            self.required_u64("image_size", &["image_size"], limits::POSITIONS)?,
            clip,
            !clip,
        )?);
        self.tower_blocks(spec, clip)?;
        // CLIP: LayerNorm before the blocks (`pre_layrnorm`); both: `post_layernorm`.
        spec.embedding_norm = clip;
        spec.head = if !clip && self.bool_or(&["vision_use_head"], true)? {
            Head::AttentionPool
        } else {
            Head::None
        };
        Ok(())
    }

    /// The patch embedding of a vision transformer cutting `image_size` images into patches
    /// of side `patch` (`num_channels` colour channels, default 3): at least one patch per
    /// side.
    pub(super) fn patches(
        &self,
        patch: u64,
        image_size: u64,
        class_token: bool,
        bias: bool,
    ) -> Result<Patches> {
        if image_size < patch {
            return Err(PlanError::InvalidValue {
                name: "image_size".into(),
                value: image_size.to_string(),
                reason: format!(
                    "must be at least patch_size = {patch}: the image is cut into patches of \
                     that side"
                ),
            });
        }
        Ok(Patches {
            patch,
            channels: self
                .optional_u64("num_channels", &["num_channels"], limits::WIDTH)?
                .unwrap_or(3),
            image_size,
            class_token,
            bias,
        })
    }

    /// ViT: patches with a class token, a pooler or image-classification head.
    pub(super) fn vit(&self, spec: &mut TransformerSpec) -> Result<()> {
        let torchvision = self.architecture_name()? == TORCHVISION_VIT;
        // `ViTConfig` defaults the patch and image sizes (16, 224); torchvision's constructor
        // takes them without defaults, so its config must name them.
        let size = |field: &'static str, default: u64| {
            if torchvision {
                self.required_u64(field, &[field], limits::POSITIONS)
            } else {
                Ok(self
                    .optional_u64(field, &[field], limits::POSITIONS)?
                    .unwrap_or(default))
            }
        };
        spec.patches = Some(self.patches(
            size("patch_size", 16)?,
            size("image_size", 224)?,
            true,
            true,
        )?);
        spec.activation = self.activation(&["hidden_act"], "gelu")?;
        spec.qkv_bias = self.bool_or(&["qkv_bias"], true)?;
        spec.softmax_fp32 = true;
        spec.attention_dropout = self.fraction_or(&["attention_probs_dropout_prob"], 0.0)?;
        spec.hidden_dropout = self.fraction_or(&["hidden_dropout_prob"], 0.0)?;
        spec.embedding_dropout = spec.hidden_dropout;
        if torchvision {
            // torchvision's `VisionTransformer`: `nn.MultiheadAttention` projects q, k and v
            // with one packed `in_proj` (their views of one contiguous copy reach SDPA), and
            // its classifier has `num_classes` outputs (1000 by default). Its forward keeps
            // the patches with the class token (`x`) and their sum with the position
            // embedding (`Encoder.forward`'s `input`) until the encoder returns.
            spec.fused_qkv = true;
            spec.sdpa_only = true;
            spec.held.embeddings = 2;
            spec.head = Head::ImageClassification {
                classes: self
                    .optional_u64("num_classes", &["num_classes", "num_labels"], limits::VOCAB)?
                    .unwrap_or(1000),
            };
            return Ok(());
        }
        spec.head = if self.architecture_name()? == "ViTModel" {
            Head::Pooler
        } else {
            Head::ImageClassification {
                classes: self.labels(2)?,
            }
        };
        Ok(())
    }

    /// Multi-head latent attention of a DeepSeek-V2/V3 config; None for other families.
    pub(super) fn latent_attention(&self) -> Result<Option<LatentAttention>> {
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
    pub(super) fn newer_decoder(&self, spec: &mut TransformerSpec) -> Result<()> {
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
            spec.hidden_dropout = self.fraction_or(&["resid_pdrop"], 0.0)?;
            spec.embedding_dropout = self.fraction_or(&["embd_pdrop"], 0.0)?;
        }
        self.decoder_experts(spec)?;
        check_routed_experts(spec, format!("the {} experts", spec.experts))?;
        Ok(())
    }

    /// Gemma 2 and 3: sandwich norms, sliding-window layers (every `full_every`-th attends to
    /// all keys), soft-capped scores and logits; Gemma 2 runs only eager attention.
    pub(super) fn gemma_attention(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        spec.sandwich_norms = true;
        let default_every = if mt == "gemma2" { 2 } else { 6 };
        if let Some(window) =
            self.optional_u64("sliding_window", &["sliding_window"], limits::POSITIONS)?
        {
            let full_every = match self.find_key(&["layer_types"]) {
                Some((key, value)) => {
                    let types = value
                        .as_array()
                        .and_then(|types| {
                            types.iter().map(Value::as_str).collect::<Option<Vec<_>>>()
                        })
                        .filter(|types| {
                            types
                                .iter()
                                .all(|t| matches!(*t, "sliding_attention" | "full_attention"))
                        })
                        .ok_or_else(|| {
                            invalid(
                                key,
                                value,
                                "must list sliding_attention or full_attention per layer",
                            )
                        })?;
                    types
                        .iter()
                        .position(|t| *t == "full_attention")
                        .map_or(0, |i| i as u64 + 1)
                }
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
        spec.attention_softcap = self.softcap("attn_logit_softcapping")?;
        spec.eager_only = mt == "gemma2";
        spec.logit_softcap = self.softcap("final_logit_softcapping")?;
        Ok(())
    }

    /// The experts of Qwen3-MoE (in every block) and DeepSeek-V2/V3 (after the dense blocks,
    /// with shared experts and an fp32 router).
    pub(super) fn decoder_experts(&self, spec: &mut TransformerSpec) -> Result<()> {
        let mt = self.model_type.as_str();
        let experts = |field: &'static str| self.optional_u64(field, &[field], limits::EXPERTS);
        // The config classes' defaults (Qwen3-30B-A3B's 128 experts, 8 per token) are no
        // model's in particular: a mixture of experts names its own.
        let routed = |field: &'static str| self.required_u64(field, &[field], limits::EXPERTS);
        match mt {
            "qwen3_moe" => {
                spec.experts = routed("num_experts")?;
                spec.experts_per_token = routed("num_experts_per_tok")?;
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
                let dense_listed = match self.find_key(&["mlp_only_layers"]) {
                    None => false,
                    Some((_, Value::Array(layers))) => !layers.is_empty(),
                    Some((key, value)) => {
                        return Err(invalid(key, value, "must be a list of layer indices"))
                    }
                };
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
                spec.experts = routed("n_routed_experts")?;
                spec.experts_per_token = routed("num_experts_per_tok")?;
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
                        .optional_count("first_k_dense_replace", limits::LAYERS)?
                        .unwrap_or(0),
                    dense_intermediate: self.required_u64(
                        "intermediate_size",
                        &["intermediate_size"],
                        limits::WIDTH,
                    )?,
                    shared_intermediate: self
                        .optional_count("n_shared_experts", limits::EXPERTS)?
                        .unwrap_or(0)
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
    pub(super) fn whisper(&self, spec: &mut TransformerSpec, positions: u64) -> Result<()> {
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
        let dropout = self.fraction_or(&["dropout"], 0.0)?;
        spec.attention_dropout = self.fraction_or(&["attention_dropout"], 0.0)?;
        spec.activation_dropout = self.fraction_or(&["activation_dropout"], 0.0)?;
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
    pub(super) fn feature_layers(&self, layers: u64) -> Result<u64> {
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
    pub(super) fn dual_encoder(&self, name: &str) -> Result<ModelSpec> {
        let clip = self.model_type == "clip";
        let mt = &self.model_type;
        // Configs written before transformers 4.22 carry the towers as `text_config_dict` /
        // `vision_config_dict` (with `text_config: null`); a tower left out takes its defaults.
        let tower_config = |key: &'static str, kind: &str| {
            let mut given = None;
            for k in [key.to_string(), format!("{key}_dict")] {
                match self.json.get(&k).filter(|v| !v.is_null()) {
                    None => {}
                    Some(tower) if tower.is_object() => {
                        given = Some(tower.clone());
                        break;
                    }
                    Some(other) => {
                        return Err(invalid(&k, other, "must be an object: the tower's config"))
                    }
                }
            }
            let mut sub = given.unwrap_or_else(|| Value::Object(Default::default()));
            let tower_type = format!("{mt}_{kind}_model");
            if let Some(object) = sub.as_object_mut() {
                match object.get("model_type").filter(|v| !v.is_null()) {
                    Some(Value::String(declared)) if *declared == tower_type => {}
                    None => {}
                    Some(declared) => {
                        return Err(PlanError::InvalidValue {
                            name: format!("{key}.model_type"),
                            value: declared
                                .as_str()
                                .map_or_else(|| declared.to_string(), str::to_string),
                            reason: format!("a {mt} model's {key} must describe a {tower_type}"),
                        })
                    }
                }
                object.insert("model_type".into(), Value::from(tower_type));
            }
            Ok(sub)
        };
        let text_config = tower_config("text_config", "text")?;
        let text = sub_spec(name, "text_config", &text_config)?;
        let vision = sub_spec(
            name,
            "vision_config",
            &tower_config("vision_config", "vision")?,
        )?;
        let torch_dtype = self
            .torch_dtype()?
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
    pub(super) fn vision_language(&self, name: &str, family: VisionLanguage) -> Result<ModelSpec> {
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
        let language = sub_spec(name, "text_config", &text)?;
        let vision = sub_spec(
            name,
            "vision_config",
            &sub_config(self.json, "vision_config", tower_type)?,
        )?;
        let mut lm = transformer_of(language.clone(), "text_config", "a language model")?;
        if !lm.decoder
            || lm.encoder_layers > 0
            || lm.audio.is_some()
            || lm.patches.is_some()
            || lm.vision.is_some()
            || lm.dual.is_some()
        {
            return Err(PlanError::InvalidValue {
                name: "text_config".into(),
                value: text["model_type"].as_str().unwrap_or(&lm.model_type).into(),
                reason: "must describe a decoder-only language model (llama, mistral, qwen2, \
                         gemma3_text, ...): the image tokens are its input"
                    .into(),
            });
        }
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
                let bias = self.bool_or(&["multimodal_projector_bias"], true)?;
                let patches = per_side.pow(2);
                let tokens = self
                    .optional_u64("image_seq_length", &["image_seq_length"], limits::POSITIONS)?
                    .unwrap_or(patches);
                // One token per patch feature, and the class token's with
                // `vision_feature_select_strategy: "full"`: transformers refuses an image whose
                // features and tokens differ in number.
                if tokens != patches && tokens != patches + 1 {
                    return Err(PlanError::InvalidValue {
                        name: "image_seq_length".into(),
                        value: tokens.to_string(),
                        reason: format!(
                            "must be the vision tower's {patches} patches ({per_side} per side), \
                             or {} with its class token: one image token per patch feature",
                            patches + 1
                        ),
                    });
                }
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
            torch_dtype: self.torch_dtype()?.or(language.torch_dtype),
            quantization: None,
        })
    }
}
