//! Which attention kernel runs: chosen once per attention of a model under a workload, then
//! matched where the memory of its tensors differs.

use crate::model::TransformerSpec;
use crate::workload::{Attention, Dtype, Mode, Target, Workload, GROUPED_KEYS_TO_SDPA_SINCE};

/// The kernel one attention runs. What it materialises and saves for backward depends on it,
/// so the planner decides it once ([`AttentionKernel::choose`]) instead of from the flags at
/// each use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AttentionKernel {
    /// The scores and their softmax as the family's Python code makes them: `--attn eager`,
    /// a family that runs only eager attention, or SDPA where PyTorch's CPU kernels cannot
    /// take the model (see [`AttentionKernel::choose`]).
    Eager,
    /// SDPA's math path on the CPU: the scores materialised in fp32 (copies of half-precision
    /// inputs), its dropout a noise tensor of the probabilities' dtype.
    SdpaMathCpu,
    /// SDPA's math path on CUDA: fp32 scores as on the CPU, a 1-byte dropout mask, and its own
    /// causal bias where transformers built no mask.
    SdpaMathCuda,
    /// A fused SDPA kernel that lays its output out as the queries are: flash attention (and
    /// cuDNN's) on CUDA in half precision, PyTorch's CPU flash kernel in every dtype.
    SdpaFlash,
    /// CUDA's memory-efficient SDPA kernel, which fp32 runs (the others need half precision):
    /// it allocates its output token-major whatever the queries' layout.
    SdpaMemoryEfficient,
    /// FlashAttention-2 (`--attn flash`), half precision only: output laid out as the queries.
    FlashAttention2,
}

impl AttentionKernel {
    /// The kernel that runs one attention of `spec` under `workload` (a cross-attention where
    /// `cross`: SDPA's path can differ between the two).
    pub(super) fn choose(spec: &TransformerSpec, workload: &Workload, cross: bool) -> Self {
        let sdpa_runs_eager = spec.eager_only
            // PyTorch's CPU flash kernel takes T5's relative position bias as an additive
            // mask but gives it no gradient: in training every attention of the model
            // materialises its scores on CPU.
            || (workload.target == Target::Cpu
                && workload.mode == Mode::Train
                && spec.relative_attention_buckets > 0);
        match workload.attention {
            Attention::Eager => AttentionKernel::Eager,
            Attention::Flash => AttentionKernel::FlashAttention2,
            Attention::Sdpa if sdpa_math_fallback(spec, workload, cross) => match workload.target {
                Target::Cpu => AttentionKernel::SdpaMathCpu,
                Target::Gpu => AttentionKernel::SdpaMathCuda,
            },
            Attention::Sdpa if sdpa_runs_eager => AttentionKernel::Eager,
            // Flash attention needs half precision; CUDA runs fp32 in the memory-efficient
            // kernel (`_efficient_attention_forward`; the H200's op logs show no merge copy in
            // fp32).
            Attention::Sdpa
                if workload.target == Target::Gpu && workload.compute_dtype() == Dtype::Fp32 =>
            {
                AttentionKernel::SdpaMemoryEfficient
            }
            Attention::Sdpa => AttentionKernel::SdpaFlash,
        }
    }

    /// Does the kernel materialise the score matrix (and so save its softmax)?
    pub(super) fn materialises_scores(self) -> bool {
        matches!(
            self,
            AttentionKernel::Eager | AttentionKernel::SdpaMathCpu | AttentionKernel::SdpaMathCuda
        )
    }

    /// Is the kernel SDPA's math path (fp32 copies of its inputs, fp32 scores)?
    pub(super) fn is_math_path(self) -> bool {
        matches!(
            self,
            AttentionKernel::SdpaMathCpu | AttentionKernel::SdpaMathCuda
        )
    }

    /// Is the kernel one of SDPA's fused kernels (whose output and log-sum-exp per-op
    /// selective checkpointing saves: torchtitan lists the flash and memory-efficient ops,
    /// not FlashAttention-2's own)?
    pub(super) fn is_sdpa_fused(self) -> bool {
        matches!(
            self,
            AttentionKernel::SdpaFlash | AttentionKernel::SdpaMemoryEfficient
        )
    }

    /// Does a fused kernel return its output in the queries' layout, so that merging the heads
    /// of per-head contiguous queries is a copy?
    pub(super) fn output_in_query_layout(self) -> bool {
        matches!(
            self,
            AttentionKernel::SdpaFlash | AttentionKernel::FlashAttention2
        )
    }
}

/// Does SDPA fall back to its math path (scores materialised)? PyTorch's CPU flash kernel
/// takes one head width for queries, keys and values, and latent attention's values are
/// narrower than its keys (the CPU traces show the math path's matmul and softmax); CUDA's
/// memory-efficient kernel takes different widths. On CUDA, transformers hands grouped
/// keys to SDPA as they are (`enable_gqa`) when it builds no mask (causal, no sliding
/// window; earlier releases repeat them first); in fp32 no fused kernel takes them (flash
/// needs half precision, the memory-efficient kernel has no grouped keys), so the math
/// path runs (measured on an H200: docs/gpu.md). A self-attention with T5's relative
/// position bias (an additive per-head mask) runs it on CUDA too, in training and in
/// inference, in every dtype; its cross-attention, which has no bias, runs a fused kernel
/// (the H200's op logs). PyTorch's CPU flash kernel takes no dropout either
/// (`check_for_dropout` among its constraints): attention dropout in training runs the
/// math path on CPU. `cross`: the attention is a cross-attention.
fn sdpa_math_fallback(spec: &TransformerSpec, workload: &Workload, cross: bool) -> bool {
    match workload.target {
        Target::Cpu => {
            spec.latent
                .is_some_and(|l| l.nope_dim + l.rope_dim != l.value_dim)
                || (workload.mode == Mode::Train && spec.attention_dropout > 0.0)
        }
        Target::Gpu => {
            (spec.relative_attention_buckets > 0 && !cross)
                || workload.compute_dtype() == Dtype::Fp32
                    && spec.kv_heads < spec.heads
                    && spec.sliding.is_none()
                    && spec.decoder
                    && workload
                        .transformers
                        .is_none_or(|release| release >= GROUPED_KEYS_TO_SDPA_SINCE)
        }
    }
}

/// How grouped keys and values (fewer key heads than query heads) reach the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GroupedKeys {
    /// As projected: no grouping, or a fused kernel that takes grouped keys.
    AsProjected,
    /// Repeated to every head before a kernel that materialises the scores (transformers'
    /// `repeat_kv`), which saves the repeated copies.
    RepeatedForScores,
    /// Repeated to every head by litgpt (`repeat_interleave`) before a fused kernel, which
    /// saves the repeated copies instead of the grouped ones.
    RepeatedByLitgpt,
}

impl GroupedKeys {
    /// How `spec`'s keys reach `kernel` (`litgpt`: the step runs litgpt's own model).
    pub(super) fn of(spec: &TransformerSpec, kernel: AttentionKernel, litgpt: bool) -> Self {
        if spec.heads <= spec.kv_heads {
            GroupedKeys::AsProjected
        } else if kernel.materialises_scores() {
            GroupedKeys::RepeatedForScores
        } else if litgpt {
            GroupedKeys::RepeatedByLitgpt
        } else {
            GroupedKeys::AsProjected
        }
    }
}
