"""PyTorch integration: the kernels as ``torch.library`` custom operators.

    torch.ops.subblock_sage.sparse_attention(q, k, v, q2k_block_index, block_counts, topk,
                                             block_size_k, softmax_scale, compute_mode, layout,
                                             check_plan) -> Tensor
    torch.ops.subblock_sage.sparse_attention_out(..., out) -> ()        (writes ``out``)
    torch.ops.subblock_sage.quantize_sage(q, k, v, layout) -> (q_int8, q_scale, k_int8, k_scale,
                                                                v_fp8, v_scale, k_mean)
    torch.ops.subblock_sage.route(...) -> (index, counts)                (ops/route.py)
    torch.ops.subblock_sage.subblock_attention(q, k, v, sparsity, compute_mode, n_q, n_k,
                                               softmax_scale, layout) -> Tensor
    torch.ops.subblock_sage.subblock_attention_out(..., out) -> ()      (writes ``out``)

Each has a fake (meta) implementation, so ``torch.compile(fullgraph=True)`` traces through it
as one opaque node, and a real one that launches on the caller's current stream (so CUDA-graph
capture records it; call :func:`preload` or run once eagerly before capturing).

``subblock_sage.sparse_attention`` / ``subblock_sage.quantize_sage`` are the wrappers below:
they keep the documented Python signatures, run every metadata check (dtype, rank, shapes,
strides, scale, devices) in plain Python before the operator, which is traceable, and leave the
data-dependent checks (pointer alignment, plan values) to the operator's real implementation.
A plain eager call (no torch.compile, no dispatch mode, no tensor subclass; see ``_eager``)
calls that real implementation directly: the dispatcher costs ~35 us of host time per call.
"""

import math
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from . import replay
from . import validation as V
from .contract import HEAD_DIM, ceil_div
from .ops.route import route  # noqa: F401  (registers torch.ops.subblock_sage.route; public)

NAMESPACE = "subblock_sage"
QUANT_KEYS = ("q_int8", "q_scale", "k_int8", "k_scale", "v_fp8", "v_scale", "k_mean")


def _eager(q, k, v, index=None, counts=None, out=None) -> bool:
    """True when nothing would intercept the operator: no tracing (torch.compile is checked by
    the caller), no dispatch mode (FakeTensorMode, make_fx, TorchDispatchMode debug tools) and
    only plain tensors (no subclasses). Then the wrappers call the real implementation directly;
    otherwise they go through ``torch.ops.subblock_sage`` so that the fake implementations and
    modes see the call. Written out argument by argument: it runs on every call (0.17 us against
    0.5 for a generator over them, build machine)."""
    if torch._C._len_torch_dispatch_stack():
        return False
    return (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor
            and (index is None or type(index) is Tensor) and (counts is None or type(counts) is Tensor)
            and (out is None or type(out) is Tensor))


# ---------------------------------------------------------------------------------------------
# sparse_attention


@torch.library.custom_op(f"{NAMESPACE}::sparse_attention", mutates_args=())
def _sparse_attention_op(q: Tensor, k: Tensor, v: Tensor, q2k_block_index: Tensor,
                         block_counts: Optional[Tensor], topk: Optional[int], block_size_k: int,
                         softmax_scale: float, compute_mode: str, layout: str,
                         check_plan: bool) -> Tensor:
    from .ops.attention import sparse_attention as impl

    def full():
        return impl(q, k, v, q2k_block_index, block_counts, topk=topk, block_size_k=block_size_k,
                    softmax_scale=softmax_scale, compute_mode=compute_mode, layout=layout,
                    check_plan=check_plan)

    # torch.compile without CUDA graphs calls this per step: replay it like an eager call
    res = None if check_plan else _replayed(q, k, v, q2k_block_index, block_counts, None, topk, block_size_k,
                                            softmax_scale, compute_mode, layout, lambda *_: full())
    return full() if res is None else res


@_sparse_attention_op.register_fake
def _(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale, compute_mode,
      layout, check_plan):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{NAMESPACE}::sparse_attention_out", mutates_args=("out",))
def _sparse_attention_out_op(q: Tensor, k: Tensor, v: Tensor, q2k_block_index: Tensor,
                             block_counts: Optional[Tensor], topk: Optional[int], block_size_k: int,
                             softmax_scale: float, compute_mode: str, layout: str,
                             check_plan: bool, out: Tensor) -> None:
    from .ops.attention import sparse_attention as impl

    def full():
        return impl(q, k, v, q2k_block_index, block_counts, topk=topk, block_size_k=block_size_k,
                    softmax_scale=softmax_scale, compute_mode=compute_mode, layout=layout,
                    check_plan=check_plan, out=out)

    if check_plan or _replayed(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k,
                               softmax_scale, compute_mode, layout, lambda *_: full()) is None:
        full()


