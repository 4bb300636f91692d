"""Build models (random weights) from config files, their inputs and optimizers (needs torch)."""

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._deps import missing, require
from .configs import model_kind

try:
    import torch
    import torch.nn.functional as F
except ModuleNotFoundError as _err:
    raise missing("torch", _err) from _err

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Workload:
    """A model plus how to feed it: `batch(...)` -> kwargs, `loss(**kwargs)` -> scalar."""
    model: torch.nn.Module
    # "causal_lm" | "masked_lm" | "seq2seq" | "image_cls" | "vision_tower" | "dual_encoder"
    # | "vlm" | "torchvision" | "diffusion"
    kind: str
    vocab_size: int | None
    image_size: int | None
    num_classes: int | None
    # Log-mel bins of a speech encoder (Whisper): its input is features, not token ids.
    mel_bins: int | None = None
    # A vision-language model's image placeholder token and image tokens per sample (LLaVA).
    image_token: int | None = None
    image_tokens: int | None = None
    # The diffusers config of a denoiser (kind "diffusion"): its inputs follow from it.
    diffusion: dict[str, Any] | None = None

    def batch(self, batch: int, seq: int | None, device: str, dtype: torch.dtype | None,
              with_labels: bool) -> dict[str, torch.Tensor]:
        """Inputs of one step, created on `device` (as a data loader would)."""
        if self.kind == "torchvision" or self.kind == "image_cls":
            size = self.image_size
            pixels = torch.randn(batch, 3, size, size, device=device, dtype=dtype)
            labels = torch.randint(0, self.num_classes, (batch,), device=device)
            key = "x" if self.kind == "torchvision" else "pixel_values"
            return {key: pixels, "labels": labels} if with_labels else {key: pixels}
        if self.kind == "vision_tower":
            size = self.image_size
            return {"pixel_values": torch.randn(batch, 3, size, size, device=device, dtype=dtype)}
        if self.kind == "dual_encoder":
            # One caption (padded to `seq`) and one image per sample.
            size = self.image_size
            return {"input_ids": torch.randint(0, self.vocab_size, (batch, seq), device=device),
                    "pixel_values": torch.randn(batch, 3, size, size, device=device,
                                                dtype=dtype)}
        if self.kind == "vlm":
            return self._image_text_batch(batch, seq, device, dtype, with_labels)
        if self.kind == "diffusion":
            return _denoiser_batch(self, batch, device, dtype, with_labels)
        if self.mel_bins is not None:
            # 30 s of audio: 3000 frames (the encoder's 1500 positions after its stride-2 conv).
            features = torch.randn(batch, self.mel_bins, 3000, device=device, dtype=dtype)
            labels = torch.randint(3, self.vocab_size, (batch, seq), device=device)
            return {"input_features": features, "labels": labels}
        ids = torch.randint(0, self.vocab_size, (batch, seq), device=device)
        if not with_labels:
            return {"input_ids": ids}
        return {"input_ids": ids, "labels": ids.clone()}

    def _image_text_batch(self, batch: int, seq: int | None, device: str,
                          dtype: torch.dtype | None,
                          with_labels: bool) -> dict[str, torch.Tensor]:
        """LLaVA's processor output: one image per sample, its `image_tokens` placeholders
        (as transformers >= 4.47 expands `<image>`) followed by text tokens, `seq` in all;
        labels ignore (-100) the image positions, as LLaVA's training data does."""
        assert self.image_token is not None and self.image_tokens is not None and seq
        if seq <= self.image_tokens:
            raise ValueError(f"seq {seq} leaves no text after {self.image_tokens} image tokens")
        size = self.image_size
        pixels = torch.randn(batch, 3, size, size, device=device, dtype=dtype)
        text = torch.randint(3, self.image_token, (batch, seq - self.image_tokens), device=device)
        image = torch.full((batch, self.image_tokens), self.image_token, device=device)
        ids = torch.cat([image, text], dim=1)
        out = {"input_ids": ids, "pixel_values": pixels, "attention_mask": torch.ones_like(ids)}
        if with_labels:
            out["labels"] = ids.masked_fill(ids == self.image_token, -100)
        return out

    def loss(self, **inputs: torch.Tensor) -> torch.Tensor:
        """Forward plus the standard loss (the model's own for HF, CE for torchvision's; a vision
        tower, which has none, the mean of its pooled image embeddings)."""
        if self.kind == "torchvision":
            labels = inputs.pop("labels")
            return F.cross_entropy(self.model(**inputs), labels)
        if self.kind == "vision_tower":
            return self.model(**inputs).pooler_output.mean()
        if self.kind == "dual_encoder":
            return self.model(**inputs, return_loss=True).loss
        if self.kind == "diffusion":
            # diffusers' train_text_to_image.py: MSE between the prediction and the noise,
            # both upcast to fp32.
            target = inputs.pop("target")
            prediction = self.model(**inputs).sample
            return F.mse_loss(prediction.float(), target.float(), reduction="mean")
        return self.model(**inputs).loss


