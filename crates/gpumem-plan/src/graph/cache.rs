//! KV caches: of a no-grad forward, and the cache copies a training forward makes.

use super::attention::AttentionCall;
use super::kernel::AttentionKernel;
use super::sizes::AttentionShape;
use super::TransformerGraph;
use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Tokens, Width};
use crate::workload::{Checkpointing, Loss, Mode};

impl TransformerGraph<'_> {
    /// Hugging Face decoders keep `use_cache` on in training unless checkpointing (the model
    /// turns it off when any of its layers checkpoints): every layer's k and v then pass through
    /// a `DynamicCache` concatenation (new tensors). litgpt's and torchtune's own models (their
    /// chunked losses) keep no cache in training.
    pub(super) fn cache_copies(&self) -> bool {
        self.training
            && self.spec.use_cache
            && self.workload.use_cache
            && !matches!(self.workload.loss, Loss::Chunked | Loss::ChunkedFp32)
            && self.spec.is_causal_lm()
            && matches!(
                self.workload.checkpointing,
                Checkpointing::None | Checkpointing::Selective
            )
    }

    /// Does this attention of a training step pass its k and v through a cache beside what
    /// its kernel saves? An encoder-decoder's decoder attentions, self and cross, when
    /// `use_cache` is on (the `EncoderDecoderCache` of T5 and Whisper fills in training too).
    /// (A decoder-only LM's cache copies are counted with its projections: `cache_copies`.)
    pub(super) fn training_cache(&self, shape: AttentionShape, cross: bool) -> bool {
        self.training
            && self.spec.is_encoder_decoder()
            && (shape.causal || cross)
            && self.spec.use_cache
            && self.workload.use_cache
            && matches!(
                self.workload.checkpointing,
                Checkpointing::None | Checkpointing::Selective
            )
    }

    /// Does the training step keep its forward's KV cache until backward ends? With
    /// `--loss none` the caller holds the model's outputs through backward, and the cache copies
    /// every layer made are among them.
    pub(super) fn outputs_hold_cache(&self) -> bool {
        self.cache_copies() && self.workload.loss == Loss::None
    }

    /// Does this no-grad forward keep a KV cache? Generation always (decoder-only LMs); a plain
    /// forward of a decoder when `use_cache` is on in the config and the call (`DynamicCache`
    /// concatenates copies of every layer's keys and values, and the output returns them).
    pub(super) fn keeps_cache(&self) -> bool {
        match self.workload.mode {
            Mode::Generate => self.spec.is_causal_lm(),
            Mode::Infer => self.spec.decoder && self.spec.use_cache && self.workload.use_cache,
            Mode::Train => false,
        }
    }

    /// Bytes per element of the keys a cache copies: fp32 under an old release's fp32 rotary.
    pub(super) fn cached_key_bytes(&self) -> BytesPerElement {
        if self.old_release().is_some_and(|o| o.fp32_rotary()) {
            BytesPerElement::FP32
        } else {
            self.bytes.act
        }
    }

    /// Does this attention of a no-grad forward keep a KV cache? An encoder's self-attention
    /// (bidirectional, not cross) caches nothing.
    pub(super) fn attention_caches(&self, call: &AttentionCall) -> bool {
        self.keeps_cache() && (call.shape.causal || call.cross)
    }

    /// The math path's own copies are what it saves: the cache kept in training holds its
    /// concatenated k (and half-precision v) beside them until the forward returns.
    pub(super) fn math_path_cache_copies(&self, call: &AttentionCall) -> Bytes {
        if call.kernel.is_math_path() && self.training_cache(call.shape, call.cross) {
            let value = if self.kernel_saves_projections(call.kernel) {
                Width::ZERO
            } else {
                call.value
            };
            call.key_tokens * self.bytes.act * (call.kv + value) / self.split.tp
        } else {
            Bytes::ZERO
        }
    }

    /// The attention's KV cache in a no-grad forward, and in training the part of its saved
    /// keys and values the caller's outputs hold until the step ends: `(kv_cache, held)`.
    /// The cache holds copies of k and v per key token (the encoder's for cross-attention);
    /// latent attention caches its compressed latent and rotary key, shared by all heads. A
    /// sliding-window layer keeps a view of its last window, so the prefill's whole copy
    /// stays alive; decoding then keeps only the window (`Unit::kv_window`).
    pub(super) fn attention_cache(&self, call: &AttentionCall) -> (Bytes, Bytes) {
        let spec = self.spec;
        let copies = self.cache_copy_bytes();
        let cache_bytes = self.cache_bytes(call);
        let kv_cache = if self.attention_caches(call) {
            cache_bytes * self.cached_positions(call)
        } else {
            Bytes::ZERO
        };
        // The copies the kernel saves are the cache's own tensors. (An old release's cache of
        // views keeps its fused projection instead, and latent attention's cache is not what
        // the kernel saves: neither is counted here.)
        let held = if self.outputs_hold_cache()
            && !call.cross
            && spec.latent.is_none()
            && !(spec.fused_qkv && self.cache_holds_views())
        {
            copies * call.key_tokens
        } else {
            Bytes::ZERO
        };
        (kv_cache, held)
    }

    /// Key positions the attention's cache holds in a no-grad forward: a static cache's
    /// positions per sequence, preallocated whatever the tokens so far (a sliding layer's at
    /// most its window, as transformers' `StaticSlidingWindowLayer`); else the keys it has seen.
    fn cached_positions(&self, call: &AttentionCall) -> Tokens {
        match self.static_positions(call) {
            Some(positions) => self.batch * positions,
            None => call.key_tokens,
        }
    }

    /// Positions per sequence of the static cache this self-attention reads whole in every
    /// forward of a generation (`Workload::static_cache_positions`); None without one.
    fn static_positions(&self, call: &AttentionCall) -> Option<Tokens> {
        let positions = Tokens(self.workload.static_cache_positions()? as f64);
        if call.cross || !self.attention_caches(call) {
            return None;
        }
        Some(match call.shape.cached_keys {
            Some(window) if window < positions => window,
            _ => positions,
        })
    }

    /// Bytes alive while an attention reads a static cache whole (every position, written or
    /// not, under a boolean mask of `queries × positions`, which SDPA copies into an additive
    /// one). transformers (5.x) reads it so only to decode: its prefill slices the keys to the
    /// prompt's (`sdpa_attention_forward`: `is_causal` with no mask), and a one-token query of
    /// grouped heads is folded onto the key heads (`pack_gqa`) rather than the keys repeated;
    /// eager attention reads every position in prefill and decode alike: it repeats grouped
    /// keys and values (`repeat_kv`) and makes the scores over them and their softmax. gpt-fast reads all positions in every forward,
    /// repeats the keys and values to every head (`repeat_interleave`, a copy even at one
    /// repeat), and decodes in SDPA's math path (`decode_n_tokens` enables only math): fp32
    /// copies of the half-precision repeated keys and values and a scaled fp32 key copy
    /// (`key.transpose(-2, -1) * scaling_factor`). Sources: transformers 5.23
    /// `integrations/sdpa_attention.py` (`sdpa_attention_forward`, `pack_gqa`) and
    /// `models/llama/modeling_llama.py` (`eager_attention_forward`); torchao
    /// `_models/llama/model.py` at 62c239cf3, `Transformer.forward` (line 225) and
    /// `Attention.forward` (lines 302-305), `generate.py` `decode_n_tokens` (line 69);
    /// PyTorch `attention.cpp` `_scaled_dot_product_attention_math`. Zero without a static
    /// cache.
    pub(super) fn static_cache_reads(&self, call: &AttentionCall) -> Bytes {
        let Some(positions) = self.static_positions(call) else {
            return Bytes::ZERO;
        };
        let gpt_fast = self.gpt_fast();
        let decoding = call.shape.queries <= Tokens(1.0);
        let eager = !gpt_fast && call.kernel == AttentionKernel::Eager;
        if !gpt_fast && !decoding && !eager {
            return Bytes::ZERO;
        }
        // Eager attention's own terms count its scores, mask and repeated keys over the keys of
        // its shape: the cache adds the positions beyond them.
        let read = if eager {
            Tokens((positions.count() - call.shape.keys.count()).max(0.0))
        } else {
            positions
        };
        let (act, fp32) = (self.bytes.act, BytesPerElement::FP32);
        let keys = self.batch * read;
        let mask = (BytesPerElement::BOOL + act) * (call.query_tokens * read.as_width());
        let heads_width = call.q / self.split.tp;
        let grouped = self.spec.heads > self.spec.kv_heads;
        let repeated = if gpt_fast || (eager && grouped) {
            keys * act * (2.0 * heads_width)
        } else {
            Bytes::ZERO
        };
        // The scores at their no-grad peak, as over the attention's own keys (`score_bytes`).
        let scores = if eager {
            self.score_bytes(call.kernel).no_grad_peak()
                * (call.heads * (call.query_tokens * read.as_width()))
        } else {
            Bytes::ZERO
        };
        let math_copies = if gpt_fast && decoding {
            let copies = if act < fp32 { 3.0 } else { 1.0 };
            keys * fp32 * (copies * heads_width)
        } else {
            Bytes::ZERO
        };
        mask + repeated + scores + math_copies
    }

    /// Bytes per key token of the k and v copies a cache concatenates (this GPU's heads).
    fn cache_copy_bytes(&self) -> BytesPerToken {
        let spec = self.spec;
        (self.cached_key_bytes() * Width(spec.kv_width() as f64)
            + self.bytes.act * Width(spec.value_width() as f64))
            / self.split.tp
    }

    /// Bytes per key token the attention's cache keeps alive: copies of k and v; latent
    /// attention's latent; a prompt's cache of the layer's own tensors (an old release's),
    /// whose views keep a fused projection alive (decoding concatenates copies).
    fn cache_bytes(&self, call: &AttentionCall) -> BytesPerToken {
        let spec = self.spec;
        let act = self.bytes.act;
        let copies = self.cache_copy_bytes();
        match (spec.latent, self.old_release()) {
            (Some(_), _) => act * Width(spec.cache_width() as f64),
            (None, Some(old)) if call.shape.queries > Tokens(1.0) && !call.cross => {
                (old.prompt_cache_bytes(act, self.cached_key_bytes()) / self.split.tp).max(copies)
            }
            (None, _) => copies,
        }
    }

    /// What the cache a training forward returns keeps alive once its backward has run (the
    /// kernel's saved tensors are gone by then, the returned tensors are not): with `--loss
    /// none` the caller holds it, and a loop that keeps its last outputs has it alive through
    /// the next step's forward (`Unit::retained`).
    pub(super) fn retained_cache(&self, call: &AttentionCall) -> Bytes {
        if self.outputs_hold_cache() && !call.cross {
            self.cache_bytes(call) * call.key_tokens
        } else {
            Bytes::ZERO
        }
    }

    /// Does an old release's cache hold the layer's own tensors (views that keep a fused
    /// projection alive) rather than copies?
    pub(super) fn cache_holds_views(&self) -> bool {
        self.old_release()
            .is_some_and(|o| o.cache_holds_own_tensors())
    }
}
