//! What is run on the model: training or inference settings, precision, optimizer, parallel layout.

use crate::error::{PlanError, Result};
use crate::names::lookup;
// Defined below the model (whose checkpoint dtype it names) and re-exported here.
pub use crate::dtype::Dtype;
use serde::Serialize;

/// Training step, plain forward pass, or autoregressive generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Forward, backward and optimizer step.
    Train,
    /// One forward pass without gradients, as `model(**batch)` runs it in eval mode: decoders
    /// return the KV cache they build (unless [`Workload::use_cache`] is off).
    Infer,
    /// Prefill of the prompt, then one decode step per new token with a KV cache.
    Generate,
}

/// PyTorch's two FSDP implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FsdpVersion {
    /// `FullyShardedDataParallel`: one flat parameter per wrapped unit (accelerate's and the
    /// Hugging Face Trainer's `fsdp_version: 1`).
    #[serde(rename = "1")]
    V1,
    /// `fully_shard`: per-parameter DTensor shards (torchtitan, torchtune, PyTorch's current
    /// recommendation; FSDP1 is deprecated in its docs).
    #[serde(rename = "2")]
    V2,
}

/// How FSDP shards a unit's parameters, gradients and optimizer states over the data-parallel
/// ranks (`torch.distributed.fsdp.ShardingStrategy`; FSDP2 spells the same choices as
/// `fully_shard(reshard_after_forward=…)` and a 2-D replicate × shard mesh).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FsdpSharding {
    /// `FULL_SHARD`: everything sharded over all ranks; a unit is gathered for its forward,
    /// freed after it, gathered again for its backward.
    FullShard,
    /// `SHARD_GRAD_OP`: sharded like `FULL_SHARD` at rest, but a unit stays gathered from its
    /// forward to the end of its backward (no second all-gather), so the whole model is
    /// gathered when the backward starts.
    ShardGradOp,
    /// `NO_SHARD` (FSDP1 only): every rank keeps whole flat parameters, gradients and optimizer
    /// states, and all-reduces the gradients in place, as DDP without its bucket copies.
    NoShard,
    /// `HYBRID_SHARD`: `FULL_SHARD` within a machine (`gpus / nodes` ranks), replicated across
    /// machines.
    HybridShard,
    /// `_HYBRID_SHARD_ZERO2`: `SHARD_GRAD_OP` within a machine, replicated across machines.
    HybridShardZero2,
}

impl FsdpSharding {
    /// Whether a unit stays gathered from its forward to the end of its backward (not freed
    /// after its forward to be gathered again; `NO_SHARD` gathers nothing).
    pub fn keeps_units_gathered(self) -> bool {
        matches!(
            self,
            FsdpSharding::ShardGradOp | FsdpSharding::HybridShardZero2
        )
    }

    /// Whether the states are sharded over one machine's ranks only.
    pub fn hybrid(self) -> bool {
        matches!(
            self,
            FsdpSharding::HybridShard | FsdpSharding::HybridShardZero2
        )
    }
}

/// `--fsdp-version` when none is given: FSDP2, what PyTorch documents and torchtitan/torchtune
/// run today. Both allocate the same units at the peak in this model; they differ in the
/// per-unit buffers (see `fsdp_buffers` in [`crate::distributed`]).
pub const DEFAULT_FSDP_VERSION: FsdpVersion = FsdpVersion::V2;

/// How DeepSpeed ZeRO's bucket sizes and stage-3 thresholds are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ZeroBuckets {
    /// DeepSpeed's own defaults (`runtime/zero/config.py`): `reduce_bucket_size` 5e8,
    /// `stage3_prefetch_bucket_size` 5e7, `stage3_param_persistence_threshold` 1e5 elements;
    /// what a config without these keys gets, as accelerate builds it from its own
    /// `deepspeed_config` questions.
    Default,
    /// "auto" in a DeepSpeed config file, filled by accelerate (`accelerator.py`
    /// `_prepare_deepspeed`) and the HF Trainer from the model's `hidden_size` h:
    /// `reduce_bucket_size` h², `stage3_prefetch_bucket_size` 0.9·h²,
    /// `stage3_param_persistence_threshold` 10·h.
    Auto,
}

/// What CPU offloading moves to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    /// Nothing: every state on the GPU.
    #[default]
    None,
    /// The optimizer only, as DeepSpeed's `offload_optimizer` without `offload_param`: the
    /// fp32 master partitions, the optimizer states and the step on the host, with the reduced
    /// gradient partitions they update (`stage3.py` / `stage_1_and_2.py`: `self.device` is the
    /// CPU, so the gradient partitions' flat buffer is allocated there); ZeRO-3's parameter
    /// partitions stay on the GPU (`offload_param` alone decides their `remote_device`,
    /// `partition_parameters.py` `Init`).
    Optimizer,
    /// The optimizer and, with ZeRO-3 or FSDP, the parameter shards and their gradients:
    /// DeepSpeed's `offload_optimizer` with `offload_param`, FSDP's
    /// `CPUOffload(offload_params=True)` (which runs the optimizer step on the host).
    All,
}

impl Offload {
    /// Whether the optimizer states and step (and the reduced gradient partitions) are on
    /// the host.
    pub fn optimizer(self) -> bool {
        self != Offload::None
    }

    /// Whether ZeRO-3's or FSDP's parameter shards are on the host.
    pub fn params(self) -> bool {
        self == Offload::All
    }
}

