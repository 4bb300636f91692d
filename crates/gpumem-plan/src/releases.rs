//! Library releases whose memory behaviour changed: the [`Release`] type (`--transformers`,
//! `--bitsandbytes`, `--peft`, `--deepspeed`, `--torch`), the first release of each library
//! that changed (the `*_SINCE` boundaries, each with the change it marks), and what older
//! transformers releases' modelling code did differently, family by family, and the first
//! release of each family that stopped (`--transformers`). Every boundary is read from the
//! released sources (`transformers/models/<family>/modeling_<family>.py` of each release); the
//! memory each change makes is measured on CPU under the old release (`measured_settings.jsonl`,
//! the `tf4.44.2` and `tf4.46.3` cases).
//!
//! The Llama family moved first (4.45: last-token logits in generate, no fp32 upcast of all
//! logits); GPT-NeoX, GPT-2, OPT and BigCode kept their older code for several releases more.

use crate::model::{Architecture, ModelSpec, TransformerSpec};
use crate::quantity::{BytesPerElement, BytesPerToken, Width};
use serde::Serialize;

use crate::error::Result;
use crate::workload::{invalid, Attention, Workload};

/// A release of a library whose memory behaviour changed between versions: transformers
/// (`--transformers`), bitsandbytes (`--bitsandbytes`), PEFT (`--peft`), DeepSpeed
/// (`--deepspeed`) or PyTorch (`--torch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Release {
    /// Major version.
    pub major: u64,
    /// Minor version.
    pub minor: u64,
    /// Patch version (0 when not given).
    pub patch: u64,
}

/// The first transformers release taken to hand grouped keys to SDPA unrepeated
/// (`enable_gqa`, its attention-interface rewrite); earlier ones repeat them (`repeat_kv`).
pub const GROUPED_KEYS_TO_SDPA_SINCE: Release = Release::new(4, 48, 0);

/// The first bitsandbytes release whose 4-bit matmul (`MatMul4Bit`) no longer keeps its input
/// for backward (bitsandbytes PR #1270, "delete useless buffered activation"): before it,
/// `ctx.tensors = (A, B)` held every frozen 4-bit linear's input until its backward ran,
/// though only the weight is needed for the input's gradient.
pub const BNB_4BIT_MATMUL_FREES_INPUT_SINCE: Release = Release::new(0, 43, 2);

/// The first PEFT release that keeps LoRA adapters in fp32 over a half-precision base
/// (`get_peft_model(..., autocast_adapter_dtype=True)`, `BaseTuner._cast_adapter_dtype`, peft
/// 0.12.0 `tuners/tuners_utils.py`). Before it `LoraLayer.update_layer` moved each new adapter
/// to the base weight's device and dtype (peft 0.9.0-0.11.1 `tuners/lora/layer.py`,
/// `self.to(weight.device, dtype=weight.dtype)`): bf16 adapters over a bf16 base, and so bf16
/// dropout outputs, gradients and optimizer states.
pub const PEFT_FP32_ADAPTERS_SINCE: Release = Release::new(0, 12, 0);

/// The first DeepSpeed release that installs its ZeRO-3 linear (`zero3_linear_wrap`, which saves
/// the weight parameter itself for backward) for a model handed to `deepspeed.initialize`
/// already built (DeepSpeed PR #8189, commit 617061d6, in v0.19.4: `Init.__init__` calls
/// `_enable_mem_efficient_linear` when given a `module`). Before it only entering a
/// `deepspeed.zero.Init()` context patched `torch.nn.functional.linear` (v0.14.2
/// `partition_parameters.py` 317-327 and 548-553, in `patch_init_and_builtins`), so a model
/// loaded without one ran PyTorch's own linear, whose backward keeps `weight.t()`, a view of the
/// gathered weight's storage: see [`Workload::zero3_keeps_gathered_linears`].
pub const DEEPSPEED_LINEAR_WRAPPER_FOR_BUILT_MODELS_SINCE: Release = Release::new(0, 19, 4);

/// The first DeepSpeed release whose ZeRO-1/2 inf/NaN check (`stage_1_and_2.py`
/// `_has_inf_or_nan`) builds `isnan`, `isinf` and `logical_or` masks beside the gradient's fp32
/// copy and converts the or to fp32 (v0.14.0, lines 2015-2020); v0.13.x summed the fp32 copy
/// (`float(x.float().sum())`). See `distributed/mod.rs` `zero_offload_overflow_check`.
pub const DEEPSPEED_OVERFLOW_CHECK_MASKS_SINCE: Release = Release::new(0, 14, 0);

