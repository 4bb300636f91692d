"""gpumem.torch.trace with a real PyTorch and no GPU (opt-in: scripts/test-torch-cpu.sh runs it
with a PyTorch environment; CI never downloads PyTorch). Skipped, saying so, without torch.

1. The record is the allocator's: the same steps on real CPU tensors and on fake tensors (CUDA
   rules off) give the same allocations and frees, byte for byte and in order (a custom
   transformer, with and without dropout, AdamW foreach, autocast bf16).
2. Three models outside the planner's catalogue plan on a CPU-only machine: a custom
   nn.Module transformer, a small UNet (bf16 autocast), a speech-like conv + transformer
   encoder with a per-frame loss; each with its peak phase, module labels, gradients and optimizer
   states at the peak, and a fit that flips between a large and a tiny GPU.
3. A catalogue model, ResNet-18 written as torchvision builds it, against the planner
   (gpumem plan --config testdata/plan/configs/resnet18.json) and the CPU measurement
   committed in testdata/plan/measured.jsonl.
4. What the user brings: optimizer states and gradients that exist before the trace are live
   from the start, no model output outlives its step, every stock torch.optim optimizer
   traces (NAdam, capturable Adam, ...), a GPU given as bytes; and what cannot run is
   refused up front or with a clear error (bad arguments, a loss without gradient,
   value-dependent operators and sparse tensors on fake tensors, LBFGS's closure).
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch_trace_cpu.py: skipped: PyTorch is not installed in this Python")
    raise SystemExit(0)

import gpumem  # noqa: E402
import gpumem.torch as gt  # noqa: E402
from gpumem import _steptrace, _torch_trace  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
GIB = 1 << 30


# --- models -----------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.p, self.drop = heads, p, nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyLM(nn.Module):
    """A decoder written by hand: tied embeddings, pre-norm blocks, SDPA, fp32 loss."""

    def __init__(self, vocab: int = 1000, d: int = 128, heads: int = 4, layers: int = 2,
                 seq: int = 64, p: float = 0.1) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, p) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.emb(input_ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


class UNet(nn.Module):
    """Two levels down and up, GroupNorm + SiLU, skip connections, an MSE loss."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()

        def conv(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(8, o), nn.SiLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.GroupNorm(8, o), nn.SiLU())
        self.inc, self.down1, self.down2 = conv(3, c), conv(c, 2 * c), conv(2 * c, 4 * c)
        self.up2, self.up1 = conv(6 * c, 2 * c), conv(3 * c, c)
        self.out = nn.Conv2d(c, 3, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x1 = self.inc(x)
        x2 = self.down1(F.max_pool2d(x1, 2))
        x3 = self.down2(F.max_pool2d(x2, 2))
        y = self.up2(torch.cat([F.interpolate(x3, scale_factor=2.0), x2], 1))
        y = self.up1(torch.cat([F.interpolate(y, scale_factor=2.0), x1], 1))
        return F.mse_loss(self.out(y), target)


class Speech(nn.Module):
    """A speech recogniser's shape: a strided conv front end over log-mel frames, a
    transformer encoder (nn.TransformerEncoderLayer), a per-frame classifier."""

    def __init__(self, mels: int = 80, d: int = 192, layers: int = 2, vocab: int = 32) -> None:
        super().__init__()
        self.front = nn.Sequential(nn.Conv1d(mels, d, 3, stride=2, padding=1), nn.GELU(),
                                   nn.Conv1d(d, d, 3, stride=2, padding=1), nn.GELU())
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, mel: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.encoder(self.front(mel).transpose(1, 2))
        logp = self.head(x).log_softmax(-1).transpose(0, 1)
        # Frame-level cross-entropy on aligned targets: CTC's loss has an output shape that
        # depends on its lengths' values, which fake tensors do not have (a known gap).
        return F.nll_loss(logp.flatten(0, 1), targets.transpose(0, 1).flatten())


class BasicBlock(nn.Module):
    def __init__(self, i: int, o: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(i, o, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(o)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(o, o, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(o)
        self.downsample = None
        if stride != 1 or i != o:
            self.downsample = nn.Sequential(nn.Conv2d(i, o, 1, stride, bias=False),
                                            nn.BatchNorm2d(o))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision.models.resnet18, written out (same modules, same forward)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(64), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, layers, i = (64, 128, 256, 512), [], 64
        for n, o in enumerate(widths):
            stride = 1 if n == 0 else 2
            layers.append(nn.Sequential(BasicBlock(i, o, stride), BasicBlock(o, o, 1)))
            i = o
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --- checks -----------------------------------------------------------------------------

def sequence(recorder: _steptrace.Recorder) -> list[tuple[bool, int, str, int | None]]:
    """The events as (alloc?, bytes, phase, step); the frees between two allocations in a
    canonical order (real and fake tensors may drop an operator's inputs in another order,
    which changes no peak)."""
    events = [(is_alloc, made.nbytes, made.phase, made.step)
              for is_alloc, made in recorder.events if not made.host]
    out: list[tuple[bool, int, str, int | None]] = []
    frees: list[tuple[bool, int, str, int | None]] = []
    for event in events + [(True, -1, "", None)]:
        if event[0]:
            out += sorted(frees, key=lambda e: (e[1], e[2], e[3] or 0))
            frees = []
            out.append(event)
        else:
            frees.append(event)
    return out[:-1]


def check_fake_matches_real() -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (4, 64))
    for p, amp in ((0.0, None), (0.1, None), (0.0, "bf16")):
        model = TinyLM(p=p).train()
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        runs = [_torch_trace.record(model, {"input_ids": ids, "labels": ids},
                                    optimizer=optimizer, amp=amp, fake=fake, cuda_rules=False)
                for fake in (True, False)]
        fake, real = (sequence(r) for r in runs)
        assert fake == real, next(
            (i, f, r) for i, (f, r) in enumerate(zip(fake, real)) if f != r) \
            if len(fake) == len(real) else (len(fake), len(real))
        print(f"fake == real: TinyLM dropout {p} amp {amp}: {len(fake)} events identical")


def run(name: str, model: nn.Module, inputs: dict, **kwargs) -> gpumem.results.StepTrace:
    started = time.perf_counter()
    result = gt.trace(model, inputs, **kwargs)
    seconds = time.perf_counter() - started
    assert result.peak_step == result.steps - 1
    assert result.peak_allocated_bytes % 512 == 0
    assert result.peak_requested_bytes <= result.peak_allocated_bytes
    assert result.peak_reserved_bytes >= result.peak_allocated_bytes
    assert sum(result.breakdown.values()) == result.peak_allocated_bytes, result.breakdown
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert result.breakdown["parameter"] >= params, (result.breakdown, params)
    assert result.largest_tensors and result.largest_modules
    print(f"{name}: peak allocated {result.peak_allocated_bytes / 2**20:.2f} MiB in "
          f"{result.peak_phase} ({result.peak_module or '-'}), reserved "
          f"{result.peak_reserved_bytes / 2**20:.2f} MiB; {result.events} events, "
          f"{seconds:.2f} s; largest: " + ", ".join(
              f"{t.kind} {t.name or t.op} {t.bytes / 2**20:.2f} MiB"
              for t in result.largest_tensors[:3]))
    return result


def check_outside_catalogue() -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (8, 64))
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters())
    lm = run("custom transformer", model, {"input_ids": ids, "labels": ids},
             optimizer=optimizer, gpu="h100")
    assert lm.gpu is not None and lm.gpu.fits and lm.gpu.name == "h100"
    assert lm.blas_workspace_bytes == 32 << 20 and lm.breakdown["blas_workspace"] == 64 << 20
    assert lm.breakdown["optimizer_state"] >= 2 * lm.breakdown["parameter"] - 4096
    assert lm.peak_phase == "backward", lm.peak_phase
    ops = {t.op for t in lm.largest_tensors}
    assert not any("bernoulli" in op for op in ops), ops
    small = gt.trace(model, {"input_ids": ids, "labels": ids}, optimizer=optimizer,
                     gpu="560MiB")
    # 60 MiB left beside the planner's CUDA context: the replay runs out of memory.
    assert small.gpu is not None and not small.gpu.fits
    assert small.replay.policies[0].oom is not None
    assert model.emb.weight.device.type == "cpu" and not optimizer.state, "untouched"

    net = UNet()
    unet = run("UNet (bf16 autocast)", net, {"x": torch.randn(4, 3, 64, 64),
                                             "target": torch.randn(4, 3, 64, 64)},
               optimizer=torch.optim.Adam(net.parameters()), amp="bf16", gpu="24GiB")
    assert any(m.module.startswith(("inc", "up1", "down1")) for m in unet.largest_modules)

    speech = Speech()
    run("speech (conv + transformer encoder)", speech,
        (torch.randn(4, 80, 400), torch.randint(1, 32, (4, 100))),
        optimizer=torch.optim.AdamW(speech.parameters(), fused=None), gpu="a100-40gb")
    with_loss_fn = gt.trace(UNet(), (torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)),
                            loss_fn=lambda out: out * 2, steps=1)
    assert with_loss_fn.steps == 1 and with_loss_fn.breakdown["optimizer_state"] == 0


