"""Training, inference and generation loops with phase boundaries (needs torch).

Each loop calls `rec.boundary(label)` at the start of every step ("step"),
at every phase ("inputs", "forward", "backward", "optimizer", "zero_grad",
"prefill", "decode") and once at the very end ("end"), so a recorded
timeline can be cut into steps and a peak attributed to a phase.
"""

import contextlib
from pathlib import Path
from typing import Any

from ._deps import missing, require
from .configs import KV_CACHE_KINDS
from .models import (DTYPES, Workload, build, cuda_autocast_policy_on_cpu, decoder_layers,
                     gpu_like_dropout, gpu_like_softmax, make_optimizer)
from .recorder import Recorder
from .settings import Settings

try:
    import torch
except ModuleNotFoundError as _err:
    raise missing("torch", _err) from _err

__all__ = ["Settings", "run"]


def _autocast(device: str, amp: str | None) -> contextlib.AbstractContextManager[Any]:
    if amp is None:
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    if device_type == "cpu":
        cuda_autocast_policy_on_cpu()
    return torch.autocast(device_type, dtype=DTYPES[amp])


def run(config_path: str | Path, s: Settings, rec: Recorder, steps: int, device: str = "cpu",
        seed: int = 0) -> None:
    """Build the model of `config_path` inside the recording and run `steps` steps."""
    torch.manual_seed(seed)
    with gpu_like_dropout(device), gpu_like_softmax(device):
        wl = build(config_path, s.dtype, s.attn, s.grad_ckpt, device, s.image_size,
                   s.grad_ckpt_every, s.grad_ckpt_per_op)
        if s.quant:
            four_bit_base(wl.model, double=s.quant == "nf4:double")
        if s.lora_rank:
            wl.model = with_lora(wl.model, s.lora_rank, s.lora_targets, s.lora_dropout or 0.0)
        if s.freeze_vision_tower:
            _vision_tower(wl.model).requires_grad_(False)
        if s.mode == "train":
            _train(wl, s, rec, steps, device)
        elif s.mode == "infer":
            _infer(wl, s, rec, steps, device)
        elif s.mode == "generate":
            _generate(wl, s, rec, steps, device)
        else:
            raise ValueError(f"unknown mode {s.mode!r}")
        rec.boundary("end")


def _vision_tower(model: Any) -> Any:
    """The vision tower of a vision-language model (LLaVA's `model.vision_tower`) or of a dual
    encoder (CLIP's and SigLIP's `vision_model`)."""
    for path in (("model", "vision_tower"), ("vision_tower",), ("vision_model",)):
        part = model
        for name in path:
            part = getattr(part, name, None)
        if part is not None:
            return part
    raise ValueError(f"{type(model).__name__} has no vision tower to freeze")


def four_bit_base(model: Any, double: bool) -> None:
    """Replace every linear of the decoder layers of `model` with a bitsandbytes `Linear4bit`
    holding its weight in NF4 (`double`: with double quantisation), bf16 storage and compute,
    the LM head and embeddings left as they are, as fsdp_qlora's loader builds a QLoRA base
    (`replace_linear` with `Linear4bit`, then `load_and_quantize` moves each weight to the
    device, which quantises it)."""
    bnb = require("bitsandbytes")
    torch = require("torch")
    device = next(model.parameters()).device
    for layer in decoder_layers(model):
        for parent in list(layer.modules()):
            for name, linear in list(parent.named_children()):
                if type(linear) is not torch.nn.Linear:
                    continue
                four_bit = bnb.nn.Linear4bit(
                    linear.in_features, linear.out_features, bias=linear.bias is not None,
                    compute_dtype=torch.bfloat16, quant_type="nf4",
                    quant_storage=torch.bfloat16, compress_statistics=double)
                four_bit.weight = bnb.nn.Params4bit(
                    linear.weight.data, requires_grad=False, quant_type="nf4",
                    quant_storage=torch.bfloat16, compress_statistics=double)
                if linear.bias is not None:
                    four_bit.bias = linear.bias
                setattr(parent, name, four_bit.to(device))


