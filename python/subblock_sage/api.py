"""The public calls: ``sparse_attention``, ``subblock_attention``, ``route``, ``quantize_sage``,
with their documented Python signatures.

Each is a composition of the same pieces (``ops/pipeline.py``): one validation into the call's
frozen description, the backend's ``can_implement`` once, the launches in order. How a call runs:

* a plain eager call (not traced by torch.compile; no dispatch mode, no tensor subclass:
  ``validation.eager``) takes its real call directly (``calls.py``): a repeated signature replays
  its recorded launches, any other runs the full path. The dispatcher would cost ~35 us of host
  time per call on the H200 host (MEASUREMENTS.md);
* anything else (torch.compile, FakeTensorMode, subclasses) validates the metadata here (what can
  be checked while tracing: no data pointers, no device's target) and calls the operator
  (``torch_ops.py``), whose real implementation is the same real call.
"""

import math
from typing import Dict, Optional

import torch
from torch import Tensor

from . import calls, torch_ops  # noqa: F401  (torch_ops registers the operators the traced calls use)
from . import validation as V
from .contract import DEFAULT_COMPUTE_MODE, HEAD_DIM
from .ops import pipeline as _P
from .ops import route as _R
from .plan import Plan
from .router_spec import DEFAULT_N_Q

_eager = V.eager