/// NCCL's default `NCCL_BUFFSIZE` (Simple protocol, per connection): 4 MiB.
pub const DEFAULT_NCCL_BUFFSIZE: u64 = 4 << 20;

/// The optimizer whose states and step temporaries are modelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// torch.optim.AdamW: two fp32-sized moments per parameter.
    AdamW,
    /// torch.optim.Adam: same memory as AdamW.
    Adam,
    /// torch.optim.SGD with momentum: one buffer per parameter.
    Sgd,
    /// Adafactor (transformers): factored second moment, no first moment.
    Adafactor,
    /// bitsandbytes 8-bit Adam: two 1-byte moments per parameter plus block scales.
    Adam8bit,
    /// No optimizer: forward and backward only, as benchmarks run. No states and no step; the
    /// gradients stay allocated at the end of backward (until `zero_grad`).
    None,
}

/// What a training step computes from the logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Loss {
    /// The model's own loss from labels in the batch, as the Hugging Face Trainer runs it:
    /// cross-entropy over every position's logits (upcast to fp32 for causal LMs).
    Hf,
    /// No loss module: backward from `outputs.logits.sum()`, the model's outputs kept until
    /// backward has run, as forward/backward benchmarks do.
    None,
    /// litgpt's: the LM head applied to chunks of positions (`lm_head_chunk_size=128`), the
    /// chunks kept referenced through backward, cross-entropy per chunk in the logits' dtype
    /// (`chunked_cross_entropy`).
    Chunked,
    /// torchtune's `CEWithChunkedOutputLoss`: the LM head per chunk (8 along the sequence),
    /// each chunk upcast to fp32 only for its own cross-entropy; the recipe drops the logits
    /// before backward.
    ChunkedFp32,
    /// Liger-Kernel's fused linear cross-entropy: no logits beyond one chunk of rows; the
    /// forward computes the loss and the gradients of the hidden states and of the LM head.
    Fused,
    /// A hand-written loop's `F.cross_entropy(logits.view(-1, V), targets.view(-1))` on the
    /// logits as the model returns them (nanoGPT, LLMs-from-scratch): no upcast to fp32, so
    /// `log_softmax` runs and saves its output in the logits' dtype (under CUDA's autocast,
    /// `nll_loss` saves its fp32 copy of half-precision log-probabilities).
    CrossEntropy,
}

impl Loss {
    /// Whether the loss reads the logits of a language-model head chunk by chunk (or fused).
    pub fn chunked(self) -> bool {
        matches!(self, Loss::Chunked | Loss::ChunkedFp32 | Loss::Fused)
    }
}

/// Whose model and LoRA code runs a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// Hugging Face transformers models, PEFT's LoRA (one adapter per linear, fp32 since PEFT 0.12:
    /// [`Workload::fp32_adapters`]).
    Hf,
    /// litgpt's own models: one fused qkv linear whose LoRA has one `lora_A` (and one dropout)
    /// for the enabled q/k/v, adapters in the model's dtype, and grouped-query keys and values
    /// repeated to every head before SDPA.
    Litgpt,
    /// gpt-fast's `generate.py` (pytorch-labs/gpt-fast, and torchao's copy in
    /// `torchao/_models/llama`), generation only: its own `Transformer` with a static KV cache
    /// and a causal-mask buffer made by `setup_caches`, keys and values repeated to every head
    /// (`repeat_interleave`) and decoding in SDPA's math path
    /// ([`Workload::static_cache_positions`]).
    #[serde(rename = "gpt-fast")]
    GptFast,
}

/// Whose kernels run a model's norms, gated activations, rotary embedding and loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// The family's own eager modules (transformers' RMSNorm, MLP and `apply_rotary_pos_emb`).
    Hf,
    /// Liger-Kernel's Triton kernels as its `apply_liger_kernel_to_*` functions install them by
    /// default (liger-kernel 0.8.0 `transformers/monkey_patch.py`; `AutoLigerKernelForCausalLM`
    /// and the HF Trainer's `use_liger_kernel=True` call the same functions): RMSNorm saves only
    /// its input and an fp32 reciprocal RMS per row (`ops/rms_norm.py` 409-482, 607-630), the
    /// gated MLP's fused SiLU/GELU-tanh product saves only the gate and up projections
    /// (`ops/swiglu.py`, `ops/geglu.py`: `ctx.save_for_backward(a, b)`), RoPE rotates q and k in
    /// place and saves its cos/sin tables (`ops/rope.py` 118-158, 226), as the eager products
    /// with the tables do; the loss is the fused linear cross-entropy ([`Loss::Fused`]).
    Liger,
}

impl Kernels {
    /// The `model_type`s whose `apply_liger_kernel_to_*` (liger-kernel 0.8.0
    /// `transformers/monkey_patch.py`) replaces RMSNorm, the gated MLP (SwiGLU, or GeGLU for
    /// Gemma) and RoPE, with the fused linear cross-entropy on by default: the dense families
    /// [`Kernels::Liger`] plans. (MoE, vision-language and LayerNorm families get other patches.)
    pub const LIGER_MODEL_TYPES: [&'static str; 7] = [
        "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3",
    ];
}

/// PyTorch's optimizer-step implementations differ in their temporaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerImpl {
    /// One parameter at a time (the CPU default): temporaries of the largest parameter.
    ForLoop,
    /// Multi-tensor `_foreach_*` kernels (the CUDA default): a parameter-sized temporary.
    Foreach,
    /// One fused kernel: no temporaries.
    Fused,
}

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// Explicit matmul + softmax: batch × heads × seq² scores are materialised and saved.
    Eager,
    /// `scaled_dot_product_attention`: a flash / memory-efficient kernel where one applies.
    Sdpa,
    /// FlashAttention-2: never materialises scores.
    Flash,
}