def with_lora(model: Any, rank: int, targets: str | None, dropout: float) -> Any:
    """`model` with PEFT LoRA adapters of `rank` (alpha 2 x rank) on `targets` (module names,
    comma-separated; None: every linear layer) with `dropout` on their inputs, the base frozen,
    as `get_peft_model` makes it (adapters in fp32 over a half-precision base: PEFT's
    `autocast_adapter_dtype` default)."""
    peft = require("peft")
    modules: str | list[str] = targets.split(",") if targets else "all-linear"
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout,
                             target_modules=modules)
    return peft.get_peft_model(model, config)


def _train(wl: Workload, s: Settings, rec: Recorder, steps: int, device: str) -> None:
    wl.model.train()
    if s.optimizer is None or (s.optimizer_impl is None) != (s.optimizer == "none"):
        raise ValueError("training needs an optimizer and its implementation (none: no "
                         "implementation)")
    opt = (None if s.optimizer == "none"
           else make_optimizer(s.optimizer, s.optimizer_impl, wl.model.parameters()))
    in_dtype = DTYPES[s.dtype]
    extra = _cache_argument(wl, s)
    for _ in range(steps):
        rec.boundary("step")
        rec.boundary("inputs")
        inputs = wl.batch(s.batch, s.seq, device, in_dtype, with_labels=s.loss is None)
        rec.boundary("forward")
        outputs = None
        with _autocast(device, s.amp):
            if s.loss is None and s.hold_outputs:
                outputs = wl.model(**inputs, **extra)
                loss = outputs.loss
            elif s.loss is None:
                loss = wl.loss(**inputs, **extra)
            elif s.loss == "none":
                outputs = wl.model(**inputs, **extra)
                loss = outputs.logits.sum()
            elif s.loss in ("chunked", "chunked-fp32"):
                loss, outputs = _chunked_loss(wl, inputs["input_ids"], s)
            else:
                raise ValueError(f"unknown loss {s.loss!r} (accepted: none, chunked, "
                                 "chunked-fp32)")
        rec.boundary("backward")
        loss.backward()
        if not s.hold_outputs:
            del outputs
        if opt is not None:
            rec.boundary("optimizer")
            opt.step()
        # As the Hugging Face Trainer does: gradients dropped after the step (without an
        # optimizer, as a forward/backward benchmark does, after backward).
        rec.boundary("zero_grad")
        (opt or wl.model).zero_grad(set_to_none=True)
        del loss, inputs
        # A loop that holds its outputs drops them only now, before the next forward.
        outputs = None


