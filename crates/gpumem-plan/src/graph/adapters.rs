//! LoRA and QLoRA adapters, and quantised weights dequantised while their matmuls run.

use super::sizes::{AttentionShape, Tally};
use super::TransformerGraph;
use crate::model::LayerKind;
use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Elements, Tokens, Width};
use crate::unit::Unit;
use crate::workload::Target;

/// What a block's saved inputs change by under LoRA on this GPU (`lora::SavedChange`, divided
/// among the tensor-parallel ranks), per token.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LoraInputs {
    /// q, k, v and o.
    pub(super) attention: BytesPerToken,
    /// The MLP's linears.
    pub(super) mlp: BytesPerToken,
    /// A cross-attention's q and o, per decoder token.
    pub(super) cross_queries: BytesPerToken,
    /// A cross-attention's k and v, per encoder token.
    pub(super) cross_keys: BytesPerToken,
}

impl TransformerGraph<'_> {
    /// Bytes per token a block's saved inputs change by under LoRA (`lora::saved_change`):
    /// frozen linears save nothing, each adapter its own input (PEFT's fp32 copy over a
    /// half-precision base, or dropout's output and mask). Measured on CPU with peft 0.21.
    pub(super) fn lora_inputs(&self, layer: LayerKind, cross_attention: bool) -> LoraInputs {
        let Some(lora) = self.workload.lora.filter(|_| self.training) else {
            return LoraInputs::default();
        };
        let half_base = self.bytes.residual < BytesPerElement::FP32;
        let adapter = self.adapter_bytes().bytes();
        // The output projection reads the attention kernel's output, which the kernel saves
        // anyway, unless eager attention (or per-head queries) makes a merged copy for it.
        let o_input_shared = !self.own_kernel.materialises_scores()
            && !self.fused_output_in_head_layout(self.own_kernel);
        let block = crate::lora::LoraBlock {
            act: self.bytes.act.bytes(),
            half_base,
            adapter,
            o_input_shared,
            litgpt: self.litgpt(),
            base_saves_inputs: self.workload.four_bit_base_saves_inputs(),
            cross_attention,
        };
        let change = crate::lora::saved_change(self.spec, layer, &lora, block);
        let tp = self.split.tp;
        LoraInputs {
            attention: BytesPerToken(change.attention) / tp,
            mlp: BytesPerToken(change.mlp) / tp,
            cross_queries: BytesPerToken(change.cross_queries) / tp,
            cross_keys: BytesPerToken(change.cross_keys) / tp,
        }
    }

    /// Short-lived bytes of the widest adapter's forward (`lora::adapter_widths`) over `tokens`
    /// of the block and `encoder_tokens` a cross-attention reads:
    /// * before `lora_A`, with dropout: the input's fp32 cast over a half-precision base (PEFT;
    ///   without dropout the cast is what `lora_A` saves), and on CPU the mask `native_dropout`
    ///   first makes in its input's dtype;
    /// * after `lora_B`: its output and the scaled copy (fp32 under PEFT, the activation dtype
    ///   under litgpt). Adding the scaled fp32 output to a half-precision base output makes an
    ///   fp32 sum; on CPU `TensorIterator` first copies the half-precision operand to fp32 (it
    ///   "creates temporaries for CPU operations"; CUDA kernels cast as they read).
    ///
    /// In grad mode the moment before `lora_A` also holds what the block has alive around the
    /// adapter (`Self::adapter_context`).
    pub(super) fn adapter_transient(
        &self,
        layer: LayerKind,
        tokens: Tokens,
        encoder_tokens: Tokens,
    ) -> Bytes {
        let Some(lora) = self.workload.lora.filter(|_| self.training) else {
            return Bytes::ZERO;
        };
        let cross_reads = encoder_tokens > Tokens::ZERO;
        let (own, cross) = crate::lora::adapter_widths(self.spec, layer, lora.targets, cross_reads);
        let (before, after) = self.adapter_moments(tokens, own);
        let own = (before + self.adapter_context(tokens, own)).max(after);
        let (before, after) = self.adapter_moments(encoder_tokens, cross);
        own.max(before.max(after))
    }

    /// What a block holds beside the widest-input adapter as its dropout runs, beyond the
    /// tensors it saves (PEFT's `Linear.forward` runs the base layer first, then each adapter
    /// on the same input): that input, alive as the caller's argument; the base linear's output
    /// (hidden-sized: the widest input is a down projection's, or an attention linear's); the
    /// residual stream the block adds its sublayers to; and, for an adapter reading the MLP's
    /// intermediate, the MLP's input (the post-attention norm's output), alive as the MLP's
    /// argument. The down projection is the block's last linear, so this moment comes with
    /// every tensor the block saves: in a checkpointed block's recomputation, the step's peak
    /// where the adapters are wide (seen on CPU traces of PEFT LoRA and QLoRA with
    /// checkpointing, with and without FSDP).
    fn adapter_context(&self, tokens: Tokens, widths: crate::lora::AdapterWidths) -> Bytes {
        let h = self.spec.hidden as f64;
        let act = self.bytes.act;
        let mlp_input = if widths.input > h { h } else { 0.0 };
        let hidden = tokens * act * Width(widths.input + 2.0 * h + mlp_input)
            + tokens * (self.bytes.residual - act) * Width(h);
        hidden / self.split.tp
    }

    /// What the adapters of a block's attention (`mlp` false) or MLP (`mlp` true) add to that
    /// sublayer's no-grad forward (a checkpointed block's forward in training), besides the
    /// base linear's output: the short-lived tensors of [`Self::adapter_transient`], made for
    /// one linear at a time. As the bytes and the size of each tensor after `lora_B` (the
    /// scaled output and the sum, one output-sized tensor each).
    pub(super) fn adapter_no_grad(
        &self,
        layer: LayerKind,
        tokens: Tokens,
        mlp: bool,
    ) -> (Bytes, Bytes) {
        let Some(lora) = self.workload.lora.filter(|_| self.training) else {
            return (Bytes::ZERO, Bytes::ZERO);
        };
        let widths = crate::lora::sublayer_adapter_widths(self.spec, layer, lora.targets, mlp);
        let tensor = tokens * self.adapter_bytes() * Width(widths.output) / self.split.tp;
        (self.adapter_tensors(tokens, widths), tensor)
    }

    /// The short-lived bytes of the widest adapter of `widths` over `tokens` (see
    /// [`Self::adapter_transient`]).
    fn adapter_tensors(&self, tokens: Tokens, widths: crate::lora::AdapterWidths) -> Bytes {
        let (before, after) = self.adapter_moments(tokens, widths);
        before.max(after)
    }

    /// The short-lived bytes of the widest adapter of `widths` over `tokens` before `lora_A`
    /// and after `lora_B` (see [`Self::adapter_transient`]).
    fn adapter_moments(
        &self,
        tokens: Tokens,
        widths: crate::lora::AdapterWidths,
    ) -> (Bytes, Bytes) {
        let Some(lora) = self.workload.lora.filter(|_| self.training) else {
            return (Bytes::ZERO, Bytes::ZERO);
        };
        let (fp32, none) = (BytesPerElement::FP32, BytesPerElement::ZERO);
        let cpu = self.workload.target == Target::Cpu;
        let adapter_dtype = self.adapter_bytes();
        // fp32 adapters over a half-precision base cast what they read and what they add.
        let casts = self.bytes.residual < fp32 && adapter_dtype > self.bytes.act;
        let before = if lora.dropout > 0.0 {
            let cast = if casts { adapter_dtype } else { none };
            cast + if cpu { adapter_dtype } else { none }
        } else {
            none
        };
        let after = 2.0 * adapter_dtype + if cpu && casts { fp32 } else { none };
        let tp = self.split.tp;
        (
            tokens * before * Width(widths.input) / tp,
            tokens * after * Width(widths.output) / tp,
        )
    }

    /// The gradient of the block's last adapter's output over `tokens`, made before a
    /// checkpointed block's recomputation starts and alive through it: the block output's
    /// gradient reaches the down projection's `result + lora_B(…) * scaling`, whose backward
    /// makes the scaled output's gradient in the adapters' dtype (PEFT's fp32 adapters over a
    /// half-precision base: the sum's cast back is undone first) before `lora_B`'s backward
    /// unpacks its saved input, which is what runs the recomputation (seen on CPU profiles of
    /// PEFT LoRA with non-reentrant checkpointing). Nothing where that linear has no adapter.
    pub(super) fn last_adapter_output_gradient(&self, layer: LayerKind, tokens: Tokens) -> Bytes {
        match self.workload.lora.filter(|_| self.training) {
            Some(lora) if crate::lora::adapts_last_linear(self.spec, layer, lora.targets) => {
                tokens * self.adapter_bytes() * Width(self.spec.hidden as f64) / self.split.tp
            }
            _ => Bytes::ZERO,
        }
    }

    /// Bytes per element of the LoRA adapters and of what they compute: PEFT's fp32 adapters
    /// (`Workload::fp32_adapters`), else the model's dtype (litgpt's adapters, and PEFT before
    /// 0.12 moved each adapter to its base weight's dtype).
    fn adapter_bytes(&self) -> BytesPerElement {
        if self.litgpt() {
            self.bytes.act
        } else if self.workload.fp32_adapters() {
            BytesPerElement::FP32
        } else {
            BytesPerElement(self.workload.dtype.bytes() as f64)
        }
    }

    /// Bytes a mixture of experts saves for the weights PEFT folds its router's and experts'
    /// adapters into (`lora::adapted_experts_bytes`).
    pub(super) fn lora_folded_experts(&self, layer: LayerKind) -> Bytes {
        match self
            .workload
            .lora
            .filter(|_| self.training && !self.litgpt())
        {
            Some(lora) => {
                let act = self.bytes.act.bytes();
                Bytes(crate::lora::adapted_experts_bytes(
                    self.spec, layer, &lora, act,
                )) / self.split.tp
            }
            None => Bytes::ZERO,
        }
    }

    /// What the first block of a decoder saves under LoRA that no gradient needs: autograd
    /// records from the first adapter on, and the block's input (the frozen embeddings' output)
    /// requires none. Its first norm records nothing; when no attention linear carries an
    /// adapter, neither does the attention, nor (blocks in sequence) the second norm; with a
    /// parallel residual (GPT-NeoX, Phi) both norms read the input, and an MLP without
    /// adapters records nothing either.
    pub(super) fn frozen_prefix(&self, shape: AttentionShape, layer: LayerKind) -> Bytes {
        let spec = self.spec;
        let Some(lora) = self.workload.lora.filter(|_| self.training) else {
            return Bytes::ZERO;
        };
        if spec.post_norm || spec.vision.is_some() || spec.dual.is_some() {
            return Bytes::ZERO;
        }
        let h = Width(spec.hidden as f64);
        let tokens = self.batch * shape.queries;
        let norm = tokens * self.norm_saved() / self.split.sequence;
        let change = self.lora_inputs(layer, false);
        let mut prefix = match (spec.parallel_residual, spec.shared_block_norm) {
            (true, false) => 2.0 * norm - tokens * self.bytes.residual * h / self.split.sequence,
            _ => norm,
        };
        if !crate::lora::adapts_attention(lora.targets) {
            let mut tally = Tally::default();
            let attention = self.attention(shape, false, &mut tally);
            let per_token = tally.sharded / self.split.tp
                + tally.replicated / self.split.sequence
                + change.attention;
            prefix += tokens * per_token + attention.key_saved + tally.core;
            if !spec.parallel_residual {
                prefix += norm;
            }
            // Nor do the experts' inputs need a gradient.
            if !self.litgpt() {
                let act = self.bytes.act.bytes();
                prefix += Bytes(crate::lora::folds_read_by_the_input(
                    spec, layer, &lora, act,
                )) / self.split.tp;
            }
        }
        if spec.parallel_residual && !crate::lora::adapts_mlp(lora.targets) {
            prefix += tokens * (self.mlp(layer) / self.split.tp + change.mlp);
        }
        // A 4-bit base that keeps its inputs keeps none that needs no gradient: the first
        // block's q, k and v read one.
        if crate::lora::adapts_attention(lora.targets) && self.workload.four_bit_base_saves_inputs()
        {
            prefix += tokens * self.bytes.act * h / self.split.sequence;
        }
        prefix
    }

    /// Bytes of the block's largest quantised weight dequantised while its matmul runs: a
    /// quantised checkpoint's inference (see `Quantization::dequantised_bytes`), or QLoRA's
    /// 4-bit base ([`Workload::four_bit_base`]).
    pub(super) fn dequantised(&self, layer: LayerKind, tokens: Tokens) -> Bytes {
        let elements = Elements(self.spec.largest_block_matrix(layer) as f64) / self.split.tp;
        self.dequantised_weight(elements, tokens)
    }

    /// Bytes a quantised weight of `elements` allocates while its matmul runs on `tokens`
    /// tokens: a quantised checkpoint in inference; QLoRA's 4-bit base always with gradients
    /// (`MatMul4Bit` dequantises in forward and again for the input's gradient), without them
    /// only for more than one token (a single token runs `gemv_4bit` on the packed weight).
    pub(super) fn dequantised_weight(&self, elements: Elements, tokens: Tokens) -> Bytes {
        let (elements, tokens) = (elements.count(), tokens.count());
        if let Some(quant) = self.workload.quant.filter(|_| !self.training) {
            return Bytes(quant.dequantised_bytes(elements, tokens, self.workload.dtype));
        }
        let Some((quant, stored)) = self.workload.four_bit_base() else {
            return Bytes::ZERO;
        };
        let tokens = if self.training {
            tokens.max(2.0)
        } else {
            tokens
        };
        Bytes(quant.dequantised_bytes(elements, tokens, stored))
    }

    /// The LM head of a litgpt QLoRA step: Lightning's bitsandbytes plugin replaces every
    /// `nn.Linear` built under `init_module`, the head's too, so the head's forward and its
    /// input's gradient dequantise its whole weight (once per chunk of a chunked loss).
    /// Unchanged otherwise (transformers keeps the output embedding unquantised).
    pub(super) fn four_bit_head(&self, head: Unit) -> Unit {
        if !self.workload.four_bit_lm_head() || !self.training || head.name != "head" {
            return head;
        }
        let elements = Elements((self.spec.vocab * self.spec.hidden) as f64) / self.split.tp;
        let dequantised = self
            .dequantised_weight(elements, self.batch * self.decoder_sequence())
            .bytes();
        Unit {
            forward_transient: head.forward_transient + dequantised,
            backward_transient: head.backward_transient + dequantised,
            ..head
        }
    }
}
