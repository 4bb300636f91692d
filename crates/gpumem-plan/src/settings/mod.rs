//! Run settings by the names of the `gpumem plan` flags (also the keys of the validation data),
//! and their conversion into a typed [`Workload`].

mod ignored;

use crate::error::{PlanError, Result};
use crate::lora::LoraTargets;
use crate::model::{Architecture, ModelSpec};
use crate::quant::{CheckpointQuant, QuantFormat, Quantization};
use crate::warning::Warning;
use crate::workload::choices::{self, parse};
use crate::workload::{
    Attention, BaseQuant, Checkpointing, Dtype, Framework, Kernels, Layout, Lora, Loss, Mode,
    Offload, OptimizerImpl, Release, Sharding, Target, Workload,
};
use serde::{Deserialize, Serialize};

/// Settings as strings and numbers, exactly as typed on the command line or stored in
/// `testdata/plan/measured.jsonl`. Absent values take the [`Workload`] defaults.
///
/// With the `clap` feature this is also the `gpumem plan` command line: every field is the flag of
/// the same name, its doc comment is the flag's help, and each help names the default that
/// [`Settings::to_workload`] applies.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default)]
pub struct Settings {
    /// train, infer or generate [default: train].
    #[cfg_attr(feature = "clap", arg(long))]
    pub mode: Option<String>,
    /// Micro-batch per data-parallel rank [default: 1].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub batch: Option<u64>,
    /// Sequence (prompt) length [default: 512].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub seq: Option<u64>,
    /// Image side in pixels (vision transformers, dual encoders, CNNs, diffusion) [default: 224,
    /// or the config's image_size where it has one (a diffusers model's sample size × 8)].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub image_size: Option<u64>,
    /// Tokens to generate (generate mode) [default: 128].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub new_tokens: Option<u64>,
    /// Weight dtype: fp32, bf16, fp16 [default: fp32; inference: the config's torch_dtype].
    #[cfg_attr(feature = "clap", arg(long))]
    pub dtype: Option<String>,
    /// Autocast dtype for mixed precision: bf16 or fp16 [default: none, no autocast].
    #[cfg_attr(feature = "clap", arg(long))]
    pub amp: Option<String>,
    /// adamw, adam, sgd, adafactor, adam8bit, or none (forward and backward only, as
    /// benchmarks run: gradients, no optimizer states) [default: adamw].
    #[cfg_attr(feature = "clap", arg(long))]
    pub optimizer: Option<String>,
    /// foreach, fused, forloop [default: foreach on GPU, forloop on CPU].
    #[cfg_attr(feature = "clap", arg(long))]
    pub optimizer_impl: Option<String>,
    /// Full activation checkpointing.
    #[cfg_attr(feature = "clap", arg(long))]
    pub grad_ckpt: bool,
    /// Selective checkpointing (recompute the attention core only).
    #[cfg_attr(feature = "clap", arg(long))]
    pub grad_ckpt_selective: bool,
    /// Full checkpointing of every K-th layer only (layers 0, K, 2K, ...; transformers'
    /// every_n_layers, torchtitan's selective_ac_option "K") [default: none].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "K", allow_negative_numbers = true, value_parser = count)
    )]
    pub grad_ckpt_every: Option<u64>,
    /// Per-op selective checkpointing of every layer as torchtitan's selective_ac_option "op":
    /// keep the attention kernel's output and every other bias-free matmul output, recompute
    /// the rest.
    #[cfg_attr(feature = "clap", arg(long))]
    pub grad_ckpt_per_op: bool,
    /// eager, sdpa, flash [default: sdpa].
    #[cfg_attr(feature = "clap", arg(long))]
    pub attn: Option<String>,
    /// Pass use_cache=False: an inference forward of a decoder keeps no KV cache (by default
    /// it returns the cache it builds, as model(**batch) does), and training passes keys and
    /// values through none.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_cache: bool,
    /// Inference with labels in the batch: the forward also computes the model's loss (an
    /// evaluation step); an encoder-decoder takes its decoder inputs from the labels.
    #[cfg_attr(feature = "clap", arg(long))]
    pub labels: bool,
    /// Micro-batches accumulated per optimizer step [default: 1].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub grad_accum: Option<u64>,
    /// Gradients zeroed, not freed, between steps (zero_grad(set_to_none=False)).
    #[cfg_attr(feature = "clap", arg(long))]
    pub keep_grads: bool,
    /// With --loss none: the previous step's outputs (logits, and the KV cache a causal LM
    /// returns in training) stay referenced until the next forward returns, as in a loop
    /// `outputs = model(...)` without `del outputs` (forward/backward benchmark scripts).
    #[cfg_attr(feature = "clap", arg(long))]
    pub keep_outputs: bool,
    /// With the model's own loss (--loss hf): the loop holds the model's outputs (the logits
    /// it returns: fp32 in a Llama-family forward before transformers 4.45) through backward
    /// and the optimizer step, and drops them before the next forward (`output = model(...,
    /// labels=...)`, `output.loss.backward()`, `optimizer.step()`, `output = None`, as
    /// AnswerDotAI's fsdp_qlora train.py runs); the HF Trainer keeps only the loss.
    #[cfg_attr(feature = "clap", arg(long))]
    pub hold_outputs: bool,
    /// Total GPUs [default: 1].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub gpus: Option<u64>,
    /// Machines the GPUs are spread over [default: 1].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub nodes: Option<u64>,
    /// ZeRO stage 0-3 [default: 0].
    #[cfg_attr(feature = "clap", arg(long, allow_negative_numbers = true))]
    pub zero: Option<String>,
    /// PyTorch FSDP (full sharding unless --fsdp-sharding says otherwise).
    #[cfg_attr(feature = "clap", arg(long))]
    pub fsdp: bool,
    /// FSDP implementation with --fsdp: 1 (FullyShardedDataParallel) or 2 (fully_shard)
    /// [default: 2].
    #[cfg_attr(feature = "clap", arg(long, allow_negative_numbers = true))]
    pub fsdp_version: Option<String>,
    /// FSDP sharding strategy with --fsdp (PyTorch's ShardingStrategy; FULL_SHARD or
    /// full_shard are read as full-shard): full-shard (everything sharded, each unit gathered
    /// for its forward and again for its backward), shard-grad-op (a unit stays gathered from
    /// its forward to its backward: FSDP2's reshard_after_forward=False), no-shard (FSDP1:
    /// whole parameters, gradients and optimizer states on every GPU), hybrid-shard or
    /// hybrid-shard-zero2 (full-shard or shard-grad-op within each of --nodes machines,
    /// replicated across them: FSDP2's 2-D mesh) [default: full-shard].
    #[cfg_attr(feature = "clap", arg(long, value_name = "STRATEGY"))]
    pub fsdp_sharding: Option<String>,
    /// FSDP mixed precision with --fsdp: parameters gathered and computed in bf16 or fp16 from
    /// --dtype sharded masters, gradients reduced in fp32 [default: none, no cast].
    #[cfg_attr(feature = "clap", arg(long))]
    pub fsdp_mp: Option<String>,
    /// NCCL_BUFFSIZE in bytes, the Simple-protocol buffer of each NCCL connection (counted in
    /// the total, outside PyTorch's allocator) [default: 4194304].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub nccl_buffsize: Option<u64>,
    /// DeepSpeed ZeRO's bucket sizes and stage-3 thresholds with --zero 1-3: default
    /// (DeepSpeed's own: reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7,
    /// stage3_param_persistence_threshold 1e5 elements; accelerate's config questions leave
    /// them so) or auto (a DeepSpeed config file's "auto", filled from hidden_size h by
    /// accelerate and the HF Trainer: h², 0.9·h², 10·h) [default: default].
    #[cfg_attr(feature = "clap", arg(long, value_name = "SIZES"))]
    pub zero_buckets: Option<String>,
    /// Offload to CPU, with --zero 1-3 or --fsdp: all (a bare --offload: the optimizer and,
    /// with ZeRO-3/FSDP, the parameters and their gradients; FSDP's CPUOffload, DeepSpeed's
    /// offload_optimizer with offload_param), optimizer (DeepSpeed's offload_optimizer alone:
    /// optimizer states, step and gradient partitions on the host, ZeRO-3's parameter
    /// partitions on the GPU) or none [default: none].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "WHAT", num_args = 0..=1, default_missing_value = "all")
    )]
    #[serde(deserialize_with = "offload_value")]
    pub offload: Option<String>,
    /// With --zero 3: the model was loaded without deepspeed.zero.Init, so
    /// deepspeed.initialize moves the whole model, cast to the module dtype, to each GPU and
    /// partitions it there, a start-up peak before the first step (a script that calls
    /// from_pretrained before building TrainingArguments or an HfDeepSpeedConfig, or plain
    /// deepspeed.initialize on a loaded model) [default: zero.Init, as the HF Trainer and
    /// accelerate's zero3_init_flag load a ZeRO-3 model].
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_zero_init: bool,
    /// With --fsdp --fsdp-version 1 in training: rank 0 loaded the model on the host (the
    /// others on the meta device) and FullyShardedDataParallel(device_id=…,
    /// sync_module_states=True) moves each unit to the GPU, broadcasts it from rank 0, flattens
    /// and shards it there; what that wrapping frees stays in the allocator's cache under the
    /// steps (accelerate's fsdp_cpu_ram_efficient_loading, fsdp_qlora's --low_memory)
    /// [default: the set-up is not planned].
    #[cfg_attr(feature = "clap", arg(long))]
    pub fsdp_cpu_ram_efficient_loading: bool,
    /// Tensor-parallel size [default: 1].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub tp: Option<u64>,
    /// Pipeline-parallel size [default: 1].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub pp: Option<u64>,
    /// Sequence parallelism over the tensor-parallel group (with --tp above 1).
    #[cfg_attr(feature = "clap", arg(long))]
    pub sp: bool,
    /// LoRA adapter rank (frozen base) [default: 16 with --qlora, else no LoRA].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub lora_rank: Option<u64>,
    /// QLoRA: LoRA over a 4-bit NF4 base.
    #[cfg_attr(feature = "clap", arg(long))]
    pub qlora: bool,
    /// The block linears that carry LoRA adapters, comma-separated: q, k, v, o, gate, up, down,
    /// qkv, gate_up, the module names of PEFT's target_modules (q_proj, v_proj, c_attn,
    /// query_key_value, fc1, …) or all-linear; PEFT's own default for Llama-family models is
    /// q_proj,v_proj [default: all-linear].
    #[cfg_attr(feature = "clap", arg(long, value_name = "LIST"))]
    pub lora_targets: Option<String>,
    /// Dropout probability on each LoRA adapter's input (PEFT's lora_dropout): each adapter then
    /// saves its dropout's output and mask [default: 0].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "P", allow_hyphen_values = true)
    )]
    pub lora_dropout: Option<f64>,
    /// Loss of a training step: hf (the model's own from labels: cross-entropy over every
    /// position, upcast to fp32 for causal LMs), none (backward from logits.sum(), the outputs
    /// kept through backward, as forward/backward benchmarks run), chunked (litgpt: LM head and
    /// cross-entropy per chunk of positions in the logits' dtype), chunked-fp32 (torchtune's
    /// CEWithChunkedOutputLoss: each chunk upcast for its own cross-entropy), fused
    /// (Liger-Kernel's fused linear cross-entropy: no logits kept) or cross-entropy (a
    /// hand-written loop's F.cross_entropy on the logits as returned, as nanoGPT and
    /// LLMs-from-scratch call it: no fp32 upcast; pair with --no-cache for a model without a
    /// KV cache) [default: hf].
    #[cfg_attr(feature = "clap", arg(long))]
    pub loss: Option<String>,
    /// Whose model and LoRA code runs the step: hf (transformers models, PEFT's LoRA: fp32
    /// adapters since PEFT 0.12, see --peft), litgpt (its own models: one LoRA lora_A and
    /// dropout for the fused qkv, adapters in the model's dtype, grouped-query keys and values
    /// repeated to every head) or
    /// gpt-fast (generate mode: gpt-fast's / torchao's generate.py without --compile, a static
    /// KV cache of --cache-len positions, default the prompt and new tokens rounded up to 8, with
    /// its cache-len² boolean causal mask) [default: hf].
    #[cfg_attr(feature = "clap", arg(long))]
    pub framework: Option<String>,
    /// Whose kernels run the norms, gated MLP activations, rotary embedding and loss: hf (the
    /// family's eager modules) or liger (Liger-Kernel as `apply_liger_kernel_to_*`,
    /// `AutoLigerKernelForCausalLM` and the HF Trainer's `use_liger_kernel=True` install it:
    /// fused RMSNorm, RoPE and SwiGLU/GeGLU, and its fused linear cross-entropy as the training
    /// loss unless --loss says otherwise; Llama, Mistral, Qwen2/3, Gemma 1/2 and Phi-3 families)
    /// [default: hf].
    #[cfg_attr(feature = "clap", arg(long))]
    pub kernels: Option<String>,
    /// Generate with a static KV cache preallocated for N positions, which decoding writes in
    /// place and every forward's attention reads whole: transformers'
    /// cache_implementation="static" / StaticCache(max_cache_len=N), gpt-fast's --cache_size N;
    /// at least --seq + --new-tokens - 1 (what transformers' generate sizes it to) [default:
    /// none, a dynamic cache that grows by concatenation; gpt-fast's own: --seq +
    /// --new-tokens].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "N", allow_negative_numbers = true, value_parser = count)
    )]
    pub cache_len: Option<u64>,
    /// Positions per chunk of `--loss chunked` / `chunked-fp32` [default: 128 (litgpt's
    /// lm_head_chunk_size) / an eighth of --seq (torchtune's 8 output chunks)].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "POSITIONS", allow_negative_numbers = true, value_parser = count)
    )]
    pub loss_chunk: Option<u64>,
    /// transformers release whose modelling code is planned, MAJOR.MINOR[.PATCH]: generate's
    /// prefill computes every prompt position's logits before the family took `logits_to_keep`
    /// (Llama family 4.45, GPT-NeoX 4.49, GPT-2 4.53, OPT and BigCode 5.0; Llama-family forwards
    /// upcast them all to fp32 before 4.45), tuple KV caches, per-layer causal-mask buffers and
    /// rotary tables, Llama 4.38's causal mask over all positions at every forward, OPT's
    /// clamped eager scores and per-head q/k/v copies, GPT-NeoX's fp32 rotary, mixtures'
    /// experts as one weight per expert before 5.0 [default: latest].
    #[cfg_attr(feature = "clap", arg(long, value_name = "VERSION"))]
    pub transformers: Option<String>,
    /// bitsandbytes release a QLoRA base (--qlora, or --quant fp4/nf4 with --lora-rank) runs
    /// with, MAJOR.MINOR[.PATCH]: before 0.43.2 each frozen 4-bit linear keeps its input for
    /// backward [default: latest].
    #[cfg_attr(feature = "clap", arg(long, value_name = "VERSION"))]
    pub bitsandbytes: Option<String>,
    /// PEFT release the LoRA adapters (--lora-rank) are built with, MAJOR.MINOR[.PATCH]:
    /// before 0.12 they take the base weights' dtype (bf16 adapters, gradients and optimizer
    /// states over a bf16 base), since then fp32 [default: latest].
    #[cfg_attr(feature = "clap", arg(long, value_name = "VERSION"))]
    pub peft: Option<String>,
    /// DeepSpeed release a ZeRO run (--zero 1-3) uses, MAJOR.MINOR[.PATCH]: before 0.19.4 a
    /// ZeRO-3 model loaded without deepspeed.zero.Init (--no-zero-init) runs PyTorch's own
    /// linear, whose backward keeps each gathered weight from its forward to its backward
    /// [default: latest].
    #[cfg_attr(feature = "clap", arg(long, value_name = "VERSION"))]
    pub deepspeed: Option<String>,
    /// PyTorch release the run trains with, MAJOR.MINOR[.PATCH]: before 2.1 a foreach Adam or
    /// AdamW step keeps two parameter-sized intermediates at once (the second moment's square
    /// root and the denominator made from it), since then one; before 1.11 an eager
    /// attention's softmax saves its input (the scores) beside its output [default: latest].
    #[cfg_attr(feature = "clap", arg(long, value_name = "VERSION"))]
    pub torch: Option<String>,
    /// Inference from a quantised checkpoint, FORMAT[:OPTION,...]: int8 (bitsandbytes
    /// LLM.int8), fp4 | nf4 (bitsandbytes 4-bit; options double, compute=fp32|bf16|fp16), gptq
    /// (options bits=2|3|4|8, group=N, kernel=exllama|exllamav2|cuda-old: AutoGPTQ's linear and
    /// its buffers), awq (options bits, group), fp8 (option block=N weights per scale), or none
    /// [default: the config's quantization_config, else none].
    #[cfg_attr(feature = "clap", arg(long, value_name = "FORMAT"))]
    pub quant: Option<String>,
    /// Training with the vision tower frozen (`requires_grad_(False)`: LLaVA's fine-tuning
    /// stage, locked-image tuning of a CLIP/SigLIP dual encoder): it saves nothing for backward
    /// and has no gradients or optimizer states.
    #[cfg_attr(feature = "clap", arg(long))]
    pub freeze_vision_tower: bool,
    /// Plan a serving engine's start-up memory profile instead of a PyTorch process: vllm
    /// (vLLM's V0 engine, 0.6.5 to 0.8: weights, the profile run's activation peak, and the
    /// KV-cache blocks, tokens and concurrency the rest of --gpu leaves) [default: none].
    #[cfg_attr(feature = "clap", arg(long))]
    pub engine: Option<String>,
    /// With --engine: the longest request in tokens [default: the config's
    /// max_position_embeddings].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub max_model_len: Option<u64>,
    /// With --engine: tokens per scheduler step, the profile run's token count [default:
    /// max(max_model_len, 2048), vLLM V0 without chunked prefill].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub max_num_batched_tokens: Option<u64>,
    /// With --engine: sequences per scheduler step, the profile run's sampled rows [default:
    /// 256].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub max_num_seqs: Option<u64>,
    /// With --engine: share of the GPU's memory the engine may use, above 0 and at most 1
    /// [default: 0.9].
    #[cfg_attr(feature = "clap", arg(long, allow_hyphen_values = true))]
    pub gpu_memory_utilization: Option<f64>,
    /// With --engine: tokens per KV-cache block [default: 16].
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = count)
    )]
    pub block_size: Option<u64>,
    /// With --engine: bytes outside PyTorch's allocator the profile counts (vLLM's logged
    /// non_torch_memory: cuBLAS and NCCL workspaces), taken off the KV cache [default: 0].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "BYTES", allow_negative_numbers = true, value_parser = count)
    )]
    pub non_torch_bytes: Option<u64>,
    /// LoRA over an int8 base (validation data only; not a `gpumem plan` flag).
    #[cfg_attr(feature = "clap", arg(skip))]
    pub lora_base_int8: bool,
    /// `cpu` reproduces PyTorch-on-CPU measurements (validation data only; not a flag) [default: gpu].
    #[cfg_attr(feature = "clap", arg(skip))]
    pub target: Option<String>,
    /// The GPU planned for (a catalogue name or a size), whose generation sets the cuBLAS
    /// workspace and whose multiprocessors size reductions' staging buffers; `gpumem plan`
    /// fills it from `--gpu` [default: an H100's workspace and multiprocessors].
    #[cfg_attr(feature = "clap", arg(skip))]
    pub gpu: Option<String>,
}

