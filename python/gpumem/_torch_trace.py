""":func:`gpumem.torch.trace` with PyTorch: the user's step run on fake tensors, its storages
recorded into a :class:`gpumem._steptrace.Recorder`. Imported only when ``trace`` is called
(PyTorch is imported here and nowhere at import time of the package)."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import os
import time
import weakref
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeCopyMode,
                                           FakeTensorMode)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

from gpumem import _steptrace
from gpumem._steptrace import Allocation, Recorder

F = torch.nn.functional

#: The dtypes of ``amp``.
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: aten operators that run on cuBLAS on a CUDA GPU: the first on a thread makes PyTorch
#: allocate that thread's cuBLAS workspace through the caching allocator.
BLAS_OPS = frozenset(
    getattr(torch.ops.aten, name).default if name != "_addmm_activation"
    else torch.ops.aten._addmm_activation.default
    for name in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot",
                 "_addmm_activation")
)

# CUDA autocast's ops that run in fp32 (PyTorch's AMP docs, "CUDA ops that can autocast to
# float32"), which CPU autocast runs in the lower precision or not at all.
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

MAPPED = [
    "CUDA caching allocator: each storage rounded up to 512 bytes, none for empty ones",
    "cuBLAS workspace (the GPU's size) at the first matrix product of the forward thread "
    "and of the autograd thread",
    "dropout as CUDA's fused native_dropout (1-byte mask)",
    "scaled_dot_product_attention as CUDA's kernel choice for the GPU's generation "
    "(sdp_utils.cpp): cuDNN first on Hopper and Blackwell (fp16/bf16, head dims up to 128, a "
    "mask without gradient), then flash (fp16/bf16, no mask), memory-efficient (masks, fp32; "
    "log-sum-exp padded to 32), math otherwise; a mask whose last dimension is strided runs "
    "math, as it does on CUDA",
    "flash attention's backward accumulators (fp32 dq_accum and softmax_d, mha_bwd)",
    "a column sum's fp32 staging buffers (a bias gradient, Reduce.cuh's setReduceConfig)",
    "cuDNN's convolution workspaces (input, weight and output transposed + 512 B; half "
    "precision, and fp32 from Ampere on)",
    "softmax(fp16, dtype=float32) as CUDA's fused half_to_float kernel",
    "autocast with CUDA's fp32 op lists",
    "optimizers left to their default implementation run foreach, as on CUDA",
    "optimizer step counters in host memory (as on CUDA unless fused or capturable)",
    "softmax backward with CUDA's grad * output temporary",
]


class _Storages:
    """Every storage seen, by identity, with its allocation; a weak reference's callback
    records the free when the storage dies (fake or real: PyTorch keeps a storage's Python
    object alive as long as the storage itself, so the callback fires when its last tensor
    goes)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.seen: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def track(self, tensor: torch.Tensor, *, op: str = "", kind: str | None = None,
              name: str = "") -> None:
        if tensor.layout != torch.strided:
            raise ValueError(
                f"gpumem.torch.trace cannot size sparse tensors: fake tensors hold none of "
                f"their entries (a {tensor.layout} tensor{' made by ' + op if op else ''} "
                f"in the {self.recorder.phase} phase); trace with dense tensors "
                f"(nn.Embedding(sparse=False), dense inputs)")
        storage = tensor.untyped_storage()
        known = self.seen.get(storage)
        nbytes = storage.nbytes()
        if known is not None:
            made, _ = known
            if made is None or made.nbytes == nbytes:
                return
            # Resized in place: CUDA allocates the new size and frees the old block.
            self.recorder.free(made)
        made = self.recorder.alloc(nbytes, op=op, kind=kind, name=name)
        recorder = self.recorder
        self.seen[storage] = (made, weakref.ref(storage, lambda _, m=made: recorder.free(m)))

    def allocation(self, tensor: Any) -> Allocation | None:
        """The recorded allocation of a tracked tensor's storage (None for anything else)."""
        if not isinstance(tensor, torch.Tensor):
            return None
        known = self.seen.get(tensor.untyped_storage())
        return known[0] if known is not None else None

    def label(self, tensor: Any, kind: str, name: str, *, host: bool = False) -> None:
        """Says what a tracked tensor's storage holds (its kind, a name)."""
        made = self.allocation(tensor)
        if made is not None:
            made.kind, made.name = kind, name
            made.host = made.host or host


