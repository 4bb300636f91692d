//! Bounds on model dimensions, and on the run values a command line gives beside them (a
//! global batch, the context per process). A config.json is user input: without bounds, 10⁹
//! layers make the estimator build 10⁹ units (an estimate is linear in layers) and 10¹⁸ hidden
//! overflows the parameter counts. Each bound is far above any published model, and together
//! with [`MAX_PARAMETERS`] they keep every count within `u64` and every estimate fast.

use crate::error::{PlanError, Result};
use crate::model::{Head, TransformerSpec};
use crate::workload::MAX_SIZE;

/// An upper bound on one kind of config dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// Largest accepted value.
    pub max: u64,
    /// What it bounds, for the error message.
    pub what: &'static str,
}

/// Blocks per stack (≤ 10⁴; the deepest published transformers have ~200).
pub const LAYERS: Bound = Bound {
    max: 10_000,
    what: "blocks per stack",
};
/// Widths: hidden size, MLP width, heads, head width, channels (≤ 10⁶; published: ≤ ~60 000).
pub const WIDTH: Bound = Bound {
    max: 1_000_000,
    what: "widths",
};
/// Tables: vocabulary, labels, token types, position buckets (≤ 10⁷; published: ≤ ~260 000).
pub const VOCAB: Bound = Bound {
    max: 10_000_000,
    what: "table sizes",
};
/// Experts per MoE layer (≤ 10⁴; published: ≤ ~400).
pub const EXPERTS: Bound = Bound {
    max: 10_000,
    what: "experts per layer",
};
/// Positions and image sides: the workload's own bound on sequence length and image size.
pub const POSITIONS: Bound = Bound {
    max: MAX_SIZE,
    what: "positions and image sides",
};

/// Samples per batch: the workload's own bound on a micro-batch, which the global batch a fit
/// reaches (`--global-batch`) keeps too, so that its accumulation stays within the bound.
pub const BATCH: Bound = Bound {
    max: MAX_SIZE,
    what: "samples per batch",
};

/// Tokens of one serving step (vLLM's `--max-num-batched-tokens`): the workload's own bound on
/// positions, which one step of a request of `--max-model-len` tokens needs.
pub const TOKENS_PER_STEP: Bound = Bound {
    max: MAX_SIZE,
    what: "tokens per step",
};

/// Most CUDA context and framework memory per process, MiB (`--context-mib`): 1 TiB, more
/// than any GPU holds (a context takes about 0.3 to 2 GiB).
pub const MAX_CONTEXT_MIB: u64 = 1 << 20;

/// Most memory outside PyTorch's allocator per process, bytes (vLLM's `--non-torch-bytes`):
/// the context's bound, 1 TiB.
pub const MAX_OUTSIDE_BYTES: u64 = MAX_CONTEXT_MIB << 20;

/// `mib` if it is a context size from 0 to [`MAX_CONTEXT_MIB`], else a typed error naming
/// `--context-mib` and the range.
pub fn check_context_mib(mib: u64) -> Result<u64> {
    at_most(
        "context-mib",
        mib,
        MAX_CONTEXT_MIB,
        "MiB (1 TiB, more than any GPU holds; a CUDA context and framework take about 300 to \
         2000 MiB)",
    )
}

/// `bytes` if it is a size of memory outside PyTorch's allocator from 0 to
/// [`MAX_OUTSIDE_BYTES`], else a typed error naming `field` and the range.
pub fn check_outside_bytes(field: &str, bytes: u64) -> Result<u64> {
    at_most(
        field,
        bytes,
        MAX_OUTSIDE_BYTES,
        "bytes (1 TiB, more than any GPU holds; cuBLAS and NCCL workspaces take a few GiB)",
    )
}

/// `value` if it is at most `max`, else a typed error naming `field` and the range from 0 to
/// `max`, followed by `unit` (the unit and why the bound).
fn at_most(field: &str, value: u64, max: u64, unit: &str) -> Result<u64> {
    if value <= max {
        Ok(value)
    } else {
        Err(PlanError::InvalidValue {
            name: field.to_string(),
            value: value.to_string(),
            reason: format!("must be between 0 and {max} {unit}"),
        })
    }
}