def _denoiser_batch(wl: "Workload", batch: int, device: str, dtype: torch.dtype | None,
                    with_target: bool) -> dict[str, torch.Tensor]:
    """One denoising step's inputs: noisy latents (image side / 8), a timestep per sample,
    and the text encoder's 77 hidden states (UNet) or a class label (DiT); the noise target
    in training."""
    cfg = wl.diffusion or {}
    side = (wl.image_size or 8 * cfg["sample_size"]) // 8
    channels = cfg.get("in_channels", 4)
    sample = torch.randn(batch, channels, side, side, device=device, dtype=dtype)
    # The UNet names its latents `sample`, the DiT `hidden_states`.
    key = "sample" if cfg["_class_name"] == "UNet2DConditionModel" else "hidden_states"
    out: dict[str, Any] = {key: sample,
                           "timestep": torch.randint(0, 1000, (batch,), device=device)}
    if cfg["_class_name"] == "UNet2DConditionModel":
        cross = cfg["cross_attention_dim"]
        out["encoder_hidden_states"] = torch.randn(batch, 77, cross, device=device, dtype=dtype)
        if cfg.get("addition_embed_type") == "text_time":
            time_ids = 6 * cfg["addition_time_embed_dim"]
            pooled = cfg["projection_class_embeddings_input_dim"] - time_ids
            out["added_cond_kwargs"] = {
                "text_embeds": torch.randn(batch, pooled, device=device, dtype=dtype),
                "time_ids": torch.randn(batch, 6, device=device, dtype=dtype)}
    else:
        out["class_labels"] = torch.randint(0, cfg.get("num_embeds_ada_norm", 1000), (batch,),
                                            device=device)
    if with_target:
        prediction_channels = cfg.get("out_channels") or channels
        out["target"] = torch.randn(batch, prediction_channels, side, side, device=device,
                                    dtype=dtype)
    return out


