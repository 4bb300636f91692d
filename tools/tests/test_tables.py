"""The config and workload tables agree with each other and with the committed testdata."""

import json
from pathlib import Path

import pytest
from conftest import REPO, TRACES

from gpumem_devtools import configs, measure_distributed, tracefile
from gpumem_devtools.capture_trace import CONFIG_DIR as TRACE_CONFIG_DIR
from gpumem_devtools.capture_trace import TRACES as TRACE_TABLE
from gpumem_devtools.measure_peak import CONFIG_DIR as PLAN_CONFIG_DIR
from gpumem_devtools.measure_peak import (LORA_HELDOUT, LOSSES_HELDOUT, MULTIMODAL_HELDOUT,
                                          SETTINGS_HELDOUT, architectures_grid, case_id,
                                          diffusion_grid, grid, heldout_grid, litgpt_grid,
                                          lora_grid, losses_grid, multimodal_grid, notes,
                                          settings_grid)
from gpumem_devtools.settings import (AMP_NAMES, ATTN_IMPLS, DTYPE_NAMES, MODES, OPTIMIZER_IMPLS,
                                      OPTIMIZERS, Settings)

MEASURED = REPO / "testdata" / "plan" / "measured.jsonl"
HELDOUT = REPO / "testdata" / "plan" / "measured_heldout.jsonl"
ARCHITECTURES = REPO / "testdata" / "plan" / "measured_architectures.jsonl"
MULTIMODAL = REPO / "testdata" / "plan" / "measured_multimodal.jsonl"
SINGLE_GPU_SETTINGS = REPO / "testdata" / "plan" / "measured_settings.jsonl"
DIFFUSION = REPO / "testdata" / "plan" / "measured_diffusion.jsonl"
LORA = REPO / "testdata" / "plan" / "measured_lora.jsonl"
TORCHVISION = "0.29.2+cu132"  # what the committed measurements were made with


def _workloads() -> list[tuple[str, Settings]]:
    return (grid() + heldout_grid() + architectures_grid() + multimodal_grid() + settings_grid()
            + diffusion_grid() + lora_grid() + losses_grid() + litgpt_grid()
            + [(cfg, s) for cfg, s, _ in TRACE_TABLE.values()])


def _measured_names() -> list[str]:
    """Configs of the measured grids, the distributed one's included."""
    return sorted({n for n, _ in grid() + heldout_grid() + architectures_grid()
                   + multimodal_grid() + diffusion_grid() + settings_grid()}
                  | {c.config for c in measure_distributed.grid() + measure_distributed.gpu_grid()})


def test_config_names() -> None:
    assert not set(configs.HF_CONFIGS) & set(configs.TORCHVISION_CONFIGS)
    assert not set(configs.ARCH_CONFIGS) & (set(configs.HF_CONFIGS) | set(configs.TORCHVISION_CONFIGS))
    assert not (set(configs.MULTIMODAL_CONFIGS) | set(configs.DIFFUSION_CONFIGS)) & (
        set(configs.HF_CONFIGS) | set(configs.TORCHVISION_CONFIGS) | set(configs.ARCH_CONFIGS))
    used = {name for name, _ in _workloads()}
    assert used <= set(configs.all_names())
    assert set(configs.all_names()) == set(_measured_names())


@pytest.mark.parametrize("name", configs.all_names())
def test_config_dict(name: str) -> None:
    cfg = configs.config_dict(name)
    if name in configs.TORCHVISION_CONFIGS:
        assert configs.model_kind(cfg) == "torchvision"
        return
    shrunk = {**configs.ARCH_CONFIGS, **configs.MULTIMODAL_CONFIGS, **configs.DIFFUSION_CONFIGS}
    if name in shrunk:
        catalogue_name, hub_id, shrink = shrunk[name]
        real = json.loads((REPO / configs.CATALOGUE).read_text())["models"][catalogue_name]
    else:
        hub_id, real, shrink = configs.HF_CONFIGS[name]
    assert cfg["_name_or_path"] == hub_id
    # A nested override changes only the keys it names.
    for key, value in shrink.items():
        if isinstance(value, dict):
            assert cfg[key] == {**real[key], **value}
        else:
            assert cfg[key] == value
    assert all(cfg[k] == v for k, v in real.items() if k not in shrink)
    leaves = sum(len(v) if isinstance(v, dict) else 1 for v in shrink.values())
    assert cfg["_gpumem_shrunk"].count("->") == leaves
    kind = configs.model_kind(cfg)
    if name in configs.DIFFUSION_CONFIGS:
        assert kind == "diffusion"
        return
    arch = cfg["architectures"][0]
    if cfg["model_type"] == "llava":
        assert kind == "vlm"
        return
    suffixes = {"ImageClassification": "image_cls", "MaskedLM": "masked_lm",
                "ConditionalGeneration": "seq2seq", "CausalLM": "causal_lm",
                "LMHeadModel": "causal_lm", "VisionModel": "vision_tower",
                "CLIPModel": "dual_encoder", "SiglipModel": "dual_encoder"}
    assert [kind] == [k for suffix, k in suffixes.items() if arch.endswith(suffix)]
    # GPU-like attention memory: no attention-probability dropout (see configs.py).
    for key in ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout"):
        assert cfg.get(key, 0.0) == 0.0