def check_catalogue_against_planner() -> None:
    torch.manual_seed(0)
    config = REPO / "testdata" / "plan" / "configs" / "resnet18.json"
    measured = {}
    for line in (REPO / "testdata" / "plan" / "measured.jsonl").read_text().splitlines():
        case = json.loads(line)
        measured[case["id"]] = case["measured"]["peak_allocated_bytes"]
    for batch, image in ((8, 224), (8, 128)):
        model = ResNet18()
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        labels = torch.randint(0, 1000, (batch,))
        result = run(f"resnet18 b{batch} img{image}", model,
                     (torch.randn(batch, 3, image, image),), optimizer=optimizer,
                     loss_fn=lambda logits: F.cross_entropy(logits, labels), gpu="h100")
        plan = gpumem.plan(config=str(config), mode="train", batch=batch, image_size=image,
                           optimizer="adamw", gpu="h100")
        cpu = measured[f"resnet18-train-b{batch}-img{image}-fp32-adamw-foreach"]
        without_blas = result.peak_requested_bytes - result.breakdown["blas_workspace"]
        vs_plan = result.peak_allocated_bytes / plan.peak_allocated_bytes - 1
        vs_cpu = without_blas / cpu - 1
        print(f"resnet18 b{batch} img{image}: trace {result.peak_allocated_bytes / 2**20:.1f} "
              f"MiB, plan {plan.peak_allocated_bytes / 2**20:.1f} MiB ({vs_plan:+.1%}); "
              f"without cuBLAS workspaces {without_blas / 2**20:.1f} MiB, CPU measured "
              f"{cpu / 2**20:.1f} MiB ({vs_cpu:+.1%}); reserved trace "
              f"{result.peak_reserved_bytes / 2**20:.1f} plan "
              f"{plan.peak_reserved_bytes / 2**20:.1f} MiB")
        assert abs(vs_plan) < 0.10, vs_plan
        assert abs(vs_cpu) < 0.10, vs_cpu


