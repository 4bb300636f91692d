"""The settings of one measured / captured workload (no PyTorch needed)."""

from dataclasses import dataclass
from typing import Any

MODES = ("train", "infer", "generate")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
AMP_NAMES = ("bf16", "fp16")
OPTIMIZERS = ("adamw", "adam", "sgd", "adafactor")
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

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)
