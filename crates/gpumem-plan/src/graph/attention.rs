//! Attention sublayers: what each kernel saves, keeps live and masks.

use super::kernel::{AttentionKernel, GroupedKeys};
use super::sizes::{AttentionShape, Tally};
use super::TransformerGraph;
use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Elements, Tokens, Width};
use crate::unit::ScoreTensors;
use crate::workload::Target;

/// What one attention sublayer keeps besides its per-query-token terms, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AttentionMemory {
    /// Saved bytes proportional to the key tokens (k, v and their expansions).
    pub(super) key_saved: Bytes,
    /// Short-lived bytes in its forward (scores before the softmax, the mask).
    pub(super) forward_transient: Bytes,
    /// Live bytes at its peak in a no-grad forward, besides the hidden states its block holds:
    /// projections, expanded keys and values, the scores' softmax or the kernel output, the mask.
    pub(super) inference_live: Bytes,
    /// Bytes a no-grad forward keeps until its block returns: eager attention's probabilities,
    /// which every family's block holds (`hidden_states, _ = self.self_attn(...)`).
    pub(super) inference_kept: Bytes,
    /// Of `inference_live`, the score matrices of a materialising kernel, tensor by tensor.
    pub(super) inference_scores: ScoreTensors,
    /// Bytes alive through all blocks of its stack in a no-grad forward: the causal mask eager
    /// attention adds (built once by the model), T5's relative position bias (computed by the
    /// first block, passed on to the others).
    pub(super) stack_held: Bytes,
    /// KV-cache bytes it adds in a no-grad forward that keeps a cache.
    pub(super) kv_cache: Bytes,
    /// Of `key_saved`, the keys and values a training forward's cache holds until the step
    /// ends, because the caller keeps the outputs through backward (`--loss none`).
    pub(super) cache_held: Bytes,
    /// What the cache the forward returns keeps alive after backward (`Unit::retained`).
    pub(super) retained: Bytes,
    /// The k and v copies a training cache holds that the kernel does not save (see
    /// `Unit::forward_held`).
    pub(super) forward_held: Bytes,
    /// Bytes alive at the start of its backward when the softmax ran in the activation dtype:
    /// the gradients of the probabilities and of the scores, one score matrix each.
    pub(super) score_gradients: Bytes,
    /// The gradients of its queries, keys and values, which its backward makes together (a
    /// cross-attention's keys and values span the encoder's tokens).
    pub(super) input_gradients: Bytes,
    /// Bytes of one score matrix in the activation dtype (the size of the tensors its core
    /// saves).
    pub(super) score_matrix: Bytes,
    /// Bytes of the probabilities a materialising kernel's softmax saves where they are wider
    /// than the scores (fp32 of half-precision scores): one tensor of its core's saved bytes.
    /// Zero otherwise.
    pub(super) wide_probs: Bytes,
}

/// One attention of a block as it runs: its shape, its kernel and its sizes on this GPU.
#[derive(Debug, Clone, Copy)]
pub(super) struct AttentionCall {
    /// Query and key lengths.
    pub(super) shape: AttentionShape,
    /// A cross-attention (its keys and values span the encoder's tokens).
    pub(super) cross: bool,
    /// The kernel that runs it.
    pub(super) kernel: AttentionKernel,
    /// How grouped keys reach the kernel.
    pub(super) grouped: GroupedKeys,
    /// Query, key and value widths over all heads.
    pub(super) q: Width,
    pub(super) kv: Width,
    pub(super) value: Width,
    /// Heads on this GPU.
    pub(super) heads: f64,
    /// Score elements of the micro-batch on this GPU.
    pub(super) scores: Elements,
    /// Query tokens of the micro-batch.
    pub(super) query_tokens: Tokens,
    /// Key tokens of the micro-batch (the encoder's for a cross-attention).
    pub(super) key_tokens: Tokens,
}