/// Most parameters a model may have (10¹⁵; the largest published models have ~2·10¹²).
pub const MAX_PARAMETERS: u64 = 1_000_000_000_000_000;

impl Bound {
    /// `value` if it is between 1 and the bound, else a typed error naming `field` and the range.
    pub fn check(self, field: &str, value: u64) -> Result<u64> {
        if (1..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(PlanError::InvalidValue {
                name: field.to_string(),
                value: value.to_string(),
                reason: format!(
                    "must be between 1 and {} (the planner's bound on {}, far above any real model)",
                    self.max, self.what
                ),
            })
        }
    }
}

/// An upper bound on the parameters of `t`, in `u128` so that no product overflows (every factor
/// is already within the bounds above): each matrix of a block is bounded by its widest
/// dimensions, each table by `rows × w` for the widest dimension `w`.
fn parameter_bound(t: &TransformerSpec) -> u128 {
    let wide = |x: u64| u128::from(x);
    let h = wide(t.hidden);
    // Every attention matrix is at most (h + a)² for its widest projection a; every MLP matrix
    // at most h × f for the widest MLP f.
    let a = [
        wide(t.heads) * wide(t.head_dim),
        wide(t.kv_heads) * wide(t.head_dim),
        wide(t.heads) * wide(t.latent.map_or(0, |l| l.nope_dim + l.value_dim + l.kv_rank)),
    ]
    .into_iter()
    .max()
    .unwrap_or(1);
    let f = [
        wide(t.intermediate),
        wide(t.moe.dense_intermediate),
        wide(t.moe.shared_intermediate),
    ]
    .into_iter()
    .max()
    .unwrap_or(1);
    let w = h.max(a).max(f).max(wide(t.embed_projection));
    // Self- and cross-attention (8 matrices), 3 MLP matrices per expert plus shared and dense
    // ones, a router row per expert, norms and biases.
    let per_block =
        8 * (h + a) * (h + a) + 3 * (wide(t.experts) + 2) * h * f + wide(t.experts) * h + 64 * w;
    let labels = match t.head {
        Head::SequenceClassification { labels } => labels,
        Head::ImageClassification { classes } => classes,
        _ => 0,
    };
    let rows = wide(t.vocab)
        + wide(t.learned_positions)
        + wide(t.token_types)
        + wide(t.embed_projection)
        + wide(labels)
        + w
        + 8;
    let patches = t.patches.map_or(0, |p| {
        let per_side = wide(p.image_size / p.patch);
        wide(p.channels) * wide(p.patch) * wide(p.patch) + per_side * per_side + 3
    });
    let audio = t
        .audio
        .map_or(0, |a| 3 * wide(a.mel_bins) + 3 * w + wide(a.frames) + 2);
    wide(t.layers + t.encoder_layers) * per_block
        + 4 * rows * w
        + (patches + audio) * w
        + 8 * w * w
        + 2 * wide(t.relative_attention_buckets) * wide(t.heads)
}

/// Rejects a transformer whose dimensions, each within its bound, multiply to more than
/// [`MAX_PARAMETERS`] (checked on an upper bound of the count, so the exact count fits too).
pub fn check_parameters(t: &TransformerSpec) -> Result<()> {
    let bound = parameter_bound(t);
    if bound > u128::from(MAX_PARAMETERS) {
        return Err(PlanError::InvalidValue {
            name: "model size".into(),
            value: format!("up to {bound} parameters"),
            reason: format!(
                "layers × widths² × experts and vocabulary × width exceed the planner's bound of \
                 {MAX_PARAMETERS} parameters; check num_hidden_layers, hidden_size, \
                 intermediate_size, num_local_experts and vocab_size"
            ),
        });
    }
    Ok(())
}