def _chunked_loss(wl: Workload, ids: torch.Tensor, s: Settings) -> tuple[torch.Tensor, Any]:
    """A causal LM's loss as litgpt's and torchtune's fine-tuning loops compute it: the body
    (their models keep no KV cache in training), the LM head per chunk of positions, and their
    own loss functions. Returns the loss and what the loop keeps referenced through backward
    (litgpt: the logit chunks; torchtune drops them)."""
    if wl.kind != "causal_lm":
        raise ValueError("chunked losses are measured for causal LMs")
    hidden = wl.model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    head = wl.model.get_output_embeddings()
    if s.loss == "chunked":
        chunked_cross_entropy = require("litgpt.utils").chunked_cross_entropy
        chunks = [head(h) for h in hidden.split(s.loss_chunk or 128, dim=1)]
        del hidden
        # litgpt's finetune loop: the last chunk drops its last position (targets shift).
        chunks[-1] = chunks[-1][..., :-1, :]
        return chunked_cross_entropy(chunks, ids[..., 1:]), chunks
    loss_fn = _torchtune_chunked_loss()(
        num_output_chunks=-(-ids.shape[1] // s.loss_chunk) if s.loss_chunk else 8)
    chunks = [head(h) for h in hidden.chunk(loss_fn.num_output_chunks, dim=1)]
    del hidden
    ignored = torch.full((ids.shape[0], 1), loss_fn.ignore_index, device=ids.device)
    loss = loss_fn(chunks, torch.hstack((ids[..., 1:], ignored)))
    del chunks  # as torchtune's recipes do before backward
    return loss, None


def _torchtune_chunked_loss() -> Any:
    """torchtune's `CEWithChunkedOutputLoss`, loaded from its own file: importing the
    torchtune package pulls in its datasets and torchao."""
    import importlib.util

    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        raise missing("torchtune", ModuleNotFoundError(name="torchtune"))
    path = Path(spec.submodule_search_locations[0]) / "modules/loss/ce_chunked_output_loss.py"
    module_spec = importlib.util.spec_from_file_location("_torchtune_ce_chunked", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.CEWithChunkedOutputLoss


def _cache_argument(wl: Workload, s: Settings) -> dict[str, Any]:
    """`use_cache=False` when the settings ask for no KV cache (see Settings.no_cache)."""
    has_cache = wl.kind in KV_CACHE_KINDS
    return {"use_cache": False} if s.passes_no_cache(has_cache) else {}


def _infer(wl: Workload, s: Settings, rec: Recorder, steps: int, device: str) -> None:
    wl.model.eval()
    extra = _cache_argument(wl, s)
    if s.labels and wl.kind not in (*KV_CACHE_KINDS, "masked_lm"):
        raise ValueError("labels in inference are measured for language models")
    with torch.no_grad():
        for _ in range(steps):
            rec.boundary("step")
            rec.boundary("inputs")
            inputs = wl.batch(s.batch, s.seq, device, DTYPES[s.dtype], with_labels=s.labels)
            if wl.kind == "seq2seq" and not s.labels:
                inputs["decoder_input_ids"] = inputs["input_ids"]
            rec.boundary("forward")
            with _autocast(device, s.amp):
                out = wl.model(**inputs, **extra)
            del out, inputs


def _generate(wl: Workload, s: Settings, rec: Recorder, steps: int, device: str) -> None:
    transformers = require("transformers")
    LogitsProcessor = transformers.LogitsProcessor
    LogitsProcessorList = transformers.LogitsProcessorList

    class _DecodeMark(LogitsProcessor):  # type: ignore[misc, valid-type]
        """Called after each forward: the first call ends the prefill."""
        def __init__(self) -> None:
            self.seen = False

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if not self.seen:
                self.seen = True
                rec.boundary("decode")
            return scores

    if wl.kind not in KV_CACHE_KINDS:
        raise ValueError("generate is measured for decoders, encoder-decoders and VLMs")
    if s.no_cache is not None or s.labels:
        raise ValueError("generate is measured with its default KV cache and no labels")
    wl.model.eval()
    eos = wl.model.generation_config.eos_token_id
    with torch.no_grad():
        for _ in range(steps):
            rec.boundary("step")
            rec.boundary("inputs")
            inputs = _prompt(wl, s, device)
            rec.boundary("prefill")
            with _autocast(device, s.amp):
                out = wl.model.generate(
                    **inputs, do_sample=False,
                    max_new_tokens=s.new_tokens, min_new_tokens=s.new_tokens,
                    pad_token_id=eos, logits_processor=LogitsProcessorList([_DecodeMark()]))
            del out, inputs


def _prompt(wl: Workload, s: Settings, device: str) -> dict[str, Any]:
    """What `generate` is called with: a prompt of `s.seq` tokens (LLaVA: with its image), or
    Whisper's 30 s of features (the decoder starts from its start token; `s.seq` unused)."""
    if wl.mel_bins is not None:
        features = wl.batch(s.batch, 1, device, DTYPES[s.dtype], with_labels=False)
        return {"input_features": features["input_features"]}
    inputs = wl.batch(s.batch, s.seq, device, DTYPES[s.dtype], with_labels=False)
    if "attention_mask" not in inputs:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    return inputs
