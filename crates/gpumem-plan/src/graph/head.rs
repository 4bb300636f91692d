//! The model's head: an LM head's logits (their loss is in `loss`), or a pooled or
//! classification head.

use super::loss::LogitsUse;
use super::TransformerGraph;
use super::Unit;
use crate::model::Head;
use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Elements, Tokens, Width};
use crate::workload::{Loss, Mode, Target};

/// The tensors of an LM head under a workload, whichever way its logits are then used.
#[derive(Debug, Clone, Copy)]
pub(super) struct LmLogits {
    /// Positions the head runs on: the decoder's, over the micro-batch.
    pub(super) tokens: Tokens,
    /// Vocabulary entries on this GPU: the logits' width.
    pub(super) vocab: Width,
    /// Positions whose logits are made (generate keeps only the last one's).
    pub(super) logits_tokens: Tokens,
    /// The logits.
    pub(super) logits: Bytes,
    /// Soft-capped logits: the division's output, and tanh's saved for backward.
    pub(super) softcap: Bytes,
    /// Saved by a masked-LM transform (dense → GELU → LayerNorm).
    pub(super) transform: BytesPerToken,
    /// T5's rescaled copy of the decoder output.
    pub(super) rescale: BytesPerToken,
    /// The log-probabilities the loss saves, per element.
    pub(super) loss_bytes: BytesPerElement,
    /// CUDA's autocast runs log_softmax in half precision on logits the model does not upcast.
    pub(super) half_log_probs: bool,
    /// The logits' fp32 copy (none where the loss reads them as they are).
    pub(super) fp32_copy: Bytes,
    /// The logits' gradient with the bias gradient's staging.
    pub(super) logits_gradient: Bytes,
    /// What the head's matmul and the final norm save.
    pub(super) head_saved: Bytes,
    /// The gradient of the head's input.
    pub(super) input_gradient: Bytes,
    /// Does the family's forward upcast all logits to fp32 (an old release)?
    pub(super) upcast_all: bool,
    /// Parameters of the head.
    pub(super) params: u64,
}

