//! Serving: vLLM's start-up memory profile planned from the model config, and the KV-cache
//! capacity it leaves (`gpumem plan --engine vllm`).
//!
//! vLLM sizes its KV cache by a profile run at start-up (V0 engine, releases 0.6.5 to 0.8:
//! `Worker.determine_num_available_blocks` in `vllm/worker/worker.py`, measured by
//! `memory_profiling` in `vllm/utils.py`, PR #10511): with the weights loaded and no KV cache,
//! `GPUModelRunnerBase.profile_run` (`vllm/worker/model_runner.py`) runs one dummy batch of
//! `max_num_seqs` sequences sharing `max_num_batched_tokens` tokens, every one sampled with
//! `top_p=0.99, top_k=vocab-1` (the sampler's most expensive path). The log's
//! "PyTorch activation peak memory" is the torch peak allocated during that run minus what was
//! allocated before it; the KV cache gets
//! `gpu_memory_utilization × total − weights − activation peak − non-torch memory`, in blocks
//! of `block_size` tokens.
//!
//! What is planned here, and from where in vLLM's model code (the Llama family,
//! `vllm/model_executor/models/llama.py`, and the families written like it):
//! - the dummy forward over the flattened batch of tokens: between layers the hidden states
//!   and the residual (`fused_add_rms_norm` updates both in place); in attention the fused
//!   `qkv_proj` output (kept by `LlamaAttention.forward` until it returns), the attention
//!   output (FlashAttention varlen writes into one `torch.empty_like(query)`; no KV cache is
//!   written while profiling) and the `o_proj` output; in the MLP the fused `gate_up_proj`
//!   output (kept until `LlamaMLP.forward` returns), `SiluAndMul`'s half-width output and the
//!   `down_proj` output;
//! - the sampler (`vllm/model_executor/layers/sampler.py`, `Sampler.forward` and
//!   `_apply_top_k_top_p`) over one row per sequence: the LM head's logits in the model dtype
//!   over the vocabulary padded to 64 (`ParallelLMHead`), kept by `ModelRunner.execute_model`
//!   while it samples; `logits.to(torch.float)`; `sort` (fp32 values, int64 indices); the
//!   top-k mask (bool); `softmax` and `cumsum` (fp32); the top-p mask (bool); the inverse
//!   permutation (int64, `scatter_`) and the re-sorted fp32 logits (`gather`), all alive at the
//!   `gather`, with the final hidden states of every token and the pruned ones of the sampled
//!   positions.

use crate::error::{PlanError, Result};
use crate::estimate::{past_bound, MAX_BYTES};
use crate::gpu::Gpu;
use crate::limits;
use crate::model::{Architecture, ModelSpec, Norm, TransformerSpec};
use crate::settings::{pick, Settings};
use crate::warning::Warning;
use crate::workload::{Dtype, Workload};
use serde::Serialize;

/// The serving engines whose start-up profile is planned (`--engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// vLLM's V0 engine (releases 0.6.5 to 0.8), whose profile run samples every sequence.
    Vllm,
}

/// Names of `--engine`.
pub const ENGINES: &[(&str, Engine)] = &[("vllm", Engine::Vllm)];

/// vLLM's default `max_num_seqs` (`SchedulerConfig`).
pub const DEFAULT_MAX_NUM_SEQS: u64 = 256;
/// vLLM's default `gpu_memory_utilization` (`CacheConfig`).
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// vLLM's default KV-cache block size in tokens on CUDA (`CacheConfig.block_size`).
pub const DEFAULT_BLOCK_SIZE: u64 = 16;
/// The KV-cache block sizes vLLM accepts (`--block-size` choices, 0.6.5 to 0.8).
pub const BLOCK_SIZES: [u64; 5] = [8, 16, 32, 64, 128];
/// The smallest `max_num_batched_tokens` vLLM's V0 scheduler picks without chunked prefill:
/// `max(max_model_len, 2048)` (`SchedulerConfig.__post_init__`).
pub const MIN_BATCHED_TOKENS_WITHOUT_CHUNKING: u64 = 2048;
/// `ParallelLMHead` pads the vocabulary to a multiple of this (`DEFAULT_VOCAB_PADDING_SIZE`).
pub const VOCAB_PADDING: u64 = 64;

