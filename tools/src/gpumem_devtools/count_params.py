"""Count the parameters of every model in the planner's catalogue by building it with
transformers (torchvision, diffusers) on PyTorch's meta device: no weights are allocated or downloaded.

The counts are committed as test data (``testdata/plan/param_counts.json``) and compared with the
planner's own counts by ``crates/gpumem-plan/tests/params.rs``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ._deps import require
from .configs import is_torchvision
from .paths import repo_root

CATALOGUE = Path("crates/gpumem-plan/data/models.json")
OUTPUT = Path("testdata/plan/param_counts.json")


def count(config: dict[str, Any]) -> tuple[str, int]:
    """Builds the model a catalogue config describes on the meta device; returns its class
    name and its number of distinct parameters (tied weights counted once)."""
    torch = require("torch")
    with torch.device("meta"):
        if "_class_name" in config:
            # A diffusers config: the class it names, built from the config (diffusers maps a
            # DiT's Transformer2DModel config to DiTTransformer2DModel).
            diffusers = require("diffusers")
            model = getattr(diffusers, config["_class_name"]).from_config(config)
        elif is_torchvision(config):
            from .models import torchvision_model
            model = torchvision_model(config)
        else:
            transformers = require("transformers")
            fields = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
            hf_config = transformers.AutoConfig.for_model(**fields)
            model = getattr(transformers, config["architectures"][0])(hf_config)
            if config["model_type"] == "t5" and config.get("tie_word_embeddings") is False:
                # As from_pretrained leaves a T5 v1.1 checkpoint's own LM head.
                from .models import untie_lm_head
                untie_lm_head(model)
    return type(model).__name__, sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    """Writes the counts of all catalogue models (or of `--only` names) as sorted JSON."""
    parser = argparse.ArgumentParser(prog="gpumem-count-params",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help=f"default: {OUTPUT}")
    parser.add_argument("--only", nargs="*", default=None, help="catalogue names to count")
    args = parser.parse_args(argv)
    root = repo_root()
    models = json.loads((root / CATALOGUE).read_text())["models"]
    transformers = require("transformers")
    torch = require("torch")
    counts: dict[str, Any] = {}
    for name in sorted(args.only or models):
        built, total = count(models[name])
        counts[name] = {"class": built, "parameters": total}
        print(f"{name:32} {built:36} {total:>16,}", flush=True)
    document = {
        "produced_by": "gpumem-count-params (tools/): models built on the meta device",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "diffusers": require("diffusers").__version__},
        "models": counts,
    }
    out = args.out or root / OUTPUT
    out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
