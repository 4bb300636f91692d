//! Element types of weights and activations: below the model (a checkpoint's dtype) and the
//! workload (its precision settings), which both name them.

use serde::Serialize;

/// Element type of weights or activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    Fp32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    Fp16,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp32 => 4,
            Dtype::Bf16 | Dtype::Fp16 => 2,
        }
    }
}

/// Names of each dtype (`--dtype`, `--amp`, a quantisation's compute dtype).
pub const DTYPES: &[(&str, Dtype)] = &[
    ("fp32", Dtype::Fp32),
    ("float32", Dtype::Fp32),
    ("bf16", Dtype::Bf16),
    ("bfloat16", Dtype::Bf16),
    ("fp16", Dtype::Fp16),
    ("float16", Dtype::Fp16),
];