/// The engine settings of a serving plan, resolved (vLLM's flags of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ServeSettings {
    /// The engine.
    pub engine: Engine,
    /// Longest sequence (prompt and output) a request may have.
    pub max_model_len: u64,
    /// Tokens of one scheduler step: the dummy forward's token count.
    pub max_num_batched_tokens: u64,
    /// Sequences of one step: the dummy batch's sequences and the sampler's rows.
    pub max_num_seqs: u64,
    /// Share of the GPU's total memory the instance may use.
    pub gpu_memory_utilization: f64,
    /// Tokens per KV-cache block.
    pub block_size: u64,
    /// Memory outside PyTorch's allocator that the profile counts (cuBLAS and NCCL
    /// workspaces, CUDA graphs' pools are later): vLLM's `non_torch_memory`, bytes.
    pub non_torch_bytes: u64,
}

/// vLLM's start-up memory profile, planned, and the KV-cache capacity it leaves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServingProfile {
    /// The settings planned.
    pub settings: ServeSettings,
    /// "model weights take": the weights in the model dtype.
    pub weights_bytes: u64,
    /// Peak of the dummy forward over `max_num_batched_tokens` tokens above the weights.
    pub forward_peak_bytes: u64,
    /// Peak of the sampler over `max_num_seqs` rows above the weights (with the hidden states
    /// the forward returned).
    pub sampler_peak_bytes: u64,
    /// "PyTorch activation peak memory": the larger of the two.
    pub activation_peak_bytes: u64,
    /// Keys and values of one token over every layer.
    pub kv_bytes_per_token: u64,
    /// The GPU's total memory, when a GPU is given.
    pub gpu_bytes: Option<u64>,
    /// What the rest leaves for the KV cache (`gpu_memory_utilization × total − weights −
    /// activation peak − non-torch`), when a GPU is given; negative: the model does not fit.
    pub kv_cache_bytes: Option<i64>,
    /// Whole KV-cache blocks in it ("# GPU blocks").
    pub gpu_blocks: Option<u64>,
    /// Tokens the blocks hold ("GPU KV cache size").
    pub kv_tokens: Option<u64>,
    /// Requests of `max_model_len` tokens the cache holds at once ("Maximum concurrency").
    pub max_concurrency: Option<f64>,
}

impl ServingProfile {
    /// Tensor bytes at the profile's peak (`torch.cuda.max_memory_allocated` over the run).
    pub fn peak_allocated_bytes(&self) -> u64 {
        self.weights_bytes + self.activation_peak_bytes
    }
}