/// The first PyTorch release whose foreach Adam and AdamW keep one parameter-sized
/// intermediate through the step (pytorch/pytorch PRs #104780 and #104898, merged in July 2023
/// for 2.1: `torch._foreach_add_(exp_avg_sq_sqrt, eps)` in place). Before it
/// `_multi_tensor_adam` / `_multi_tensor_adamw` (torch 2.0.1 `torch/optim/adam.py` and
/// `adamw.py`, the non-capturable branch) made `exp_avg_sq_sqrt = torch._foreach_sqrt(...)`
/// and then `denom = torch._foreach_add(exp_avg_sq_sqrt, eps)`, both alive at the
/// `_foreach_addcdiv_` that updates the parameters: two copies of every parameter's size in
/// the states' dtype (issue #97712 documents them).
pub const FOREACH_ADAM_ONE_INTERMEDIATE_SINCE: Release = Release::new(2, 1, 0);

/// The first PyTorch release whose softmax keeps only its output for backward (PR #66018,
/// the reland of #65242, October 2021: `derivatives.yaml` passes `self.scalar_type()` to
/// `_softmax_backward_data`). Before it the formula was `_softmax_backward_data(grad, result,
/// dim, self)`, so autograd saved the softmax's input beside its output although the kernels
/// never read it (issue #64000): an eager attention kept its scores, one more score-sized
/// tensor per layer, until its backward.
pub const SOFTMAX_SAVES_OUTPUT_ONLY_SINCE: Release = Release::new(1, 11, 0);

impl Release {
    /// The release `major.minor.patch`.
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Release {
            major,
            minor,
            patch,
        }
    }

    /// Parses `library`'s release as `MAJOR.MINOR` or `MAJOR.MINOR.PATCH` (e.g. `4.44.2`),
    /// with a typed error naming the flag and the accepted form.
    pub fn parse(library: &str, text: &str) -> Result<Self> {
        let parts: Vec<&str> = text.trim().split('.').collect();
        let numbers: Option<Vec<u64>> = parts
            .iter()
            .map(|p| {
                (!p.is_empty() && p.len() <= 6 && p.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| p.parse().ok())
                    .flatten()
            })
            .collect();
        let any = |major: u64, minor: u64| major > 0 || minor > 0;
        match numbers.as_deref() {
            Some(&[major, minor]) if any(major, minor) => Ok(Self::new(major, minor, 0)),
            Some(&[major, minor, patch]) if any(major, minor) => Ok(Self::new(major, minor, patch)),
            _ => Err(invalid(
                library,
                text,
                format!(
                    "must be a {library} release as MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. \
                     4.44.2 or 0.42.0 (no pre-release suffix)"
                ),
            )),
        }
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The transformers patch release that gave Llama's rotary embedding its `_cos_cached` and
/// `_sin_cached` tables back "for BC" (4.38.2, `modeling_llama.py` lines 102-111; 4.38.0 and
/// 4.38.1 had none), and turned 4.38's `LlamaModel.causal_mask` buffer from int64 to bool.
const LLAMA_BC_ROTARY_TABLES_SINCE: Release = Release::new(4, 38, 2);

/// A release as `(major, minor)`, for the tables below.
type Since = (u64, u64);

/// The first release whose `generate` asks the family's model for the last position's logits
/// only in the prefill (`num_logits_to_keep` / `logits_to_keep` in its `ForCausalLM.forward`;
/// PR huggingface/transformers#31292 for the Llama family). Before it the prefill computes the
/// logits of every prompt position.
fn last_token_logits_since(model_type: &str) -> Since {
    match model_type {
        "gpt_neox" => (4, 49),
        "gpt2" => (4, 53),
        "opt" | "gpt_bigcode" => (5, 0),
        _ => (4, 45),
    }
}

/// `model_type`s whose `ForCausalLM.forward` ran `logits = logits.float()` on every position
/// before 4.45 (read from the 4.44.2 sources: llama, mistral, mixtral, gemma, gemma2, phi, phi3,
/// qwen2; GPT-2, GPT-NeoX, OPT and BigCode kept the logits in the model dtype). PR #31292 upcast
/// only when labels are given.
const UPCAST_ALL_LOGITS_BEFORE_4_45: &[&str] = &[
    "llama", "mistral", "mixtral", "gemma", "gemma2", "phi", "phi3", "qwen2",
];

/// The first release whose family decodes with a cache class (`DynamicCache`) instead of a
/// tuple of per-layer `(key, value)` tensors; None: the family never had a tuple cache.
///
/// The Llama family's models took a `DynamicCache` in 4.36 (`modeling_llama.py` 4.36.0:
/// `DynamicCache.from_legacy_cache`), but `generate` still started from no cache, so each
/// forward wrapped the tuple it was given and returned `to_legacy_cache()`: the previous
/// step's tuple stayed referenced by `model_kwargs` as before. 4.42 made `generate` start from
/// `DynamicCache()` for every model with `_supports_cache_class` (`generation/utils.py` 4.42.4,
/// lines 1775-1783, "avoid back and forth from legacy format that keeps copying the cache"):
/// llama, mistral, mixtral, qwen2, gemma, phi and phi3 among the catalogue's families.
fn cache_class_since(model_type: &str) -> Option<Since> {
    match model_type {
        "llama" | "mistral" | "mixtral" | "qwen2" | "gemma" | "phi" | "phi3" => Some((4, 42)),
        "gpt_neox" => Some((4, 45)),
        "opt" => Some((4, 49)),
        "gpt2" => Some((4, 52)),
        "gpt_bigcode" => Some((4, 56)),
        _ => None,
    }
}

/// The first transformers release whose mixture-of-experts blocks hold the routed experts as
/// two 3-D parameters (`gate_up_proj`, `down_proj`) rather than a list of expert MLPs (read
/// from `modeling_mixtral.py` and its siblings of 4.57.3 and 5.0.0).
const FUSED_EXPERTS_SINCE: Since = (5, 0);

/// The causal mask an older release builds over all positions at every forward (see
/// [`OldRelease::all_positions_mask`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllPositionsMask {
    /// Elements of one sample's mask: `max_positions²`.
    pub(crate) elements_per_sample: f64,
    /// Bytes per element of the buffer it is repeated from (the mask is cast from it).
    pub(crate) buffer_element_bytes: f64,
}