/// Which activations are recomputed in backward instead of kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpointing {
    /// Keep all activations.
    None,
    /// Keep each layer's input only; recompute the layer in backward.
    Full,
    /// Recompute the attention core only (Korthikanti et al.).
    Selective,
    /// Full checkpointing of every k-th block only (transformers'
    /// `activation_checkpointing_enable(every_n_layers=k)`: blocks 0, k, 2k, ...; torchtitan's
    /// `selective_ac_option = "k"` picks the same count of blocks); the others keep all their
    /// activations.
    EveryNth(u64),
    /// Per-op selective checkpointing of every block as torchtitan's `apply_ac` runs it: the
    /// outputs of the attention kernel and of every other bias-free matmul (`aten.mm`) are
    /// saved, everything else is recomputed in backward.
    PerOp,
}

impl Checkpointing {
    /// Does block `index` (counted over the transformer blocks) run under checkpointing?
    pub fn covers_block(self, index: u64) -> bool {
        match self {
            Checkpointing::None => false,
            Checkpointing::Full | Checkpointing::Selective | Checkpointing::PerOp => true,
            Checkpointing::EveryNth(k) => index.is_multiple_of(k.max(1)),
        }
    }
}

pub use crate::releases::{
    Release, BNB_4BIT_MATMUL_FREES_INPUT_SINCE, DEEPSPEED_LINEAR_WRAPPER_FOR_BUILT_MODELS_SINCE,
    DEEPSPEED_OVERFLOW_CHECK_MASKS_SINCE, FOREACH_ADAM_ONE_INTERMEDIATE_SINCE,
    GROUPED_KEYS_TO_SDPA_SINCE, PEFT_FP32_ADAPTERS_SINCE, SOFTMAX_SAVES_OUTPUT_ONLY_SINCE,
};

/// How model states are sharded over data-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharding {
    /// Plain data parallel (DDP): everything replicated, plus gradient buckets.
    None,
    /// ZeRO-1: optimizer states sharded.
    Zero1,
    /// ZeRO-2: optimizer states and gradients sharded.
    Zero2,
    /// ZeRO-3: optimizer states, gradients and weights sharded; layers gathered on use.
    Zero3,
    /// PyTorch FSDP full shard: units gathered on use, the root kept gathered through forward
    /// and backward, the next unit prefetched ([`crate::distributed`]).
    Fsdp,
}

impl Sharding {
    /// The flag that asks for it: `--zero N`, or `--fsdp`.
    pub fn flag(self) -> String {
        match self {
            Sharding::Fsdp => "--fsdp".into(),
            stage => format!(
                "--zero {}",
                choices::name(choices::ZERO_STAGES, stage).unwrap_or("?")
            ),
        }
    }
}

/// Where the tensors live; the CPU target reproduces PyTorch-on-CPU validation measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// A CUDA/ROCm GPU (default).
    Gpu,
    /// PyTorch on CPU: SDPA falls back to the math kernel when attention dropout is active.
    Cpu,
}

/// Storage of the frozen base model under LoRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseQuant {
    /// Base weights in the model dtype (LoRA).
    None,
    /// bitsandbytes int8 (LLM.int8).
    Int8,
    /// bitsandbytes 4-bit (NF4, or FP4 of the same size), its absmax double-quantised
    /// (`bnb_4bit_use_double_quant`, litgpt's `bnb.nf4-dq`) or one fp32 per 64 weights.
    Nf4 {
        /// Double-quantised absmax: int8 with one fp32 scale per 256 blocks.
        double_quant: bool,
    },
}

impl BaseQuant {
    /// QLoRA's base as its paper trains it: NF4 with double-quantised absmax (`--qlora`).
    pub const QLORA: BaseQuant = BaseQuant::Nf4 { double_quant: true };

    /// Whether the base is stored in bitsandbytes 4-bit.
    pub fn four_bit(self) -> bool {
        matches!(self, BaseQuant::Nf4 { .. })
    }
}

/// Low-rank adapters on linear layers of the transformer blocks; the base is frozen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Lora {
    /// Adapter rank r: each targeted `in × out` matrix gains `r·(in + out)` trainable parameters.
    pub rank: u64,
    /// Storage of the frozen base.
    pub base: BaseQuant,
    /// The linears that carry adapters (all of a block's by default).
    pub targets: crate::lora_targets::LoraTargets,
    /// Dropout on each adapter's input (PEFT's `lora_dropout`; 0: none).
    pub dropout: f64,
}

impl Lora {
    /// Adapters of `rank` on every block linear over a `base`, without dropout.
    pub fn new(rank: u64, base: BaseQuant) -> Self {
        Lora {
            rank,
            base,
            targets: Default::default(),
            dropout: 0.0,
        }
    }
}