class _Record(TorchDispatchMode):
    """Records the storages every aten operator returns, and allocates the cuBLAS workspace
    of a thread at its first matrix product."""

    def __init__(self, storages: _Storages, workspace: int, cuda: bool = True,
                 facts: _steptrace.GpuFacts | None = None) -> None:
        super().__init__()
        self.storages = storages
        self.workspace = workspace
        self.cuda = cuda
        self.facts = facts
        self.workspaces: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        recorder = self.storages.recorder
        if func in BLAS_OPS and self.workspace:
            thread = "autograd" if recorder.phase == "backward" else "main"
            if thread not in self.workspaces:
                self.workspaces.add(thread)
                recorder.alloc(self.workspace, op="cuBLAS workspace", kind="blas_workspace",
                               name=f"cuBLAS workspace ({thread} thread)", module="")
        if func is torch.ops.aten._local_scalar_dense.default and \
                recorder.phase == "optimizer" and _is_fake(args[0]):
            # A value read in the optimizer step (a step counter, NAdam's momentum product,
            # Adafactor's parameter norm): fake tensors have none, and it sizes nothing there.
            # 0.5 keeps the optimizers' arithmetic valid (1 - mu_product, 1 - beta ** step).
            return True if args[0].dtype == torch.bool else \
                0.5 if args[0].is_floating_point() else 1
        staging = []
        if self.cuda:
            staging = [recorder.alloc(nbytes, op=label, kind="temporary")
                       for nbytes, label in _kernel_inside(func, args, kwargs or {}, self.facts)]
        out = func(*args, **(kwargs or {}))
        op = str(func)
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self.storages.track(tensor, op=op)
        if self.cuda:
            # Allocated inside the kernel once its outputs exist, freed when it returns.
            staging += [recorder.alloc(nbytes, op=label, kind="temporary")
                        for nbytes, label in _kernel_after(func, args, out, self.facts)]
        for made in staging:
            recorder.free(made)
        return out


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _kernel_inside(func: Any, args: Any, kwargs: dict[str, Any],
                   facts: _steptrace.GpuFacts | None) -> list[tuple[int, str]]:
    """Memory a CUDA kernel takes from the caching allocator inside itself, beside its inputs
    and outputs, which no dispatcher-level tracker sees: (bytes, label) each, held while the
    operator runs."""
    aten = torch.ops.aten
    if func is aten._softmax_backward_data.default:
        # CUDA's softmax backward first makes grad * output (SoftMax.cu), a temporary the size
        # of the gradient beside it and the result (the H200's op logs, docs/gpu.md).
        return [(_nbytes(args[0]), "softmax backward: grad * output (CUDA)")]
    if func is aten._scaled_dot_product_flash_attention_backward.default:
        # mha_bwd (flash_api.cpp): softmax_d [b, h, ⌈s_q⌉128] and dq_accum [b, ⌈s_q⌉128, h,
        # ⌈d⌉32] in fp32; with fewer key heads, dk and dv expanded to every query head.
        query, key = args[1], args[2]
        batch, heads, seq_q, head_dim = query.shape
        seq_k, key_heads = key.shape[2], key.shape[1]
        rows = _round_up(seq_q, 128)
        made = [(4 * batch * heads * rows, "flash attention backward: softmax_d (CUDA)"),
                (4 * batch * rows * heads * _round_up(_round_up(head_dim, 8), 32),
                 "flash attention backward: dq_accum (CUDA)")]
        if key_heads != heads:
            expanded = batch * seq_k * heads * _round_up(head_dim, 8) * query.element_size()
            made += [(expanded, "flash attention backward: dk expanded (CUDA)"),
                     (expanded, "flash attention backward: dv expanded (CUDA)")]
        return made
    if func is aten.sum.dim_IntList and facts is not None:
        rows_cols = _column_sum(args, kwargs)
        if rows_cols is not None:
            return [(nbytes, "column sum: fp32 partial sums (CUDA, Reduce.cuh)")
                    for nbytes in _steptrace.column_sum_staging_bytes(*rows_cols, facts)]
    return []