def sparse_attention(q: Tensor, k: Tensor, v: Tensor, q2k_block_index: Tensor,
                     block_counts: Optional[Tensor] = None, *, topk: Optional[int] = None,
                     block_size_k: int = 64, softmax_scale: Optional[float] = None,
                     compute_mode: str = DEFAULT_COMPUTE_MODE, layout: str = "BSHD", out: Optional[Tensor] = None,
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
        compute_mode: ``"bf16"`` (the default of both attention calls,
            ``contract.DEFAULT_COMPUTE_MODE``: every target serves it and it is exact up to bf16
            rounding) or ``"sage_fp8"`` (INT8 Q·Kᵀ, FP8 P·V: faster where the target serves it).
        out: optional bf16 output with q's shape.
        check_plan: raise ValueError on out-of-range counts or index values (costs a host wait
            for the plan kernel; skipped under CUDA-graph capture). Without it bad counts are
            clamped and bad ids skipped on the GPU, and the call never waits.
    Returns:
        bf16 tensor in q's layout. Raises TypeError/ValueError on bad input before any launch.

    A plain eager call (see ``validation.eager``) of a signature seen before is replayed
    (``replay.py``): its launches as the full path recorded them, with this call's pointers and
    stream.
    """
    eager = not torch.compiler.is_compiling() and _eager(q, k, v, q2k_block_index, block_counts, out)
    if eager and library is None and backend is None and check_plan is False:
        res = calls.attention(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale,
                              compute_mode, layout)
        if res is not None:
            return res
    if eager or library is not None or backend is not None:
        # test builds (library / backend given) have no operator; a plain eager call skips it
        return calls.attention_full(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k,
                                    softmax_scale, compute_mode, layout, bool(check_plan), library, backend)
    args = V.check_attention_args(q, k, v, q2k_block_index, block_counts, topk=topk, block_size_k=block_size_k,
                                  softmax_scale=softmax_scale, compute_mode=compute_mode, layout=layout, out=out,
                                  check_plan=bool(check_plan), runtime=not torch.compiler.is_compiling())
    topk = None if topk is None else int(topk)
    if out is None:
        return torch.ops.subblock_sage.sparse_attention(
            q, k, v, q2k_block_index, block_counts, topk, int(block_size_k), args.scale, compute_mode, layout,
            args.check_plan)
    torch.ops.subblock_sage.sparse_attention_out(
        q, k, v, q2k_block_index, block_counts, topk, int(block_size_k), args.scale, compute_mode, layout,
        args.check_plan, out)
    return out


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
    return dict(zip(torch_ops.QUANT_KEYS, torch.ops.subblock_sage.quantize_sage(q, k, v, layout)))


def subblock_attention(q: Tensor, k: Tensor, v: Tensor, *, sparsity: float = 0.75,
                       compute_mode: str = DEFAULT_COMPUTE_MODE, n_q: int = 4, n_k: Optional[int] = None,
                       softmax_scale: Optional[float] = None, layout: str = "BSHD",
                       out: Optional[Tensor] = None) -> Tensor:
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
        compute_mode: ``"bf16"`` (the default of both attention calls, as ``sparse_attention``
            says why) or ``"sage_fp8"``.
        n_q, n_k: cells per query / key block (1, 2, 4, 8); ``n_k`` default: 16-key cells.
        softmax_scale: default ``1/sqrt(128)``. out: optional bf16 output with q's shape.
    Returns:
        bf16 tensor in q's layout. Raises TypeError/ValueError before any launch.

    Launches on the current stream and never waits for the GPU: CUDA-graph capturable (call
    ``preload`` or run once eagerly first) and one opaque node under ``torch.compile``. The same
    result as ``route`` then ``sparse_attention(q, k, v, plan.index, plan.counts,
    block_size_k=plan.block_size_k, ...)`` with that geometry, bit for bit. A plain eager call of
    a signature seen before replays its recorded launches, as ``sparse_attention`` does.
    """
    if not torch.compiler.is_compiling() and _eager(q, k, v, out):
        return calls.subblock(q, k, v, out, sparsity, compute_mode, n_q, n_k, softmax_scale, layout)
    call = _P.check_subblock_args(q, k, v, sparsity=sparsity, compute_mode=compute_mode, n_q=n_q, n_k=n_k,
                               softmax_scale=softmax_scale, layout=layout, out=out, runtime=False)
    r = call.route
    n_k = None if n_k is None else int(n_k)
    if out is None:
        return torch.ops.subblock_sage.subblock_attention(q, k, v, r.sparsity, compute_mode, r.n_q, n_k,
                                                          r.softmax_scale, layout)
    torch.ops.subblock_sage.subblock_attention_out(q, k, v, r.sparsity, compute_mode, r.n_q, n_k,
                                                   r.softmax_scale, layout, out)
    return out


def route(q, k, *, sparsity, softmax_scale=None, n_q=DEFAULT_N_Q, n_k=None, block_size_k=64,
          budget_granularity=None, dense_rows=None, layout="BSHD", library=None) -> Plan:
    """Route ``q`` against ``k``: each 64-row query block keeps its best key blocks.

    Args:
        q: bf16 ``[B, Sq, H, 128]`` (``layout="BSHD"``) or ``[B, H, Sq, 128]`` (``"BHSD"``);
           strided views are read in place (head dim contiguous, other strides multiples of 8).
        k: bf16, same layout and (B, H), ``Sk`` keys.
        sparsity: fraction of key blocks dropped, in [0, 1): each routed row keeps
            ``min(Gk, ceil(ceil((1 - sparsity) Gk) / g) g)`` blocks (``router_spec.router_budget``).
        softmax_scale: default ``1/sqrt(128)``: Q's cells carry ``softmax_scale * log2(e)``.
        n_q, n_k: cells per query / key block, in {1, 2, 4, 8}; ``n_k`` defaults to 16-key cells
            (4 for 64-key blocks, 8 for 128).
        block_size_k: 64 or 128 (128: sm_90a Sage's key blocks).
        budget_granularity: ``g`` above; default 8 for 64-key blocks, 1 for 128.
        dense_rows: optional bool tensor broadcastable to ``[B, H, Gq]``: those rows list every
            key block (the plan's capacity is then ``Gk``).
    Returns:
        :class:`Plan` with ``index`` int32 ``[B, H, Gq, capacity]`` (each row's ids ascending, then
        zeros) and ``counts`` int32 ``[B, H, Gq]``; pass ``plan.index, plan.counts,
        block_size_k=plan.block_size_k`` to ``sparse_attention``.

    A plain eager call without ``library`` of a signature seen before is replayed (``replay.py``):
    its launches as the full path recorded them, with this call's pointers and stream, the same
    :class:`~subblock_sage.plan.Plan` bit for bit. Why: the full path's Python (checks, sizes, the
    launch choice, packing two or three argument blocks) made an isolated call 0.02-0.04 ms slower
    than back to back on an H100 (MEASUREMENTS.md 2026-12-07), and the SGLang plugin calls
    ``route`` once per layer. ``library=`` (test builds) always takes the full path.
    """
    if library is not None:  # test builds: the full path, never recorded
        return calls.route_full(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity,
                                dense_rows, layout, library)
    if not torch.compiler.is_compiling() and _eager(q, k, dense_rows):
        return calls.route(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows,
                           layout)
    # traced (torch.compile, a dispatch mode such as FakeTensorMode, tensor subclasses): what can be
    # checked while tracing, then the operator, whose real implementation is calls.route
    args = _R.check_route_args(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                               block_size_k=block_size_k, budget_granularity=budget_granularity,
                               dense_rows=dense_rows, layout=layout, runtime=False)
    idx, counts = torch.ops.subblock_sage.route(q, k, args.sparsity, args.softmax_scale, args.n_q, args.n_k,
                                                args.block_size_k, args.granularity, dense_rows, layout)
    return Plan(idx, counts, args.topk, args.block_size_k, args.seqlen_k)


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


__all__ = ["sparse_attention", "subblock_attention", "quantize_sage", "route", "preload", "default_scale"]