/// Parses a count typed on the command line; a negative number gets the same reason as in the
/// typed errors rather than clap's "invalid digit".
#[cfg(feature = "clap")]
fn count(text: &str) -> std::result::Result<u64, String> {
    text.parse()
        .map_err(|_| "must be a positive integer".to_string())
}

/// Default LoRA rank when `--qlora` is given without `--lora-rank`.
pub const DEFAULT_LORA_RANK: u64 = 16;

/// Parses an optional choice against its table of accepted names.
/// `offload` as a settings file or Python gives it: a string of [`choices::OFFLOADS`], or a
/// boolean as earlier settings files have it (`true` is `all`, `false` none).
fn offload_value<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Flag(bool),
        Name(String),
    }
    Ok(match Option::<Value>::deserialize(d)? {
        None | Some(Value::Flag(false)) => None,
        Some(Value::Flag(true)) => Some("all".into()),
        Some(Value::Name(name)) => Some(name),
    })
}

pub(crate) fn pick<T: Clone>(
    value: &Option<String>,
    kind: &'static str,
    table: &[(&str, T)],
) -> Result<Option<T>> {
    value.as_deref().map(|v| parse(kind, v, table)).transpose()
}

/// `--kernels liger` needs a family Liger-Kernel patches as planned
/// ([`Kernels::LIGER_MODEL_TYPES`]); any other model is a typed error naming them.
fn check_liger_family(model: &ModelSpec) -> Result<()> {
    let model_type = match &model.arch {
        Architecture::Transformer(spec) if spec.vision.is_none() && spec.dual.is_none() => {
            spec.model_type.as_str()
        }
        _ => "",
    };
    if Kernels::LIGER_MODEL_TYPES.contains(&model_type) {
        return Ok(());
    }
    Err(PlanError::InvalidValue {
        name: "kernels".into(),
        value: "liger".into(),
        reason: format!(
            "{} ({}) has no Liger-Kernel patch planned; planned families (model_type): {}",
            model.name,
            if model_type.is_empty() {
                "not a text decoder"
            } else {
                model_type
            },
            Kernels::LIGER_MODEL_TYPES.join(", ")
        ),
    })
}