/// The parallel layout: `gpus = data × tensor × pipeline` ranks over `nodes` machines.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Layout {
    /// Total GPUs.
    pub gpus: u64,
    /// Machines the GPUs are spread over (each holds `gpus / nodes`).
    pub nodes: u64,
    /// Tensor-parallel size.
    pub tp: u64,
    /// Pipeline-parallel size.
    pub pp: u64,
    /// Sequence parallelism (splits the non-tensor-parallel activations over the TP group).
    pub sp: bool,
    /// Model-state sharding over the data-parallel group.
    pub sharding: Sharding,
    /// What is offloaded to CPU memory.
    pub offload: Offload,
    /// Whether a ZeRO-3 model was built under `deepspeed.zero.Init` (each parameter
    /// partitioned as it is created); without it `deepspeed.initialize` moves the whole
    /// module-dtype model to each GPU and partitions it there (see
    /// [`crate::sequence::startup_sequence`]).
    pub zero_init: bool,
    /// Whether FSDP1 wraps a model rank 0 loaded on the host: each unit moved to the GPU,
    /// broadcast from rank 0, flattened and sharded there before the first step, its freed
    /// blocks left in the allocator's cache (see [`crate::sequence::has_fsdp_setup`]).
    pub fsdp_cpu_loading: bool,
    /// Which PyTorch FSDP (with [`Sharding::Fsdp`]).
    pub fsdp_version: FsdpVersion,
    /// How FSDP shards (with [`Sharding::Fsdp`]).
    pub fsdp_sharding: FsdpSharding,
    /// FSDP mixed precision: the dtype parameters are gathered and computed in, from sharded
    /// masters in [`Workload::dtype`] (`MixedPrecisionPolicy(param_dtype=…)`); None: no cast.
    pub fsdp_mp: Option<Dtype>,
    /// NCCL's `NCCL_BUFFSIZE`: bytes of the Simple-protocol buffer of each connection.
    pub nccl_buffsize: u64,
    /// DeepSpeed ZeRO's bucket sizes and stage-3 thresholds (with ZeRO stages 1-3).
    pub zero_buckets: ZeroBuckets,
}

impl Layout {
    /// One GPU, nothing sharded.
    pub fn single() -> Self {
        Layout {
            gpus: 1,
            nodes: 1,
            tp: 1,
            pp: 1,
            sp: false,
            sharding: Sharding::None,
            offload: Offload::None,
            zero_init: true,
            fsdp_cpu_loading: false,
            fsdp_version: DEFAULT_FSDP_VERSION,
            fsdp_sharding: FsdpSharding::FullShard,
            fsdp_mp: None,
            nccl_buffsize: DEFAULT_NCCL_BUFFSIZE,
            zero_buckets: ZeroBuckets::Default,
        }
    }

    /// Data-parallel size: `gpus / (tp · pp)`.
    pub fn dp(&self) -> u64 {
        self.gpus / (self.tp * self.pp)
    }

    /// Data-parallel ranks the model states are sharded over: all of them under ZeRO and
    /// FSDP, one machine's under a hybrid FSDP strategy, none (1) under FSDP's `NO_SHARD`
    /// and plain data parallelism.
    pub fn shard_ranks(&self) -> u64 {
        match self.sharding {
            Sharding::None => 1,
            Sharding::Fsdp if self.fsdp_sharding == FsdpSharding::NoShard => 1,
            Sharding::Fsdp if self.fsdp_sharding.hybrid() => (self.dp() / self.nodes).max(1),
            _ => self.dp(),
        }
    }
}