/// The masks and biases of one attention, in bytes (elements for the boolean sliding mask).
#[derive(Debug, Clone, Copy)]
pub(super) struct AttentionMasks {
    /// T5's relative position bias, held through the stack.
    pub(super) stack_bias: Bytes,
    /// The causal mask(s) transformers builds, held through the forward.
    pub(super) causal: Bytes,
    /// CUDA's math path makes its own causal bias (transformers built no mask).
    pub(super) kernel_causal: bool,
    /// SDPA's boolean sliding-window mask, held through the stack.
    pub(super) sliding: Elements,
    /// A mask a fused kernel is given and saves for backward: a sliding layer's additive
    /// conversion, or an older release's per-layer copy of its mask's slice.
    pub(super) converted: Bytes,
}

/// What one attention's kernel itself keeps, in bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct AttentionCore {
    /// Saved for backward inside the attention core.
    pub(super) saved: Bytes,
    /// Short-lived in its forward.
    pub(super) transient: Bytes,
    /// Alive at the start of its backward (see `AttentionMemory::score_gradients`).
    pub(super) score_gradients: Bytes,
    /// Alive at its no-grad peak.
    pub(super) inference_live: Bytes,
    /// Kept by a no-grad forward until the block returns (returned probabilities).
    pub(super) inference_kept: Bytes,
    /// Of `inference_live`, the score matrices (see `AttentionMemory::inference_scores`).
    pub(super) inference_scores: ScoreTensors,
    /// Masks alive through the stack.
    pub(super) stack_mask: Bytes,
}

