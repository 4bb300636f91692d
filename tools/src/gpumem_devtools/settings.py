"""The settings of one measured / captured workload (no PyTorch needed)."""

from dataclasses import dataclass
from typing import Any

MODES = ("train", "infer", "generate")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
AMP_NAMES = ("bf16", "fp16")
# "none": forward and backward only, as benchmarks run (gradients dropped after backward).
OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor", "none")
OPTIMIZER_IMPLS = ("foreach", "fused", "forloop")
ATTN_IMPLS = ("eager", "sdpa")


@dataclass
class Settings:
    mode: str  # "train" | "infer" | "generate"
    batch: int
    seq: int | None = None
    image_size: int | None = None
    new_tokens: int | None = None
    dtype: str = "fp32"
    amp: str | None = None
    optimizer: str | None = None
    optimizer_impl: str | None = None
    grad_ckpt: bool = False
    attn: str | None = None
    # The fields below came after the first measurements: `as_dict` writes them only when
    # set, so the rows and trace headers written before them read as they were.
    #
    # `no_cache` (the `--no-cache` of `gpumem plan`): True passes `use_cache=False` to the
    # forward of a decoder or encoder-decoder (no KV cache); False passes nothing, so the
    # config's default applies (`use_cache=True`: a plain `model(**batch)` returns the cache).
    # None leaves it unstated: the harness's plain inference forward then passes
    # `use_cache=False` (how the committed infer traces were captured), training nothing.
    no_cache: bool | None = None
    # `labels` (infer only, `--labels`): the batch carries `labels = input_ids`, so the model
    # computes its own loss (an evaluation step); encoder-decoders derive their decoder
    # inputs from the labels. Without it an encoder-decoder gets `decoder_input_ids = input_ids`.
    labels: bool = False
    # `grad_ckpt_every` (`--grad-ckpt-every K`): checkpoint every K-th decoder layer, as
    # transformers' `activation_checkpointing_enable(every_n_layers=K)` selects them (layers
    # 0, K, 2K, ...). `grad_ckpt_per_op` (`--grad-ckpt-per-op`): every layer checkpointed with
    # torchtitan's per-op policy (save the outputs of the attention kernel and of every other
    # bias-free matmul, recompute the rest).
    grad_ckpt_every: int | None = None
    grad_ckpt_per_op: bool = False
    # `transformers` (`--transformers VERSION`): the transformers release the case must be
    # measured with (and is planned for); None: the environment's. Releases before 4.45
    # compute the whole prompt's logits in generate's prefill.
    transformers: str | None = None
    # `loss` (`--loss none`): None is the model's own loss (HF: labels in the batch); "none"
    # runs the forward without labels and backpropagates from `outputs.logits.sum()`, keeping
    # `outputs` until backward has run, as forward/backward benchmarks do; "chunked" and
    # "chunked-fp32" run the body, then the LM head per chunk of positions and the real loss
    # functions of litgpt (`chunked_cross_entropy`, the chunks kept through backward) and
    # torchtune (`CEWithChunkedOutputLoss`, the chunks dropped before backward).
    loss: str | None = None
    # `lora_rank` (`--lora-rank R`): PEFT LoRA adapters of rank R (alpha 2R, no dropout) on
    # every linear layer (`target_modules="all-linear"`), the base frozen; needs peft.
    lora_rank: int | None = None
    # `lora_targets` (`--lora-targets`): PEFT's `target_modules` as a comma-separated list of
    # module names (None: "all-linear"); `lora_dropout` (`--lora-dropout`): its `lora_dropout`.
    lora_targets: str | None = None
    lora_dropout: float | None = None
    # `freeze_vision_tower` (`--freeze-vision-tower`): the vision tower of a vision-language
    # model or dual encoder gets `requires_grad_(False)` before training (LLaVA's fine-tuning
    # stage, LiT), so its forward records nothing for backward.
    freeze_vision_tower: bool = False
    # `loss_chunk` (`--loss-chunk N`): positions per chunk of `loss="chunked"` (litgpt,
    # default 128) or `"chunked-fp32"` (torchtune, default: 8 chunks along the sequence).
    loss_chunk: int | None = None
    # `framework` (`--framework litgpt`): the step runs litgpt's own model and LoRA
    # (litgpt_run.py) instead of a transformers model with PEFT.
    framework: str | None = None
    # `hold_outputs` (`--hold-outputs`): with the model's own loss, the loop keeps the model's
    # outputs (its logits) through backward and the optimizer step and drops them before the
    # next forward, as AnswerDotAI's fsdp_qlora `train.py` does (`output = None`).
    hold_outputs: bool = False
    # `quant` (`--quant nf4|nf4:double`): every block linear a bitsandbytes `Linear4bit` (NF4,
    # with double quantisation for `nf4:double`; bf16 storage and compute), the LM head left
    # in the model's dtype, as AnswerDotAI's fsdp_qlora loads a QLoRA base; needs bitsandbytes.
    quant: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if out["no_cache"] is None:
            del out["no_cache"]
        for key in ("labels", "grad_ckpt_every", "grad_ckpt_per_op", "transformers", "loss",
                    "lora_rank", "freeze_vision_tower", "loss_chunk", "lora_targets",
                    "lora_dropout", "framework", "hold_outputs", "quant"):
            if not out[key]:
                del out[key]
        return out

    def passes_no_cache(self, has_cache: bool) -> bool:
        """Whether the forward gets `use_cache=False` (`has_cache`: a decoder or an
        encoder-decoder, whose forward can build a KV cache)."""
        if not has_cache:
            return False
        if self.no_cache is None:
            return self.mode == "infer"
        return self.no_cache