/// Everything about the run except the model itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    /// Train, infer or generate.
    pub mode: Mode,
    /// Micro-batch size per data-parallel rank.
    pub batch: u64,
    /// Sequence length (prompt length for generate); ignored by CNNs.
    pub seq: u64,
    /// Input image side in pixels for vision models.
    pub image_size: u64,
    /// Tokens generated after the prompt (generate mode).
    pub new_tokens: u64,
    /// Storage dtype of the weights.
    pub dtype: Dtype,
    /// Autocast compute dtype (mixed precision with `dtype` weights, normally fp32 masters).
    pub amp: Option<Dtype>,
    /// Optimizer (training).
    pub optimizer: Optimizer,
    /// Optimizer-step implementation (training).
    pub optimizer_impl: OptimizerImpl,
    /// Micro-batches accumulated per optimizer step; above 1, gradients stay alive through forward.
    pub grad_accum: u64,
    /// Gradients are zeroed instead of freed after the step (`zero_grad(set_to_none=False)`,
    /// the PyTorch < 2.0 default): they stay allocated through the next forward.
    pub keep_grads: bool,
    /// The loop keeps the previous step's outputs referenced through the next step's forward
    /// (`outputs = model(...)` rebinds only when the forward returns): with `--loss none` its
    /// logits and the KV cache a causal LM returns in training (`Unit::retained`).
    pub keep_outputs: bool,
    /// With the model's own loss ([`Loss::Hf`]), the loop holds the model's outputs through
    /// backward and the optimizer step (`Unit::held`), dropping them before the next forward.
    pub hold_outputs: bool,
    /// Activation recomputation.
    pub checkpointing: Checkpointing,
    /// Attention implementation.
    pub attention: Attention,
    /// Low-rank adaptation of a frozen base.
    pub lora: Option<Lora>,
    /// Parallel layout.
    pub layout: Layout,
    /// GPU or PyTorch-on-CPU.
    pub target: Target,
    /// The forward's `use_cache` (on in Hugging Face configs unless they say otherwise): an
    /// inference forward of a decoder returns the KV cache it builds, and training passes its
    /// keys and values through a cache. Off with `--no-cache` (`use_cache=False`). Generation
    /// always decodes with its cache.
    pub use_cache: bool,
    /// Inference with labels in the batch: the forward also computes the model's loss (an
    /// evaluation step); an encoder-decoder takes its decoder inputs from the labels.
    pub labels: bool,
    /// What a training step computes from the logits.
    pub loss: Loss,
    /// Positions per chunk of a chunked loss (None: the framework's default, litgpt's 128 or
    /// torchtune's eighth of the sequence).
    pub loss_chunk: Option<u64>,
    /// Whose model and LoRA code runs the step.
    pub framework: Framework,
    /// Whose kernels run the norms, gated activations, rotary embedding and loss.
    pub kernels: Kernels,
    /// Generation with a static (preallocated) KV cache of this many positions (`--cache-len`):
    /// transformers' `StaticCache(max_cache_len=N)`, gpt-fast's `--cache_size`. None: a
    /// dynamic cache (gpt-fast's own default, [`Workload::static_cache_positions`]).
    pub cache_len: Option<u64>,
    /// The transformers release whose modelling code is planned (see `releases`); None:
    /// today's (the latest).
    pub transformers: Option<Release>,
    /// The bitsandbytes release a QLoRA base runs with (see
    /// [`BNB_4BIT_MATMUL_FREES_INPUT_SINCE`]); None: today's (the latest).
    pub bitsandbytes: Option<Release>,
    /// The PEFT release LoRA adapters are built with (see [`PEFT_FP32_ADAPTERS_SINCE`]);
    /// None: today's (the latest).
    pub peft: Option<Release>,
    /// The DeepSpeed release a ZeRO run uses (see
    /// [`DEEPSPEED_LINEAR_WRAPPER_FOR_BUILT_MODELS_SINCE`]); None: today's (the latest).
    pub deepspeed: Option<Release>,
    /// The PyTorch release the run trains with (see [`FOREACH_ADAM_ONE_INTERMEDIATE_SINCE`]);
    /// None: today's (the latest).
    pub torch: Option<Release>,
    /// Inference from a quantised checkpoint: how its block linears are stored (None: in
    /// `dtype`). Training plans a quantised base through [`Lora::base`].
    pub quant: Option<crate::quant::Quantization>,
    /// Training leaves the vision tower (of a vision-language model or dual encoder) frozen:
    /// it runs without recording anything for backward and gets no gradient.
    pub freeze_vision_tower: bool,
    /// The cuBLAS workspace PyTorch allocates through its caching allocator for each thread
    /// and stream that runs a matrix product (by the GPU, [`crate::gpu::Gpu`]; Hopper's when
    /// none is named; 0 on the CPU).
    pub blas_workspace: u64,
    /// The GPU's multiprocessors, which size the staging buffers of PyTorch's reductions
    /// ([`crate::gpu::column_sum_staging_bytes`]); the H100's when no GPU is named; None on
    /// the CPU, whose reductions stage nothing.
    pub cores: Option<crate::gpu::Cores>,
    /// Memory of the GPU planned for, where one is named (`--gpu`): PyTorch's allocator frees
    /// its cached blocks and retries before it reports out-of-memory, so a run that fills the
    /// GPU reserves at most what the GPU has. None: no GPU named (reserved memory unbounded).
    pub device_memory: Option<u64>,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            mode: Mode::Train,
            batch: 1,
            seq: 512,
            image_size: 224,
            new_tokens: 128,
            dtype: Dtype::Fp32,
            amp: None,
            optimizer: Optimizer::AdamW,
            optimizer_impl: OptimizerImpl::Foreach,
            grad_accum: 1,
            keep_grads: false,
            keep_outputs: false,
            hold_outputs: false,
            checkpointing: Checkpointing::None,
            attention: Attention::Sdpa,
            lora: None,
            layout: Layout::single(),
            target: Target::Gpu,
            blas_workspace: crate::gpu::HOPPER_WORKSPACE,
            cores: Some(crate::gpu::H100_CORES),
            device_memory: None,
            use_cache: true,
            labels: false,
            loss: Loss::Hf,
            loss_chunk: None,
            framework: Framework::Hf,
            kernels: Kernels::Hf,
            cache_len: None,
            transformers: None,
            bitsandbytes: None,
            peft: None,
            deepspeed: None,
            torch: None,
            quant: None,
            freeze_vision_tower: false,
        }
    }
}

/// Largest accepted `NCCL_BUFFSIZE` (1 GiB): beyond it a setting is a typo.
pub const MAX_NCCL_BUFFSIZE: u64 = 1 << 30;

/// Largest accepted batch, sequence, image or token count: beyond it a setting is a typo.
pub const MAX_SIZE: u64 = 1 << 24;

impl Workload {
    /// The 4-bit base of a QLoRA training step as bitsandbytes runs it: its quantisation,
    /// computing in the activations' dtype, and the dtype its quantisation state records (what
    /// `dequantize_4bit` writes before the cast to the compute dtype): the model's under
    /// transformers, fp16 under litgpt (Lightning's `_Linear4bit.quantize` casts each weight
    /// to half before quantising it). None without one.
    pub fn four_bit_base(&self) -> Option<(crate::quant::Quantization, Dtype)> {
        let Some(BaseQuant::Nf4 { double_quant }) = self.lora.map(|l| l.base) else {
            return None;
        };
        let quant = crate::quant::Quantization {
            double_quant,
            compute: self.compute_dtype(),
            ..crate::quant::Quantization::of(crate::quant::QuantFormat::Nf4)
        };
        let stored = match self.framework {
            Framework::Litgpt => Dtype::Fp16,
            Framework::Hf | Framework::GptFast => self.dtype,
        };
        Some((quant, stored))
    }

    /// Whether the 4-bit base includes the LM head: litgpt's does (Lightning's bitsandbytes
    /// plugin replaces every `nn.Linear` its model builds); transformers keeps the output
    /// embedding unquantised.
    pub fn four_bit_lm_head(&self) -> bool {
        self.framework == Framework::Litgpt && self.four_bit_base().is_some()
    }