MIB = 1 << 20


def linear() -> tuple[nn.Module, torch.Tensor]:
    """A 4 MiB weight and its input."""
    torch.manual_seed(0)
    return nn.Linear(1024, 1024, bias=False), torch.randn(8, 1024)


def total(y: torch.Tensor) -> torch.Tensor:
    return y.sum()


def raises(error: type[Exception] | tuple[type[Exception], ...], words: str, call) -> None:
    """``call()`` raises ``error`` saying ``words``."""
    try:
        call()
    except error as raised:
        assert words in str(raised), (words, str(raised))
        return
    raise AssertionError(f"no {error} saying {words!r}")


def check_existing_state_and_gradients() -> None:
    model, x = linear()
    fresh = gt.trace(model, (x,), optimizer=torch.optim.Adam(model.parameters()),
                     loss_fn=total)
    optimizer = torch.optim.Adam(model.parameters())
    total(model(x)).backward()
    optimizer.step()
    optimizer.zero_grad()
    stepped = gt.trace(model, (x,), optimizer=optimizer, loss_fn=total)
    # exp_avg and exp_avg_sq (8 MiB) exist before the trace: counted as from a fresh Adam.
    assert stepped.breakdown["optimizer_state"] == 8 * MIB, stepped.breakdown
    assert stepped.peak_allocated_bytes == fresh.peak_allocated_bytes
    # Adagrad makes its state in __init__; with foreach=False as with foreach.
    for foreach in (True, False):
        adagrad = gt.trace(model, (x,), optimizer=torch.optim.Adagrad(
            model.parameters(), foreach=foreach), loss_fn=total, steps=1)
        assert adagrad.breakdown["optimizer_state"] == 4 * MIB, (foreach, adagrad.breakdown)
        assert adagrad.step_peaks[0] >= 12 * MIB
    recorder = _torch_trace.record(model, (x,), optimizer=torch.optim.Adagrad(
        model.parameters(), foreach=False), loss_fn=total, steps=1)
    states = [made for is_alloc, made in recorder.events
              if is_alloc and made.kind == "optimizer_state"]
    assert {made.phase for made in states} == {"setup"}, states

    without = gt.trace(model, (x,), loss_fn=total, steps=1)
    total(model(x)).backward()
    accumulated = gt.trace(model, (x,), loss_fn=total, steps=1)
    # A gradient kept from an earlier step (gradient accumulation) is 4 MiB more.
    assert accumulated.peak_allocated_bytes == without.peak_allocated_bytes + 4 * MIB
    assert model.weight.grad is not None and \
        not _torch_trace._is_fake(optimizer.state[model.weight]["exp_avg"]), "untouched"
    print(f"existing state and gradients: Adam stepped before "
          f"{stepped.peak_allocated_bytes / MIB:.0f} MiB as fresh; accumulated gradient "
          f"+{(accumulated.peak_allocated_bytes - without.peak_allocated_bytes) / MIB:.0f} MiB")