def _column_sum(args: Any, kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(rows, columns) of a sum over the leading dimensions of a contiguous floating tensor
    (a bias gradient: ``grad.sum(0)``), None for any other sum."""
    tensor = args[0]
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or \
            not tensor.is_contiguous() or not dims or tensor.dim() < 2:
        return None
    reduced = sorted({d % tensor.dim() for d in dims})
    if reduced != list(range(len(reduced))) or len(reduced) == tensor.dim():
        return None
    rows = 1
    for d in reduced:
        rows *= tensor.shape[d]
    return rows, tensor.numel() // max(rows, 1)


def _kernel_after(func: Any, args: Any, out: Any,
                  facts: _steptrace.GpuFacts | None) -> list[tuple[int, str]]:
    """cuDNN's convolution workspaces (crates/gpumem-plan/src/graph/cudnn.rs, the planner's
    rule): ``run_conv_plan`` allocates the plan's workspace after the op's output exists and
    frees it when it returns; the tensor-core engines (half precision on every NVIDIA GPU,
    fp32 as TF32 from Ampere on) hold the input, the weight (unless 1×1) and the output
    transposed to NHWC, plus 512 bytes. The backward's data and filter plans take as much,
    with both gradients made."""
    aten = torch.ops.aten
    if facts is None or facts.amd or func not in (aten.convolution.default,
                                                   aten.convolution_backward.default):
        return []
    forward = func is aten.convolution.default
    if forward:
        x, weight = args[0], args[1]
        transposed, groups = args[6], args[8]
        y = out
    else:
        x, weight = args[1], args[2]
        transposed, groups = args[7], args[9]
        y = args[0]
    if transposed or groups != 1 or x.dim() != 4 or \
            x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or \
            (x.dtype == torch.float32 and not facts.tf32):
        return []
    size = x.numel() + y.numel() + (weight.numel() if weight.shape[2:].numel() > 1 else 0)
    phase = "forward" if forward else "backward"
    return [(size * x.element_size() + 512, f"cuDNN convolution {phase} workspace (CUDA)")]


def _is_fake(tensor: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


#: The GPU the trace plans for while it runs (its generation picks SDPA's kernels).
_GPU: list[_steptrace.GpuFacts] = []


def _sdpa_generation() -> str:
    return _GPU[-1].generation if _GPU else "hopper"


def _fused_strides_ok(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: torch.Tensor | None, ignore_singleton: bool) -> bool:
    """check_last_dim_stride_equals_1_dense (sdp_utils_cpp.h): every fused kernel wants the
    last dimension of q, k, v and of the mask at stride 1 (a strided mask, such as T5's
    permuted position bias before transformers made it contiguous, runs the math path)."""
    qkv = all(t.stride(-1) == 1 for t in (query, key, value))
    if ignore_singleton:
        qkv = qkv or query.shape[-1] == 1
    return qkv and (mask is None or mask.stride(-1) == 1)


def _cudnn_attention_ok(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        mask: torch.Tensor | None, enable_gqa: bool) -> bool:
    """can_use_cudnn_attention (sdp_utils.cpp) for dense inputs: half precision, a mask that
    needs no gradient and broadcasts as [b|1, h|1, s_q|1, s_k|1] (check_attn_mask_shape),
    head dims up to 128 and multiples of 8, more than one key, stride-1 last dimensions."""
    if query.dtype not in (torch.float16, torch.bfloat16) or \
            not query.dtype == key.dtype == value.dtype:
        return False
    if mask is not None:
        if mask.requires_grad or mask.dim() not in (2, 4):
            return False
        if mask.shape[-2] not in (query.shape[2], 1) or mask.shape[-1] not in (key.shape[2], 1):
            return False
        if mask.dim() == 4 and (mask.shape[0] not in (query.shape[0], 1) or
                                mask.shape[1] not in (query.shape[1], 1)):
            return False
    d_qk, d_v = query.shape[-1], value.shape[-1]
    if d_qk > 128 or d_v > 128 or d_qk % 8 or d_v % 8 or key.shape[2] == 1:
        return False
    if query.shape[0] != key.shape[0] or (key.shape[1] != query.shape[1] and not enable_gqa):
        return False
    return _fused_strides_ok(query, key, value, mask, ignore_singleton=True)


def _sdpa_cuda(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
               is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` as CUDA's dispatcher runs it on the planned GPU's
    generation (sdp_utils.cpp's ``select_sdp_backend``: cuDNN first on sm90/sm100
    (``check_prefer_cudnn_attention``), then flash, memory-efficient and math; before Ampere
    no flash, no cuDNN and no bf16 in the memory-efficient kernel), through those kernels'
    own aten operators, whose shapes fake tensors compute as on CUDA."""
    aten = torch.ops.aten
    generation = _sdpa_generation()
    head_dim = query.shape[-1]
    dense4 = query.dim() == 4 and key.dim() == 4 and value.dim() == 4 and \
        query.shape[-2] > 0 and key.shape[-2] > 0
    same_heads = dense4 and key.shape[-3] == query.shape[-3] == value.shape[-3]
    half = query.dtype in (torch.float16, torch.bfloat16)
    bool_mask = attn_mask is not None and attn_mask.dtype == torch.bool
    compute_lse = query.requires_grad or key.requires_grad or value.requires_grad
    if generation == "hopper" and dense4 and \
            _cudnn_attention_ok(query, key, value, attn_mask, enable_gqa):
        bias = attn_mask
        if bool_mask:
            bias = torch.where(bias.logical_not(), float("-inf"), 0.0).to(query.dtype)
        return aten._scaled_dot_product_cudnn_attention(
            query, key, value, bias, compute_lse and torch.is_grad_enabled(), dropout_p,
            is_causal, False, scale=scale)[0]
    flash_gpu = generation in ("ampere", "hopper")
    dims_ok = dense4 and key.shape[-1] == head_dim and value.shape[-1] == head_dim
    if flash_gpu and half and attn_mask is None and dims_ok and head_dim % 8 == 0 and \
            head_dim <= 256 and same_heads and \
            not (is_causal and query.shape[-2] != key.shape[-2]) and \
            _fused_strides_ok(query, key, value, None, ignore_singleton=True):
        return aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    # minimum_gemm_alignment: 8 for half precision, 4 for fp32 from Ampere on (1 before).
    alignment = 8 if half else 4 if generation != "pre-ampere" else 1
    # The memory-efficient kernel takes values of another head width (latent attention's
    # narrower values), aligned as the queries' (check_head_dim_size_mem_efficient).
    efficient_dims = dense4 and key.shape[-1] == head_dim and \
        value.shape[-1] % alignment == 0
    efficient_dtypes = (torch.float16, torch.float32) if generation == "pre-ampere" else \
        (torch.float16, torch.bfloat16, torch.float32)
    aligned = generation == "pre-ampere" or all(
        (t.storage_offset() * t.element_size()) % (alignment * t.element_size()) == 0
        for t in (query, key, value))
    if efficient_dims and same_heads and head_dim % alignment == 0 and aligned and \
            query.dtype in efficient_dtypes and \
            _fused_strides_ok(query, key, value, attn_mask, ignore_singleton=False):
        bias = attn_mask
        if bool_mask:
            # convert_boolean_attn_mask: where(logical_not(mask), -inf, 0) in q's dtype.
            bias = torch.where(bias.logical_not(), float("-inf"), 0.0).to(query.dtype)
        if bias is not None and bias.shape[-1] % 16:
            # The kernel wants the bias's rows aligned to 16 elements: a padded copy.
            pad = 16 - bias.shape[-1] % 16
            bias = F.pad(bias, (0, pad))[..., :bias.shape[-1]]
        if bias is not None:
            bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, compute_lse, dropout_p, is_causal, scale=scale)[0]
    if dropout_p > 0.0 and torch.is_grad_enabled() and query.shape[-3:-2] == key.shape[-3:-2]:
        return _sdpa_math_cuda_dropout(query, key, value, attn_mask, dropout_p, is_causal,
                                       scale)
    return aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
        enable_gqa=enable_gqa)[0]