/// A transformers release other than today's, as it runs one family's model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OldRelease<'a> {
    spec: &'a TransformerSpec,
    release: Release,
}

impl<'a> OldRelease<'a> {
    /// The release `workload` plans for `spec`'s family; None: today's (no `--transformers`).
    pub(crate) fn of(spec: &'a TransformerSpec, workload: &Workload) -> Option<Self> {
        workload
            .transformers
            .map(|release| OldRelease { spec, release })
    }

    /// The release `workload` plans for `model` where it is a transformer; None: today's, or
    /// a model without transformers modelling code (a ResNet, a diffusion model).
    pub(crate) fn of_model(model: &'a ModelSpec, workload: &Workload) -> Option<Self> {
        match &model.arch {
            Architecture::Transformer(spec) => OldRelease::of(spec, workload),
            Architecture::Resnet(_) | Architecture::Diffusion(_) => None,
        }
    }

    fn before(&self, (major, minor): Since) -> bool {
        (self.release.major, self.release.minor) < (major, minor)
    }

    /// Is the release a patch of `major.minor`?
    fn minor_is(&self, (major, minor): Since) -> bool {
        (self.release.major, self.release.minor) == (major, minor)
    }

    fn family(&self) -> &str {
        self.spec.model_type.as_str()
    }

    /// Does `generate`'s prefill compute the logits of every prompt position?
    pub(crate) fn full_prompt_logits(&self) -> bool {
        self.before(last_token_logits_since(self.family()))
    }

    /// Does `generate` clone all the logits the model returned before taking the last
    /// position's (`outputs.logits.clone()[:, -1, :].float()`, 4.45 and 4.46)? A whole-prompt
    /// copy where the family returns every position's logits.
    pub(crate) fn clones_all_logits(&self) -> bool {
        !self.before((4, 45)) && self.before((4, 47))
    }

    /// Does the family's forward upcast all logits to fp32 (not only for a loss)?
    pub(crate) fn upcast_all_logits(&self) -> bool {
        self.before((4, 45)) && UPCAST_ALL_LOGITS_BEFORE_4_45.contains(&self.family())
    }