@_sparse_attention_out_op.register_fake
def _(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale, compute_mode,
      layout, check_plan, out):
    return None


def sparse_attention(q: Tensor, k: Tensor, v: Tensor, q2k_block_index: Tensor,
                     block_counts: Optional[Tensor] = None, *, topk: Optional[int] = None,
                     block_size_k: int = 64, softmax_scale: Optional[float] = None,
                     compute_mode: str = "sage_fp8", layout: str = "BSHD", out: Optional[Tensor] = None,
                     check_plan: bool = False, library: object = None,
                     backend: Optional[str] = None) -> Tensor:
    """Block-sparse attention over 64-row query blocks (see ``subblock_sage.ops.attention``).

    Args:
        q: bf16 ``[B, Sq, H, 128]`` (``layout="BSHD"``) or ``[B, H, Sq, 128]`` (``"BHSD"``).
        k, v: bf16, same layout with ``Sk`` keys; strided views are used in place.
        q2k_block_index: int32 ``[B, H, ceil(Sq/64), capacity]`` key-block ids (units of
            ``block_size_k``); only the first ``block_counts[b,h,i]`` of a row are read; ids
            outside ``[0, ceil(Sk/block_size_k))`` are skipped (``check_plan=True`` raises).
        block_counts: int32 ``[B, H, ceil(Sq/64)]`` in ``0..capacity``, or None (every row uses
            ``topk``, default capacity). A row with 0 blocks returns zeros.
        block_size_k: 64 or 128. softmax_scale: default ``1/sqrt(128)``.
        compute_mode: ``"sage_fp8"`` or ``"bf16"``. out: optional bf16 output with q's shape.
        check_plan: raise ValueError on out-of-range counts or index values (costs a host wait
            for the plan kernel; skipped under CUDA-graph capture). Without it bad counts are
            clamped and bad ids skipped on the GPU, and the call never waits.
    Returns:
        bf16 tensor in q's layout. Raises TypeError/ValueError on bad input before any launch.

    A plain eager call (see ``_eager``) of a signature seen before is replayed (``replay.py``):
    its launches as the full path recorded them, with this call's pointers and stream.
    """
    if library is None and backend is None and check_plan is False and not torch.compiler.is_compiling() \
            and _eager(q, k, v, q2k_block_index, block_counts, out):
        res = _replayed(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale,
                        compute_mode, layout, _direct_call)
        if res is not None:
            return res
    return _full_call(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale,
                      compute_mode, layout, out, check_plan, library, backend)


def _direct_call(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale,
                 compute_mode, layout):
    """The full path of an eager call, for the replay recorder (``_replayed``'s ``full``). A
    function of the call's arguments, not a closure made per call: a lambda over them made
    every argument of ``sparse_attention`` a cell, created on each call (build machine, CPU
    stubs for the CUDA pieces, the replayed call with ``_eager`` written out: 8.3 -> 7.7 us)."""
    return _full_call(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale,
                      compute_mode, layout, out, False, None, None, direct=True)


def _replayed(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale,
              compute_mode, layout, full):
    """The call through ``replay.py``: a replay of its signature's recorded launches, or the full
    path recorded (``full`` called with this function's arguments but ``full``); None when the
    caller must take the full path itself (a signature that cannot be keyed or replayed, or a
    misaligned pointer: nothing was launched, the full path names it)."""
    got = replay.keyed(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k,
                       softmax_scale, compute_mode, layout)
    if got is None:
        return None
    key, ptrs = got
    hit = replay.lookup(key)
    if hit.__class__ is replay.Replay:
        if out is not None:
            V.check_out_inputs(out, {"q": q, "k": k, "v": v, "q2k_block_index": q2k_block_index,
                                     "block_counts": block_counts})
        return hit.launch(ptrs, out)
    if hit is None:
        return replay.record(key, (q, k, v, q2k_block_index, block_counts, out),
                             lambda: full(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k,
                                          softmax_scale, compute_mode, layout))
    return None