def torchvision_model(cfg: dict[str, Any], image_size: int | None = None) -> torch.nn.Module:
    """The torchvision model gpumem's JSON `cfg` describes (configs.is_torchvision): a ResNet
    of its depth, or a `VisionTransformer` of its sizes (for `image_size`, default the
    config's), with `num_classes` outputs."""
    torchvision = require("torchvision")
    if cfg.get("model_type") == "resnet":
        return getattr(torchvision.models, f"resnet{cfg['depth']}")(
            num_classes=cfg["num_classes"])
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(
        image_size=image_size or cfg["image_size"], patch_size=cfg["patch_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
        hidden_dim=cfg["hidden_size"], mlp_dim=cfg["intermediate_size"],
        num_classes=cfg["num_classes"])


def load_config(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def build(config_path: str | Path, dtype: str = "fp32", attn: str | None = None,
          grad_ckpt: bool = False, device: str = "cpu",
          image_size: int | None = None, grad_ckpt_every: int | None = None,
          grad_ckpt_per_op: bool = False) -> Workload:
    """Instantiate the architecture of `config_path` with random weights."""
    cfg = load_config(config_path)
    torch_dtype = DTYPES[dtype]
    kind = model_kind(cfg)
    if kind == "torchvision":
        if grad_ckpt or grad_ckpt_every or grad_ckpt_per_op:
            raise ValueError("gradient checkpointing is not defined for torchvision models")
        model = torchvision_model(cfg, image_size).to(device=device, dtype=torch_dtype)
        return Workload(model, "torchvision", None, image_size or cfg.get("image_size", 224),
                        cfg["num_classes"])

    if kind == "vlm":
        return _build_vlm(cfg, config_path, kwargs_for(torch_dtype, attn), grad_ckpt, device)
    if kind == "diffusion":
        if grad_ckpt:
            raise ValueError("gradient checkpointing of diffusers models is not measured")
        diffusers = require("diffusers")
        model = getattr(diffusers, cfg["_class_name"]).from_config(cfg)
        model = model.to(device=device, dtype=torch_dtype)
        return Workload(model, "diffusion", None, image_size or 8 * cfg["sample_size"], None,
                        diffusion=cfg)

    if kind == "dual_encoder":
        if grad_ckpt or grad_ckpt_every or grad_ckpt_per_op:
            raise ValueError("checkpointing of dual encoders is not measured")
        return _build_dual_encoder(cfg, config_path, kwargs_for(torch_dtype, attn), image_size,
                                   device)
    if image_size is not None and image_size != cfg.get("image_size"):
        raise ValueError(f"{config_path}: built for image_size {cfg.get('image_size')}, "
                         f"not {image_size}")
    transformers = require("transformers")
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    arch = cfg["architectures"][0]
    kwargs = kwargs_for(torch_dtype, attn)
    auto = {"image_cls": transformers.AutoModelForImageClassification,
            "vision_tower": transformers.AutoModel,
            "masked_lm": transformers.AutoModelForMaskedLM,
            "seq2seq": transformers.AutoModelForSeq2SeqLM,
            "causal_lm": transformers.AutoModelForCausalLM}[kind]
    mel_bins = cfg.get("num_mel_bins") if cfg.get("model_type") == "whisper" else None
    if mel_bins is not None:
        auto = transformers.AutoModelForSpeechSeq2Seq
    model = auto.from_config(hf_cfg, **kwargs).to(device)
    if type(model).__name__ != arch:
        raise ValueError(f"{config_path}: built {type(model).__name__}, config names {arch}")
    if cfg.get("model_type") == "t5" and cfg.get("tie_word_embeddings") is False:
        untie_lm_head(model)
    if grad_ckpt:
        checkpointing_enable(model)
    elif grad_ckpt_every:
        checkpointing_enable(model, every_n_layers=grad_ckpt_every)
    elif grad_ckpt_per_op:
        checkpointing_enable(model, checkpoint_kwargs={
            "use_reentrant": False, "context_fn": per_op_checkpoint_context})
    return Workload(model, kind, cfg.get("vocab_size"), cfg.get("image_size"),
                    len(cfg["id2label"]) if "id2label" in cfg else None, mel_bins)


def decoder_layers(model: Any) -> Any:
    """The decoder layers of a causal LM: `model.model.layers` (Llama family and most others),
    `model.transformer.h` (GPT-2)."""
    for path in (("model", "layers"), ("transformer", "h")):
        part = model
        for name in path:
            part = getattr(part, name, None)
        if part is not None:
            return part
    raise ValueError(f"{type(model).__name__} has no decoder layers (model.layers or "
                     "transformer.h)")


def untie_lm_head(model: Any) -> None:
    """Give the LM head its own weight, as `from_pretrained` leaves it for a checkpoint that
    stores a separate one: transformers 5.x's T5Config forces `tie_word_embeddings=True`
    (T5 v1.1 and FLAN-T5 configs say False), so `from_config` ties the head, but loading finds
    `lm_head.weight` and `shared.weight` both present and different and does not tie them."""
    torch = require("torch")
    weight = model.lm_head.weight
    model.lm_head.weight = torch.nn.Parameter(weight.detach().clone(),
                                              requires_grad=weight.requires_grad)
    # Nothing ties it again (`tie_weights()` reads this mapping).
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict):
        tied.pop("lm_head.weight", None)


def checkpointing_enable(model: Any, every_n_layers: int | None = None,
                         checkpoint_kwargs: dict[str, Any] | None = None) -> None:
    """Activation checkpointing of every layer (or every `every_n_layers`-th), as
    transformers names it: `activation_checkpointing_enable` in newer releases,
    `gradient_checkpointing_enable` (use_reentrant=False, today's default) before, which has
    no every-n-layers choice."""
    if hasattr(model, "activation_checkpointing_enable"):
        extra: dict[str, Any] = {}
        if every_n_layers is not None:
            extra["every_n_layers"] = every_n_layers
        if checkpoint_kwargs is not None:
            extra["activation_checkpointing_kwargs"] = checkpoint_kwargs
        model.activation_checkpointing_enable(**extra)
        return
    if every_n_layers is not None:
        raise ValueError("checkpointing every n-th layer needs a transformers release with "
                         "activation_checkpointing_enable")
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs=checkpoint_kwargs or {"use_reentrant": False})