    /// Does the family decode with a tuple cache? Each decode step's forward then concatenates
    /// every layer's keys and values into new tensors while the previous step's tuple stays
    /// referenced by `generate` until the step returns: two whole caches at its end (a
    /// `DynamicCache` replaces one layer at a time).
    pub(crate) fn tuple_cache(&self) -> bool {
        cache_class_since(self.family()).is_some_and(|since| self.before(since))
    }

    /// Does a prompt's cache hold the layer's own key and value tensors (a tuple cache, or a
    /// `DynamicCache` before 4.56, whose first update stored them as they were)? Since 4.56 it
    /// concatenates them onto an empty tensor: copies.
    pub(crate) fn cache_holds_own_tensors(&self) -> bool {
        self.tuple_cache() || self.before((4, 56))
    }

    /// Bytes per token and layer that a prompt's cache keeps alive where its tensors are views:
    /// a fused q|k|v projection split by `view`/`permute` (GPT-2, BigCode, GPT-NeoX, Phi-3)
    /// stays referenced whole behind its key and value views, beside a rotated key (a new
    /// tensor, `key_bytes` per element); 0 where the cache holds nothing larger than its keys
    /// and values.
    pub(crate) fn prompt_cache_bytes(
        &self,
        act: BytesPerElement,
        key_bytes: BytesPerElement,
    ) -> BytesPerToken {
        let spec = self.spec;
        if !(spec.fused_qkv && self.cache_holds_own_tensors()) {
            return BytesPerToken::ZERO;
        }
        let (q, kv, value) = (
            Width(spec.query_width() as f64),
            Width(spec.kv_width() as f64),
            Width(spec.value_width() as f64),
        );
        let rotated_key = if spec.rotary_fraction > 0.0 {
            key_bytes * kv
        } else {
            BytesPerToken::ZERO
        };
        act * (q + kv + value) + rotated_key
    }

    /// Bytes of the buffers the release registers and later ones dropped (`register_buffer`,
    /// so every rank keeps them whole: FSDP and ZeRO-3 shard parameters only). Per layer:
    /// GPT-2's attention (before 5.2) and GPT-NeoX's (before 4.49) keep a boolean causal mask
    /// of `max_positions²` (`register_buffer("bias", torch.tril(...))`); Qwen2's (before
    /// 4.45), Mistral's (before 4.42) and Llama's rotary embedding their `cos` and `sin`
    /// tables (`max_positions × head_dim` each) in the weight dtype (`from_pretrained` sets
    /// the default dtype they are built in to `torch_dtype`): Llama's `_set_cos_sin_cache`
    /// before 4.38, and again from 4.38.2 to 4.40 its `_cos_cached` / `_sin_cached` "for BC"
    /// (4.38.0 and 4.38.1 compute them per call only; 4.41 dropped them). Per model: Llama
    /// 4.38's `LlamaModel.causal_mask` of `max_positions²`, `torch.full(..., fill_value=1)`
    /// (int64) in 4.38.0 and 4.38.1, boolean in 4.38.2 (4.39 builds its mask per forward).
    /// In every mode: they are part of the model.
    pub(crate) fn buffer_bytes(&self, weight_bytes: f64) -> f64 {
        let layer: f64 = self.layer_buffers(weight_bytes).iter().sum();
        let model: f64 = self.model_buffers().iter().sum();
        layer * self.spec.layers as f64 + model
    }

    /// The bytes of each buffer one layer registers (see [`Self::buffer_bytes`]), in
    /// registration order.
    pub(crate) fn layer_buffers(&self, weight_bytes: f64) -> Vec<f64> {
        let spec = self.spec;
        let positions = spec.max_positions.unwrap_or(0) as f64;
        let table = positions * spec.head_dim as f64 * weight_bytes;
        let llama_tables = self.before((4, 38))
            || (self.release >= LLAMA_BC_ROTARY_TABLES_SINCE && self.before((4, 41)));
        match self.family() {
            "gpt2" if self.before((5, 2)) => vec![positions * positions],
            "gpt_neox" if self.before((4, 49)) => vec![positions * positions],
            "qwen2" if self.before((4, 45)) => vec![table, table],
            "mistral" if self.before((4, 42)) => vec![table, table],
            "llama" if llama_tables => vec![table, table],
            _ => Vec::new(),
        }
    }