/// Reading the serving flags of a request.
impl Settings {
    /// The serving engine's settings when `--engine` is given (None without it), with vLLM's
    /// defaults for `model`. A bad name, a count outside the planner's bounds
    /// ([`crate::limits`]), a block size vLLM does not accept, fewer batched tokens than
    /// sequences (vLLM's own `SchedulerConfig` check), a utilization outside (0, 1] and more
    /// non-torch memory than [`crate::limits::MAX_OUTSIDE_BYTES`] are typed errors, and so are
    /// engine flags without `--engine`.
    pub fn serving(&self, model: &ModelSpec) -> Result<Option<ServeSettings>> {
        let Some(engine) = pick(&self.engine, "engine", ENGINES)? else {
            let given = [
                ("--max-model-len", self.max_model_len.is_some()),
                (
                    "--max-num-batched-tokens",
                    self.max_num_batched_tokens.is_some(),
                ),
                ("--max-num-seqs", self.max_num_seqs.is_some()),
                (
                    "--gpu-memory-utilization",
                    self.gpu_memory_utilization.is_some(),
                ),
                ("--block-size", self.block_size.is_some()),
                ("--non-torch-bytes", self.non_torch_bytes.is_some()),
            ];
            return match given.iter().find(|(_, set)| *set) {
                Some((flag, _)) => Err(PlanError::Conflict {
                    first: (*flag).into(),
                    second: "no --engine".into(),
                    reason: "it sets a serving engine; add --engine vllm".into(),
                }),
                None => Ok(None),
            };
        };
        let max_model_len = match (self.max_model_len, max_position_embeddings(model)) {
            (Some(len), _) => limits::POSITIONS.check("max-model-len", len)?,
            (None, Some(len)) => len,
            (None, None) => {
                return Err(PlanError::InvalidValue {
                    name: "max-model-len".into(),
                    value: "none".into(),
                    reason: format!(
                        "{} states no max_position_embeddings; give --max-model-len",
                        model.name
                    ),
                })
            }
        };
        let utilization = self
            .gpu_memory_utilization
            .unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION);
        if !(utilization > 0.0 && utilization <= 1.0) {
            return Err(PlanError::InvalidValue {
                name: "gpu-memory-utilization".into(),
                value: utilization.to_string(),
                reason: "must be a share of the GPU above 0 and at most 1".into(),
            });
        }
        let max_num_batched_tokens = match self.max_num_batched_tokens {
            Some(tokens) => limits::TOKENS_PER_STEP.check("max-num-batched-tokens", tokens)?,
            None => max_model_len.max(MIN_BATCHED_TOKENS_WITHOUT_CHUNKING),
        };
        let max_num_seqs = match self.max_num_seqs {
            Some(seqs) => limits::BATCH.check("max-num-seqs", seqs)?,
            None => DEFAULT_MAX_NUM_SEQS,
        };
        // vLLM's `SchedulerConfig._verify_args`: every sequence of a step has a token.
        if max_num_batched_tokens < max_num_seqs {
            let flag = |name: &str, value: u64, given: bool| {
                let default = if given { "" } else { " (the default)" };
                format!("--{name} {value}{default}")
            };
            return Err(PlanError::Conflict {
                first: flag(
                    "max-num-batched-tokens",
                    max_num_batched_tokens,
                    self.max_num_batched_tokens.is_some(),
                ),
                second: flag("max-num-seqs", max_num_seqs, self.max_num_seqs.is_some()),
                reason: "vLLM refuses fewer tokens per step than sequences (every sequence of a \
                         step has a token); raise --max-num-batched-tokens or lower \
                         --max-num-seqs"
                    .into(),
            });
        }
        let block_size = self.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
        if !BLOCK_SIZES.contains(&block_size) {
            return Err(PlanError::InvalidValue {
                name: "block-size".into(),
                value: block_size.to_string(),
                reason: format!(
                    "must be one of {} tokens (vLLM's --block-size choices)",
                    BLOCK_SIZES.map(|b| b.to_string()).join(", ")
                ),
            });
        }
        let non_torch_bytes = self
            .non_torch_bytes
            .map(|bytes| limits::check_outside_bytes("non-torch-bytes", bytes))
            .transpose()?
            .unwrap_or(0);
        Ok(Some(ServeSettings {
            engine,
            max_model_len,
            max_num_batched_tokens,
            max_num_seqs,
            gpu_memory_utilization: utilization,
            block_size,
            non_torch_bytes,
        }))
    }

    /// The flags of a PyTorch forward that a serving engine's profile does not read: it runs
    /// its own batch (`max_num_seqs` sequences sharing `max_num_batched_tokens` tokens) with
    /// its own attention kernel and no KV cache, through its own model code in the weights'
    /// dtype (no transformers, litgpt or gpt-fast modelling code, no autocast).
    pub(crate) fn ignored_by_engine(&self) -> Vec<Warning> {
        if self.engine.is_none() {
            return Vec::new();
        }
        let batch = "the serving engine's profile runs its own batch (--max-num-seqs sequences \
                     sharing --max-num-batched-tokens tokens) with its own attention kernel";
        let code = "the serving engine runs its own model code (vLLM's) in the weights' dtype \
                    (--dtype): no transformers, litgpt or gpt-fast modelling code, no autocast";
        [
            ("--batch", self.batch.is_some(), batch),
            ("--seq", self.seq.is_some(), batch),
            ("--new-tokens", self.new_tokens.is_some(), batch),
            ("--attn", self.attn.is_some(), batch),
            ("--no-cache", self.no_cache, batch),
            ("--labels", self.labels, batch),
            ("--framework", self.framework.is_some(), code),
            ("--transformers", self.transformers.is_some(), code),
            ("--amp", self.amp.is_some(), code),
        ]
        .into_iter()
        .filter(|(_, given, _)| *given)
        .map(|(flag, _, reason)| Warning::Ignored {
            flag,
            reason: reason.into(),
        })
        .collect()
    }
}

/// The config's `max_position_embeddings`: vLLM's default `max_model_len`.
fn max_position_embeddings(model: &ModelSpec) -> Option<u64> {
    match &model.arch {
        Architecture::Transformer(spec) => spec.max_positions,
        _ => None,
    }
}