def _full_call(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale,
               compute_mode, layout, out, check_plan, library, backend, direct=False):
    """Validate, then the implementation (eager; ``direct``: the replay recorder, whose own
    dispatch mode is active) or the custom operator (traced, other modes)."""
    check = bool(check_plan)
    runtime = not torch.compiler.is_compiling()
    args = V.check_attention_args(q, k, v, q2k_block_index, block_counts, topk=topk,
                                  block_size_k=block_size_k, softmax_scale=softmax_scale,
                                  compute_mode=compute_mode, layout=layout, out=out,
                                  check_plan=check, runtime=runtime)
    scale = args.scale
    if topk is not None:
        topk = int(topk)
    block_size_k = int(block_size_k)
    # Test builds (library / backend given) have no operator; a plain eager call skips the
    # dispatcher (~35 us of host time per call on the H200 host, MEASUREMENTS.md). Both hand the
    # call validated above straight to the implementation (no second check).
    if direct or library is not None or backend is not None or (
            runtime and _eager(q, k, v, q2k_block_index, block_counts, out)):
        from .ops.attention import run

        return run(args, library=library, backend=backend)
    if out is None:
        return torch.ops.subblock_sage.sparse_attention(
            q, k, v, q2k_block_index, block_counts, topk, block_size_k, scale, compute_mode,
            layout, check)
    torch.ops.subblock_sage.sparse_attention_out(
        q, k, v, q2k_block_index, block_counts, topk, block_size_k, scale, compute_mode, layout,
        check, out)
    return out


# ---------------------------------------------------------------------------------------------
# quantize_sage