/// Settings resolved against the model they run on.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The workload to estimate.
    pub workload: Workload,
    /// Flags given that the mode or the model ignores (the estimate adds its own warnings).
    pub warnings: Vec<Warning>,
}

impl Settings {
    /// Fields that are not `gpumem plan` flags: set by the validation data, or (`gpu`) filled
    /// from the command's own `--gpu`.
    pub const NOT_FLAGS: [&str; 3] = ["lora_base_int8", "target", "gpu"];

    /// Converts to a validated [`Workload`] without a model (absent dtype: fp32); every bad name
    /// or size, and ZeRO with FSDP, is a typed error.
    pub fn to_workload(&self) -> Result<Workload> {
        let mut workload = self.build(None)?;
        self.quantize(None, "the model", &mut workload)?;
        Ok(workload)
    }

    /// Converts for `model`: inference without `--dtype` loads the config's `torch_dtype` (as
    /// `from_pretrained(torch_dtype="auto")` and serving stacks do; training keeps the fp32
    /// default), and the flags that the mode or the model ignores become warnings.
    pub fn resolve(&self, model: &ModelSpec) -> Result<Resolved> {
        // A model that calls SDPA itself takes no `--attn` (ignored, with a warning, below).
        let own_attention = model.calls_sdpa_itself().then(|| Settings {
            attn: None,
            ..self.clone()
        });
        let mut workload = own_attention
            .as_ref()
            .unwrap_or(self)
            .build(model.torch_dtype)?;
        self.quantize(model.quantization.as_ref(), &model.name, &mut workload)?;
        if workload.kernels == Kernels::Liger {
            check_liger_family(model)?;
        }
        // Module names are the family's (GPT-NeoX's `dense` is the attention output, BERT's
        // every output projection).
        if let (Some(lora), Architecture::Transformer(spec)) = (workload.lora.as_mut(), &model.arch)
        {
            lora.targets = self.lora_targets(&spec.model_type)?;
        }
        // A model's default image is the one it was trained at.
        if let (None, Some(size)) = (self.image_size, model.native_image_size()) {
            workload.image_size = size;
        }
        let mut warnings = self.ignored(model, workload.mode);
        warnings.extend(self.ignored_by_engine());
        if self.bitsandbytes.is_some()
            && (workload.mode != Mode::Train || workload.four_bit_base().is_none())
        {
            warnings.push(Warning::Ignored {
                flag: "--bitsandbytes",
                reason: "only the 4-bit base of a QLoRA training step (--qlora, or --quant \
                         fp4/nf4 with --lora-rank) is planned by bitsandbytes release"
                    .into(),
            });
        }
        warnings.extend(self.lower_default_seq(model, &mut workload));
        Ok(Resolved { workload, warnings })
    }