# Ops whose outputs torchtitan's per-op selective checkpointing saves (`_save_list` of
# torchtitan's `apply_ac`, "op" option): matmuls and the CUDA attention kernels. The CPU flash
# kernel is added here as their counterpart, so that CPU runs save what CUDA runs would.
_PER_OP_SAVED = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def per_op_checkpoint_context() -> Any:
    """torchtitan's per-op policy for one checkpointed region: save the outputs of the ops in
    `_PER_OP_SAVED` except every second `mm` (counted separately in forward and recompute),
    recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[mode] += 1
        save = func in _PER_OP_SAVED and not (
            func == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _build_dual_encoder(cfg: dict[str, Any], config_path: str | Path, kwargs: dict[str, Any],
                        image_size: int | None, device: str) -> Workload:
    """A CLIPModel or SiglipModel: the image size comes from its vision config, the vocabulary
    from its text config."""
    transformers = require("transformers")
    vision, text = cfg["vision_config"], cfg["text_config"]
    if image_size is not None and image_size != vision.get("image_size"):
        raise ValueError(f"{config_path}: built for image_size {vision.get('image_size')}, "
                         f"not {image_size}")
    model = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**cfg),
                                               **kwargs).to(device)
    if type(model).__name__ != cfg["architectures"][0]:
        raise ValueError(f"{config_path}: built {type(model).__name__}, config names "
                         f"{cfg['architectures'][0]}")
    return Workload(model, "dual_encoder", text["vocab_size"], vision["image_size"], None)


def kwargs_for(dtype: torch.dtype, attn: str | None) -> dict[str, Any]:
    """`from_config` keyword arguments: the weights' dtype and the attention implementation.
    `from_config(dtype=...)` came with transformers 4.56; older releases (measured for
    `--transformers`) take `torch_dtype`."""
    transformers = require("transformers")
    release = tuple(int(p) for p in transformers.__version__.split(".")[:2])
    kwargs: dict[str, Any] = {"dtype" if release >= (4, 56) else "torch_dtype": dtype}
    if attn is not None:
        kwargs["attn_implementation"] = attn
    return kwargs


def _build_vlm(cfg: dict[str, Any], config_path: str | Path, kwargs: dict[str, Any],
               grad_ckpt: bool, device: str) -> Workload:
    """A LLaVA-style model (vision tower, projector, language model), all trainable."""
    transformers = require("transformers")
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForImageTextToText.from_config(hf_cfg, **kwargs).to(device)
    arch = cfg["architectures"][0]
    if type(model).__name__ != arch:
        raise ValueError(f"{config_path}: built {type(model).__name__}, config names {arch}")
    if grad_ckpt:
        checkpointing_enable(model)
    vision = hf_cfg.vision_config
    return Workload(model, "vlm", hf_cfg.text_config.vocab_size, vision.image_size, None,
                    image_token=hf_cfg.image_token_id, image_tokens=hf_cfg.image_seq_length)


def make_optimizer(name: str, impl: str,
                   params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch.optim optimizer `name` with implementation `impl` (foreach/fused/forloop)."""
    flags = {"foreach": {"foreach": True}, "fused": {"fused": True},
             "forloop": {"foreach": False}}[impl]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, **flags)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, **flags)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags)
    if name == "adafactor":
        if impl == "fused":
            raise ValueError("torch.optim.Adafactor has no fused implementation")
        return torch.optim.Adafactor(params, lr=1e-3, **flags)
    raise ValueError(f"unknown optimizer {name!r}")


@contextlib.contextmanager
def gpu_like_dropout(device: str) -> Iterator[None]:
    """Make CPU dropout allocate like CUDA's: a bool mask, not an input-dtype one.

    On CUDA `F.dropout` runs the fused `native_dropout` kernel (output + 1-byte
    mask); on CPU it multiplies by a noise tensor of the input's dtype. For CPU
    runs this routes dropout through `torch.native_dropout`, the CUDA path.
    """
    if torch.device(device).type != "cpu":
        yield
        return
    original = F.dropout

    def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
                inplace: bool = False) -> torch.Tensor:
        if not training or p == 0.0:
            return input
        if p == 1.0:
            return original(input, p, training, inplace)
        return torch.native_dropout(input, p, True)[0]

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original


# Rows of the scores computed at once by the GPU-like softmax below: its only temporaries
# (an fp32 copy of one chunk of the input, and of the gradient in backward) stay small.
SOFTMAX_CHUNK_ROWS = 64