def _sdpa_math_cuda_dropout(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attn_mask: torch.Tensor | None, dropout_p: float, is_causal: bool,
                            scale: float | None) -> torch.Tensor:
    """SDPA's math path with dropout as CUDA runs it: ``_scaled_dot_product_attention_math``
    (attention.cpp) op for op — half precision upcast to fp32, q and k scaled by the square
    root of the scale, the mask added in place, ``_safe_softmax`` — with its ``at::dropout``
    as CUDA's fused ``native_dropout`` (1-byte mask) where the CPU's would keep a noise tensor
    of the scores' dtype."""
    origin = query.dtype
    if origin in (torch.float16, torch.bfloat16):
        query, key, value = query.float(), key.float(), value.float()
    factor = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    query = query * factor
    if is_causal:
        rows, cols = query.shape[-2], key.shape[-2]
        causal = torch.ones(rows, cols, dtype=torch.bool).tril()
        attn_mask = torch.where(causal.logical_not(), float("-inf"), 0.0).to(query.dtype)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask.logical_not(), float("-inf"), 0.0).to(query.dtype)
    attn = torch.matmul(query, key.transpose(-2, -1) * factor)
    if attn_mask is not None:
        attn.add_(attn_mask)
    attn = torch.ops.aten._safe_softmax(attn, -1)
    attn = torch.native_dropout(attn, dropout_p, True)[0]
    return torch.matmul(attn, value).to(origin)


