//! Element sizes, tensor-parallel split, attention shapes and the per-block tally the parts add to.

use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Tokens, Width};
use crate::workload::Workload;

/// Bytes per element for the tensors of a workload.
#[derive(Debug, Clone, Copy)]
pub(super) struct ElementSizes {
    /// Activations computed by matmuls (the autocast dtype under AMP).
    pub(super) act: BytesPerElement,
    /// The residual stream and norm outputs (fp32 under autocast with fp32 weights).
    pub(super) residual: BytesPerElement,
    /// Autocast copies inputs per linear call instead of saving one shared tensor.
    pub(super) autocast: bool,
}

impl ElementSizes {
    /// The element sizes of `workload`.
    pub(super) fn of(workload: &Workload) -> Self {
        let act = BytesPerElement(workload.compute_dtype().bytes() as f64);
        let residual = BytesPerElement(workload.module_dtype().bytes() as f64);
        ElementSizes {
            act,
            residual,
            autocast: workload.amp.is_some() && residual != act,
        }
    }

    /// Bytes per token saved for a norm output of `width` read by `consumers` linear layers.
    pub(super) fn linear_input(&self, width: Width, consumers: f64) -> BytesPerToken {
        if self.autocast {
            self.act * width * consumers
        } else {
            self.residual * width
        }
    }
}

/// Tensor-parallel split: terms inside attention/MLP divide by `tp`, the rest only with SP.
#[derive(Debug, Clone, Copy)]
pub(super) struct Split {
    /// Tensor-parallel degree.
    pub(super) tp: f64,
    /// What sequence parallelism divides the rest by (the TP degree with SP, else 1).
    pub(super) sequence: f64,
}

/// Sequence lengths of one attention: queries and keys.
#[derive(Debug, Clone, Copy)]
pub(super) struct AttentionShape {
    /// Query tokens per sequence.
    pub(super) queries: Tokens,
    /// Key tokens per sequence.
    pub(super) keys: Tokens,
    /// Causal (a decoder's self-attention).
    pub(super) causal: bool,
    /// Key tokens per sequence a sliding-window layer attends to and keeps in its cache while
    /// decoding; None: all.
    pub(super) cached_keys: Option<Tokens>,
}

/// Per-token and per-score byte counts of one block, before multiplying by tokens.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tally {
    /// Saved bytes per token inside tensor-parallel regions.
    pub(super) sharded: BytesPerToken,
    /// Saved bytes per token outside them (norm inputs, residual, dropout masks).
    pub(super) replicated: BytesPerToken,
    /// Saved bytes of the attention core, absolute.
    pub(super) core: Bytes,
}
