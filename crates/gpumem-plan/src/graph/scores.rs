//! Bytes per score element of a materialised softmax.

use super::kernel::AttentionKernel;
use super::TransformerGraph;
use crate::quantity::BytesPerElement;
use crate::workload::Dtype;

/// Bytes per score element of eager attention's softmax, by the tensors that exist.
#[derive(Debug, Clone, Copy)]
pub(super) struct ScoreBytes {
    /// The scores in the activation dtype (the softmax's input).
    pub(super) input: BytesPerElement,
    /// The softmax output: fp32 where the family upcasts (`softmax(..., dtype=torch.float32)`)
    /// or autocast runs softmax in fp32, else the activation dtype.
    pub(super) probs: BytesPerElement,
    /// The fp32 copy of a bf16 input that `softmax(x, dtype=float32)` converts first: PyTorch's
    /// fused `half_to_float` kernel takes fp16 on CUDA only (aten/src/ATen/native/SoftMax.cpp).
    pub(super) conversion: BytesPerElement,
    /// The cast of fp32 probabilities back to the activation dtype.
    pub(super) cast: BytesPerElement,
    /// `tanh` soft-capping of the scores: its output, saved for backward and alive beside the
    /// scores without gradients.
    pub(super) softcap: BytesPerElement,
    /// Dropout on the probabilities in training: a 1-byte mask and the output.
    pub(super) dropout: BytesPerElement,
    /// The masked scores an old release's clamp (`torch.max`) saves for backward.
    pub(super) clamp: BytesPerElement,
    /// The tensor the softmax ran on, which PyTorch before 1.11 saved for backward beside its
    /// output ([`crate::workload::SOFTMAX_SAVES_OUTPUT_ONLY_SINCE`]): the scores, or the fp32
    /// copy autocast (or a bf16 input's conversion) hands the softmax.
    pub(super) softmax_input: BytesPerElement,
}

impl ScoreBytes {
    /// Saved for backward: the softmax output, and what the matmul with the values saves: the
    /// cast, or with dropout its mask and output (dropout runs on the cast, or under autocast
    /// on the fp32 probabilities, whose half-precision copy for the matmul is the same size).
    pub(super) fn saved(&self) -> BytesPerElement {
        let into_values = if self.dropout > BytesPerElement::ZERO {
            self.dropout
        } else {
            self.cast
        };
        self.probs + into_values + self.softcap + self.clamp + self.softmax_input
    }

    /// Peak in a no-grad forward: the input stays named while the softmax makes its fp32 copy
    /// and output, then while the output is cast (`x = softmax(x, ...).to(dtype)`).
    pub(super) fn no_grad_peak(&self) -> BytesPerElement {
        self.input + self.softcap + self.probs + self.conversion.max(self.cast)
    }

    /// The probabilities the attention returns (the cast if any, else the softmax output).
    pub(super) fn returned(&self) -> BytesPerElement {
        if self.cast > BytesPerElement::ZERO {
            self.cast
        } else {
            self.probs
        }
    }
}

impl TransformerGraph<'_> {
    /// Bytes per score element of a materialised attention's softmax under `kernel`, with the
    /// softmax's input saved too under a PyTorch release that saved it.
    pub(super) fn score_bytes(&self, kernel: AttentionKernel) -> ScoreBytes {
        let mut score = self.kernel_score_bytes(kernel);
        if self.workload.softmax_saves_input() {
            score.softmax_input =
                if self.workload.amp.is_some() || score.conversion > BytesPerElement::ZERO {
                    score.probs
                } else {
                    score.input
                };
        }
        score
    }

    /// Bytes per score element of a materialised attention's softmax under `kernel`, as
    /// today's PyTorch saves them.
    fn kernel_score_bytes(&self, kernel: AttentionKernel) -> ScoreBytes {
        let input = self.bytes.act;
        let dropout = if self.dropout_active(self.spec.attention_dropout) {
            BytesPerElement::BOOL + input
        } else {
            BytesPerElement::ZERO
        };
        let old = self.old_release();
        let clamp = if old.is_some_and(|o| o.clamps_scores()) {
            input
        } else {
            BytesPerElement::ZERO
        };
        if old.is_some_and(|o| o.fp32_rotary()) && input < BytesPerElement::FP32 {
            // fp32 queries and keys: fp32 scores and softmax, cast to the values' dtype.
            return ScoreBytes {
                input: BytesPerElement::FP32,
                probs: BytesPerElement::FP32,
                conversion: BytesPerElement::ZERO,
                cast: input,
                softcap: BytesPerElement::ZERO,
                dropout,
                clamp,
                softmax_input: BytesPerElement::ZERO,
            };
        }
        // SDPA's math fallback computes in fp32: the scores and their softmax. Its dropout is
        // `at::dropout`: CUDA's fused kernel keeps a 1-byte mask, CPU's `_dropout` a noise
        // tensor of the probabilities' dtype (`empty_like(input).bernoulli_`).
        let math_dropout_mask = match kernel {
            AttentionKernel::SdpaMathCpu => Some(BytesPerElement::FP32),
            AttentionKernel::SdpaMathCuda => Some(BytesPerElement::BOOL),
            _ => None,
        };
        if let Some(mask) = math_dropout_mask {
            return ScoreBytes {
                input: BytesPerElement::FP32,
                probs: BytesPerElement::FP32,
                conversion: BytesPerElement::ZERO,
                cast: BytesPerElement::ZERO,
                softcap: BytesPerElement::ZERO,
                dropout: if dropout > BytesPerElement::ZERO {
                    mask + BytesPerElement::FP32
                } else {
                    BytesPerElement::ZERO
                },
                clamp,
                softmax_input: BytesPerElement::ZERO,
            };
        }
        // OPT before 4.49 upcast the softmax of fp16 scores only (bf16 ran in bf16).
        let upcasts = self.spec.softmax_fp32
            && !(old.is_some_and(|o| o.upcasts_fp16_softmax_only())
                && self.workload.compute_dtype() != Dtype::Fp16);
        let probs = if upcasts || self.workload.amp.is_some() {
            BytesPerElement::FP32
        } else {
            input
        };
        let upcast = probs != input;
        ScoreBytes {
            input,
            probs,
            conversion: if upcast && self.workload.compute_dtype() == Dtype::Bf16 {
                probs
            } else {
                BytesPerElement::ZERO
            },
            cast: if upcast { input } else { BytesPerElement::ZERO },
            softcap: if self.spec.attention_softcap {
                input
            } else {
                BytesPerElement::ZERO
            },
            dropout,
            clamp,
            softmax_input: BytesPerElement::ZERO,
        }
    }
}