impl TransformerGraph<'_> {
    /// The kernel of this model's self-attention, or of its cross-attention where `cross`.
    pub(super) fn kernel(&self, cross: bool) -> AttentionKernel {
        if cross {
            self.cross_kernel
        } else {
            self.own_kernel
        }
    }

    /// One attention of `shape` (a cross-attention where `cross`) as it runs on this GPU.
    pub(super) fn attention_call(&self, shape: AttentionShape, cross: bool) -> AttentionCall {
        let spec = self.spec;
        let kernel = self.kernel(cross);
        let heads = spec.heads as f64 / self.split.tp;
        AttentionCall {
            shape,
            cross,
            kernel,
            grouped: GroupedKeys::of(spec, kernel, self.litgpt()),
            q: Width(spec.query_width() as f64),
            kv: Width(spec.kv_width() as f64),
            value: Width(spec.value_width() as f64),
            heads,
            scores: self.batch * heads * shape.queries * shape.keys.as_width(),
            query_tokens: self.batch * shape.queries,
            key_tokens: self.batch * shape.keys,
        }
    }

    /// Does the kernel save the projections' q, k and v as they are? SDPA's math path copies
    /// half-precision inputs to fp32 first and saves the copies.
    pub(super) fn kernel_saves_projections(&self, kernel: AttentionKernel) -> bool {
        !(kernel.is_math_path() && self.bytes.act < BytesPerElement::FP32)
    }

    /// Are the queries contiguous per head when they reach the kernel (the family's own code,
    /// an old release's (OPT's `_shape` before 4.49), or litgpt's attention, which builds its
    /// rotated queries with `torch.cat`)? The kernel's output then comes in head layout and
    /// merging the heads is a copy.
    pub(super) fn head_layout_queries(&self) -> bool {
        self.spec.head_layout_queries
            || self.litgpt()
            || self
                .old_release()
                .is_some_and(|o| o.queries_contiguous_per_head())
    }

    /// Does fused `kernel` return its output in head layout, so that merging the heads copies
    /// it? Where the queries are contiguous per head and the kernel keeps their layout.
    pub(super) fn fused_output_in_head_layout(&self, kernel: AttentionKernel) -> bool {
        self.head_layout_queries() && kernel.output_in_query_layout()
    }

    /// The attention sublayer: adds its per-query-token terms to `tally` and returns the rest.
    pub(super) fn attention(
        &self,
        shape: AttentionShape,
        cross: bool,
        tally: &mut Tally,
    ) -> AttentionMemory {
        let call = self.attention_call(shape, cross);
        let act = self.bytes.act;
        let key_side = self.saved_attention_inputs(&call, tally);
        let key_side = self.saved_key_views(&call, key_side);
        let masks = self.attention_masks(&call);
        let core = if call.kernel.materialises_scores() {
            self.materialised_core(&call, &masks, tally)
        } else {
            self.fused_core(&call, &masks, tally)
        };
        if self.dropout_active(self.spec.hidden_dropout) {
            // A 1-byte mask per hidden element.
            tally.replicated += BytesPerElement::BOOL * Width(self.spec.hidden as f64);
        }
        tally.core += core.saved;
        let (kv_cache, cache_held) = self.attention_cache(&call);
        AttentionMemory {
            key_saved: key_side / self.split.tp * call.key_tokens,
            forward_transient: core.transient,
            inference_live: core.inference_live + self.static_cache_reads(&call),
            inference_kept: core.inference_kept,
            inference_scores: core.inference_scores,
            stack_held: masks.stack_bias + core.stack_mask,
            kv_cache,
            cache_held,
            retained: self.retained_cache(&call),
            forward_held: self.math_path_cache_copies(&call),
            score_gradients: core.score_gradients,
            input_gradients: act / self.split.tp
                * (call.query_tokens * call.q + call.key_tokens * (call.kv + call.value)),
            score_matrix: self.bytes.act * call.scores,
            wide_probs: match self.score_bytes(call.kernel).probs {
                probs if call.kernel.materialises_scores() && probs > act => call.scores * probs,
                _ => Bytes::ZERO,
            },
        }
    }

    /// What one attention saves of its inputs for backward (the norm output its projections
    /// read, q, k and v or the kernel's copies of them, per-head norms, latent attention's
    /// low-rank path): adds the bytes per query token to `tally` and returns the bytes per key
    /// token (a cross-attention's keys are the encoder's).
    pub(super) fn saved_attention_inputs(
        &self,
        call: &AttentionCall,
        tally: &mut Tally,
    ) -> BytesPerToken {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, Width(spec.hidden as f64));
        let (q, kv, value) = (call.q, call.kv, call.value);
        let fp32 = BytesPerElement::FP32;
        let mut key_side = BytesPerToken::ZERO;
        let projections_from_norm = if call.cross || spec.fused_qkv {
            1.0
        } else {
            3.0
        };
        if call.cross && self.bytes.autocast {
            // Under autocast a cross-attention's k and v each save their own half-precision
            // copy of the encoder's output, in every decoder block.
            key_side += 2.0 * act * h;
        }
        tally.sharded += if spec.post_norm && !call.cross {
            BytesPerToken::ZERO
        } else {
            self.bytes.linear_input(h, projections_from_norm)
        };
        // q, k, v (rotated when RoPE is used) are saved by the attention. RoPE's products with the
        // gradient-free cos/sin tables save only the tables, so the raw projections are freed.
        // SDPA's math path scales copies of the queries and keys (and copies half-precision
        // inputs to fp32 first), which its matmuls save instead (counted below); fp32 values
        // are saved as they are.
        let math_path = call.kernel.is_math_path();
        if !math_path {
            tally.sharded += act * q;
            key_side += act * (kv + value);
        } else if self.kernel_saves_projections(call.kernel) {
            key_side += act * value;
        }
        // An old release's fp32 rotary: eager attention saves the fp32 queries and keys its
        // scores are made from; the SDPA path saves half-precision casts, while the fp32 keys
        // stay referenced as the layer's cache (`present`) in training too.
        if self.old_release().is_some_and(|o| o.fp32_rotary()) {
            if call.kernel.materialises_scores() {
                tally.sharded += (fp32 - act) * q;
                key_side += (fp32 - act) * kv;
            } else if self.cache_copies() {
                key_side += fp32 * kv;
            }
        }
        if spec.qk_norm {
            // The family's RMSNorm over each head's q and k.
            tally.sharded += self.norm_element_bytes(act) * (q + kv);
        }
        tally.sharded += self.saved_latent_path(call);
        if math_path {
            // The math path saves its fp32 copies of the scaled queries and keys, and of the
            // values when they are in half precision.
            tally.sharded += fp32 * q;
            key_side += fp32 * kv
                + if act < fp32 {
                    fp32 * value
                } else {
                    BytesPerToken::ZERO
                };
        }
        key_side
    }

    /// Saved bytes per query token of latent attention's low-rank path: q_a output and its
    /// RMSNorm, the kv latent (with the rotary key) and its RMSNorm, and the decompressed
    /// per-head keys and values of kv_b, kept whole where a fused kernel saves the values as
    /// views of it (eager attention's matmul and SDPA's math path save copies).
    pub(super) fn saved_latent_path(&self, call: &AttentionCall) -> BytesPerToken {
        let Some(l) = self.spec.latent else {
            return BytesPerToken::ZERO;
        };
        let (act, fp32) = (self.bytes.act, BytesPerElement::FP32);
        let (qr, kvr) = (Width(l.query_rank as f64), Width(l.kv_rank as f64));
        let decompressed =
            if self.kernel_saves_projections(call.kernel) && !call.kernel.materialises_scores() {
                act * Width((self.spec.heads * (l.nope_dim + l.value_dim)) as f64)
            } else {
                BytesPerToken::ZERO
            };
        act * qr
            + (fp32 + act) * qr
            + act * (kvr + Width(l.rope_dim as f64))
            + (fp32 + act) * kvr
            + decompressed
    }

    /// Adds to `key_side` (saved bytes per key token) what the saved keys and values keep
    /// alive besides themselves: the fused projection they are views of, the cache's copies,
    /// or the copies grouped keys are repeated into.
    pub(super) fn saved_key_views(
        &self,
        call: &AttentionCall,
        mut key_side: BytesPerToken,
    ) -> BytesPerToken {
        let spec = self.spec;
        let act = self.bytes.act;
        let (q, kv, value) = (call.q, call.kv, call.value);
        // Does the kernel receive the values as a view of a fused projection (the family's, or
        // litgpt's fused qkv for every model)? Not when the cache hands it copies (today's
        // releases, cache on), nor when grouped values are repeated first (eager attention,
        // SDPA's math path, litgpt's `repeat_interleave`).
        let values_view_fused = (spec.fused_qkv || self.litgpt())
            && !call.cross
            && (self.cache_holds_views() || !self.cache_copies())
            && call.grouped == GroupedKeys::AsProjected;
        if values_view_fused {
            // The saved values keep the whole fused projection alive; beside rotated queries
            // and keys (new tensors), its q and k parts are extra. (Without rotary, q, k and
            // v are all views of it, as counted.)
            if spec.rotary_fraction > 0.0 {
                key_side += act * (q + kv);
            }
        } else if self.cache_copies()
            && !call.kernel.materialises_scores()
            && spec.fused_qkv
            && spec.rotary_fraction == 0.0
            && !call.cross
        {
            // The KV cache concatenates copies of k and v, which the kernel saves, while the
            // query view keeps the whole fused projection alive.
            key_side += act * (kv + value);
        }
        key_side += match call.grouped {
            GroupedKeys::AsProjected => BytesPerToken::ZERO,
            // repeat_kv expands k and v to all heads before the matmuls.
            GroupedKeys::RepeatedForScores => self.repeated_keys(call),
            // litgpt repeats grouped keys and values to every head before SDPA, which saves
            // the repeated copies instead.
            GroupedKeys::RepeatedByLitgpt => act * 2.0 * q - act * (kv + value),
        };
        key_side
    }

    /// Bytes per key token of grouped keys and values repeated to every head.
    pub(super) fn repeated_keys(&self, call: &AttentionCall) -> BytesPerToken {
        self.bytes.act * 2.0 * call.q
    }

    /// The masks and biases one attention has alive.
    pub(super) fn attention_masks(&self, call: &AttentionCall) -> AttentionMasks {
        let spec = self.spec;
        let (act, shape) = (self.bytes.act, call.shape);
        // T5's relative position bias (batch 1) lives through its stack: the self-attention's in
        // the weight dtype, the decoder's cross-attention zeros in the activation dtype.
        let stack_bias = if spec.relative_attention_buckets > 0 {
            let bias = if call.cross {
                self.bytes.act
            } else {
                self.bytes.residual
            };
            bias * call.heads * shape.queries * shape.keys.as_width()
        } else {
            Bytes::ZERO
        };
        // A causal mask (b × q × k in the activation dtype) lives through the whole forward; a
        // model with sliding-window layers builds a second one for them. Where CUDA's math
        // path takes grouped keys, transformers built none (`is_causal`): the kernel makes
        // its own bias.
        let masks = if spec.sliding.is_some() { 2.0 } else { 1.0 };
        let kernel_causal =
            call.kernel == AttentionKernel::SdpaMathCuda && spec.relative_attention_buckets == 0;
        let causal = if shape.causal && !kernel_causal {
            masks * act * self.batch * shape.queries * shape.keys.as_width()
        } else {
            Bytes::ZERO
        };
        // SDPA takes a boolean mask for sliding layers once the keys exceed the window (built
        // once, held through the stack), which it converts to an additive mask in the
        // activation dtype on each sliding layer (saved for backward).
        let (sliding, mut converted) = match spec.sliding {
            Some(s) if shape.causal && shape.keys > Tokens(s.window as f64) => {
                let elements = self.batch * shape.queries * shape.keys.as_width();
                let converted = if shape.cached_keys.is_some() {
                    act * elements
                } else {
                    Bytes::ZERO
                };
                (elements, converted)
            }
            _ => (Elements(0.0), Bytes::ZERO),
        };
        // An older release's mask over all positions (Llama 4.38): each layer copies its
        // slice (`attention_mask[:, :, cache_position, :kv_len]`), which a fused kernel saves.
        let all_positions = self
            .old_release()
            .and_then(|o| o.all_positions_mask(self.workload.attention));
        if all_positions.is_some() && shape.causal && !call.cross {
            converted += act * self.batch * shape.queries * shape.keys.as_width();
        }
        AttentionMasks {
            stack_bias,
            causal,
            kernel_causal,
            sliding,
            converted,
        }
    }

    /// No-grad projections alive at the attention (this GPU's heads): a fused projection stays
    /// whole behind its q/k/v views (RoPE adds a rotated q, and k unless the cache took a
    /// copy); separate projections leave q, and k and v unless the cache holds their copies.
    pub(super) fn no_grad_projections(&self, call: &AttentionCall) -> Bytes {
        let spec = self.spec;
        let act = self.bytes.act;
        let cached = self.attention_caches(call);
        let (q_local, kv_local) = (call.q / self.split.tp, call.kv / self.split.tp);
        if let Some(l) = spec.latent {
            // Latent attention: q_b's output behind the no-rope queries and the concatenated
            // queries; kv_b's output behind the values and the assembled per-head keys, and the
            // shared rotary key expanded to every head (the cache holds the latent instead).
            let per_head = |width: u64| Width((spec.heads * width) as f64) / self.split.tp;
            call.query_tokens
                * act
                * (2.0 * q_local
                    + per_head(l.nope_dim + l.value_dim)
                    + kv_local
                    + per_head(l.rope_dim))
        } else if spec.fused_qkv && !call.cross {
            let rotated = if spec.rotary_fraction > 0.0 {
                q_local + if cached { Width::ZERO } else { kv_local }
            } else {
                Width::ZERO
            };
            call.query_tokens * act * (q_local + 2.0 * kv_local + rotated)
        } else {
            call.query_tokens * act * q_local
                + if cached {
                    Bytes::ZERO
                } else {
                    call.key_tokens * act * (call.kv + call.value) / self.split.tp
                }
        }
    }

    /// The core of an attention whose kernel materialises the scores (eager attention, SDPA's
    /// math path): the softmax's saved tensors, the scores beside it, and its no-grad peak.
    pub(super) fn materialised_core(
        &self,
        call: &AttentionCall,
        masks: &AttentionMasks,
        tally: &mut Tally,
    ) -> AttentionCore {
        let (act, fp32) = (self.bytes.act, BytesPerElement::FP32);
        let (scores, shape) = (call.scores, call.shape);
        let score = self.score_bytes(call.kernel);
        let score_gradients = match self.workload.target {
            // CUDA's softmax backward first makes `grad * output` (SoftMax.cu): the
            // probabilities' gradient, that product and the scores' gradient, each in
            // the probabilities' dtype.
            Target::Gpu => 3.0 * scores * score.probs,
            Target::Cpu if score.probs == score.input => 2.0 * scores * score.input,
            Target::Cpu => Bytes::ZERO,
        };
        // The head-merging copy is saved by the output projection.
        tally.sharded += act * call.q;
        // The math path keeps fp32 copies of half-precision q, k and v for the whole call,
        // and scales a copy of the queries.
        let (q_local, kv_local) = (call.q / self.split.tp, call.kv / self.split.tp);
        let copies = if act < fp32 {
            fp32 * (q_local * call.query_tokens
                + (kv_local + call.value / self.split.tp) * call.key_tokens)
        } else {
            Bytes::ZERO
        };
        let scaled_queries = fp32 * q_local * call.query_tokens;
        let (scaled, returned) = match call.kernel {
            // CUDA's (SDPA: no probabilities returned; grouped keys and values repeated to
            // every head, counted as `expanded`) also turns `is_causal` (no mask given)
            // into an fp32 bias, and `_safe_softmax` marks the masked scores in a 1-byte
            // tensor beside the biased scores and the probabilities (the H200's op logs).
            AttentionKernel::SdpaMathCuda => {
                let causal_bias = if shape.causal && masks.kernel_causal {
                    fp32 * shape.queries * shape.keys.as_width()
                } else {
                    Bytes::ZERO
                };
                (
                    copies + scaled_queries + causal_bias + scores * BytesPerElement::BOOL,
                    Bytes::ZERO,
                )
            }
            AttentionKernel::SdpaMathCpu => (copies + scaled_queries, scores * score.returned()),
            _ => (Bytes::ZERO, scores * score.returned()),
        };
        let expanded = match call.grouped {
            GroupedKeys::RepeatedForScores => self.repeated_keys(call),
            GroupedKeys::AsProjected | GroupedKeys::RepeatedByLitgpt => BytesPerToken::ZERO,
        };
        AttentionCore {
            saved: scores * score.saved(),
            // The raw scores exist next to their scaled/masked copy before the softmax. (A bf16
            // input's fp32 copy exists before the block's later saved tensors do, which the
            // forward replay counts already.)
            transient: scores * score.input + masks.causal,
            score_gradients,
            inference_live: self.no_grad_projections(call)
                + expanded / self.split.tp * call.key_tokens
                + scores * score.no_grad_peak()
                + scaled,
            inference_kept: returned,
            inference_scores: ScoreTensors {
                input: (scores * score.input).bytes(),
                // SDPA's math path adds the mask in place; the families' own code scales and
                // masks out of place.
                copied: call.kernel == AttentionKernel::Eager,
                softcap: (scores * score.softcap).bytes(),
                conversion: (scores * score.conversion).bytes(),
                probs: (scores * score.probs).bytes(),
                cast: (scores * score.cast).bytes(),
                returned: returned > Bytes::ZERO,
            },
            stack_mask: masks.causal,
        }
    }

    /// The core of an attention whose kernel is fused (SDPA's flash or memory-efficient
    /// kernel, FlashAttention-2): its output and fp32 log-sum-exp.
    pub(super) fn fused_core(
        &self,
        call: &AttentionCall,
        masks: &AttentionMasks,
        tally: &mut Tally,
    ) -> AttentionCore {
        let (act, fp32) = (self.bytes.act, BytesPerElement::FP32);
        let shape = call.shape;
        // Kernel output + fp32 log-sum-exp; the output is in the layout the output projection
        // reads unless the queries were made contiguous per head (then the merge copies).
        let merge_copy = if self.fused_output_in_head_layout(call.kernel) {
            act * call.q
        } else {
            BytesPerToken::ZERO
        };
        // One fp32 log-sum-exp per head and query token.
        tally.sharded += act * call.q + merge_copy + fp32 * Width(self.spec.heads as f64);
        // Without gradients T5's bias goes to the kernel as an additive mask: a causal
        // decoder's is combined with the mask (`torch.where`) and made contiguous.
        let bias_mask = if masks.stack_bias > Bytes::ZERO && shape.causal {
            2.0 * act * call.heads * shape.queries * shape.keys.as_width()
        } else {
            Bytes::ZERO
        };
        let q_local = call.q / self.split.tp;
        AttentionCore {
            saved: masks.converted,
            transient: Bytes::ZERO,
            score_gradients: Bytes::ZERO,
            inference_live: self.no_grad_projections(call)
                + call.query_tokens
                    * (act * q_local + merge_copy / self.split.tp + fp32 * Width(call.heads))
                + bias_mask
                + masks.converted,
            inference_kept: Bytes::ZERO,
            inference_scores: ScoreTensors::default(),
            stack_mask: masks.sliding * BytesPerElement::BOOL,
        }
    }
}
