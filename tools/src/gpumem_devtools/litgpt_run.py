"""A training step of litgpt's own model (`litgpt.lora.GPT`) as its fine-tuning scripts run it
(finetune/lora.py, finetune/full.py): the config of a Llama-family Hugging Face config, weights
in the step's dtype ("bf16-true"), LoRA on the chosen projections (`mark_only_lora_as_trainable`),
`model(ids, lm_head_chunk_size=128)` and `chunked_cross_entropy` kept through backward, AdamW
on the trainable parameters. Needs litgpt (pip install litgpt --no-deps, plus lightning)."""

import json
from pathlib import Path
from typing import Any

import torch

from ._deps import require
from .models import DTYPES, gpu_like_dropout, gpu_like_softmax
from .recorder import Recorder
from .settings import Settings

# `--lora-targets` roles and the litgpt Config switch that adapts them (`lora_mlp` adapts the
# three MLP linears together).
LORA_SWITCHES = {"q": "lora_query", "k": "lora_key", "v": "lora_value", "o": "lora_projection",
                 "gate": "lora_mlp", "up": "lora_mlp", "down": "lora_mlp"}


def litgpt_config(hf: dict[str, Any], s: Settings) -> dict[str, Any]:
    """litgpt `Config` fields for the Llama-family config `hf` and the LoRA of `s`."""
    if hf.get("model_type") not in ("llama", "mistral", "qwen2"):
        raise ValueError(f"litgpt runs are measured for Llama-family configs, not "
                         f"{hf.get('model_type')!r}")
    vocab = hf["vocab_size"]
    out: dict[str, Any] = dict(
        name="gpumem", n_layer=hf["num_hidden_layers"], n_embd=hf["hidden_size"],
        n_head=hf["num_attention_heads"],
        n_query_groups=hf.get("num_key_value_heads", hf["num_attention_heads"]),
        intermediate_size=hf["intermediate_size"], vocab_size=vocab, padded_vocab_size=vocab,
        block_size=hf.get("max_position_embeddings", 2048), bias=False,
        norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", rotary_percentage=1.0,
        parallel_residual=False, norm_eps=hf.get("rms_norm_eps", 1e-5))
    if s.lora_rank:
        roles = set((s.lora_targets or "q,k,v,o,gate,up,down").split(","))
        unknown = sorted(roles - set(LORA_SWITCHES))
        mlp = roles & {"gate", "up", "down"}
        if unknown or mlp not in (set(), {"gate", "up", "down"}):
            raise ValueError(f"litgpt LoRA targets {sorted(roles)}: accepted q, k, v, o and the "
                             "MLP's gate, up, down together")
        switches = {switch: False for switch in LORA_SWITCHES.values()}
        switches.update({LORA_SWITCHES[role]: True for role in roles})
        out.update(lora_r=s.lora_rank, lora_alpha=2 * s.lora_rank,
                   lora_dropout=s.lora_dropout or 0.0, lora_head=False, **switches)
    return out


def run_litgpt(config_path: str | Path, s: Settings, rec: Recorder, steps: int,
               device: str = "cpu", seed: int = 0) -> None:
    """`steps` litgpt training steps of the model of `config_path` inside the recording."""
    lora = require("litgpt.lora")
    chunked_cross_entropy = require("litgpt.utils").chunked_cross_entropy
    if s.mode != "train" or s.loss != "chunked" or s.optimizer != "adamw":
        raise ValueError("litgpt runs are measured as its fine-tuning scripts train: mode "
                         "train, loss chunked, optimizer adamw")
    torch.manual_seed(seed)
    hf = json.loads(Path(config_path).read_text())
    with gpu_like_dropout(device), gpu_like_softmax(device):
        config = lora.Config(**litgpt_config(hf, s))
        model = lora.GPT(config).to(device=device, dtype=DTYPES[s.dtype])
        model.max_seq_length = s.seq
        if s.lora_rank:
            lora.mark_only_lora_as_trainable(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=3e-4, weight_decay=0.02, betas=(0.9, 0.95),
                                      foreach=s.optimizer_impl == "foreach")
        model.train()
        for _ in range(steps):
            rec.boundary("step")
            rec.boundary("inputs")
            ids = torch.randint(0, config.vocab_size, (s.batch, s.seq), device=device)
            rec.boundary("forward")
            logits = model(ids, lm_head_chunk_size=s.loss_chunk or 128)
            logits[-1] = logits[-1][..., :-1, :]
            loss = chunked_cross_entropy(logits, ids[..., 1:])
            rec.boundary("backward")
            loss.backward()
            rec.boundary("optimizer")
            optimizer.step()
            rec.boundary("zero_grad")
            optimizer.zero_grad()
            del logits, loss, ids
        rec.boundary("end")