    /// `--lora-targets` read with `model_type`'s module names (all-linear without the flag).
    fn lora_targets(&self, model_type: &str) -> Result<LoraTargets> {
        self.lora_targets
            .as_deref()
            .map_or(Ok(LoraTargets::default()), |text| {
                LoraTargets::parse(text, model_type)
            })
    }

    /// `--amp`: a half-precision autocast dtype, the error for another listing only those.
    /// `fp32` is read as itself, which [`Workload::validate`] refuses with its reason.
    fn amp(&self) -> Result<Option<Dtype>> {
        let Some(text) = self.amp.as_deref() else {
            return Ok(None);
        };
        match parse("amp dtype", text, choices::AMP_DTYPES) {
            Err(_) if parse("amp dtype", text, choices::DTYPES).ok() == Some(Dtype::Fp32) => {
                Ok(Some(Dtype::Fp32))
            }
            half => half.map(Some),
        }
    }

    /// `--lora-dropout`: a probability below 1.
    fn lora_dropout(&self) -> Result<f64> {
        match self.lora_dropout {
            None => Ok(0.0),
            Some(p) if (0.0..1.0).contains(&p) => Ok(p),
            Some(p) => Err(PlanError::InvalidValue {
                name: "lora-dropout".into(),
                value: p.to_string(),
                reason: "must be a probability from 0 up to (not including) 1".into(),
            }),
        }
    }

