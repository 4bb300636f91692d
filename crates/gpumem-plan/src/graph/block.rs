//! One transformer block, assembled from its attention(s), MLP, norms and adapters.

use super::attention::AttentionMemory;
use super::sizes::{AttentionShape, Tally};
use super::TransformerGraph;
use crate::model::LayerKind;
use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Elements, Tokens, Width};
use crate::single_gpu::per_op_saved_matmul_widths;
use crate::unit::{NoGradPhase, SavedGroup, Unit, WholeTensors};

/// A block's attentions as they ran: its self-attention and a decoder's cross-attention.
struct BlockAttentions {
    /// The self-attention.
    own: AttentionMemory,
    /// Zero where the block has none.
    cross: AttentionMemory,
    /// The block has a cross-attention (a decoder of an encoder-decoder).
    has_cross: bool,
    /// The tokens a cross-attention's keys and values span (the encoder's).
    encoder_tokens: Tokens,
}

impl TransformerGraph<'_> {
    /// One transformer block: its norms, its attention (and a decoder's cross-attention
    /// over the encoder's tokens of `cross`), its MLP or experts, and their adapters.
    pub(super) fn block(
        &self,
        shape: AttentionShape,
        cross: Option<AttentionShape>,
        layer: LayerKind,
    ) -> Unit {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, Width(spec.hidden as f64));
        let tokens = self.batch * shape.queries;
        let mut tally = Tally::default();
        self.tally_block_norms(cross.is_some(), &mut tally);
        let attentions = self.block_attentions(shape, cross, &mut tally);
        let (own, cross_memory) = (&attentions.own, &attentions.cross);
        let transient = own.forward_transient.max(cross_memory.forward_transient);
        tally.sharded += self.mlp(layer);
        if self.dropout_active(spec.hidden_dropout) {
            // A 1-byte mask per hidden element.
            tally.replicated += BytesPerElement::BOOL * h;
        }
        let f = Width(spec.routed_intermediate(layer) as f64) / self.split.tp;
        let (inference_live, no_grad) = self.block_no_grad_live(tokens, layer, &attentions);
        let dequantised = self.dequantised(layer, tokens);
        // The cache copies the outputs hold: through backward where the caller keeps the
        // outputs (`--loss none`, `--hold-outputs`), else until the forward returns. As
        // (held, forward_held).
        let cache_copies = own.forward_held + cross_memory.forward_held;
        let outputs_held = if self.outputs_through_backward() {
            (cache_copies, Bytes::ZERO)
        } else {
            (Bytes::ZERO, cache_copies)
        };
        let residual_gradient = 2.0 * tokens * self.bytes.residual * h;
        let adapters = self.adapter_transient(layer, tokens, attentions.encoder_tokens);
        Unit {
            name: "block",
            saved: self.block_saved(tokens, layer, &tally, &attentions).bytes(),
            attention_core: tally.core.bytes(),
            checkpoint: Some((tokens * self.bytes.residual * h / self.split.sequence).bytes()),
            per_op_saved: self.per_op_saved(shape, cross, layer).bytes(),
            held: (own.cache_held + outputs_held.0).bytes(),
            retained: (own.retained + cross_memory.retained).bytes(),
            forward_held: outputs_held.1.bytes(),
            // A 4-bit base's weight is dequantised for its own matmul, which PEFT's
            // `Linear4bit` runs before the adapters, and freed by the time they run.
            forward_transient: (transient + tokens * act * f + dequantised)
                .max(adapters)
                .bytes(),
            // Saved tensors are released as their node runs: one intermediate's gradient at a
            // time (and a QLoRA base weight dequantised again for the input's gradient).
            backward_transient: (self.block_largest_gradient(
                tokens,
                layer,
                tally.core,
                &attentions,
            ) + residual_gradient
                + dequantised)
                .bytes(),
            gradient_transient: residual_gradient.bytes(),
            pre_recompute_gradient: self.last_adapter_output_gradient(layer, tokens).bytes(),
            first_norm: (
                (tokens * self.norm_saved() / self.split.sequence).bytes(),
                (tokens * self.norm_backward_temporaries() / self.split.sequence).bytes(),
            ),
            inference_live: (inference_live + dequantised).bytes(),
            kv_cache: (own.kv_cache + cross_memory.kv_cache).bytes(),
            kv_window: shape.cached_keys.map(Tokens::count),
            whole: WholeTensors {
                kv_cache: [own.kv_cache, cross_memory.kv_cache].map(|bytes| SavedGroup {
                    bytes: bytes.bytes(),
                    tensor: (bytes / 2.0).bytes(),
                }),
                encoder_hidden: if spec.audio.is_some() && cross.is_none() {
                    (tokens * act * h).bytes()
                } else {
                    0.0
                },
                ..self.block_whole_tensors(tokens, layer, tally.core, own, no_grad)
            },
            params: spec.block_params(attentions.has_cross, layer),
            ..Unit::default()
        }
    }

    /// The block's tensors big enough to decide the allocator's segments: the score matrix
    /// among the attention core's saved bytes (`core`; `own`'s wide probabilities one tensor
    /// of them), the MLP's saved intermediates, a no-grad forward's phases (`no_grad`), and
    /// its weight matrices.
    fn block_whole_tensors(
        &self,
        tokens: Tokens,
        layer: LayerKind,
        core: Bytes,
        own: &AttentionMemory,
        no_grad: [NoGradPhase; 3],
    ) -> WholeTensors {
        let f = Width(self.spec.routed_intermediate(layer) as f64) / self.split.tp;
        let intermediates = (tokens * self.mlp_intermediates(layer) / self.split.tp).bytes();
        let group = |bytes: Bytes, tensor: Bytes| SavedGroup {
            bytes: bytes.bytes(),
            tensor: tensor.bytes(),
        };
        let core_group = group(core, own.score_matrix);
        WholeTensors {
            saved: if layer.moe {
                // A mixture of experts (transformers 5's `grouped_mm` over the routed copies,
                // sorted by expert) saves its gathered input and its output before the
                // routing weights, each one tensor of every routed copy, and each routed
                // intermediate over every copy.
                let copies = tokens * self.spec.experts_per_token as f64 * self.bytes.act;
                let h = Width(self.spec.hidden as f64);
                let expert = Width(self.spec.intermediate as f64) / self.split.tp;
                [
                    core_group,
                    SavedGroup {
                        bytes: (2.0 * copies * h).bytes(),
                        tensor: (copies * h).bytes(),
                    },
                    SavedGroup {
                        bytes: intermediates,
                        tensor: (copies * expert).bytes(),
                    },
                ]
            } else {
                [
                    group(own.wide_probs, own.wide_probs),
                    group(core - own.wide_probs, own.score_matrix),
                    SavedGroup {
                        bytes: intermediates,
                        tensor: (tokens * self.bytes.act * f).bytes(),
                    },
                ]
            },
            no_grad,
            block_matrices: !layer.moe,
            moe_tensors: layer.moe,
            ..WholeTensors::default()
        }
    }

    /// Adds what a block's norms save to `tally` (`cross`: a decoder block's third norm).
    fn tally_block_norms(&self, cross: bool, tally: &mut Tally) {
        let spec = self.spec;
        let h = Width(spec.hidden as f64);
        let norms = spec.block_norms() as f64 + if cross { 1.0 } else { 0.0 };
        if spec.post_norm {
            // The block input is saved by q/k/v; each add+norm saves the sum.
            tally.sharded += self
                .bytes
                .linear_input(h, if spec.fused_qkv { 1.0 } else { 3.0 });
            // (LayerNorm's fp32 mean and reciprocal deviation per row.)
            tally.replicated += 2.0 * (self.bytes.residual * h + BytesPerToken(8.0));
        } else if spec.parallel_residual && !spec.shared_block_norm {
            // Both norms read the same residual input: it is saved once.
            tally.replicated += 2.0 * self.norm_saved() - self.bytes.residual * h;
        } else {
            tally.replicated += norms * self.norm_saved();
        }
    }

    /// The block's self-attention and, over the encoder's tokens, its cross-attention.
    fn block_attentions(
        &self,
        shape: AttentionShape,
        cross: Option<AttentionShape>,
        tally: &mut Tally,
    ) -> BlockAttentions {
        let own = self.attention(shape, false, tally);
        BlockAttentions {
            own,
            cross: cross
                .map(|c| self.attention(c, true, tally))
                .unwrap_or_default(),
            has_cross: cross.is_some(),
            encoder_tokens: cross.map_or(Tokens::ZERO, |c| self.batch * c.keys),
        }
    }

    /// Bytes a block saves for backward: its tally over `tokens`, the attentions' key-side
    /// tensors and core, autocast's weight copies, and what LoRA changes.
    fn block_saved(
        &self,
        tokens: Tokens,
        layer: LayerKind,
        tally: &Tally,
        attentions: &BlockAttentions,
    ) -> Bytes {
        let (own, cross) = (&attentions.own, &attentions.cross);
        let key_bytes = own.key_saved + cross.key_saved - own.cache_held;
        let autocast_weights = if self.bytes.autocast {
            let params = self.spec.block_linear_params(layer, attentions.has_cross);
            self.bytes.act * Elements(params as f64) / self.split.tp
        } else {
            Bytes::ZERO
        };
        let change = self.lora_inputs(layer, attentions.has_cross);
        tokens * (tally.sharded / self.split.tp + tally.replicated / self.split.sequence)
            + key_bytes
            + tally.core
            + autocast_weights
            + (tokens * (change.attention + change.mlp + change.cross_queries)
                + attentions.encoder_tokens * change.cross_keys)
            + self.lora_folded_experts(layer)
    }

    /// A no-grad block's peak (besides weights and KV cache), and its phases: its attention,
    /// a decoder's cross-attention, its MLP ([`NoGradPhase`]). No-grad forward: the hidden
    /// states the family's block code holds (block input, norm output, residual sum, attention
    /// output) beside what each sublayer computes; the probabilities eager attention returns
    /// stay held until the block returns, T5's position bias through the stack.
    fn block_no_grad_live(
        &self,
        tokens: Tokens,
        layer: LayerKind,
        attentions: &BlockAttentions,
    ) -> (Bytes, [NoGradPhase; 3]) {
        let (own, cross) = (&attentions.own, &attentions.cross);
        let hidden = tokens * self.bytes.residual * Width(self.spec.hidden as f64);
        let held = &self.spec.held;
        let stack = own.stack_held + cross.stack_held;
        // The pass counts the block's whole KV cache: the cross-attention's copies do not exist
        // yet while the self-attention runs.
        let attention_live =
            hidden * held.at_attention as f64 + own.inference_live - cross.kv_cache;
        // Cross-attention runs beside the self-attention's residual sum as well.
        let cross_live = if attentions.has_cross {
            hidden * (held.at_attention + 1) as f64 + own.inference_kept + cross.inference_live
        } else {
            Bytes::ZERO
        };
        // The block names each attention's probabilities `_`: the cross-attention's replace the
        // self-attention's.
        let kept = if attentions.has_cross {
            cross.inference_kept
        } else {
            own.inference_kept
        };
        let mlp_own_live = self.mlp_no_grad_live(tokens, layer);
        let mlp_live = hidden * held.at_mlp as f64 + mlp_own_live + kept;
        let f = Width(self.spec.routed_intermediate(layer) as f64) / self.split.tp;
        let intermediates = if layer.moe {
            SavedGroup::default()
        } else {
            SavedGroup {
                bytes: mlp_own_live.bytes(),
                // One tensor of the MLP's intermediate width.
                tensor: (tokens * self.bytes.act * f).bytes(),
            }
        };
        // In training (a checkpointed block's forward), the adapters' tensors beside each
        // sublayer's base outputs.
        let (attention_adapters, _) = self.adapter_no_grad(layer, tokens, false);
        let (mlp_adapters, adapter_tensor) = self.adapter_no_grad(layer, tokens, true);
        let intermediates = if (adapter_tensor.bytes() - intermediates.tensor).abs() < 1.0 {
            SavedGroup {
                bytes: intermediates.bytes + mlp_adapters.bytes(),
                ..intermediates
            }
        } else {
            intermediates
        };
        let phases = [
            NoGradPhase {
                bytes: (attention_live + attention_adapters + stack).bytes(),
                scores: own.inference_scores,
                hidden: hidden.bytes(),
                ..NoGradPhase::default()
            },
            NoGradPhase {
                bytes: if attentions.has_cross {
                    (cross_live + stack).bytes()
                } else {
                    0.0
                },
                scores: cross.inference_scores,
                hidden: hidden.bytes(),
                ..NoGradPhase::default()
            },
            NoGradPhase {
                bytes: (mlp_live + mlp_adapters + stack).bytes(),
                whole: intermediates,
                hidden: hidden.bytes(),
                ..NoGradPhase::default()
            },
        ];
        let inference_live = attention_live.max(cross_live).max(mlp_live) + stack;
        (inference_live, phases)
    }

    /// The largest gradient a block's backward makes beside one residual-stream gradient:
    /// of an intermediate, of the scores (`core`: the attention core's saved bytes), of the
    /// first MLP linear's bias, or of a cross-attention's inputs.
    fn block_largest_gradient(
        &self,
        tokens: Tokens,
        layer: LayerKind,
        core: Bytes,
        attentions: &BlockAttentions,
    ) -> Bytes {
        let spec = self.spec;
        let act = self.bytes.act;
        let f = Width(spec.routed_intermediate(layer) as f64) / self.split.tp;
        // The score gradients exist in the attention's backward, after the MLP's (and, where
        // blocks run in sequence, the MLP's norm and the output projection's saved input are
        // released by then).
        let score_gradients = attentions
            .own
            .score_gradients
            .max(attentions.cross.score_gradients);
        let released_before_attention = if spec.parallel_residual || score_gradients == Bytes::ZERO
        {
            Bytes::ZERO
        } else {
            tokens
                * (self.mlp(layer) / self.split.tp
                    + self.norm_saved() / self.split.sequence
                    + act * Width(spec.query_width() as f64) / self.split.tp)
        };
        let residual_gradient = 2.0 * tokens * self.bytes.residual * Width(spec.hidden as f64);
        // In the attention's backward one residual-stream gradient is alive beside its own.
        let attention_backward = (score_gradients - released_before_attention)
            .max(attentions.cross.input_gradients - released_before_attention)
            - residual_gradient / 2.0;
        // On the GPU the first MLP linear's bias gradient is summed from its output's gradient
        // through a staging buffer, after the activation's and the second linear's backward
        // have released the intermediates they saved.
        let first_mlp_bias = if spec.mlp_bias && !spec.gated_mlp && !layer.moe {
            let staging = self.bias_gradient_staging(tokens, f);
            staging + tokens * (act * f - self.mlp_intermediates(layer) / self.split.tp)
        } else {
            Bytes::ZERO
        };
        (core / 2.0)
            .max(tokens * act * f * self.mlp_backward_intermediates())
            .max(first_mlp_bias)
            .max(attention_backward)
    }

    /// Bytes a block keeps under per-op selective checkpointing besides its input: the saved
    /// matmul outputs (per query token, and per key token for cross-attention's k and v) and,
    /// where SDPA runs a fused kernel, its output and fp32 log-sum-exp (torchtitan saves the
    /// flash and memory-efficient kernels' outputs; FlashAttention-2's own op is not in its list).
    pub(super) fn per_op_saved(
        &self,
        shape: AttentionShape,
        cross: Option<AttentionShape>,
        layer: LayerKind,
    ) -> Bytes {
        let spec = self.spec;
        let act = self.bytes.act;
        let (per_query, per_key) = per_op_saved_matmul_widths(spec, layer, cross.is_some());
        let (per_query, per_key) = (Width(per_query), Width(per_key));
        let queries = self.batch * shape.queries;
        let keys = cross.map_or(Tokens::ZERO, |c| self.batch * c.keys);
        let attentions = [
            self.own_kernel.is_sdpa_fused(),
            cross.is_some() && self.cross_kernel.is_sdpa_fused(),
        ]
        .into_iter()
        .filter(|&f| f)
        .count() as f64;
        // Per query token: the kernel's output and its fp32 log-sum-exp per head.
        let per_token = act * Width(spec.query_width() as f64)
            + BytesPerElement::FP32 * Width(spec.heads as f64);
        let kernel = attentions * queries * per_token / self.split.tp;
        (queries * per_query + keys * per_key) * act / self.split.tp + kernel
    }
}