/// Plans vLLM's start-up profile of `model` under `serve` (weights in `workload.dtype`), and
/// the KV cache it leaves on `gpu` when one is given.
pub fn serving_profile(
    model: &ModelSpec,
    workload: &Workload,
    serve: &ServeSettings,
    gpu: Option<&Gpu>,
) -> Result<ServingProfile> {
    let spec = served_decoder(model)?;
    if workload.quant.is_some() {
        return Err(not_planned(
            model,
            "quantised checkpoints (their dequantising kernels' workspaces are not modelled)",
        ));
    }
    let d = workload.dtype.bytes();
    let weights_bytes = model.params().total() * d;
    let forward_peak_bytes = forward_peak(spec, serve.max_num_batched_tokens, d);
    let sampler_peak_bytes = sampler_peak(spec, serve, d);
    let activation_peak_bytes = forward_peak_bytes.max(sampler_peak_bytes);
    if weights_bytes + activation_peak_bytes >= MAX_BYTES {
        return Err(past_bound(
            format!(
                "max-num-batched-tokens {}, max-num-seqs {}",
                serve.max_num_batched_tokens, serve.max_num_seqs
            ),
            "the profile run's peak".into(),
            "lower --max-num-batched-tokens or --max-num-seqs",
        ));
    }
    let kv_bytes_per_token = spec.layers * spec.cache_width() * kv_dtype(workload).bytes();
    let mut profile = ServingProfile {
        settings: *serve,
        weights_bytes,
        forward_peak_bytes,
        sampler_peak_bytes,
        activation_peak_bytes,
        kv_bytes_per_token,
        gpu_bytes: None,
        kv_cache_bytes: None,
        gpu_blocks: None,
        kv_tokens: None,
        max_concurrency: None,
    };
    if let Some(gpu) = gpu {
        // Within `i64`: the bounds on the profile's peak ([`MAX_BYTES`]), on non-torch memory
        // and on the GPU's keep every term below 2⁴⁹ bytes.
        let usable = (gpu.memory_bytes as f64 * serve.gpu_memory_utilization) as i64;
        let kv = usable - (weights_bytes + activation_peak_bytes + serve.non_torch_bytes) as i64;
        let blocks = kv.max(0) as u64 / (serve.block_size * kv_bytes_per_token);
        let tokens = blocks * serve.block_size;
        profile.gpu_bytes = Some(gpu.memory_bytes);
        profile.kv_cache_bytes = Some(kv);
        profile.gpu_blocks = Some(blocks);
        profile.kv_tokens = Some(tokens);
        profile.max_concurrency = Some(tokens as f64 / serve.max_model_len as f64);
    }
    Ok(profile)
}

/// The KV cache's dtype: vLLM's `kv_cache_dtype="auto"`, the model's.
fn kv_dtype(workload: &Workload) -> Dtype {
    workload.dtype
}

/// The decoder vLLM's Llama-style model code runs: a causal LM with RMSNorm, a gated MLP,
/// standard (not latent) attention and no experts; anything else is a typed error.
fn served_decoder(model: &ModelSpec) -> Result<&TransformerSpec> {
    let Architecture::Transformer(spec) = &model.arch else {
        return Err(not_planned(model, "models that are not transformers"));
    };
    let unplanned = if !spec.is_causal_lm() || spec.is_encoder_decoder() {
        Some("models that are not decoder-only causal LMs")
    } else if spec.norm != Norm::RmsNorm || spec.sandwich_norms || spec.post_norm {
        Some("norms other than pre-block RMSNorm (Gemma's offset and sandwich norms, LayerNorm)")
    } else if !spec.gated_mlp {
        Some("MLPs without a gate (vLLM fuses gate and up projections)")
    } else if spec.latent.is_some() || spec.experts > 1 {
        Some("latent attention and mixtures of experts")
    } else if spec.vision.is_some() || spec.dual.is_some() || spec.audio.is_some() {
        Some("multimodal models (the profile also runs dummy images or audio)")
    } else {
        None
    };
    match unplanned {
        Some(what) => Err(not_planned(model, what)),
        None => Ok(spec),
    }
}

/// The typed error for a model or setting the serving plan does not cover.
fn not_planned(model: &ModelSpec, what: &str) -> PlanError {
    PlanError::InvalidValue {
        name: "engine".into(),
        value: format!("vllm for {}", model.name),
        reason: format!(
            "the vLLM profile is planned for Llama-style decoders (RMSNorm, gated MLP, \
             grouped-query attention: Llama, Mistral, Qwen2, Qwen3, ...), not {what}"
        ),
    }
}

/// Peak bytes of the dummy forward over `tokens` flattened tokens in `d`-byte elements: the
/// larger of the attention step (hidden, residual, fused qkv, attention output, o_proj output)
/// and the MLP step (hidden, residual, fused gate_up, SiluAndMul output, down_proj output).
fn forward_peak(spec: &TransformerSpec, tokens: u64, d: u64) -> u64 {
    let h = spec.hidden;
    let qkv = spec.query_width() + spec.kv_width() + spec.value_width();
    let attention = 3 * h + qkv + spec.query_width();
    let mlp = 3 * h + 3 * spec.intermediate;
    tokens * d * attention.max(mlp)
}