    /// The quantisation of the weights: `--quant`, else the checkpoint's `quantization_config`.
    /// Inference loads it as stored; training trains adapters over it (bitsandbytes int8 and
    /// 4-bit bases, as `--qlora`), and refuses to train quantised weights themselves, as
    /// transformers does.
    fn quantize(
        &self,
        checkpoint: Option<&CheckpointQuant>,
        model: &str,
        workload: &mut Workload,
    ) -> Result<()> {
        let quant = match (&self.quant, checkpoint) {
            (Some(text), _) => Quantization::parse(text)?,
            (None, Some(CheckpointQuant::Known(quant))) => Some(*quant),
            (None, Some(CheckpointQuant::Unknown { method })) => {
                return Err(crate::quant::unknown_method(model, method))
            }
            (None, None) => None,
        };
        let Some(quant) = quant else {
            return Ok(());
        };
        if self.qlora {
            return Err(PlanError::Conflict {
                first: "--qlora".into(),
                second: "--quant".into(),
                reason: "--qlora already stores the base in NF4; keep one (a quantised \
                         checkpoint's own format comes from --quant or its config)"
                    .into(),
            });
        }
        if workload.mode != Mode::Train {
            workload.quant = Some(quant);
            return Ok(());
        }
        let base = match quant.format {
            QuantFormat::Int8 => BaseQuant::Int8,
            QuantFormat::Fp4 | QuantFormat::Nf4 => BaseQuant::Nf4 {
                double_quant: quant.double_quant,
            },
            _ => BaseQuant::None,
        };
        let reason = match workload.lora.as_mut() {
            Some(lora) if base != BaseQuant::None => {
                // Planned as QLoRA's base (4-bit with the absmax storage --quant names).
                lora.base = base;
                return Ok(());
            }
            Some(_) => format!(
                "LoRA over a {} base is not modelled (planned bases: bitsandbytes int8, fp4, \
                 nf4); pass --quant none to plan LoRA over unquantised weights",
                quant.format.name()
            ),
            None => format!(
                "training {model}'s quantised weights is not possible (transformers trains only \
                 adapters over them): add --lora-rank for adapters over a bitsandbytes \
                 int8/fp4/nf4 base, or pass --quant none to plan training of unquantised weights"
            ),
        };
        Err(PlanError::InvalidValue {
            name: "quant".into(),
            value: quant.format.name().into(),
            reason,
        })
    }

    /// Without `--seq`, a model whose learned positions are fewer than the default sequence
    /// needs (the prompt, plus the new tokens but the last when generating) is planned at the
    /// longest sequence it runs, with a warning that says so.
    fn lower_default_seq(&self, model: &ModelSpec, workload: &mut Workload) -> Option<Warning> {
        let limit = model.token_limit().filter(|_| model.reads_tokens())?;
        if self.seq.is_some() {
            return None;
        }
        let (longest, what) = match workload.mode {
            Mode::Generate => (
                (limit + 1).checked_sub(workload.new_tokens)?,
                format!(
                    "the prompt and {} new tokens but the last must fit in the {limit} learned \
                     positions of {}",
                    workload.new_tokens, model.name
                ),
            ),
            Mode::Train | Mode::Infer => (
                limit,
                format!("{} has {limit} learned positions", model.name),
            ),
        };
        if workload.seq <= longest || longest == 0 {
            return None;
        }
        let default = workload.seq;
        workload.seq = longest;
        Some(Warning::DefaultLowered {
            flag: "--seq",
            default,
            planned: longest,
            reason: what,
        })
    }

