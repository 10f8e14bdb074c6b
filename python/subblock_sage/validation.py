"""Input validation shared by every public op: clear ValueError/TypeError before any launch.

Everything is normalised to *canonical* views: bf16 tensors as (B, S, H, 128) views of the
caller's memory (a BHSD tensor is passed as its permuted view, never copied).

Order of the checks (so that each error names the most basic problem first, and so that
everything but the device can be checked on CPU or ``meta`` tensors):

1. argument values that are not tensors: ``compute_mode``, ``layout``, ``block_size_k``,
   ``softmax_scale``, ``topk``;
2. per tensor: type, dtype, rank, head_dim, empty, strides (all metadata, no device access);
3. shapes that must agree across tensors (q/k/v, the plan, ``out``);
4. devices: one device for everything, and that device is CUDA;
5. at run time only (not while ``torch.compile`` traces): data-pointer alignment;
6. plan values, only with ``check_plan=True`` (counts in ``0..capacity``, ids in range): they
   need the plan kernel's summary and a host wait; skipped under CUDA-graph capture. By default
   the plan kernel clamps counts and skips bad ids, so no value can make a kernel read or write
   out of bounds and the call never waits (``plan.py``).
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Any, Optional

from .contract import BLOCK_SIZES_K, COMPUTE_MODES, DEFAULT_COMPUTE_MODE, HEAD_DIM, MAX_GRID_YZ, Q_BLOCK, ceil_div
from .plan import Plan, PlanSpec

LAYOUTS = ("BSHD", "BHSD")
_INT32_MAX = 2**31 - 1


def _compiling() -> bool:
    try:
        import torch

        return bool(torch.compiler.is_compiling())
    except Exception:  # pragma: no cover - very old torch
        return False


def capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph (False without CUDA)."""
    import torch

    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # CPU-only build of torch
        return False


_EAGER_NAMES: tuple = ()  # (torch.Tensor, torch._C._len_torch_dispatch_stack) once torch is imported


def _eager_names() -> tuple:
    global _EAGER_NAMES
    import torch

    _EAGER_NAMES = (torch.Tensor, torch._C._len_torch_dispatch_stack)
    return _EAGER_NAMES


def eager(a, b, c=None, d=None, e=None, f=None) -> bool:
    """True when nothing would intercept a call's operator: no dispatch mode (FakeTensorMode,
    make_fx, TorchDispatchMode debug tools) and only plain tensors (no subclasses) among the call's
    tensors ``a`` .. ``f`` (None: absent). The caller checks ``torch.compiler.is_compiling()``
    first. Then every entry point runs its steps directly; otherwise it goes through its
    ``torch.ops.subblock_sage`` operator, so that the fake implementations and modes see the call.
    Written out argument by argument: it runs on every call (0.17 us against 0.5 for a generator
    over them, build machine), and reads torch's two names from a module global, not an import
    per call."""
    T, modes = _EAGER_NAMES or _eager_names()
    if modes():
        return False
    return (type(a) is T and type(b) is T and (c is None or type(c) is T) and (d is None or type(d) is T)
            and (e is None or type(e) is T) and (f is None or type(f) is T))


# ---------------------------------------------------------------------------------------------
# Scalars


def cuda_device_index(device, what: str = "this call") -> int:
    """Index of a CUDA device given as an int, a string or a torch.device (None-index: the
    current device); ValueError for a non-CUDA device. An int or ``"cuda:N"`` needs no torch
    (``validate_startup(device=0)`` must report a missing torch as a problem, not crash)."""
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"{what} needs a device index >= 0, got {device}")
        return device
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    import torch

    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"{what} needs a CUDA device, got {d}")
    return d.index if d.index is not None else torch.cuda.current_device()


@functools.cache
def sm_count(index: int) -> int:
    """The SM count of CUDA device ``index`` (cached): the launch shapes of the router's select
    kernel and of the sm_90a bf16 kernel's last wave depend on it."""
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def check_compute_mode(compute_mode) -> str:
    if compute_mode not in COMPUTE_MODES:
        raise ValueError(f"compute_mode must be one of {COMPUTE_MODES}, got {compute_mode!r}")
    return compute_mode