@pytest.mark.parametrize("config_dir, names", [
    (PLAN_CONFIG_DIR, _measured_names()),
    (TRACE_CONFIG_DIR, sorted({cfg for cfg, _, _ in TRACE_TABLE.values()})),
])
def test_committed_config_files_are_what_write_configs_writes(
        tmp_path: Path, config_dir: str, names: list[str]) -> None:
    committed = REPO / config_dir
    assert sorted(p.stem for p in committed.glob("*.json")) == names
    written = configs.write_configs(tmp_path, names)
    for path in written:
        assert path.read_bytes() == (committed / path.name).read_bytes(), path.name


@pytest.mark.parametrize("name, s", _workloads(), ids=lambda x: x if isinstance(x, str) else "")
def test_workload_settings_are_buildable(name: str, s: Settings) -> None:
    kind = configs.model_kind(configs.config_dict(name))
    image = kind in ("torchvision", "image_cls", "vision_tower", "diffusion")
    assert s.mode in MODES and s.dtype in DTYPE_NAMES
    assert s.amp in (None, *AMP_NAMES)
    assert s.batch >= 1
    if kind == "dual_encoder":
        assert s.seq is not None and s.image_size is not None
    elif image:
        assert s.seq is None and s.image_size is not None
        assert s.attn == (None if kind == "torchvision" else "sdpa") or s.attn in ATTN_IMPLS
    else:
        assert s.seq is not None and s.seq >= 1 and s.image_size is None
        assert s.attn in ATTN_IMPLS
    if kind == "torchvision":
        assert s.attn is None and not s.grad_ckpt
    if s.mode == "train" and s.optimizer == "none":
        assert s.optimizer_impl is None
    elif s.mode == "train":
        assert s.optimizer in OPTIMIZERS and s.optimizer_impl in OPTIMIZER_IMPLS
        assert (s.optimizer, s.optimizer_impl) != ("adafactor", "fused")
    else:
        assert s.optimizer is None and s.optimizer_impl is None
    assert (s.new_tokens is not None) == (s.mode == "generate")
    if s.mode == "generate":
        assert kind in configs.KV_CACHE_KINDS
        assert s.no_cache is None and not s.labels
    if s.no_cache is not None:
        assert kind in configs.KV_CACHE_KINDS
    if s.labels:
        assert s.mode == "infer" and kind in (*configs.KV_CACHE_KINDS, "masked_lm")