    /// The workload, with `inference_dtype` as the weight dtype of inference when none is given.
    fn build(&self, inference_dtype: Option<Dtype>) -> Result<Workload> {
        let d = Workload::default();
        // A serving engine runs inference: its weights load in the config's dtype.
        let default_mode = if self.engine.is_some() {
            Mode::Infer
        } else {
            d.mode
        };
        let mode = pick(&self.mode, "mode", choices::MODES)?.unwrap_or(default_mode);
        self.check_engine(mode)?;
        self.check_unread_sizes(mode)?;
        let sharding = self.sharding()?;
        let target = self.target()?;
        let gpu = match target {
            Target::Gpu => self.gpu.as_deref().map(crate::gpu::find_gpu).transpose()?,
            Target::Cpu => None,
        };
        let lora = self.lora()?;
        let checkpointing = self.checkpointing()?;
        let default_dtype = match mode {
            Mode::Train => d.dtype,
            Mode::Infer | Mode::Generate => inference_dtype.unwrap_or(d.dtype),
        };
        let framework =
            pick(&self.framework, "framework", choices::FRAMEWORKS)?.unwrap_or(d.framework);
        let kernels = pick(&self.kernels, "kernels", choices::KERNELS)?.unwrap_or(d.kernels);
        if kernels == Kernels::Liger && framework != Framework::Hf {
            return Err(PlanError::Conflict {
                first: "--kernels liger".into(),
                second: format!("--framework {}", self.framework.as_deref().unwrap_or("")),
                reason: "Liger-Kernel patches transformers' modelling code, which litgpt and \
                         gpt-fast do not run; keep one"
                    .into(),
            });
        }
        // Liger's `apply_liger_kernel_to_*` install its fused linear cross-entropy by default.
        let default_loss = match kernels {
            Kernels::Liger => Loss::Fused,
            Kernels::Hf => d.loss,
        };
        let loss = pick(&self.loss, "loss", choices::LOSSES)?.unwrap_or(default_loss);
        let workload = Workload {
            mode,
            batch: self.batch.unwrap_or(d.batch),
            seq: self.seq.unwrap_or(d.seq),
            image_size: self.image_size.unwrap_or(d.image_size),
            new_tokens: self.new_tokens.unwrap_or(d.new_tokens),
            dtype: pick(&self.dtype, "dtype", choices::DTYPES)?.unwrap_or(default_dtype),
            amp: self.amp()?,
            optimizer: pick(&self.optimizer, "optimizer", choices::OPTIMIZERS)?
                .unwrap_or(d.optimizer),
            optimizer_impl: pick(
                &self.optimizer_impl,
                "optimizer implementation",
                choices::OPTIMIZER_IMPLS,
            )?
            .unwrap_or(match target {
                Target::Gpu => d.optimizer_impl,
                Target::Cpu => OptimizerImpl::ForLoop,
            }),
            grad_accum: self.grad_accum.unwrap_or(d.grad_accum),
            keep_grads: self.keep_grads,
            keep_outputs: self.keep_outputs,
            hold_outputs: self.hold_outputs && mode == Mode::Train && loss == Loss::Hf,
            checkpointing,
            // gpt-fast's model calls SDPA itself (`F.scaled_dot_product_attention`).
            attention: match framework {
                Framework::GptFast => Attention::Sdpa,
                Framework::Hf | Framework::Litgpt => {
                    pick(&self.attn, "attention", choices::ATTENTIONS)?.unwrap_or(d.attention)
                }
            },
            lora,
            layout: self.layout(sharding, mode)?,
            target,
            blas_workspace: match target {
                Target::Cpu => 0,
                Target::Gpu => gpu
                    .as_ref()
                    .map_or(d.blas_workspace, |g| g.blas_workspace_bytes),
            },
            cores: match target {
                Target::Cpu => None,
                Target::Gpu => gpu.as_ref().map_or(d.cores, |g| Some(g.cores)),
            },
            device_memory: gpu.as_ref().map(|g| g.memory_bytes),
            use_cache: !self.no_cache,
            labels: self.labels,
            loss,
            loss_chunk: self.loss_chunk,
            framework,
            kernels,
            cache_len: self.cache_len,
            transformers: self
                .transformers
                .as_deref()
                .map(|text| Release::parse("transformers", text))
                .transpose()?,
            bitsandbytes: self
                .bitsandbytes
                .as_deref()
                .map(|text| Release::parse("bitsandbytes", text))
                .transpose()?,
            peft: self
                .peft
                .as_deref()
                .map(|text| Release::parse("peft", text))
                .transpose()?,
            deepspeed: self
                .deepspeed
                .as_deref()
                .map(|text| Release::parse("deepspeed", text))
                .transpose()?,
            torch: self
                .torch
                .as_deref()
                .map(|text| Release::parse("torch", text))
                .transpose()?,
            quant: None,
            freeze_vision_tower: self.freeze_vision_tower,
        };
        workload.validate()?;
        Ok(workload)
    }

    /// A serving engine's profile is one inference forward of its own batch, on one GPU per
    /// instance, over the base model's weights: another mode, tensor or pipeline parallelism
    /// and LoRA adapters are conflicts (the profile would silently answer without them).
    fn check_engine(&self, mode: Mode) -> Result<()> {
        let engines = crate::serving::ENGINES;
        let Some(engine) = pick(&self.engine, "engine", engines)? else {
            return Ok(());
        };
        let one_gpu = "the profile is planned for one GPU per instance (vLLM's \
                       tensor_parallel_size and pipeline_parallel_size 1): parallel workers \
                       are not modelled; plan a model that fits one GPU, or drop --engine";
        let (tp, pp) = (self.tp.unwrap_or(1), self.pp.unwrap_or(1));
        let adapters = if self.qlora {
            Some("--qlora".to_string())
        } else {
            self.lora_rank.map(|rank| format!("--lora-rank {rank}"))
        };
        let refused = [
            (
                mode != Mode::Infer,
                format!(
                    "--mode {}",
                    choices::name(choices::MODES, mode).unwrap_or("?")
                ),
                "a serving engine's profile runs one inference forward over its own batch; \
                 drop --mode",
            ),
            (tp > 1, format!("--tp {tp}"), one_gpu),
            (pp > 1, format!("--pp {pp}"), one_gpu),
            (
                adapters.is_some(),
                adapters.unwrap_or_default(),
                "the profile plans the base model's weights; serving LoRA adapters (vLLM's \
                 --enable-lora) is not modelled",
            ),
        ];
        match refused.into_iter().find(|(given, _, _)| *given) {
            None => Ok(()),
            Some((_, second, reason)) => Err(PlanError::Conflict {
                first: format!("--engine {}", choices::name(engines, engine).unwrap_or("?")),
                second,
                reason: reason.into(),
            }),
        }
    }