/// Bytes per logit element alive at the sampler's `gather` besides the LM head's own output:
/// fp32 logits (4), sorted values (4) and indices (8), top-k mask (1), softmax (4), cumsum
/// (4), top-p mask (1), inverse permutation (8) and re-sorted logits (4).
const SAMPLER_BYTES_PER_LOGIT: u64 = 4 + 4 + 8 + 1 + 4 + 4 + 1 + 8 + 4;

/// Peak bytes of the profile's sampler step: the final hidden states of every token and of
/// the sampled ones, the LM head's logits over the padded vocabulary, and the top-k/top-p
/// path's tensors over one row per sequence (every sequence has a token:
/// [`Settings::serving`]).
fn sampler_peak(spec: &TransformerSpec, serve: &ServeSettings, d: u64) -> u64 {
    let rows = serve.max_num_seqs;
    let padded_vocab = spec.vocab.div_ceil(VOCAB_PADDING) * VOCAB_PADDING;
    let hidden = (serve.max_num_batched_tokens + rows) * spec.hidden * d;
    hidden + rows * padded_vocab * d + rows * spec.vocab * SAMPLER_BYTES_PER_LOGIT
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::find_model;
    use crate::settings::Settings;

    fn settings(tokens: u64, seqs: u64) -> ServeSettings {
        ServeSettings {
            engine: Engine::Vllm,
            max_model_len: 8192,
            max_num_batched_tokens: tokens,
            max_num_seqs: seqs,
            gpu_memory_utilization: 0.9,
            block_size: 16,
            non_torch_bytes: 0,
        }
    }

    fn bf16() -> Workload {
        Settings {
            mode: Some("infer".into()),
            dtype: Some("bf16".into()),
            ..Settings::default()
        }
        .to_workload()
        .unwrap()
    }

    #[test]
    fn llama_3_8b_profile_by_hand() {
        let model = find_model("llama-3-8b").unwrap();
        let p = serving_profile(&model, &bf16(), &settings(8192, 256), None).unwrap();
        // Sampler: 256 rows × 128256 logits × (2 + 38) bytes, hidden states of 8192 + 256
        // tokens × 4096 × 2 bytes.
        let rows = 256 * 128_256u64;
        assert_eq!(p.sampler_peak_bytes, rows * 40 + (8192 + 256) * 4096 * 2);
        // Forward: the MLP step, 3 × (4096 + 14336) elements per token.
        assert_eq!(p.forward_peak_bytes, 8192 * 2 * 3 * (4096 + 14336));
        assert_eq!(p.activation_peak_bytes, p.sampler_peak_bytes);
        // 32 layers × 8 KV heads × 128 × 2 (k and v) × 2 bytes.
        assert_eq!(p.kv_bytes_per_token, 32 * 8 * 128 * 2 * 2);
    }

    #[test]
    fn long_batches_peak_in_the_forward() {
        let model = find_model("llama-3-8b").unwrap();
        let p = serving_profile(&model, &bf16(), &settings(65_536, 256), None).unwrap();
        assert_eq!(p.activation_peak_bytes, p.forward_peak_bytes);
        assert!(p.forward_peak_bytes > p.sampler_peak_bytes);
    }

    #[test]
    fn kv_capacity_from_the_gpu() {
        let model = find_model("llama-3-8b").unwrap();
        let gpu = crate::gpu::find_gpu("h100").unwrap();
        let p = serving_profile(&model, &bf16(), &settings(8192, 256), Some(&gpu)).unwrap();
        let kv = p.kv_cache_bytes.unwrap();
        let expected = (gpu.memory_bytes as f64 * 0.9) as i64
            - (p.weights_bytes + p.activation_peak_bytes) as i64;
        assert_eq!(kv, expected);
        let blocks = p.gpu_blocks.unwrap();
        assert_eq!(blocks, kv as u64 / (16 * p.kv_bytes_per_token));
        assert_eq!(p.kv_tokens, Some(blocks * 16));
        assert_eq!(p.max_concurrency, Some((blocks * 16) as f64 / 8192.0));
    }

    #[test]
    fn encoders_are_refused_by_name() {
        let model = find_model("bert-base-uncased").unwrap();
        let err = serving_profile(&model, &bf16(), &settings(8192, 256), None).unwrap_err();
        assert!(err.to_string().contains("decoder-only"), "{err}");
    }
}