class _CudaRules(TorchFunctionMode):
    """Routes the functions whose CPU kernels allocate differently from CUDA's to what CUDA
    runs: dropout, scaled_dot_product_attention, softmax of fp16 to fp32. A mode sees the
    calls the model makes (however it imported them); :func:`_patched_functional` covers the
    calls ``torch.nn.functional`` makes inside itself (``multi_head_attention_forward``)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        replaced = _replacement(func)
        if replaced is not None:
            made = replaced(*args, **kwargs)
            if made is not NotImplemented:
                return made
        return func(*args, **kwargs)


def _replacement(func: Any) -> Callable[..., Any] | None:
    if func in _ORIGINAL_DROPOUT:
        return lambda *args, **kwargs: _dropout(func, *args, **kwargs)
    if func in _ORIGINAL_SDPA:
        return _sdpa_cuda
    if func in _ORIGINAL_SOFTMAX:
        def softmax(*args: Any, **kwargs: Any) -> Any:
            made = _half_to_float_softmax(*args, **kwargs)
            return NotImplemented if made is None else made
        return softmax
    return None


_ORIGINAL_DROPOUT = (F.dropout, torch.dropout)
_ORIGINAL_SDPA = (F.scaled_dot_product_attention,)
_ORIGINAL_SOFTMAX = (F.softmax, torch.softmax, torch.Tensor.softmax)


@contextlib.contextmanager
def _patched_functional() -> Iterator[None]:
    """``torch.nn.functional``'s dropout, scaled_dot_product_attention and softmax replaced
    by the CUDA-like ones for the trace, so that its own functions that call them by their
    global names (``multi_head_attention_forward``) run them too."""
    original = {name: getattr(F, name) for name in ("dropout", "scaled_dot_product_attention",
                                                     "softmax")}

    def softmax(input: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
        made = _half_to_float_softmax(input, dim, dtype=dtype)
        return original["softmax"](input, dim, _stacklevel, dtype) if made is None else made

    F.dropout = lambda *args, **kwargs: _dropout(original["dropout"], *args, **kwargs)
    F.scaled_dot_product_attention = _sdpa_cuda
    F.softmax = softmax
    try:
        yield
    finally:
        for name, function in original.items():
            setattr(F, name, function)


def _dropout(func: Any, input: torch.Tensor, p: float = 0.5, training: bool = True,
             inplace: bool = False, **kwargs: Any) -> torch.Tensor:
    """CUDA's dropout: the fused kernel (output + bool mask) when training with 0 < p < 1;
    in-place dropout keeps the noise tensor on CUDA too."""
    train = kwargs.pop("train", training)
    if train and 0.0 < p < 1.0 and not inplace and input.numel() > 0:
        return torch.native_dropout(input, p, True)[0]
    if func is torch.dropout:
        return func(input, p, train)
    return func(input, p, train, inplace)


def _half_to_float_softmax(input: torch.Tensor, dim: int | None = None, *rest: Any,
                           dtype: torch.dtype | None = None, **_: Any) -> torch.Tensor | None:
    """``softmax(x, dim, dtype=float32)`` of fp16 ``x`` as CUDA runs it (SoftMax.cpp): the
    fused ``half_to_float`` kernel, no fp32 copy of the input; None for any other call."""
    if rest and isinstance(rest[-1], torch.dtype):
        dtype = rest[-1]
    if dtype is not torch.float32 or not isinstance(input, torch.Tensor) or \
            input.dtype is not torch.float16 or dim is None:
        return None
    return torch._softmax(input, dim, True)


@contextlib.contextmanager
def _cuda_autocast_policy(enabled: bool) -> Iterator[None]:
    """CPU autocast with CUDA's fp32 op lists, for the duration of the trace (the kernels are
    registered on AutocastCPU and removed afterwards)."""
    if not enabled:
        yield
        return
    lib = torch.library.Library("aten", "IMPL")
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def eligible(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64

    def fp32_kernel(op: Any) -> Any:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = tree_map_only(
                torch.Tensor, lambda t: t.float() if eligible(t) else t, (args, kwargs))
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                return op(*args, **kwargs)
        return kernel

    def set_dtype_kernel(op: Any) -> Any:
        names = [a.name for a in op._schema.arguments if not a.kwarg_only]
        position = names.index("dtype") if "dtype" in names else None

        def kernel(*args: Any, **kwargs: Any) -> Any:
            if eligible(args[0]):
                if position is not None and position < len(args):
                    if args[position] is None:
                        args = args[:position] + (torch.float32,) + args[position + 1:]
                elif kwargs.get("dtype") is None:
                    kwargs["dtype"] = torch.float32
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                return op(*args, **kwargs)
        return kernel

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in _CUDA_FP32_OPS + _CUDA_FP32_SET_DTYPE_OPS:
            base, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
            make = fp32_kernel if name in _CUDA_FP32_OPS else set_dtype_kernel
            lib.impl(name, make(op), "AutocastCPU")
    try:
        yield
    finally:
        lib._destroy()


def _fake_optimizer(optimizer: Any, fake_of: dict[int, torch.Tensor],
                    convert: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """The user's optimizer rebuilt over the fake parameters: its class, groups and settings,
    its state converted; ``foreach`` as CUDA's default when the user left it to PyTorch."""
    kind = type(optimizer)
    if any(id(p) not in fake_of for group in optimizer.param_groups for p in group["params"]):
        raise ValueError("the optimizer holds parameters that are not the model's: "
                         "gpumem.torch.trace plans an optimizer over model.parameters()")
    groups = []
    for group in optimizer.param_groups:
        made = {key: value for key, value in group.items() if key != "params"}
        made["params"] = [fake_of[id(p)] for p in group["params"]]
        if "foreach" in made and made["foreach"] is None and not made.get("fused") and \
                not made.get("differentiable"):
            made["foreach"] = True
        groups.append(made)
    accepted = inspect.signature(kind.__init__).parameters
    defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted}
    if "foreach" in defaults and defaults["foreach"] is None and \
            not defaults.get("fused") and not defaults.get("differentiable"):
        defaults["foreach"] = True
    try:
        made_optimizer = kind(groups, **defaults)
    except TypeError as error:
        raise TypeError(
            f"gpumem.torch.trace rebuilds the optimizer over fake parameters as "
            f"{kind.__name__}(param_groups, **defaults) and that failed: {error}") from error
    for param, state in optimizer.state.items():
        fake = fake_of.get(id(param))
        if fake is not None:
            made_optimizer.state[fake] = {
                key: convert(value) if isinstance(value, torch.Tensor) else value
                for key, value in state.items()}
    return made_optimizer