class TwoOutputs(nn.Module):
    """A loss and a 4 MiB activation, in either order."""

    def __init__(self, loss_first: bool) -> None:
        super().__init__()
        self.fc, self.loss_first = nn.Linear(1024, 1024, bias=False), loss_first

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x)
        return (y.sum(), y * 2) if self.loss_first else (y * 2, y.sum())


def check_outputs_are_dropped_before_the_optimizer() -> None:
    x = torch.randn(1024, 1024)
    peaks = []
    for loss_first in (True, False):
        model = TwoOutputs(loss_first)
        result = gt.trace(model, (x,), optimizer=torch.optim.Adam(model.parameters()),
                          loss_fn=lambda out, i=int(not loss_first): out[i])
        peaks.append({p.phase: p.allocated_bytes for p in result.phases})
    # The optimizer step holds no output (the 4 MiB y * 2 is dropped with the loss).
    assert peaks[0] == peaks[1], peaks
    print(f"outputs dropped: optimizer step {peaks[0]['optimizer'] / MIB:.0f} MiB in either "
          f"order")


def check_every_stock_optimizer_traces() -> None:
    model, x = linear()
    params = list(model.parameters())
    made = [torch.optim.SGD(params, lr=0.1, momentum=0.9)]
    for kind in (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam,
                 torch.optim.Adamax, torch.optim.ASGD, torch.optim.RMSprop, torch.optim.Rprop,
                 torch.optim.Adadelta):
        made += [kind(params), kind(params, capturable=True),
                 kind(params, capturable=True, foreach=False), kind(params, foreach=False)]
    made += [torch.optim.Adagrad(params), torch.optim.Adafactor(params)]
    for optimizer in made:
        result = gt.trace(model, (x,), optimizer=optimizer, loss_fn=total, steps=3)
        assert result.breakdown["optimizer_state"] >= 4 * MIB or \
            isinstance(optimizer, torch.optim.Adafactor), (optimizer, result.breakdown)
    raises(ValueError, "LBFGS.step needs them",
           lambda: gt.trace(model, (x,), optimizer=torch.optim.LBFGS(params), loss_fn=total))
    print(f"stock optimizers: {len(made)} settings traced; LBFGS refused")


def check_sparse_tensors_are_refused() -> None:
    # Fake tensors hold no entries of a sparse tensor (nnz 0): refused, not counted as 0.
    torch.manual_seed(0)
    embedding = nn.Embedding(10_000, 64, sparse=True)
    ids = torch.randint(0, 10_000, (32,))
    raises(ValueError, "cannot size sparse tensors: fake tensors hold none of their entries "
           "(a torch.sparse_coo tensor made by aten.", lambda: gt.trace(
               embedding, (ids,), optimizer=torch.optim.SparseAdam(embedding.parameters()),
               loss_fn=total))
    for adjacency in (torch.eye(16).to_sparse(), torch.eye(16).to_sparse_csr()):
        raises(ValueError, f"a {adjacency.layout} tensor made by aten.clone.default in the "
               f"inputs phase", lambda: gt.trace(GraphConv(), (adjacency, torch.randn(16, 16)),
                                                 loss_fn=total))
    print("sparse tensors: refused (sparse gradient, COO and CSR inputs)")


