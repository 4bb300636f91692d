//! Normalisation layers: what a norm saves.

use super::TransformerGraph;
use crate::model::Norm;

impl TransformerGraph<'_> {
    /// Saved bytes per token of a norm (its input and, for RMSNorm, the normalised fp32 values).
    pub(super) fn norm_saved(&self) -> f64 {
        let h = self.spec.hidden as f64;
        let per_row = match self.spec.norm {
            Norm::LayerNorm => 8.0,
            _ => 4.0,
        };
        self.norm_element_bytes(self.bytes.residual.0) * h + per_row
    }

    /// Saved bytes per normalised element of an input of `input` bytes per element.
    pub(super) fn norm_element_bytes(&self, input: f64) -> f64 {
        // Under LoRA the norms' weights are frozen: the product with the weight saves nothing,
        // so an RMSNorm keeps only the fp32 values its variance reads (LayerNorm saves its
        // input either way), and T5's `x * rsqrt(var)` its half-precision x beside them.
        let frozen = self.training && self.workload.lora.is_some();
        let litgpt = self.litgpt();
        let scaled_input = if self.spec.norm == Norm::RmsNormScaledInput && input < 4.0 {
            input
        } else {
            0.0
        };
        match self.spec.norm {
            Norm::RmsNorm | Norm::RmsNormOffset | Norm::RmsNormScaledInput if frozen => {
                4.0 + scaled_input
            }
            Norm::LayerNorm => input,
            // litgpt's RMSNorm multiplies the fp32 normalised values by the weight in fp32
            // (`x_normed * weight.float()`): both fp32 tensors are saved.
            Norm::RmsNorm | Norm::RmsNormOffset if litgpt => 8.0,
            // The fp32 copy the variance reads and the fp32 normalised values (scaled by
            // `1 + weight` before the cast back).
            Norm::RmsNormOffset => 8.0,
            // The fp32 copy and the cast of the normalised values that the weight scales;
            // `x * rsqrt(var)` (T5) saves a half-precision x beside the fp32 copy.
            Norm::RmsNorm | Norm::RmsNormScaledInput => 4.0 + input + scaled_input,
        }
    }
}