@torch.library.custom_op(f"{NAMESPACE}::quantize_sage", mutates_args=())
def _quantize_sage_op(q: Tensor, k: Tensor, v: Tensor,
                      layout: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    from .ops.quantize import quantize_sage as impl

    res = impl(q, k, v, layout=layout)
    return tuple(res[key] for key in QUANT_KEYS)


@_quantize_sage_op.register_fake
def _(q, k, v, layout):
    qc = q if layout == "BSHD" else q.permute(0, 2, 1, 3)
    kc = k if layout == "BSHD" else k.permute(0, 2, 1, 3)
    B, Sq, H, D = qc.shape
    Sk = kc.shape[1]
    nbk = ceil_div(Sk, 64)
    f32 = dict(dtype=torch.float32, device=q.device)
    return (
        q.new_empty((B, H, Sq, D), dtype=torch.int8),
        q.new_empty((B, H, ceil_div(Sq, 128) * 4), **f32),
        q.new_empty((B, H, Sk, D), dtype=torch.int8),
        q.new_empty((B, H, nbk), **f32),
        q.new_empty((B, H, D, nbk * 64), dtype=torch.float8_e4m3fn),
        q.new_empty((B, H, D), **f32),
        q.new_empty((B, H, D), **f32),
    )


def quantize_sage(q: Tensor, k: Tensor, v: Tensor, layout: str = "BSHD") -> Dict[str, Tensor]:
    """Quantize bf16 Q, K, V for Sage attention (see ``subblock_sage.ops.quantize``).

    Returns a dict with ``q_int8``, ``q_scale``, ``k_int8``, ``k_scale``, ``v_fp8``,
    ``v_scale``, ``k_mean``.
    """
    runtime = not torch.compiler.is_compiling()
    qc, kc, vc = V.check_qkv(q, k, v, layout, runtime=runtime)
    if runtime and _eager(q, k, v):
        from .ops.quantize import quantize_canonical

        return quantize_canonical(qc, kc, vc)  # the checks above are the implementation's own
    return dict(zip(QUANT_KEYS, torch.ops.subblock_sage.quantize_sage(q, k, v, layout)))


# ---------------------------------------------------------------------------------------------
# subblock_attention: route + attend


@torch.library.custom_op(f"{NAMESPACE}::subblock_attention", mutates_args=())
def _subblock_attention_op(q: Tensor, k: Tensor, v: Tensor, sparsity: float, compute_mode: str, n_q: int,
                           n_k: Optional[int], softmax_scale: float, layout: str) -> Tensor:
    return _subblock_call(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, None)


@_subblock_attention_op.register_fake
def _(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{NAMESPACE}::subblock_attention_out", mutates_args=("out",))
def _subblock_attention_out_op(q: Tensor, k: Tensor, v: Tensor, sparsity: float, compute_mode: str, n_q: int,
                               n_k: Optional[int], softmax_scale: float, layout: str, out: Tensor) -> None:
    _subblock_call(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out)


@_subblock_attention_out_op.register_fake
def _(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out):
    return None


def subblock_attention(q: Tensor, k: Tensor, v: Tensor, *, sparsity: float = 0.75, compute_mode: str = "bf16",
                       n_q: int = 4, n_k: Optional[int] = None, softmax_scale: Optional[float] = None,
                       layout: str = "BSHD", out: Optional[Tensor] = None) -> Tensor:
    """SubBlock attention in one call: route q against k, then block-sparse attention on the plan.

    Each 64-row query block keeps its best key blocks (``route``: the log-sum-exp of pooled
    16-token cells, float32, exact top-k) and attends to those only. The key-block size and the
    budget's granularity follow the device's target and ``compute_mode`` as SGLang's SubBlock
    backend chooses them (128-key blocks for sm_90a Sage, else 64; granularity 1 for Sage, 8 for
    bf16: ``backends.base.Backend.router_geometry``).

    Args:
        q: bf16 ``[B, Sq, H, 128]`` (``layout="BSHD"``) or ``[B, H, Sq, 128]`` (``"BHSD"``).
        k, v: bf16, same layout with ``Sk`` keys; strided views are used in place.
        sparsity: fraction of key blocks dropped per query block, in [0, 1) (an upper bound: the
            budget is rounded up to the granularity).
        compute_mode: ``"bf16"`` or ``"sage_fp8"``.
        n_q, n_k: cells per query / key block (1, 2, 4, 8); ``n_k`` default: 16-key cells.
        softmax_scale: default ``1/sqrt(128)``. out: optional bf16 output with q's shape.
    Returns:
        bf16 tensor in q's layout. Raises TypeError/ValueError before any launch.

    Launches on the current stream and never waits for the GPU: CUDA-graph capturable (call
    ``preload`` or run once eagerly first) and one opaque node under ``torch.compile``. The same
    result as ``route`` then ``sparse_attention(q, k, v, plan.index, plan.counts,
    block_size_k=plan.block_size_k, ...)`` with that geometry, bit for bit.
    """
    if not torch.compiler.is_compiling() and _eager(q, k, v, out=out):
        return _subblock_call(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out)
    from .ops.subblock import check_subblock_args

    args, _ = check_subblock_args(q, k, v, sparsity=sparsity, compute_mode=compute_mode, n_q=n_q, n_k=n_k,
                                  softmax_scale=softmax_scale, layout=layout, out=out, runtime=False)
    n_k = None if n_k is None else int(n_k)
    if out is None:
        return torch.ops.subblock_sage.subblock_attention(q, k, v, args.sparsity, compute_mode, args.n_q, n_k,
                                                          args.softmax_scale, layout)
    torch.ops.subblock_sage.subblock_attention_out(q, k, v, args.sparsity, compute_mode, args.n_q, n_k,
                                                   args.softmax_scale, layout, out)
    return out


def _subblock_call(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out):
    """The call on real tensors (eager, or the operators' real implementations): the geometry of
    the device's target, every check, then ``sage_fp8``'s fused path (``ops/subblock.attend_fused``)
    or the plan's launches and ``sparse_attention``'s."""
    from .ops import subblock as S

    V.check_compute_mode(compute_mode)
    V.check_same_cuda_device({"q": q})  # the geometry asks q's device for its target
    bk, g = S.geometry(q.device, compute_mode)
    args, vc = S.check_subblock_args(q, k, v, sparsity=sparsity, compute_mode=compute_mode, n_q=n_q, n_k=n_k,
                                     softmax_scale=softmax_scale, layout=layout, out=out, block_size_k=bk,
                                     budget_granularity=g)
    if compute_mode == "sage_fp8":
        res = S.attend_fused(args, vc, out, layout)
        if res is not None:
            return res
    plan = S.plan(args)
    return sparse_attention(q, k, v, plan.index, plan.counts, block_size_k=plan.block_size_k,
                            softmax_scale=args.softmax_scale, compute_mode=compute_mode, layout=layout, out=out)


# ---------------------------------------------------------------------------------------------


def preload(device=None) -> None:
    """Load the kernel library for ``device`` (default: current CUDA device) and load all its
    kernels onto that GPU. Call this before capturing a CUDA graph (a first eager call also
    does it)."""
    from . import loader

    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"preload needs a CUDA device, got {dev}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    loader.library_for_device(index).preload(index)


def default_scale() -> float:
    return 1.0 / math.sqrt(HEAD_DIM)
