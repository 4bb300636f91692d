//! Normalisation layers: what a norm saves.

use super::TransformerGraph;
use crate::model::Norm;
use crate::quantity::{BytesPerElement, BytesPerToken, Width};

impl TransformerGraph<'_> {
    /// Saved bytes per token of a norm (its input and, for RMSNorm, the normalised fp32 values).
    pub(super) fn norm_saved(&self) -> BytesPerToken {
        let h = Width(self.spec.hidden as f64);
        // fp32 statistics per row: LayerNorm's mean and reciprocal deviation, RMSNorm's one.
        let per_row = match self.spec.norm {
            Norm::LayerNorm => BytesPerToken(8.0),
            _ => BytesPerToken(4.0),
        };
        self.norm_element_bytes(self.bytes.residual) * h + per_row
    }

    /// Bytes per token of a norm's backward temporaries at their peak, beyond the gradient
    /// that flows through it: an RMSNorm written in Python (transformers', litgpt's) runs its
    /// fp32 chain back op by op, and at the variance's `pow` backward five fp32 hidden-sized
    /// tensors are alive (the product's gradient, the mean's expanded gradient and the pow
    /// backward's three; seen in a CPU profile of Llama's `LlamaRMSNorm` under PyTorch 2.15,
    /// eager ops that run alike on a GPU). LayerNorm's and Liger's are fused kernels that make
    /// only the input's gradient.
    pub(super) fn norm_backward_temporaries(&self) -> BytesPerToken {
        let h = Width(self.spec.hidden as f64);
        match self.spec.norm {
            Norm::LayerNorm => BytesPerToken(0.0),
            _ if self.liger() => BytesPerToken(0.0),
            Norm::RmsNorm | Norm::RmsNormOffset | Norm::RmsNormScaledInput => {
                5.0 * BytesPerElement::FP32 * h
            }
        }
    }

    /// Saved bytes per normalised element of an input of `input` bytes per element.
    pub(super) fn norm_element_bytes(&self, input: BytesPerElement) -> BytesPerElement {
        let fp32 = BytesPerElement::FP32;
        // Under LoRA the norms' weights are frozen: the product with the weight saves nothing,
        // so an RMSNorm keeps only the fp32 values its variance reads (LayerNorm saves its
        // input either way), and T5's `x * rsqrt(var)` its half-precision x beside them.
        let frozen = self.training && self.workload.lora.is_some();
        let litgpt = self.litgpt();
        let scaled_input = if self.spec.norm == Norm::RmsNormScaledInput && input < fp32 {
            input
        } else {
            BytesPerElement::ZERO
        };
        match self.spec.norm {
            // Liger-Kernel's RMSNorm saves its input as it came (and the per-row fp32
            // reciprocal RMS, counted per row), whether or not the weight trains.
            Norm::RmsNorm | Norm::RmsNormOffset if self.liger() => input,
            Norm::RmsNorm | Norm::RmsNormOffset | Norm::RmsNormScaledInput if frozen => {
                fp32 + scaled_input
            }
            Norm::LayerNorm => input,
            // litgpt's RMSNorm multiplies the fp32 normalised values by the weight in fp32
            // (`x_normed * weight.float()`): both fp32 tensors are saved.
            Norm::RmsNorm | Norm::RmsNormOffset if litgpt => BytesPerElement(8.0),
            // The fp32 copy the variance reads and the fp32 normalised values (scaled by
            // `1 + weight` before the cast back).
            Norm::RmsNormOffset => BytesPerElement(8.0),
            // The fp32 copy and the cast of the normalised values that the weight scales;
            // `x * rsqrt(var)` (T5) saves a half-precision x beside the fp32 copy.
            Norm::RmsNorm | Norm::RmsNormScaledInput => fp32 + input + scaled_input,
        }
    }
}