def _check_arguments(model: Any, optimizer: Any, loss_fn: Any) -> None:
    """Refuses, before anything runs, a model, optimizer or loss_fn that the trace cannot
    use."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (its parameters and buffers are "
                        f"copied to fake tensors), not {type(model).__name__}: wrap a "
                        f"function in an nn.Module whose forward calls it")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be None or a function of the model's output, not "
                        f"{type(loss_fn).__name__}")
    if optimizer is None:
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        made = "a class: pass an instance, e.g. torch.optim.AdamW(model.parameters())" \
            if isinstance(optimizer, type) else type(optimizer).__name__
        raise TypeError(f"optimizer must be None or a torch.optim.Optimizer over the model's "
                        f"parameters, not {made}")
    try:
        inspect.signature(optimizer.step).bind()
    except TypeError as error:
        raise ValueError(
            f"gpumem.torch.trace runs optimizer.step() without arguments, and "
            f"{type(optimizer).__name__}.step needs them ({error}): an optimizer that "
            f"re-evaluates the model through a closure (LBFGS) is not supported; every other "
            f"torch.optim optimizer is") from error


@contextlib.contextmanager
def _capturable_on_the_cpu(optimizer: Any) -> Iterator[None]:
    """A capturable optimizer (``capturable=True``: step counters on the device) asserts that
    its tensors are on a GPU-like device; the fake ones are on the CPU, which the check
    accepts for the trace (in the modules of the optimizer's class and its bases)."""
    modules = {inspect.getmodule(kind) for kind in type(optimizer).__mro__}
    original = {module: module._get_capturable_supported_devices for module in modules
                if hasattr(module, "_get_capturable_supported_devices")}
    for module, devices in original.items():
        module._get_capturable_supported_devices = \
            lambda *args, devices=devices, **kwargs: [*devices(*args, **kwargs), "cpu"]
    try:
        yield
    finally:
        for module, devices in original.items():
            module._get_capturable_supported_devices = devices


def _module_hooks(model: torch.nn.Module, recorder: Recorder) -> list[Any]:
    """Forward hooks that keep the recorder's module stack, and a hook on each module
    output's autograd node that names the module whose backward runs."""
    handles = []
    for name, module in model.named_modules():
        label = name

        def pre(_module: Any, _args: Any, label: str = label) -> None:
            recorder.enter_module(label)

        def post(_module: Any, _args: Any, output: Any, label: str = label) -> None:
            recorder.exit_module()
            for tensor in tree_flatten(output)[0]:
                node = getattr(tensor, "grad_fn", None) if isinstance(tensor, torch.Tensor) \
                    else None
                if node is not None:
                    node.register_prehook(
                        lambda _grads, label=label: recorder.backward_module(label))

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    return handles


def _scalar_loss(output: Any, loss_fn: Callable[[Any], Any] | None) -> torch.Tensor:
    if loss_fn is not None:
        loss = loss_fn(output)
    elif isinstance(output, torch.Tensor):
        loss = output
    else:
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = f"loss_fn returned {_described(loss)}" if loss_fn is not None else \
            f"the model returned {_described(output)}" + \
            ("" if isinstance(output, torch.Tensor) else f" whose loss is {_described(loss)}")
        raise TypeError(
            "gpumem.torch.trace needs a scalar loss: pass loss_fn(output), or a model that "
            f"returns one (a scalar tensor, or an output with .loss); {got}")
    return loss


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return "None" if value is None else f"a {type(value).__name__}"


def trace(model: torch.nn.Module, example_inputs: Any, *, optimizer: Any = None,
          loss_fn: Callable[[Any], Any] | None = None, steps: int = 2, amp: str | None = None,
          gpu: str | int | None = None, top: int = 10,
          trace_out: str | os.PathLike[str] | None = None) -> Any:
    """See :func:`gpumem.torch.trace`."""
    if not isinstance(top, int) or isinstance(top, bool):
        raise TypeError(f"top must be a non-negative integer (the tensors and modules listed "
                        f"at the peak), not {type(top).__name__}")
    if top < 0:
        raise ValueError(f"top must be a non-negative integer (the tensors and modules listed "
                         f"at the peak), not {top}")
    if trace_out is not None and not isinstance(trace_out, (str, os.PathLike)):
        raise TypeError(f"trace_out must be None or a path (str or os.PathLike), not "
                        f"{type(trace_out).__name__}")
    facts = _steptrace.gpu_facts(gpu)
    started = time.perf_counter()
    recorder = record(model, example_inputs, optimizer=optimizer, loss_fn=loss_fn,
                      steps=steps, amp=amp, workspace=facts.blas_workspace_bytes,
                      facts=facts)
    trace_bytes = _steptrace.native_trace(
        recorder, name=f"gpumem.torch.trace: {type(model).__name__}",
        meta={"steps": str(steps), "amp": amp or "none", "gpu": facts.name or "default",
              "torch": torch.__version__})
    if trace_out is not None:
        with open(trace_out, "wb") as out:
            out.write(trace_bytes)
    replayed = _steptrace.replay_trace(trace_bytes, facts)
    return _steptrace.result(recorder, facts=facts, replay=replayed, steps=steps, amp=amp,
                             mapped=MAPPED, seconds=time.perf_counter() - started, top=top)


def record(model: torch.nn.Module, example_inputs: Any, *, optimizer: Any = None,
           loss_fn: Callable[[Any], Any] | None = None, steps: int = 2, amp: str | None = None,
           workspace: int = 0, fake: bool = True, cuda_rules: bool = True,
           facts: _steptrace.GpuFacts | None = None) -> Recorder:
    """The allocations of ``steps`` training steps. ``fake=False`` runs them on real tensors
    (a copy of the model on its own device: for checking the record against the real
    allocator), ``cuda_rules=False`` leaves out the CUDA mappings (the CPU's own kernels,
    no cuBLAS workspace). ``facts``: the GPU planned for (its generation picks SDPA's
    kernels, its multiprocessors size a column sum's staging, TF32 decides cuDNN's fp32
    workspaces); None: the planner's default GPU."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive integer, not {steps!r}")
    if amp is not None and amp not in AMP_DTYPES:
        raise ValueError(f"amp must be None, 'bf16' or 'fp16', not {amp!r}")
    if not isinstance(example_inputs, (dict, tuple)):
        raise TypeError("example_inputs must be a dict of keyword arguments or a tuple of "
                        f"positional ones, not {type(example_inputs).__name__}")
    _check_arguments(model, optimizer, loss_fn)
    recorder = Recorder()
    storages = _Storages(recorder)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None

    # The model as fake tensors: a copy, the user's own untouched.
    if fake_mode is not None:
        with FakeCopyMode(fake_mode):
            fake_model = copy.deepcopy(model)
    else:
        fake_model = copy.deepcopy(model)
    fake_of = {id(real): fake for real, fake in zip(model.parameters(), fake_model.parameters())}
    convert = fake_mode.from_tensor if fake_mode is not None else (lambda t: t.detach().clone())
    for real in model.parameters():
        # deepcopy under FakeCopyMode leaves gradients behind: accumulated ones are carried.
        if real.grad is not None and fake_of[id(real)].grad is None:
            fake_of[id(real)].grad = convert(real.grad)
    param_names = {}
    for name, param in fake_model.named_parameters():
        param_names[id(param)] = name
        storages.track(param, kind="parameter", name=name)
        if param.grad is not None:
            storages.track(param.grad, kind="gradient", name=name)
    for name, buffer in fake_model.named_buffers():
        storages.track(buffer, kind="buffer", name=name)
    for module_name, module in fake_model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                storages.track(value, kind="buffer",
                               name=f"{module_name}.{attr}" if module_name else attr)
    fake_optimizer = None
    if optimizer is not None:
        fake_optimizer = _fake_optimizer(optimizer, fake_of, convert)
        _label_states(storages, fake_optimizer, param_names)
    fake_inputs = tree_map_only(torch.Tensor, convert, example_inputs)

    hooks = _module_hooks(fake_model, recorder)
    dtype = AMP_DTYPES.get(amp or "")
    rules = [_cuda_autocast_policy(amp is not None), _patched_functional(), _CudaRules()] \
        if cuda_rules else []
    if cuda_rules and facts is None:
        facts = _steptrace.gpu_facts(None)
    try:
        with contextlib.ExitStack() as stack:
            if cuda_rules:
                _GPU.append(facts)
                stack.callback(_GPU.pop)
            if fake_mode is not None:
                stack.enter_context(fake_mode)
            for rule in rules:
                stack.enter_context(rule)
            if fake_optimizer is not None:
                stack.enter_context(_capturable_on_the_cpu(fake_optimizer))
            stack.enter_context(_Record(storages, workspace if cuda_rules else 0, cuda_rules,
                                        facts if cuda_rules else None))
            for _ in range(steps):
                _step(fake_model, fake_inputs, fake_optimizer, loss_fn, dtype, recorder,
                      storages, param_names)
    except (DataDependentOutputException, DynamicOutputShapeException) as error:
        raise RuntimeError(
            f"gpumem.torch.trace runs the step on fake tensors, which have shapes but no "
            f"values, and {error.func} in the {recorder.phase} phase needs them (a value "
            f"read: .item(), .tolist(), `if tensor > x`; or an output shape that depends on "
            f"values: nonzero(), boolean masking, masked_select): move the value-dependent "
            f"code out of the step, or measure on a GPU with gpumem.torch.use, or plan "
            f"with gpumem.plan") from error
    finally:
        recorder.recording = False
        for handle in hooks:
            handle.remove()
    return recorder


def _label_states(storages: _Storages, optimizer: Any, names: dict[int, str]) -> None:
    """Records the optimizer's states (live from now: those it holds before the trace; the
    dispatcher made the others) and labels them by parameter and key; a step counter stays
    in host memory on CUDA unless the optimizer is fused or capturable."""
    for group in optimizer.param_groups:
        on_device = bool(group.get("fused")) or bool(group.get("capturable"))
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                if not isinstance(value, torch.Tensor):
                    continue
                name = f"{names.get(id(param), '?')}.{key}"
                storages.track(value, kind="optimizer_state", name=name)
                host = key == "step" and not on_device and value.numel() == 1
                storages.label(value, "optimizer_state", name, host=host)


def _label_outputs(storages: _Storages, output: Any) -> None:
    """Marks the activations the model returns as its outputs (here, so that no reference to
    one outlives the step's ``del output``)."""
    for tensor in tree_flatten(output)[0]:
        made = storages.allocation(tensor)
        if made is not None and made.kind == "activation":
            made.kind = "output"


def _step(model: torch.nn.Module, fake_inputs: Any, optimizer: Any,
          loss_fn: Callable[[Any], Any] | None, dtype: torch.dtype | None, recorder: Recorder,
          storages: _Storages, names: dict[int, str]) -> None:
    """One training step: inputs copied to the device, forward, loss, backward, optimizer
    step, zero_grad(set_to_none=True); the model's outputs dropped after the backward, the
    inputs at the end. Without an optimizer, a loss that needs no gradient runs the forward
    only (inference); with one, it is refused."""
    recorder.start_step()
    inputs = tree_map_only(torch.Tensor, lambda t: t.clone(), fake_inputs)
    autocast = torch.autocast("cpu", dtype=dtype) if dtype is not None \
        else contextlib.nullcontext()
    recorder.set_phase("forward")
    with autocast:
        output = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
        recorder.set_phase("loss")
        loss = _scalar_loss(output, loss_fn)
    _label_outputs(storages, output)
    if optimizer is not None and not loss.requires_grad:
        raise RuntimeError(
            "gpumem.torch.trace: the loss does not require grad, so its backward would fail "
            "(PyTorch: element 0 of tensors does not require grad and does not have a "
            "grad_fn): check that the model has trainable parameters (requires_grad) and "
            "that loss_fn does not detach the output or turn it into an integer; without an "
            "optimizer, a loss that needs no gradient traces the forward only")
    recorder.set_phase("backward")
    if loss.requires_grad:
        loss.backward()
    del loss, output
    for param in model.parameters():
        if param.grad is not None:
            storages.label(param.grad, "gradient", names.get(id(param), ""))
    if optimizer is not None:
        recorder.set_phase("optimizer")
        optimizer.step()
        _label_states(storages, optimizer, names)
        recorder.set_phase("zero_grad")
        optimizer.zero_grad(set_to_none=True)
    else:
        recorder.set_phase("zero_grad")
        model.zero_grad(set_to_none=True)
    del inputs