impl TransformerGraph<'_> {
    /// The model's head unit: an LM head with its loss, or a pooled or classification head.
    pub(super) fn head(&self) -> Unit {
        match self.spec.head {
            Head::CausalLm | Head::Seq2SeqLm | Head::MaskedLm => {
                let logits = self.lm_logits();
                match LogitsUse::of(self.workload) {
                    LogitsUse::Summed => self.summed_logits_head(&logits),
                    LogitsUse::ChunkedLoss => self.chunked_lm_head(&logits),
                    LogitsUse::FullLoss => self.full_loss_head(&logits),
                    LogitsUse::NoGrad => self.no_grad_lm_head(&logits),
                }
            }
            Head::Pooler
            | Head::AttentionPool
            | Head::None
            | Head::SequenceClassification { .. }
            | Head::ImageClassification { .. } => self.pooled_head(),
        }
    }

    /// Saved bytes per token of the final norm, if the model has one.
    fn final_norm_saved(&self) -> BytesPerToken {
        if self.spec.final_norm {
            self.norm_saved()
        } else {
            BytesPerToken::ZERO
        }
    }

    /// The LM head's tensors under this workload.
    fn lm_logits(&self) -> LmLogits {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, Width(spec.hidden as f64));
        let fp32 = BytesPerElement::FP32;
        let tokens = self.batch * self.decoder_sequence();
        let vocab = Width(spec.vocab as f64) / self.split.tp;
        let transform = if spec.head == Head::MaskedLm {
            // dense → GELU → LayerNorm before the decoder.
            self.bytes.linear_input(h, 1.0) + act * 2.0 * h + self.bytes.residual * h
        } else {
            BytesPerToken::ZERO
        };
        // T5 rescales the decoder output before the tied LM head: a fresh tensor.
        let rescale = if spec.rescaled_output {
            self.bytes.residual * h
        } else {
            BytesPerToken::ZERO
        };
        let (full_prompt, upcast_all) = self.old_logits();
        // gpt-fast's `Transformer.forward` computes every prompt position's logits
        // (`logits = self.output(x)`), in the model's dtype.
        let full_prompt = full_prompt || self.gpt_fast();
        let logits_tokens = if self.workload.mode == Mode::Generate && !full_prompt {
            // One position per sequence.
            Tokens(self.batch)
        } else {
            tokens
        };
        let logits = logits_tokens * vocab * act;
        // Causal LMs upcast logits before the loss (transformers' `ForCausalLMLoss`:
        // `logits.float()`), a hand-written loop's `F.cross_entropy` does not; autocast runs
        // cross-entropy in fp32; masked-LM and T5 heads take the loss in the activation dtype.
        let model_upcasts = spec.head == Head::CausalLm
            && !(self.workload.mode == Mode::Train && self.workload.loss == Loss::CrossEntropy);
        let upcast = model_upcasts || self.workload.amp.is_some();
        // Except CUDA's autocast on half-precision logits that the model does not
        // upcast: `cross_entropy` names the logits' dtype for its log_softmax, which so
        // runs (and saves its output) in half precision, and nll_loss, an fp32 op,
        // saves the fp32 copy of the log-probabilities it reads. CPU's autocast casts
        // the logits to fp32 before log_softmax.
        let half_log_probs =
            upcast && !model_upcasts && self.workload.target == Target::Gpu && act < fp32;
        let loss_bytes = if upcast && !half_log_probs { fp32 } else { act };
        // A masked-LM decoder's (or a biased LM head's) bias gradient sums the logits'
        // gradient through a staging buffer beside the input's gradient.
        let bias_staging = if spec.head == Head::MaskedLm || spec.lm_head_bias {
            self.bias_gradient_staging(logits_tokens, vocab)
        } else {
            Bytes::ZERO
        };
        let saved_per_token = self.final_norm_saved() + transform + rescale + self.head_input();
        LmLogits {
            tokens,
            vocab,
            logits_tokens,
            logits,
            softcap: if spec.logit_softcap {
                logits
            } else {
                Bytes::ZERO
            },
            transform,
            rescale,
            loss_bytes,
            half_log_probs,
            fp32_copy: if loss_bytes == act && !half_log_probs {
                Bytes::ZERO
            } else {
                logits_tokens * vocab * fp32
            },
            logits_gradient: logits + bias_staging,
            // What the head's matmul and the final norm save: alive while the head's
            // backward makes the gradient of its input and then of its weight (the final
            // norm's backward comes after).
            head_saved: tokens * saved_per_token + self.autocast_lm_weight(),
            input_gradient: tokens * act * h,
            upcast_all,
            params: spec.params_of_head(),
        }
    }

    /// Bytes of the LM head weight's autocast copy (none without autocast).
    fn autocast_lm_weight(&self) -> Bytes {
        if self.bytes.autocast {
            self.bytes.act * Elements((self.spec.vocab * self.spec.hidden) as f64) / self.split.tp
        } else {
            Bytes::ZERO
        }
    }

    /// A pooler, classification or bare head (and a SigLIP attention pool without gradients).
    fn pooled_head(&self) -> Unit {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, Width(spec.hidden as f64));
        let tokens = self.batch * self.decoder_sequence();
        // A classifier on the first token keeps the whole final-norm output alive through its view.
        let keeps_norm_output =
            matches!(spec.head, Head::ImageClassification { .. }) && spec.final_norm;
        // One pooled position per sample, and its pooler's output.
        let pooled = Tokens(self.batch) * h * act * 2.0;
        let saved = tokens
            * (self.final_norm_saved()
                + if keeps_norm_output {
                    self.bytes.residual * h
                } else {
                    BytesPerToken::ZERO
                })
            + pooled;
        let hidden = tokens * self.bytes.residual * h;
        Unit {
            name: "head",
            saved: if self.training { saved.bytes() } else { 0.0 },
            inference_live: (hidden + pooled).bytes(),
            backward_transient: hidden.bytes(),
            gradient_transient: hidden.bytes(),
            params: spec.params_of_head(),
            ..Unit::default()
        }
    }

    /// Bytes per token the LM head's matmul saves of its input: the input, for its weight's
    /// gradient; nothing when the head is frozen (LoRA), unless it is a 4-bit linear that keeps
    /// its input anyway (litgpt quantises its head; bitsandbytes before 0.43.2).
    pub(super) fn head_input(&self) -> BytesPerToken {
        let h = Width(self.spec.hidden as f64);
        if self.workload.lora.is_none() {
            self.bytes.linear_input(h, 1.0)
        } else if self.workload.four_bit_lm_head() && self.workload.four_bit_base_saves_inputs() {
            self.bytes.act * h
        } else {
            BytesPerToken::ZERO
        }
    }

    /// Do this run's logits cover every prompt position in generate's prefill (a release
    /// before the family's `logits_to_keep`), and does the family's forward then upcast them
    /// all to fp32?
    pub(super) fn old_logits(&self) -> (bool, bool) {
        self.old_release().map_or((false, false), |old| {
            (old.full_prompt_logits(), old.upcast_all_logits())
        })
    }
}