def check_block_size_k(block_size_k) -> int:
    if isinstance(block_size_k, bool) or block_size_k not in BLOCK_SIZES_K:
        raise ValueError(f"block_size_k must be one of {BLOCK_SIZES_K}, got {block_size_k!r}")
    return int(block_size_k)


def check_scale(softmax_scale) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(HEAD_DIM)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        # numpy / torch scalars: accept anything float() takes that is a real number
        try:
            import numbers

            if not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
                raise TypeError
            softmax_scale = float(softmax_scale)
        except TypeError:
            raise TypeError(
                f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}"
            ) from None
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    # The kernels take it as float32 (times log2(e)): it must survive that conversion, or the
    # call would fail (OverflowError) after the quantizer and plan kernel were already enqueued.
    if not _F32_TINY <= softmax_scale * math.log2(math.e) <= _F32_MAX:
        raise ValueError(
            f"softmax_scale={softmax_scale} is outside what the kernels' float32 arithmetic can "
            f"hold ({_F32_TINY / math.log2(math.e):.3g} .. {_F32_MAX / math.log2(math.e):.3g}). "
            f"Fix: use 1/sqrt(head_dim) (the default, None) or a scale of that order")
    return float(softmax_scale)


_F32_MAX = 3.4028234663852886e38
_F32_TINY = 1.1754943508222875e-38  # smallest normal float32


def check_topk(topk, capacity: int) -> int:
    if topk is None:
        return capacity
    try:
        if isinstance(topk, bool):
            raise TypeError
        k = operator.index(topk)
    except TypeError:
        raise ValueError(f"topk must be an int in 0..capacity ({capacity}), got {topk!r}") from None
    if not 0 <= k <= capacity:
        raise ValueError(f"topk must be an int in 0..capacity ({capacity}), got {topk!r}")
    return k


# ---------------------------------------------------------------------------------------------
# Q / K / V / out