class _HalfToFloatSoftmax(torch.autograd.Function):
    """`softmax(x, dim=-1, dtype=float32)` of an fp16 `x` as CUDA's fused `half_to_float`
    kernel allocates it: the fp32 output (and, in backward, the fp16 gradient of `x`) and no
    fp32 copy of the whole input. Computed `SOFTMAX_CHUNK_ROWS` rows at a time."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = torch.empty(rows.shape, dtype=torch.float32)
        for start in range(0, rows.shape[0], SOFTMAX_CHUNK_ROWS):
            chunk = slice(start, start + SOFTMAX_CHUNK_ROWS)
            out[chunk] = torch.softmax(rows[chunk].float(), dim=-1)
        out = out.view(x.shape)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (out,) = ctx.saved_tensors
        g_rows = grad.reshape(-1, grad.shape[-1])
        o_rows = out.reshape(-1, out.shape[-1])
        grad_in = torch.empty(o_rows.shape, dtype=torch.float16)
        for start in range(0, o_rows.shape[0], SOFTMAX_CHUNK_ROWS):
            chunk = slice(start, start + SOFTMAX_CHUNK_ROWS)
            grad_in[chunk] = torch._softmax_backward_data(
                g_rows[chunk], o_rows[chunk], -1, torch.float32)
        return grad_in.view(out.shape)


@contextlib.contextmanager
def gpu_like_softmax(device: str) -> Iterator[None]:
    """Make a CPU `softmax(x, dtype=float32)` of fp16 `x` allocate as on CUDA.

    PyTorch's `softmax(input, dim, dtype)` (aten/src/ATen/native/SoftMax.cpp) calls the fused
    `_softmax(input, dim, half_to_float=true)` when the input is on CUDA, fp16 and `dtype` is
    float32; everywhere else (CPU, and bf16 on CUDA) it first converts the whole input
    (`input_.toType(dtype)`), an extra fp32 copy. Hugging Face's eager attention calls
    `softmax(scores, dtype=torch.float32)`; for CPU runs this routes fp16 inputs through
    `_HalfToFloatSoftmax`, so they allocate the CUDA kernel's tensors.
    """
    if torch.device(device).type != "cpu":
        yield
        return
    original = F.softmax

    def softmax(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3,
                dtype: torch.dtype | None = None) -> torch.Tensor:
        last = dim is not None and dim in (-1, input.dim() - 1)
        if dtype == torch.float32 and input.dtype == torch.float16 and last:
            return _HalfToFloatSoftmax.apply(input)
        return original(input, dim, _stacklevel, dtype)

    F.softmax = softmax
    try:
        yield
    finally:
        F.softmax = original


# torch.autocast op policy of CUDA that CPU autocast lacks (PyTorch AMP docs:
# "CUDA ops that can autocast to float32"): these run in fp32 on CUDA, while
# CPU autocast runs them in the input's bf16/fp16, which would shrink the
# activations it saves.
_CUDA_FP32_OPS = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp",
]
# ... and these run with dtype=float32 unless a dtype is given.
_CUDA_FP32_SET_DTYPE_OPS = [
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "sum",
    "sum.dim_IntList",
]
_cuda_policy_lib: Any = None


def cuda_autocast_policy_on_cpu() -> None:
    """Make CPU autocast cast ops as CUDA autocast does (idempotent, process-wide).

    Registers AutocastCPU kernels for CUDA's fp32 op lists; they only run
    inside `torch.autocast("cpu")`, so non-AMP work is unaffected.
    """
    global _cuda_policy_lib
    if _cuda_policy_lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def eligible(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64

    def fp32_kernel(op: Any) -> Any:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = torch.utils._pytree.tree_map(
                lambda t: t.float() if eligible(t) else t, (args, kwargs))
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                return op(*args, **kwargs)
        return kernel

    def set_dtype_kernel(op: Any) -> Any:
        names = [a.name for a in op._schema.arguments if not a.kwarg_only]
        pos = names.index("dtype") if "dtype" in names else None

        def kernel(*args: Any, **kwargs: Any) -> Any:
            if eligible(args[0]):
                if pos is not None and pos < len(args):
                    if args[pos] is None:
                        args = args[:pos] + (torch.float32,) + args[pos + 1:]
                elif kwargs.get("dtype") is None:
                    kwargs["dtype"] = torch.float32
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                return op(*args, **kwargs)
        return kernel

    for name in _CUDA_FP32_OPS + _CUDA_FP32_SET_DTYPE_OPS:
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        make = fp32_kernel if name in _CUDA_FP32_OPS else set_dtype_kernel
        lib.impl(name, make(op), "AutocastCPU")
    _cuda_policy_lib = lib