    /// Whether PEFT's LoRA adapters are fp32 whatever the base's dtype (a PEFT release since
    /// [`PEFT_FP32_ADAPTERS_SINCE`]); otherwise they are in the model's dtype (litgpt's own
    /// LoRA, or an older PEFT).
    pub fn fp32_adapters(&self) -> bool {
        self.framework == Framework::Hf
            && self
                .peft
                .is_none_or(|release| release >= PEFT_FP32_ADAPTERS_SINCE)
    }

    /// Parameter-sized intermediates a foreach Adam or AdamW step holds at once: two before
    /// [`FOREACH_ADAM_ONE_INTERMEDIATE_SINCE`], one since.
    pub fn foreach_adam_intermediates(&self) -> f64 {
        if self
            .torch
            .is_some_and(|release| release < FOREACH_ADAM_ONE_INTERMEDIATE_SINCE)
        {
            2.0
        } else {
            1.0
        }
    }

    /// Whether a softmax saves its input for backward beside its output: a PyTorch release
    /// before [`SOFTMAX_SAVES_OUTPUT_ONLY_SINCE`].
    pub fn softmax_saves_input(&self) -> bool {
        self.torch
            .is_some_and(|release| release < SOFTMAX_SAVES_OUTPUT_ONLY_SINCE)
    }

    /// Whether each frozen 4-bit linear of a QLoRA base keeps its input for backward: a
    /// bitsandbytes release before [`BNB_4BIT_MATMUL_FREES_INPUT_SINCE`] (training only).
    pub fn four_bit_base_saves_inputs(&self) -> bool {
        self.mode == Mode::Train
            && self.four_bit_base().is_some()
            && self
                .bitsandbytes
                .is_some_and(|release| release < BNB_4BIT_MATMUL_FREES_INPUT_SINCE)
    }

    /// Whether ZeRO-3's gathered linear weights stay allocated from their forward to their
    /// backward: a model built before `deepspeed.initialize` (no `zero.Init` context, see
    /// [`Layout::zero_init`]) under a DeepSpeed release before
    /// [`DEEPSPEED_LINEAR_WRAPPER_FOR_BUILT_MODELS_SINCE`] runs PyTorch's `F.linear`, whose
    /// matmul saves `weight.t()` for the input's gradient: a view that keeps the gathered
    /// storage when ZeRO-3 releases the parameter after the forward (`free_param` only swaps
    /// `param.data` for an empty tensor, v0.14.2 `partition_parameters.py` 279-289). With more
    /// than one data-parallel rank only: on one rank nothing is gathered (`param.data` is the
    /// partition itself, `_no_gather_coalesced`). Training only.
    pub fn zero3_keeps_gathered_linears(&self) -> bool {
        self.mode == Mode::Train
            && self.layout.sharding == Sharding::Zero3
            && !self.layout.zero_init
            && self.layout.dp() > 1
            && self
                .deepspeed
                .is_some_and(|release| release < DEEPSPEED_LINEAR_WRAPPER_FOR_BUILT_MODELS_SINCE)
    }

    /// The dtype activations are computed in: the autocast dtype if any, else the dtype the
    /// modules' parameters have while they run ([`Workload::module_dtype`]).
    pub fn compute_dtype(&self) -> Dtype {
        self.amp.unwrap_or(self.module_dtype())
    }

    /// The dtype of the parameters while the modules run (and of their unsharded gradients):
    /// FSDP mixed precision (planned for training) gathers them in its `param_dtype`; otherwise
    /// the storage dtype.
    pub fn module_dtype(&self) -> Dtype {
        match (self.mode, self.layout.sharding, self.layout.fsdp_mp) {
            (Mode::Train, Sharding::Fsdp, Some(mp)) => mp,
            _ => self.dtype,
        }
    }

    /// Positions one sequence occupies in the model: the prompt, and when generating every new
    /// token but the last (which is never fed back).
    pub fn tokens(&self) -> u64 {
        match self.mode {
            Mode::Generate => self.seq.saturating_add(self.new_tokens).saturating_sub(1),
            Mode::Train | Mode::Infer => self.seq,
        }
    }

    /// Positions of the static KV cache a generation preallocates: `--cache-len`, else under
    /// gpt-fast the prompt and the new tokens (`generate`: `cache_size = max_seq_length = T +
    /// max_new_tokens`), which gpt-fast rounds up to a multiple of 8 (`setup_caches`:
    /// `find_multiple(max_seq_length, 8)`; torchao/_models/llama/model.py at 62c239cf3, line
    /// 160; generate.py, lines 108-120). None: not generating, or a dynamic cache that grows with the tokens.
    pub fn static_cache_positions(&self) -> Option<u64> {
        if self.mode != Mode::Generate {
            return None;
        }
        match self.framework {
            Framework::GptFast => Some(
                self.cache_len
                    .unwrap_or(self.seq.saturating_add(self.new_tokens))
                    .next_multiple_of(8),
            ),
            Framework::Hf | Framework::Litgpt => self.cache_len,
        }
    }

    /// Bytes of the causal-mask buffer gpt-fast's `setup_caches` keeps beside its static cache:
    /// `torch.tril(torch.ones(N, N, dtype=torch.bool))` over the cache's N positions (torchao
    /// `_models/llama/model.py` at 62c239cf3, line 172), whose row of each forward's positions
    /// every attention is masked with. While it is made, the `ones` it is made from exists
    /// too. Zero without gpt-fast.
    pub fn static_causal_mask_bytes(&self) -> u64 {
        match (self.framework, self.static_cache_positions()) {
            (Framework::GptFast, Some(positions)) => positions.saturating_mul(positions),
            _ => 0,
        }
    }