def test_case_ids_are_unique_and_descriptive() -> None:
    ids = [case_id(n, s) for n, s in grid()]
    assert len(ids) == len(set(ids)) == 144
    heldout = [case_id(n, s) for n, s in heldout_grid()]
    assert len(heldout) == len(set(heldout)) == 60
    assert not set(ids) & set(heldout)
    architectures = [case_id(n, s) for n, s in architectures_grid()]
    assert len(architectures) == len(set(architectures)) == 36
    assert not (set(ids) | set(heldout)) & set(architectures)
    multimodal = [case_id(n, s) for n, s in multimodal_grid()]
    assert len(multimodal) == len(set(multimodal)) == 60
    assert len(MULTIMODAL_HELDOUT) == 24 and multimodal[-24:] == [
        case_id(n, s) for n, s in MULTIMODAL_HELDOUT]
    assert not (set(ids) | set(heldout) | set(architectures)) & set(multimodal)
    single = [case_id(n, s) for n, s in settings_grid()]
    assert len(single) == len(set(single)) == 84
    assert len(SETTINGS_HELDOUT) == 19 and single[-19:] == [
        case_id(n, s) for n, s in SETTINGS_HELDOUT]
    assert not (set(ids) | set(heldout) | set(architectures)) & set(single)
    losses = [case_id(n, s) for n, s in losses_grid()]
    assert len(losses) == len(set(losses)) == 14
    assert len(LOSSES_HELDOUT) == 5 and losses[-5:] == [case_id(n, s) for n, s in LOSSES_HELDOUT]
    assert all(s.loss in ("chunked", "chunked-fp32") for _, s in losses_grid())
    litgpt = [case_id(n, s) for n, s in litgpt_grid()]
    assert len(litgpt) == len(set(litgpt)) == 7 and all(i.endswith("-litgpt") for i in litgpt)
    assert case_id("tinyllama-8l", Settings("train", 4, 512, optimizer="none", attn="sdpa",
                                            grad_ckpt_every=2)) == \
        "tinyllama-8l-train-b4-s512-fp32-no-optimizer-ckpt-every2-sdpa"
    assert case_id("gpt2-12l", Settings("generate", 4, 256, new_tokens=32, attn="sdpa",
                                        transformers="4.44.2")) == \
        "gpt2-12l-generate-b4-s256-new32-fp32-sdpa-tf4.44.2"
    assert case_id("tinyllama-8l", Settings("train", 2, 512, dtype="bf16", optimizer="adamw",
                                            optimizer_impl="foreach", attn="sdpa",
                                            transformers="4.39.3", hold_outputs=True)) == \
        "tinyllama-8l-train-b2-s512-bf16-adamw-foreach-sdpa-tf4.39.3-hold"
    # Cache and labels are named where they depart from the harness's convention.
    assert case_id("t5-small-4l", Settings("infer", 4, 256, attn="sdpa", no_cache=False,
                                           labels=True)) == \
        "t5-small-4l-infer-b4-s256-fp32-labels-cache-sdpa"
    assert case_id("gpt2-2l", Settings("infer", 1, 128, attn="sdpa", no_cache=True)) == \
        "gpt2-2l-infer-b1-s128-fp32-sdpa"
    assert case_id("llama-8l", Settings("train", 4, 256, optimizer="adamw",
                                        optimizer_impl="foreach", attn="sdpa",
                                        no_cache=True)) == \
        "llama-8l-train-b4-s256-fp32-adamw-foreach-nocache-sdpa"
    assert case_id("gpt2-2l", Settings("train", 2, 256, dtype="bf16", amp=None,
                                       optimizer="adamw", optimizer_impl="fused",
                                       grad_ckpt=True, attn="eager")) == \
        "gpt2-2l-train-b2-s256-bf16-adamw-fused-ckpt-eager"
    assert case_id("tinyllama-2l", Settings("generate", 4, 256, new_tokens=32, attn="sdpa")) \
        == "tinyllama-2l-generate-b4-s256-new32-fp32-sdpa"
    assert case_id("resnet18", Settings("train", 8, None, image_size=128, amp="bf16",
                                        optimizer="sgd", optimizer_impl="foreach")) == \
        "resnet18-train-b8-img128-fp32-amp-bf16-sgd-foreach"


@pytest.mark.parametrize("path, cases", [(MEASURED, grid()), (HELDOUT, heldout_grid()),
                                         (ARCHITECTURES, architectures_grid()),
                                         (MULTIMODAL, multimodal_grid()),
                                         (SINGLE_GPU_SETTINGS, settings_grid()),
                                         (DIFFUSION, diffusion_grid()),
                                         (LORA, lora_grid())],
                         ids=["measured", "heldout", "architectures", "multimodal", "settings",
                              "diffusion", "lora"])
def test_measured_rows_are_the_grid_in_order(path: Path,
                                             cases: list[tuple[str, Settings]]) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == [case_id(n, s) for n, s in cases]
    for row, (name, s) in zip(rows, cases):
        assert row["config"] == f"{PLAN_CONFIG_DIR}/{name}.json"
        assert row["settings"] == s.as_dict()
        assert row["notes"] == notes(name, s, "cpu", 2, TORCHVISION), row["id"]
        assert row["measured"]["peak_allocated_bytes"] > 0
        assert row.get("heldout", False) == (
            (name, s) in MULTIMODAL_HELDOUT + LORA_HELDOUT + SETTINGS_HELDOUT)