    /// The bytes of each buffer the model registers outside its layers (see
    /// [`Self::buffer_bytes`]).
    pub(crate) fn model_buffers(&self) -> Vec<f64> {
        let positions = self.spec.max_positions.unwrap_or(0) as f64;
        self.causal_mask_element_bytes()
            .map(|element| vec![element * positions * positions])
            .unwrap_or_default()
    }

    /// Bytes per element of Llama 4.38's `LlamaModel.causal_mask` buffer: int64 in 4.38.0 and
    /// 4.38.1 (`torch.full(..., fill_value=1)`), boolean from 4.38.2; None for other releases
    /// and families.
    fn causal_mask_element_bytes(&self) -> Option<f64> {
        match self.family() {
            "llama" if self.minor_is((4, 38)) => {
                Some(if self.release >= LLAMA_BC_ROTARY_TABLES_SINCE {
                    1.0
                } else {
                    8.0
                })
            }
            _ => None,
        }
    }

    /// The causal mask the release's model builds at every forward over all its positions,
    /// not the sequence's, where `attention` is not FlashAttention-2: Llama 4.38's
    /// `LlamaModel._update_causal_mask` repeats its `max_positions²` buffer over the batch,
    /// casts it to the embeddings' dtype and multiplies it by the dtype's minimum (`batch ×
    /// max_positions²` kept through the model's forward, an input of every layer), and each
    /// layer copies its slice out of it (`attention_mask[:, :, cache_position, :kv_len]`,
    /// which SDPA saves for backward); 4.39 builds a sequence-sized mask. None otherwise.
    pub(crate) fn all_positions_mask(&self, attention: Attention) -> Option<AllPositionsMask> {
        let positions = self.spec.max_positions? as f64;
        let buffer_element_bytes = self.causal_mask_element_bytes()?;
        (attention != Attention::Flash).then_some(AllPositionsMask {
            elements_per_sample: positions * positions,
            buffer_element_bytes,
        })
    }

    /// Does eager attention clamp the masked scores (OPT before 4.49:
    /// `torch.max(scores + mask, finfo.min)`)? `maximum` saves its input for backward, one more
    /// score matrix in the activation dtype, and its output exists beside it.
    pub(crate) fn clamps_scores(&self) -> bool {
        self.family() == "opt" && self.before((4, 49))
    }

    /// Does eager attention upcast the softmax for fp16 scores only (OPT before 4.49:
    /// `softmax(..., dtype=float32).to(float16)` when the scores are fp16, a plain softmax in
    /// bf16)?
    pub(crate) fn upcasts_fp16_softmax_only(&self) -> bool {
        self.family() == "opt" && self.before((4, 49))
    }

    /// Does the family's attention make its queries, keys and values contiguous per head (OPT
    /// before 4.49: `_shape` is `view(...).transpose(1, 2).contiguous()`; 4.49 keeps the
    /// transposed views)? A fused kernel that lays its output out as the queries (CUDA's flash
    /// attention: `out = at::empty_like(q)` in `mha_fwd`) then returns it per head, and merging
    /// the heads (`attn_output.transpose(1, 2).contiguous()`) copies it, a copy the output
    /// projection saves.
    pub(crate) fn queries_contiguous_per_head(&self) -> bool {
        self.family() == "opt" && self.before((4, 49))
    }

    /// Does the rotary embedding run in fp32 (GPT-NeoX before 4.45: its `cos_cached` and
    /// `sin_cached` tables stay fp32 in a half-precision model, so the rotated queries and keys,
    /// concatenated with their pass-through part, come out fp32)? The fp32 keys are what the
    /// layer returns as its cache (`present`), the SDPA path casts both back, and eager
    /// attention computes its scores from them in fp32.
    /// Does the family keep each routed expert's MLP as modules of its own
    /// (`nn.ModuleList`), one weight tensor per expert and projection? transformers 5.0 made
    /// them two tensors over all experts (`<Family>Experts.gate_up_proj`/`down_proj`) in every
    /// mixture family the planner reads (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3).
    pub(crate) fn experts_as_modules(&self) -> bool {
        self.before(FUSED_EXPERTS_SINCE)
    }

    pub(crate) fn fp32_rotary(&self) -> bool {
        self.family() == "gpt_neox" && self.before((4, 45))
    }
}