    /// Rejects nonsense sizes and layouts, and flash attention in fp32, with a typed error (the
    /// checks that need the model are in [`crate::checks::check`]).
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("batch", self.batch),
            ("seq", self.seq),
            ("image-size", self.image_size),
            ("grad-accum", self.grad_accum),
            ("gpus", self.layout.gpus),
            ("nodes", self.layout.nodes),
            ("tp", self.layout.tp),
            ("pp", self.layout.pp),
        ];
        for (name, value) in sizes {
            check_size(name, value)?;
        }
        if self.mode == Mode::Generate {
            check_size("new-tokens", self.new_tokens)?;
        }
        if let (Mode::Generate, Some(positions)) = (self.mode, self.cache_len) {
            check_size("cache-len", positions)?;
            // A static cache holds every position a generation writes: the prompt and every
            // new token but the last (transformers sizes its own `max_length - 1`; gpt-fast
            // asserts one more, `cache_size >= T + max_new_tokens`).
            let needed = self.tokens();
            if positions < needed {
                return Err(invalid(
                    "cache-len",
                    positions,
                    format!(
                        "a static cache must hold the prompt and every new token but the last: at \
                         least seq + new-tokens - 1 = {needed}"
                    ),
                ));
            }
        }
        if self.framework == Framework::GptFast && self.mode != Mode::Generate {
            return Err(invalid(
                "framework",
                "gpt-fast",
                "gpt-fast's generate.py is planned for --mode generate; use hf or litgpt for \
                 training and plain forwards"
                    .into(),
            ));
        }
        if let Some(chunk) = self.loss_chunk {
            check_size("loss-chunk", chunk)?;
        }
        let layout = &self.layout;
        if !layout.gpus.is_multiple_of(layout.tp * layout.pp) {
            return Err(invalid(
                "gpus",
                layout.gpus,
                format!("must be a multiple of tp × pp = {}", layout.tp * layout.pp),
            ));
        }
        if !layout.gpus.is_multiple_of(layout.nodes) {
            return Err(invalid(
                "nodes",
                layout.nodes,
                format!("must divide gpus = {}", layout.gpus),
            ));
        }
        if layout.sharding == Sharding::Fsdp
            && layout.fsdp_sharding == FsdpSharding::NoShard
            && layout.fsdp_version != FsdpVersion::V1
        {
            return Err(PlanError::Conflict {
                first: "--fsdp-sharding no-shard".into(),
                second: "--fsdp-version 2".into(),
                reason: "NO_SHARD is FullyShardedDataParallel's (FSDP1) only; add \
                         --fsdp-version 1, or plan FSDP2's replicate() as plain data \
                         parallelism (--gpus without --fsdp)"
                    .into(),
            });
        }
        if layout.sharding == Sharding::Fsdp
            && layout.fsdp_sharding.hybrid()
            && !layout.dp().is_multiple_of(layout.nodes)
        {
            return Err(invalid(
                "nodes",
                layout.nodes,
                format!(
                    "a hybrid FSDP strategy shards within each machine, so the nodes must \
                     divide the data-parallel ranks ({})",
                    layout.dp()
                ),
            ));
        }
        if !(1..=MAX_NCCL_BUFFSIZE).contains(&layout.nccl_buffsize) {
            return Err(invalid(
                "nccl-buffsize",
                layout.nccl_buffsize,
                format!("must be between 1 and {MAX_NCCL_BUFFSIZE} bytes"),
            ));
        }
        if let Some(lora) = self.lora {
            check_size("lora-rank", lora.rank)?;
        }
        if let Checkpointing::EveryNth(k) = self.checkpointing {
            check_size("grad-ckpt-every", k)?;
        }
        if self.amp == Some(Dtype::Fp32) {
            return Err(invalid(
                "amp",
                "fp32",
                "autocast dtype must be bf16 or fp16 (fp32 compute is no autocast: leave --amp \
                 out)"
                    .into(),
            ));
        }
        if self.attention == Attention::Flash && self.compute_dtype() == Dtype::Fp32 {
            return Err(PlanError::Conflict {
                first: "--attn flash".into(),
                second: "fp32 compute (--dtype fp32 without --amp)".into(),
                reason: "FlashAttention-2 computes in fp16 or bf16 only; add --amp bf16 (or \
                         fp16), use --dtype bf16, or --attn sdpa"
                    .into(),
            });
        }
        Ok(())
    }
}

fn check_size(name: &str, value: u64) -> Result<()> {
    if value == 0 || value > MAX_SIZE {
        return Err(invalid(
            name,
            value,
            format!("must be between 1 and {MAX_SIZE}"),
        ));
    }
    Ok(())
}

/// The error for a bad value of `name`: the value and why it is refused.
pub(crate) fn invalid(name: &str, value: impl ToString, reason: String) -> PlanError {
    PlanError::InvalidValue {
        name: name.to_string(),
        value: value.to_string(),
        reason,
    }
}

/// Names accepted for each choice, as typed on the command line.
pub mod choices {
    use super::*;