class GraphConv(nn.Module):
    """A sparse adjacency times a linear layer's output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(adjacency, self.fc(x))


def check_arguments_and_clear_errors() -> None:
    model, x = linear()
    by_bytes = gt.trace(model, (x,), loss_fn=total, gpu=24 * GIB, steps=1)
    assert by_bytes.gpu is not None and by_bytes.gpu.memory_bytes == 24 * GIB
    assert by_bytes.gpu.fits and gt.trace(model, (x,), loss_fn=total, gpu=1000 * MIB + 1,
                                           steps=1).gpu.memory_bytes == 1000 * MIB + 1
    top = gt.trace(model, (x,), loss_fn=total, top=0, steps=1)
    assert top.largest_tensors == [] and top.largest_modules == []
    adam = torch.optim.Adam(model.parameters())
    for words, call in (
            ("top must be a non-negative integer", lambda: gt.trace(model, (x,), top=-1)),
            ("top must be a non-negative integer", lambda: gt.trace(model, (x,), top="3")),
            ("gpu must be", lambda: gt.trace(model, (x,), gpu=True)),
            ("must be positive", lambda: gt.trace(model, (x,), gpu=-1)),
            ("model must be a torch.nn.Module", lambda: gt.trace(total, (x,))),
            ("optimizer must be None or a torch.optim.Optimizer",
             lambda: gt.trace(model, (x,), optimizer="adam")),
            ("pass an instance", lambda: gt.trace(model, (x,), optimizer=torch.optim.Adam)),
            ("loss_fn must be None or a function", lambda: gt.trace(model, (x,), loss_fn=1)),
            ("trace_out must be None or a path",
             lambda: gt.trace(model, (x,), loss_fn=total, trace_out=3))):
        raises((TypeError, ValueError), words, call)
    raises(TypeError, "loss_fn returned None",
           lambda: gt.trace(model, (x,), loss_fn=lambda y: None))
    raises(TypeError, "the model returned a tensor of shape (8, 1024)",
           lambda: gt.trace(model, (x,)))
    frozen = nn.Linear(64, 64).requires_grad_(False)
    raises(RuntimeError, "the loss does not require grad", lambda: gt.trace(
        frozen, (torch.randn(2, 64),), loss_fn=total,
        optimizer=torch.optim.SGD(frozen.parameters(), lr=0.1)))
    raises(RuntimeError, "the loss does not require grad", lambda: gt.trace(
        model, (x,), loss_fn=lambda y: y.detach().sum(), optimizer=adam))
    # Without an optimizer a loss that needs no gradient is a forward-only step.
    forward = gt.trace(frozen, (torch.randn(2, 64),), loss_fn=total)
    assert [p.phase for p in forward.phases] == ["inputs", "forward", "loss"], forward.phases

    class ValueDependent(nn.Module):
        def __init__(self, read: str) -> None:
            super().__init__()
            self.fc, self.read = nn.Linear(16, 16), read

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            if self.read == "if":
                return y.sum() if y.abs().max() > 1e4 else y.mean()
            if self.read == "item":
                return y.sum() * y.max().item()
            if self.read == "nonzero":
                return y[y.nonzero(as_tuple=True)].sum()
            return y[y > 0].sum()

    for read, op in (("if", "_local_scalar_dense"), ("item", "_local_scalar_dense"),
                     ("nonzero", "nonzero"), ("mask", "nonzero")):
        raises(RuntimeError, f"aten.{op}.default in the forward phase needs them",
               lambda: gt.trace(ValueDependent(read), (torch.randn(4, 16),)))
    print("arguments: gpu as bytes, top=0; bad arguments, a loss without gradient and "
          "value-dependent operators refused with clear errors")


def main() -> int:
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    check_fake_matches_real()
    check_outside_catalogue()
    check_catalogue_against_planner()
    check_existing_state_and_gradients()
    check_outputs_are_dropped_before_the_optimizer()
    check_every_stock_optimizer_traces()
    check_sparse_tensors_are_refused()
    check_arguments_and_clear_errors()
    print("torch_trace_cpu.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