def test_notes_on_cuda() -> None:
    s = Settings("train", 2, 256, amp="bf16", optimizer="sgd", optimizer_impl="foreach",
                 attn="sdpa")
    assert notes("gpt2-2l", s, "cuda:1", 8) == (
        "torch.cuda.memory._record_memory_history trace; peak over train step 2 of 2; "
        "zero_grad(set_to_none=True) after optimizer.step as HF Trainer; "
        "loss: model's own loss with labels=input_ids; sgd momentum=0.9")


@pytest.mark.parametrize("trace", sorted(TRACE_TABLE))
def test_committed_trace_headers_match_the_trace_table(trace: str) -> None:
    cfg, s, _steps = TRACE_TABLE[trace]
    header, _ = tracefile.read(TRACES / f"{trace}.jsonl.gz")
    meta = header["meta"]
    assert header["name"] == trace
    assert meta["config"] == f"{TRACE_CONFIG_DIR}/{cfg}.json"
    assert meta["device"] == "cpu"
    for key, value in s.as_dict().items():
        if value is None:
            assert key not in meta
        else:
            assert meta[key] == tracefile._text(value), key


def test_settings_added_fields_are_written_only_when_set() -> None:
    # Rows and trace headers written before no_cache / labels existed read as they were.
    base = Settings("infer", 2, 64, attn="sdpa")
    assert "no_cache" not in base.as_dict() and "labels" not in base.as_dict()
    stated = Settings("infer", 2, 64, attn="sdpa", no_cache=False, labels=True).as_dict()
    assert (stated["no_cache"], stated["labels"]) == (False, True)
    # use_cache=False: given when asked, and by the harness's plain inference forward when
    # unstated; never for a model without a cache.
    assert base.passes_no_cache(True) and not base.passes_no_cache(False)
    assert not Settings("infer", 2, 64, no_cache=False).passes_no_cache(True)
    assert not Settings("train", 2, 64).passes_no_cache(True)
    assert Settings("train", 2, 64, no_cache=True).passes_no_cache(True)


@pytest.mark.parametrize("name, cases", [
    ("measured_cuda.jsonl", grid()), ("measured_cuda_heldout.jsonl", heldout_grid()),
    ("measured_cuda_architectures.jsonl", architectures_grid())])
def test_cuda_rows_are_grid_cases_in_order(name: str, cases: list[tuple[str, Settings]]) -> None:
    """The GPU-measured sets (one run on an H200): each row a case of its grid, in grid order,
    with the CUDA notes and both of PyTorch's peaks."""
    rows = [json.loads(line) for line in (REPO / "testdata" / "plan" / name).read_text()
            .splitlines()]
    by_id = {case_id(n, s): (n, s) for n, s in cases}
    order = list(by_id)
    assert [order.index(r["id"]) for r in rows] == sorted(order.index(r["id"]) for r in rows)
    for row in rows:
        config, s = by_id[row["id"]]
        assert row["config"] == f"{PLAN_CONFIG_DIR}/{config}.json"
        assert row["settings"] == s.as_dict()
        assert row["notes"] == notes(config, s, "cuda", 8, "0.26.0+cu130"), row["id"]
        measured = row["measured"]
        assert 0 < measured["peak_allocated_bytes"] <= measured["peak_allocated_bytes_whole_run"]
        assert measured["peak_allocated_bytes_whole_run"] <= measured["peak_reserved_bytes"]


def test_inference_cases_of_cached_models_state_their_cache() -> None:
    """A measured forward of a model with a KV cache runs with `use_cache=False` unless the case
    says otherwise; a row that leaves `no_cache` unset would be planned with the cache. (The
    replay traces' headers are read with the harness's own default.)"""
    from gpumem_devtools import configs
    traces = {case_id(cfg, s) for cfg, s, _ in TRACE_TABLE.values()}
    unstated = [case_id(n, s) for n, s in _workloads() if case_id(n, s) not in traces
                if s.mode == "infer" and s.no_cache is None
                and configs.model_kind(configs.config_dict(n)) in configs.KV_CACHE_KINDS]
    assert not unstated, unstated