    /// `--mode`.
    pub const MODES: &[(&str, Mode)] = &[
        ("train", Mode::Train),
        ("infer", Mode::Infer),
        ("generate", Mode::Generate),
    ];
    pub use crate::dtype::DTYPES;
    /// `--optimizer`.
    pub const OPTIMIZERS: &[(&str, Optimizer)] = &[
        ("adamw", Optimizer::AdamW),
        ("adam", Optimizer::Adam),
        ("sgd", Optimizer::Sgd),
        ("adafactor", Optimizer::Adafactor),
        ("adam8bit", Optimizer::Adam8bit),
        ("adamw8bit", Optimizer::Adam8bit),
        ("none", Optimizer::None),
    ];
    /// `--optimizer-impl`.
    pub const OPTIMIZER_IMPLS: &[(&str, OptimizerImpl)] = &[
        ("foreach", OptimizerImpl::Foreach),
        ("fused", OptimizerImpl::Fused),
        ("forloop", OptimizerImpl::ForLoop),
    ];
    /// `--attn`.
    pub const ATTENTIONS: &[(&str, Attention)] = &[
        ("eager", Attention::Eager),
        ("sdpa", Attention::Sdpa),
        ("flash", Attention::Flash),
        ("flash-attention-2", Attention::Flash),
    ];
    /// `--fsdp-version`.
    pub const FSDP_VERSIONS: &[(&str, FsdpVersion)] =
        &[("1", FsdpVersion::V1), ("2", FsdpVersion::V2)];
    /// `--fsdp-sharding`: PyTorch's `ShardingStrategy` names (`FULL_SHARD` and `full_shard`
    /// are accepted too: names are compared in lower case with `_` read as `-`).
    pub const FSDP_SHARDINGS: &[(&str, FsdpSharding)] = &[
        ("full-shard", FsdpSharding::FullShard),
        ("shard-grad-op", FsdpSharding::ShardGradOp),
        ("no-shard", FsdpSharding::NoShard),
        ("hybrid-shard", FsdpSharding::HybridShard),
        ("hybrid-shard-zero2", FsdpSharding::HybridShardZero2),
    ];
    /// `--framework`.
    pub const FRAMEWORKS: &[(&str, Framework)] = &[
        ("hf", Framework::Hf),
        ("litgpt", Framework::Litgpt),
        ("gpt-fast", Framework::GptFast),
    ];
    /// `--kernels`.
    pub const KERNELS: &[(&str, Kernels)] = &[("hf", Kernels::Hf), ("liger", Kernels::Liger)];
    /// `--loss`.
    pub const LOSSES: &[(&str, Loss)] = &[
        ("hf", Loss::Hf),
        ("none", Loss::None),
        ("chunked", Loss::Chunked),
        ("chunked-fp32", Loss::ChunkedFp32),
        ("fused", Loss::Fused),
        ("cross-entropy", Loss::CrossEntropy),
    ];
    /// `--fsdp-mp` (a half-precision `param_dtype`).
    pub const FSDP_MP_DTYPES: &[(&str, Dtype)] = &[
        ("bf16", Dtype::Bf16),
        ("bfloat16", Dtype::Bf16),
        ("fp16", Dtype::Fp16),
        ("float16", Dtype::Fp16),
    ];
    /// `--amp` (autocast to a half-precision dtype).
    pub const AMP_DTYPES: &[(&str, Dtype)] = FSDP_MP_DTYPES;
    /// `--offload` (a bare `--offload`, or `true` in a settings file, is `all`).
    pub const OFFLOADS: &[(&str, Offload)] = &[
        ("none", Offload::None),
        ("optimizer", Offload::Optimizer),
        ("all", Offload::All),
    ];
    /// `--zero-buckets`.
    pub const ZERO_BUCKETS: &[(&str, ZeroBuckets)] = &[
        ("default", ZeroBuckets::Default),
        ("auto", ZeroBuckets::Auto),
    ];
    /// `--zero`.
    pub const ZERO_STAGES: &[(&str, Sharding)] = &[
        ("0", Sharding::None),
        ("1", Sharding::Zero1),
        ("2", Sharding::Zero2),
        ("3", Sharding::Zero3),
    ];

    /// The first name `table` gives `value`, as typed on the command line.
    pub fn name<T: PartialEq>(table: &[(&'static str, T)], value: T) -> Option<&'static str> {
        table.iter().find(|(_, v)| *v == value).map(|(n, _)| *n)
    }

    /// Parses a choice from `table`, with a typed error naming the accepted values.
    pub fn parse<T: Clone>(kind: &'static str, given: &str, table: &[(&str, T)]) -> Result<T> {
        lookup(kind, given, table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zero_and_absurd_sizes() {
        let zero = Workload {
            batch: 0,
            ..Workload::default()
        };
        assert!(matches!(
            zero.validate(),
            Err(PlanError::InvalidValue { .. })
        ));
        let huge = Workload {
            seq: MAX_SIZE + 1,
            ..Workload::default()
        };
        assert!(huge.validate().is_err());
        let bad_layout = Workload {
            layout: Layout {
                gpus: 6,
                tp: 4,
                ..Layout::single()
            },
            ..Workload::default()
        };
        assert!(bad_layout.validate().is_err());
        assert!(Workload::default().validate().is_ok());
    }

    #[test]
    fn parses_choices_with_suggestions() {
        assert_eq!(
            choices::parse("optimizer", "AdamW", choices::OPTIMIZERS).unwrap(),
            Optimizer::AdamW
        );
        let err = choices::parse("optimizer", "adamm", choices::OPTIMIZERS).unwrap_err();
        assert!(err.to_string().contains("did you mean adam"), "{err}");
    }
}