    /// `--new-tokens` and `--cache-len` outside generate mode, which ignores them (with a
    /// warning): a value no run accepts is still an error ([`Workload::validate`] checks them
    /// in generate mode).
    fn check_unread_sizes(&self, mode: Mode) -> Result<()> {
        if mode == Mode::Generate {
            return Ok(());
        }
        for (name, value) in [
            ("new-tokens", self.new_tokens),
            ("cache-len", self.cache_len),
        ] {
            if let Some(value) = value {
                crate::limits::POSITIONS.check(name, value)?;
            }
        }
        Ok(())
    }

    /// The sharding `--zero` or `--fsdp` asks for; both at once are a conflict.
    fn sharding(&self) -> Result<Sharding> {
        let d = Workload::default();
        let zero =
            pick(&self.zero, "ZeRO stage", choices::ZERO_STAGES)?.unwrap_or(d.layout.sharding);
        if self.fsdp && zero != Sharding::None {
            return Err(PlanError::Conflict {
                first: zero.flag(),
                second: Sharding::Fsdp.flag(),
                reason: "both shard the model states (DeepSpeed ZeRO or PyTorch FSDP, one per \
                         run); keep one: --fsdp shards like --zero 3"
                    .into(),
            });
        }
        Ok(if self.fsdp { Sharding::Fsdp } else { zero })
    }

    /// Where the run is planned: a CUDA GPU, or the CPU of the validation data.
    fn target(&self) -> Result<Target> {
        match self.target.as_deref() {
            None | Some("gpu") | Some("cuda") => Ok(Target::Gpu),
            Some("cpu") => Ok(Target::Cpu),
            Some(other) => Err(crate::names::unknown("target", other, ["gpu", "cpu"])),
        }
    }

    /// The LoRA adapters the flags ask for, over the base their quantisation gives; none
    /// without a rank, QLoRA or an int8 base. `--lora-dropout` is checked either way: a value
    /// that is no probability is an error even where no adapter reads it.
    fn lora(&self) -> Result<Option<Lora>> {
        let dropout = self.lora_dropout()?;
        let base = if self.qlora {
            Some(BaseQuant::QLORA)
        } else if self.lora_base_int8 {
            Some(BaseQuant::Int8)
        } else {
            self.lora_rank.map(|_| BaseQuant::None)
        };
        match base {
            Some(base) => Ok(Some(Lora {
                targets: self.lora_targets("")?,
                dropout,
                ..Lora::new(self.lora_rank.unwrap_or(DEFAULT_LORA_RANK), base)
            })),
            None => Ok(None),
        }
    }

    /// The GPUs, their parallelism and the sharding of the model states in `mode`: ZeRO, FSDP
    /// and offloading only in training (elsewhere they are warned about as ignored, and change
    /// nothing).
    fn layout(&self, sharding: Sharding, mode: Mode) -> Result<Layout> {
        let d = Workload::default().layout;
        let offload = self.offload_for(sharding, mode)?;
        let sharding = match mode {
            Mode::Train => sharding,
            Mode::Infer | Mode::Generate => Sharding::None,
        };
        Ok(Layout {
            gpus: self.gpus.unwrap_or(d.gpus),
            nodes: self.nodes.unwrap_or(d.nodes),
            tp: self.tp.unwrap_or(d.tp),
            pp: self.pp.unwrap_or(d.pp),
            sp: self.sp,
            sharding,
            offload,
            zero_init: !self.no_zero_init,
            fsdp_cpu_loading: self.fsdp_cpu_ram_efficient_loading,
            fsdp_version: pick(&self.fsdp_version, "FSDP version", choices::FSDP_VERSIONS)?
                .unwrap_or(d.fsdp_version),
            fsdp_sharding: pick(
                &self.fsdp_sharding,
                "FSDP sharding strategy",
                choices::FSDP_SHARDINGS,
            )?
            .unwrap_or(d.fsdp_sharding),
            fsdp_mp: pick(
                &self.fsdp_mp,
                "FSDP mixed precision",
                choices::FSDP_MP_DTYPES,
            )?
            .filter(|_| sharding == Sharding::Fsdp),
            nccl_buffsize: self.nccl_buffsize.unwrap_or(d.nccl_buffsize),
            zero_buckets: pick(
                &self.zero_buckets,
                "ZeRO bucket sizes",
                choices::ZERO_BUCKETS,
            )?
            .unwrap_or(d.zero_buckets),
        })
    }