def check_bf16_4d(x, layout: str, name: str):
    """Metadata checks of one bf16 activation; returns its canonical (B, S, H, 128) view."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    check_layout(layout)
    if x.dtype != torch.bfloat16:
        raise TypeError(f"{name} must be torch.bfloat16, got {x.dtype} (convert with .to(torch.bfloat16))")
    if x.dim() != 4:
        dims = "[B, S, H, 128]" if layout == "BSHD" else "[B, H, S, 128]"
        raise ValueError(f"{name} must be rank 4 {dims} for layout={layout!r}, got shape {tuple(x.shape)}")
    if x.shape[-1] != HEAD_DIM:
        raise ValueError(f"{name} must have head_dim {HEAD_DIM} (last dim), got {x.shape[-1]}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}); every extent must be >= 1")
    for mode, n in enumerate(x.shape):
        if n > _INT32_MAX:
            raise ValueError(f"{name}: extent {n} of dim {mode} does not fit int32")
    if x.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last (head) dim, got strides {tuple(x.stride())}; "
            f"pass .contiguous() or a view whose head dim has stride 1"
        )
    for mode, st in enumerate(x.stride()[:-1]):
        if x.shape[mode] > 1 and st % 8:
            raise ValueError(
                f"{name}: stride {st} of dim {mode} is not a multiple of 8 elements (16 bytes), "
                f"which the kernels' 16-byte loads need; pass .contiguous()"
            )
    return x if layout == "BSHD" else x.permute(0, 2, 1, 3)


def check_aligned(x, name: str) -> None:
    """16-byte alignment of the data pointer (skipped while torch.compile traces: fake tensors
    have no storage; the custom op's real implementation checks it again at run time)."""
    if _compiling():
        return
    if x.device.type == "meta":
        return
    if x.data_ptr() % 16:
        raise ValueError(
            f"{name}: data pointer is not 16-byte aligned (offset {x.data_ptr() % 16} bytes); "
            f"pass .clone() or a view that starts on a 16-byte boundary"
        )


def check_same_cuda_device(tensors: dict) -> None:
    """Every tensor on one device, and that device CUDA (mixed devices are reported first)."""
    present = {n: t for n, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    if len(devices) > 1:
        where = ", ".join(f"{n} on {t.device}" for n, t in present.items())
        raise ValueError(f"all tensors must be on one CUDA device, got {where}")
    for n, t in present.items():
        if t.device.type != "cuda":
            raise ValueError(f"{n} must be on a CUDA device, got {t.device} (move it with .cuda())")


def check_qkv_shapes(q, k, v, layout: str):
    """Metadata checks of q, k, v and their agreement; no device access. Canonical views."""
    check_layout(layout)
    qc, kc, vc = (check_bf16_4d(t, layout, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    if kc.shape != vc.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if qc.shape[0] != kc.shape[0]:
        raise ValueError(f"q and k must have the same batch size, got {qc.shape[0]} and {kc.shape[0]}")
    if qc.shape[2] != kc.shape[2]:
        raise ValueError(
            f"q and k must have the same number of heads (MHA), got {qc.shape[2]} and {kc.shape[2]}"
        )
    B, H = qc.shape[0], qc.shape[2]
    if B > MAX_GRID_YZ or H > MAX_GRID_YZ:
        raise ValueError(
            f"batch ({B}) and heads ({H}) must each be <= {MAX_GRID_YZ}: every kernel launches one "
            f"grid row per head and batch (CUDA grid limit). Fix: split the call over batch or heads")
    return qc, kc, vc


def check_qkv(q, k, v, layout: str, *, runtime: bool = True):
    """Canonical (B,S,H,128) views of q, k, v after checking they agree, then their device."""
    qc, kc, vc = check_qkv_shapes(q, k, v, layout)
    check_same_cuda_device({"q": q, "k": k, "v": v})
    if runtime:
        for t, n in ((q, "q"), (k, "k"), (v, "v")):
            check_aligned(t, n)
    return qc, kc, vc


def check_v(q, k, v, layout: str, *, runtime: bool = True):
    """v's checks in a call whose q and k were checked already (the routed entry points: the
    router's checks take q and k): its metadata and agreement with q and k (metadata only), one
    device with them, at run time its alignment. Returns v's canonical view."""
    vc = check_qkv_shapes(q, k, v, layout)[2]
    check_same_cuda_device({"q": q, "k": k, "v": v})
    if runtime:
        check_aligned(v, "v")
    return vc


def check_out_shape(out, q, name: str = "out"):
    """Metadata checks of a caller-given output (no device access)."""
    import torch

    if out is None:
        return None
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype != torch.bfloat16:
        raise TypeError(f"{name} must be torch.bfloat16, got {out.dtype}")
    if out.shape != q.shape:
        raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    if out.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last (head) dim, got strides {tuple(out.stride())}")
    for mode, st in enumerate(out.stride()[:-1]):
        if out.shape[mode] > 1 and (st == 0 or st % 8):
            raise ValueError(
                f"{name}: stride {st} of dim {mode} is not supported (must be a non-zero multiple "
                f"of 8 elements, and rows must not overlap); pass a fresh tensor"
            )
    return out


# ---------------------------------------------------------------------------------------------
# Aliasing: `out` must not share a byte with itself (other rows) or with any input. Metadata only
# (data_ptr, shape, strides): no device access. Rows are the contiguous last dim (128 elements);
# the exact test enumerates row start addresses only when a cheap test cannot decide.


def _byte_span(t) -> tuple[int, int]:
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()


def _row_starts(t):
    """Sorted byte addresses of the rows (last dim) of a rank-4 tensor, as an int64 CPU tensor."""
    import torch

    idx = torch.zeros((), dtype=torch.int64)
    for n, st in zip(t.shape[:-1], t.stride()[:-1]):
        idx = (idx.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * st).flatten()
    return (idx * t.element_size() + t.data_ptr()).sort().values


def _self_overlaps(t) -> bool:
    dims = sorted((abs(st), n) for n, st in zip(t.shape, t.stride()) if n > 1)
    extent = 1
    for st, n in dims:  # non-overlapping if each stride clears everything inside it
        if st < extent:
            break
        extent = st * (n - 1) + extent
    else:
        return False
    starts = _row_starts(t)
    row_bytes = t.shape[-1] * t.element_size()
    return bool((starts[1:] - starts[:-1] < row_bytes).any())


def _overlaps(a, b) -> bool:
    """True if tensors ``a`` (rows of its last dim) and ``b`` share a byte."""
    import torch

    a0, a1 = _byte_span(a)
    b0, b1 = _byte_span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if a.dim() != 4 or b.dim() != 4 or a.element_size() != b.element_size() or a.shape[-1] != b.shape[-1]:
        return True  # an index tensor inside out's bytes: overlap for our purpose
    sa, sb = _row_starts(a), _row_starts(b)
    row_bytes = a.shape[-1] * a.element_size()
    pos = torch.searchsorted(sb, sa)
    after = sb[pos.clamp(max=len(sb) - 1)]
    before = sb[(pos - 1).clamp(min=0)]
    return bool(((after - sa).abs() < row_bytes).any() or ((sa - before).abs() < row_bytes).any())


def check_out_aliasing(out, inputs: dict, name: str = "out") -> None:
    """``out`` must not overlap itself (two rows at the same bytes: written in an undefined order)
    nor any input (q, k, v, the plan: the kernels read inputs while they write ``out``, so an
    overlap would return wrong values without any error). Run time only: it reads data pointers,
    and while torch.compile traces, strides are symbolic."""
    if out is None:
        return
    if _self_overlaps(out):
        raise ValueError(f"{name} has rows that overlap each other in memory (strides {tuple(out.stride())} "
                         f"for shape {tuple(out.shape)}): the kernel would write them in an undefined order. "
                         f"Fix: pass a fresh tensor (torch.empty_like(q)) or None")
    check_out_inputs(out, inputs)


def check_out_inputs(out, inputs: dict) -> None:
    """The pointer-dependent half of :func:`check_out_aliasing` (``out`` vs each input); the
    replay fast path runs it per call (self-overlap depends only on shape and strides, which are
    part of its signature)."""
    for name, t in inputs.items():
        if t is not None and t.numel() and out.numel() and _overlaps(out, t):
            raise ValueError(f"out shares memory with {name}: the kernels would overwrite their own inputs. "
                             f"Fix: pass a separate output tensor (torch.empty_like(q)) or None")


# ---------------------------------------------------------------------------------------------
# The routing plan


def check_plan_shapes(q2k_block_index, block_counts, topk, *, B, H, Sq, Sk, block_size_k) -> int:
    """Type/dtype/shape checks of the plan (no device access); returns the capacity."""
    import torch

    check_block_size_k(block_size_k)
    gq = ceil_div(Sq, Q_BLOCK)
    idx = q2k_block_index
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"q2k_block_index must be a torch.Tensor, got {type(idx).__name__}")
    if idx.dtype != torch.int32:
        raise TypeError(f"q2k_block_index must be torch.int32, got {idx.dtype} (convert with .int())")
    if idx.dim() != 4 or tuple(idx.shape[:3]) != (B, H, gq):
        raise ValueError(
            f"q2k_block_index must have shape [B, H, ceil(Sq/64), capacity] = [{B}, {H}, {gq}, capacity], "
            f"got {tuple(idx.shape)}"
        )
    capacity = idx.shape[3]
    if capacity < 1:
        raise ValueError("q2k_block_index has capacity 0; give at least one slot per row")
    if capacity > _INT32_MAX:
        raise ValueError(f"q2k_block_index capacity {capacity} does not fit int32")
    if block_counts is None:
        check_topk(topk, capacity)
    else:
        if not isinstance(block_counts, torch.Tensor):
            raise TypeError(f"block_counts must be a torch.Tensor or None, got {type(block_counts).__name__}")
        if block_counts.dtype != torch.int32:
            raise TypeError(f"block_counts must be torch.int32, got {block_counts.dtype} (convert with .int())")
        if tuple(block_counts.shape) != (B, H, gq):
            raise ValueError(
                f"block_counts must have shape [B, H, ceil(Sq/64)] = [{B}, {H}, {gq}], got {tuple(block_counts.shape)}"
            )
    return capacity


# ---------------------------------------------------------------------------------------------
# Everything `sparse_attention` takes, in the order described at the top


def check_routing_plan(q2k_block_index, block_counts, topk, *, B, H, Sq, Sk, block_size_k) -> Plan:
    """The caller's :class:`plan.Plan` after its shape checks (values: ``plan.prepare_plan``)."""
    capacity = check_plan_shapes(q2k_block_index, block_counts, topk, B=B, H=H, Sq=Sq, Sk=Sk,
                                 block_size_k=block_size_k)
    k_used = capacity if block_counts is not None else check_topk(topk, capacity)
    counts = None if block_counts is None else block_counts.contiguous()
    return Plan(q2k_block_index.contiguous(), counts, k_used, int(block_size_k), Sk)


@dataclass(frozen=True)
class AttentionArgs:
    """A validated attention call, the description the pipeline (``ops/pipeline.py``) launches
    from: canonical (B, S, H, 128) views of q/k/v, the caller's ``out`` (its layout) or None, the
    resolved softmax scale and mode, and the plan: ``spec`` always (its shapes and scalars, what
    the backends choose by), ``plan`` the caller's tensors (shapes checked; values are checked by
    the plan kernel, they need the device), None in a routed call (``subblock_attention``: the
    router makes the plan). Frozen: every step reads the one description, none amends it;
    backends receive it and never re-check."""

    q: Any
    k: Any
    v: Any
    out: Optional[Any]  # the caller's output tensor (its layout), or None
    layout: str
    plan: Optional[Plan]
    scale: float
    compute_mode: str
    check_plan: bool
    spec: PlanSpec

    def canonical(self, x):
        """The canonical view of a tensor in the caller's layout (e.g. the allocated output)."""
        return x if self.layout == "BSHD" else x.permute(0, 2, 1, 3)


def check_attention_args(q, k, v, q2k_block_index, block_counts=None, *, topk=None, block_size_k=64,
                         softmax_scale=None, compute_mode=DEFAULT_COMPUTE_MODE, layout="BSHD", out=None,
                         check_plan=False, runtime: bool = True) -> AttentionArgs:
    """All metadata and device checks of a ``sparse_attention`` call, in the order described at
    the top, once; ``runtime=False`` (while torch.compile traces) skips the pointer checks."""
    check_compute_mode(compute_mode)
    check_layout(layout)
    check_block_size_k(block_size_k)
    scale = check_scale(softmax_scale)
    qc, kc, vc = check_qkv_shapes(q, k, v, layout)
    B, Sq, H, _ = qc.shape
    Sk = kc.shape[1]
    plan = check_routing_plan(q2k_block_index, block_counts, topk, B=B, H=H, Sq=Sq, Sk=Sk, block_size_k=block_size_k)
    check_out_shape(out, q)
    check_same_cuda_device({"q": q, "k": k, "v": v, "q2k_block_index": q2k_block_index,
                            "block_counts": block_counts, "out": out})
    if runtime:
        check_out_aliasing(out, {"q": q, "k": k, "v": v, "q2k_block_index": q2k_block_index,
                                 "block_counts": block_counts})
        for t, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out")):
            if t is not None:
                check_aligned(t, n)
    return AttentionArgs(qc, kc, vc, out, layout, plan, scale, compute_mode, bool(check_plan), plan.spec)