    /// What `--offload` moves to the host under `sharding` in `mode`. FSDP has no
    /// optimizer-only offload: its `CPUOffload(offload_params=True)` moves the parameter shards
    /// and runs the optimizer step on the host, so `optimizer` with `--fsdp` is a conflict.
    /// Offloading is DeepSpeed ZeRO's or FSDP's, so a training run without either that asks
    /// for it is a conflict too; outside training nothing is offloaded (the flag is ignored,
    /// with a warning).
    fn offload_for(&self, sharding: Sharding, mode: Mode) -> Result<Offload> {
        let offload = pick(&self.offload, "offload", choices::OFFLOADS)?.unwrap_or_default();
        if sharding == Sharding::Fsdp && offload == Offload::Optimizer {
            return Err(PlanError::Conflict {
                first: "--fsdp".into(),
                second: "--offload optimizer".into(),
                reason: "FSDP's CPU offload moves the parameters with the optimizer; use \
                         --offload all"
                    .into(),
            });
        }
        if mode != Mode::Train {
            return Ok(Offload::None);
        }
        if sharding == Sharding::None && offload != Offload::None {
            return Err(PlanError::Conflict {
                first: format!(
                    "--offload {}",
                    choices::name(choices::OFFLOADS, offload).unwrap_or("?")
                ),
                second: "no --zero or --fsdp".into(),
                reason: "offloading is DeepSpeed ZeRO's (offload_optimizer and offload_param, \
                         stages 1-3) or FSDP's (CPUOffload); add --zero 2 (ZeRO-Offload), \
                         --zero 3 or --fsdp"
                    .into(),
            });
        }
        Ok(offload)
    }

    /// The checkpointing policy the flags ask for; two policies at once are a conflict.
    fn checkpointing(&self) -> Result<Checkpointing> {
        let asked: Vec<(String, Checkpointing)> = [
            (
                self.grad_ckpt,
                "--grad-ckpt".to_string(),
                Checkpointing::Full,
            ),
            (
                self.grad_ckpt_selective,
                "--grad-ckpt-selective".to_string(),
                Checkpointing::Selective,
            ),
            (
                self.grad_ckpt_per_op,
                "--grad-ckpt-per-op".to_string(),
                Checkpointing::PerOp,
            ),
        ]
        .into_iter()
        .filter(|(given, _, _)| *given)
        .map(|(_, flag, policy)| (flag, policy))
        .chain(
            self.grad_ckpt_every
                .map(|k| (format!("--grad-ckpt-every {k}"), Checkpointing::EveryNth(k))),
        )
        .collect();
        match asked.as_slice() {
            [] => Ok(Checkpointing::None),
            [(_, policy)] => Ok(*policy),
            [(first, _), (second, _), ..] => Err(PlanError::Conflict {
                first: first.clone(),
                second: second.clone(),
                reason: "each asks for a different checkpointing policy; keep one".into(),
            }),
        }
    }
}

#[cfg(all(test, feature = "clap"))]
mod tests {
    use super::*;
    use clap::Args;

    /// The name a choice table gives `value` (its first spelling).
    fn name<T: PartialEq>(table: &[(&'static str, T)], value: T) -> &'static str {
        table
            .iter()
            .find(|(_, v)| *v == value)
            .map(|(n, _)| *n)
            .unwrap()
    }

    /// The fields that are not flags are exactly those the command line lacks: every other
    /// field is the flag of its name (what callers passing settings by name rely on).
    #[test]
    fn the_fields_not_flags_are_the_ones_the_command_line_lacks() {
        let command = Settings::augment_args(clap::Command::new("plan"));
        let mut flags: Vec<String> = command
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect();
        let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(Settings::default())
        else {
            panic!("Settings serializes as an object");
        };
        let mut names: Vec<String> = fields
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| !Settings::NOT_FLAGS.contains(&name.as_str()))
            .collect();
        flags.sort();
        names.sort();
        assert!(names.contains(&"grad_ckpt".to_string()));
        assert_eq!(names, flags);
    }

    /// Every flag that takes a value shows its default in `--help`, and the default shown is the
    /// one `to_workload` applies (so the help cannot drift from `Workload::default()`).
    #[test]
    fn help_shows_the_defaults_to_workload_applies() {
        let command = Settings::augment_args(clap::Command::new("plan"));
        let help = |id: &str| {
            command
                .get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default()
        };
        for arg in command.get_arguments() {
            if arg.get_action().takes_values() {
                let text = help(arg.get_id().as_str());
                assert!(text.contains("[default: "), "--{}: {text}", arg.get_id());
            }
        }
        let d = Workload::default();
        let shown = [
            ("mode", name(choices::MODES, d.mode).to_string()),
            ("batch", d.batch.to_string()),
            ("seq", d.seq.to_string()),
            ("image_size", d.image_size.to_string()),
            ("new_tokens", d.new_tokens.to_string()),
            ("dtype", name(choices::DTYPES, d.dtype).to_string()),
            (
                "optimizer",
                name(choices::OPTIMIZERS, d.optimizer).to_string(),
            ),
            (
                "optimizer_impl",
                name(choices::OPTIMIZER_IMPLS, d.optimizer_impl).to_string(),
            ),
            ("attn", name(choices::ATTENTIONS, d.attention).to_string()),
            ("grad_accum", d.grad_accum.to_string()),
            ("gpus", d.layout.gpus.to_string()),
            ("nodes", d.layout.nodes.to_string()),
            (
                "zero",
                name(choices::ZERO_STAGES, d.layout.sharding).to_string(),
            ),
            ("tp", d.layout.tp.to_string()),
            ("pp", d.layout.pp.to_string()),
            (
                "fsdp_version",
                name(choices::FSDP_VERSIONS, d.layout.fsdp_version).to_string(),
            ),
            ("fsdp_mp", "none".to_string()),
            (
                "fsdp_sharding",
                name(choices::FSDP_SHARDINGS, d.layout.fsdp_sharding).to_string(),
            ),
            (
                "offload",
                name(choices::OFFLOADS, d.layout.offload).to_string(),
            ),
            ("nccl_buffsize", d.layout.nccl_buffsize.to_string()),
            (
                "zero_buckets",
                name(choices::ZERO_BUCKETS, d.layout.zero_buckets).to_string(),
            ),
            ("kernels", name(choices::KERNELS, d.kernels).to_string()),
            ("lora_rank", DEFAULT_LORA_RANK.to_string()),
            ("amp", "none".to_string()),
        ];
        assert_eq!(d.amp, None);
        for (id, value) in shown {
            assert!(
                help(id).contains(&format!("[default: {value}")),
                "--{id}: {}",
                help(id)
            );
        }
    }
}
