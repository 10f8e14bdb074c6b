"""`route`: the SubBlock router (method: ``router_spec.py``) on the AOT kernels, q and k -> a
:class:`~subblock_sage.plan.Plan` that ``sparse_attention`` takes.

Two launches on the caller's current stream, nothing read back (CUDA-graph capturable):
``router_pool`` (Q and K -> pooled bf16 cells, ``router_spec``'s layout) and ``router_select``
(block scores, log-sum-exp over the cell pairs in registers, and an exact per-row top-k ->
``q2k_block_index``, ``block_counts``). Kernels: ``aot/kernels/router`` (design and limits in
its docstring). Every argument is checked here, in plain Python, before any launch.

The public function (``api.route``) and its ``torch.library`` operator (``torch_ops.py``) are
above this module; a plain eager call replays its signature's launches (``calls.route``).
``route_with_scores`` (tests) always takes the full path.
"""

from __future__ import annotations

import functools
import numbers
import operator
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import abi
from ..contract import HEAD_DIM, MAX_GRID_YZ, Q_BLOCK, SAGE_QUANT_KERNEL, ceil_div
from ..errors import LaunchError
from ..plan import Plan
from ..backends.quantizer import POOL_PARAMS, quantize_canonical
from ..router_spec import (DEFAULT_GRANULARITY, DEFAULT_N_Q, LOG2E, PHASE_FUSED, PHASE_SCORES, PHASE_SELECT,
                           POOL_KERNEL, ROUTER_BLOCK_SIZES_K, ROUTER_N_VALUES, RUNTIME_N_IMPLS, SELECT_IMPLS,
                           SELECT_KERNELS, SELECT_TILE_CELLS, default_n_k, num_cells, router_budget, valid_cells)
from ..validation import (check_aligned, check_bf16_4d, check_layout, check_same_cuda_device, check_scale,
                          cuda_device_index)

SELECT_KERNEL = SELECT_KERNELS[SELECT_IMPLS[0]]  # the shipped score phase (mma)
ROUTER_KERNELS = (POOL_KERNEL, SELECT_KERNEL)  # what a library needs for route / subblock_attention



@dataclass(frozen=True)
class RouteArgs:
    """A checked router call: canonical (B, S, H, 128) views and every derived size, computed
    once when it is made (the launches read them as plain values)."""

    q: Any
    k: Any
    sparsity: float
    softmax_scale: float
    n_q: int
    n_k: int
    block_size_k: int
    granularity: int
    dense_rows: Optional[Any]  # None, or a tensor broadcastable to [B, H, Gq]
    B: int
    H: int
    seqlen_q: int
    seqlen_k: int
    num_query_blocks: int = field(init=False)
    num_key_blocks: int = field(init=False)
    topk: int = field(init=False)
    capacity: int = field(init=False)  # columns of q2k_block_index: every key block when a row may be dense
    sub_q: int = field(init=False)  # query rows per cell
    sub_k: int = field(init=False)  # keys per cell

    def __post_init__(self):
        gk = ceil_div(self.seqlen_k, self.block_size_k)
        topk = router_budget(gk, self.sparsity, self.granularity)
        for name, value in (("num_query_blocks", ceil_div(self.seqlen_q, Q_BLOCK)), ("num_key_blocks", gk),
                            ("topk", topk), ("capacity", gk if self.dense_rows is not None else topk),
                            ("sub_q", Q_BLOCK // self.n_q), ("sub_k", self.block_size_k // self.n_k)):
            object.__setattr__(self, name, value)


def _check_n(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) not in ROUTER_N_VALUES:
        raise ValueError(f"{name} must be one of {ROUTER_N_VALUES}, got {value!r}. Fix: pick one of those "
                         f"(defaults: n_q={DEFAULT_N_Q}, n_k=block_size_k // 16)")
    return int(value)


def _check_sparsity(sparsity) -> float:
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real):
        raise TypeError(f"sparsity must be a float in [0, 1), got {type(sparsity).__name__}. "
                        f"Fix: pass e.g. sparsity=0.75")
    s = float(sparsity)
    # comparisons alone (NaN and inf fail them): math.isfinite cannot take the symbolic float
    # torch.compile(dynamic=True) makes of a default argument
    if not 0.0 <= s < 1.0:
        raise ValueError(f"sparsity must be in [0, 1) (the fraction of key blocks dropped), got {sparsity!r}. "
                         f"Fix: pass e.g. sparsity=0.75 (0 keeps every block)")
    return s


def _check_granularity(g, block_size_k: int) -> int:
    if g is None:
        return DEFAULT_GRANULARITY[block_size_k]
    try:
        if isinstance(g, bool):
            raise TypeError
        g = operator.index(g)
    except TypeError:
        raise TypeError(f"budget_granularity must be an int >= 1 or None, got {type(g).__name__}. "
                        f"Fix: pass 1 (exact budgets) or 8 (the 64-key FlashInfer classes')") from None
    if g < 1:
        raise ValueError(f"budget_granularity must be >= 1, got {g}. Fix: pass 1 or 8, or None for the default")
    return g


def _check_dense_rows(dense_rows, B: int, H: int, gq: int, device):
    import torch

    if dense_rows is None:
        return None
    if not isinstance(dense_rows, torch.Tensor):
        raise TypeError(f"dense_rows must be a torch.Tensor or None, got {type(dense_rows).__name__}. "
                        f"Fix: pass a bool tensor of shape [Gq], [B, 1, Gq] or [B, H, Gq]")
    if dense_rows.dtype not in (torch.bool, torch.int32, torch.int64, torch.int8, torch.uint8):
        raise TypeError(f"dense_rows must be bool or integer, got {dense_rows.dtype}. Fix: pass a bool tensor")
    try:
        torch.broadcast_shapes(tuple(dense_rows.shape), (B, H, gq))
        ok = dense_rows.dim() <= 3
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"dense_rows of shape {tuple(dense_rows.shape)} does not broadcast to [B, H, Gq] = "
                         f"{[B, H, gq]} (Gq = ceil(Sq/{Q_BLOCK})). Fix: one flag per query block, e.g. [Gq]")
    if dense_rows.device != device:
        raise ValueError(f"dense_rows is on {dense_rows.device}, q on {device}. Fix: move it to q's device")
    return dense_rows


def dense_int32(dense_rows):
    """Checked ``dense_rows`` (or None) as ``router_select`` reads them: int32, the tensor itself
    when it is int32 already, else a converted copy on the current stream (a device operation
    outside the launches: ``calls.route`` makes it before recording, and again per replayed call)."""
    import torch

    if dense_rows is None or dense_rows.dtype == torch.int32:
        return dense_rows
    return dense_rows.to(torch.int32)


def check_route_args(q, k, *, sparsity, softmax_scale=None, n_q=DEFAULT_N_Q, n_k=None, block_size_k=64,
                     budget_granularity=None, dense_rows=None, layout="BSHD", runtime: bool = True) -> RouteArgs:
    """Every check of a router call (metadata only; ``runtime``: also pointer alignment), raising
    TypeError / ValueError with a Fix before anything is launched."""
    # scalars first (no tensor needed), then the tensors, then what depends on both
    check_layout(layout)
    sparsity = _check_sparsity(sparsity)
    softmax_scale = check_scale(softmax_scale)
    if isinstance(block_size_k, bool) or block_size_k not in ROUTER_BLOCK_SIZES_K:
        raise ValueError(f"block_size_k must be one of {ROUTER_BLOCK_SIZES_K}, got {block_size_k!r}. "
                         f"Fix: 128 for sm_90a Sage, else 64")
    bk = int(block_size_k)
    nq = _check_n(n_q, "n_q")
    nk = default_n_k(bk) if n_k is None else _check_n(n_k, "n_k")
    granularity = _check_granularity(budget_granularity, bk)
    qc = check_bf16_4d(q, layout, "q")
    kc = check_bf16_4d(k, layout, "k")
    if qc.shape[0] != kc.shape[0] or qc.shape[2] != kc.shape[2]:
        raise ValueError(f"q and k must have the same batch size and heads, got (B, H) = "
                         f"{(qc.shape[0], qc.shape[2])} and {(kc.shape[0], kc.shape[2])}. Fix: route one layer's q, k")
    check_same_cuda_device({"q": q, "k": k})
    if runtime:
        check_aligned(q, "q")
        check_aligned(k, "k")
    B, Sq, H, _ = qc.shape
    Sk = kc.shape[1]
    dense = _check_dense_rows(dense_rows, B, H, ceil_div(Sq, Q_BLOCK), q.device)
    args = RouteArgs(qc, kc, sparsity, softmax_scale, nq, nk, bk, granularity, dense, B, H, Sq, Sk)
    can_implement(args)
    return args


def can_implement(args: RouteArgs) -> None:
    """The kernels' limits (``aot/kernels/router``): raise ValueError with a Fix outside them."""
    if args.B > MAX_GRID_YZ or args.H > MAX_GRID_YZ:
        raise ValueError(f"B={args.B}, H={args.H}: the router launches one grid row per head and batch "
                         f"(at most {MAX_GRID_YZ} each). Fix: split the call over batch or heads")
    # int32 cell and token arithmetic in the kernels
    if args.seqlen_q * HEAD_DIM >= 2**31 or args.seqlen_k * HEAD_DIM >= 2**31:
        raise ValueError(f"sequence lengths {args.seqlen_q}, {args.seqlen_k} exceed the router's int32 "
                         f"token arithmetic (S * 128 < 2^31). Fix: route shorter sequences")


def _library(index: int, library):
    from .. import loader

    lib = library or loader.library_for_device(index)
    missing = [k for k in ROUTER_KERNELS if not lib.has_kernel(k)]
    if missing:
        raise LaunchError(f"{lib.target}: the kernel library has no {', '.join(missing)}. Fix: install a "
                          f"subblock-sage-kernels wheel built with the router (the same version as subblock-sage)")
    return lib


def check_pooling(lib):
    """``lib`` after checking that its Sage quantizer has the pooling variant
    (``ops/quantize_route.py``)."""
    try:
        lib.kernel(SAGE_QUANT_KERNEL, **POOL_PARAMS)
    except LaunchError:
        raise LaunchError(f"{lib.target}: the kernel library's {SAGE_QUANT_KERNEL} has no pooling variant "
                          f"({POOL_PARAMS}). Fix: install the subblock-sage-kernels wheel of the same version "
                          f"as subblock-sage, or route with route() and quantize with quantize_sage()") from None
    return lib


def pooled_cells(args: RouteArgs):
    """Empty pooled-cell tensors of a checked call (``router_spec``'s layout): ``(pooled_q,
    pooled_k)``, bf16 ``[B, H, cells, 128]`` on q's device."""
    import torch

    bf16 = dict(dtype=torch.bfloat16, device=args.q.device)
    cq = num_cells(args.seqlen_q, Q_BLOCK, args.n_q)
    ck = num_cells(args.seqlen_k, args.block_size_k, args.n_k)
    return (torch.empty(args.B, args.H, cq, HEAD_DIM, **bf16), torch.empty(args.B, args.H, ck, HEAD_DIM, **bf16))


def check_impl(impl: str) -> None:
    if impl not in SELECT_IMPLS:
        raise ValueError(f"impl must be one of {SELECT_IMPLS}, got {impl!r}. Fix: leave it at 'mma'")


def _select_library(impl: str, lib, select_library):
    """The library holding ``impl``'s select kernel: ``select_library`` or the call's; ``simt`` is
    compiled only into the sm_90a test library (router_spec.SELECT_KERNELS)."""
    slib = select_library or lib
    if impl == SELECT_IMPLS[0]:  # the shipped kernel: _library has checked the call's library for it
        return slib
    kernel = SELECT_KERNELS[impl]
    if slib is not None and not slib.has_kernel(kernel):
        raise LaunchError(f"{slib.target}: {slib.path.name} has no {kernel} (impl={impl!r}); the shipped "
                          f"libraries have {SELECT_KERNEL} only, {kernel} is in the sm_90a test library. Fix: "
                          f"build it with SBS_TEST_LIBS=ON ./wheels/build.sh and pass select_library="
                          f"loader.Library('<...>/libsubblock_sage_test_sm90a.so'), or leave impl at 'mma'")
    return slib


# router_select's launch shape (select_launches). A CTA of the score phase has 4 warps, one
# m16n8k16 fragment row block each, over the key tiles of its query tile: with one or two CTAs per
# SM a warp scheduler has one or two warps and every MMA/exp2/shuffle latency shows. Below
# FUSED_MIN_CTAS_PER_SM query tiles per SM the key tiles are split over CTAs up to
# SPLIT_CTAS_PER_SM per SM and the selection becomes a launch of its own. Measured (H100,
# S=37760, 132 SMs, 37 query tiles per head, router_select plus router_pool back to back, ms;
# MEASUREMENTS.md 2026-12-07): H=2 (74 CTAs) fused 0.259, split 2 / 4 / 16: 0.150 / 0.130 / 0.128;
# H=6 (222) fused 0.336, split 2 / 3 / 8 / 16: 0.211 / 0.235 / 0.195 / 0.196; H=14 (518) fused
# 0.410, split 2 / 4 / 8: 0.435 / 0.420 / 0.398 (level: the score phase is issue-bound there).
# So: ~1000+ CTAs where the query tiles are fewer than 3 per SM.
FUSED_MIN_CTAS_PER_SM = 3
SPLIT_CTAS_PER_SM = 8


@functools.cache
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def select_launches(args: RouteArgs, sms: int, k_splits: Optional[int] = None) -> tuple:
    """``router_select``'s launches for a checked call on a GPU of ``sms`` SMs: ``((phase,
    k_splits), ...)``, one fused launch or a split score launch then the selection.
    ``k_splits``: forced (1: fused; benchmark/router_bench.py compares)."""
    q_tiles = ceil_div(num_cells(args.seqlen_q, Q_BLOCK, args.n_q), SELECT_TILE_CELLS)
    k_tiles = ceil_div(num_cells(args.seqlen_k, args.block_size_k, args.n_k), SELECT_TILE_CELLS)
    ctas = q_tiles * args.H * args.B
    if k_splits is None:
        k_splits = 1 if ctas >= FUSED_MIN_CTAS_PER_SM * sms else ceil_div(SPLIT_CTAS_PER_SM * sms, ctas)
    k_splits = max(1, min(int(k_splits), k_tiles))
    if k_splits == 1:
        return ((PHASE_FUSED, 1),)
    return ((PHASE_SCORES, k_splits), (PHASE_SELECT, 1))


def launch_select(args: RouteArgs, lib, pooled_q, pooled_k, impl: str = "mma", select_library=None,
                  k_splits: Optional[int] = None):
    """``router_select`` on pooled cells (``router_pool``'s, or the pooling quantizer's) on the
    current stream of q's device: ``(index, counts, scores)``, in one or two launches
    (:func:`select_launches`; ``k_splits`` forces its choice). ``impl="simt"``: the test library's
    score phase instead (``select_library``), compiled per (n_q, n_k) where ``router_select`` takes
    them as arguments, in one launch."""
    import torch

    dev = args.q.device
    B, H = args.B, args.H
    gq, gk = args.num_query_blocks, args.num_key_blocks
    i32 = dict(dtype=torch.int32, device=dev)
    scores = torch.empty(B, H, gq, gk, dtype=torch.float32, device=dev)
    idx = torch.empty(B, H, gq, args.capacity, **i32)
    counts = torch.empty(B, H, gq, **i32)
    values = {"pooled_q": pooled_q, "pooled_k": pooled_k, "scores": scores, "q2k_block_index": idx,
              "block_counts": counts, "q_valid": valid_cells(args.seqlen_q, args.sub_q),
              "k_valid": valid_cells(args.seqlen_k, args.sub_k), "topk": args.topk}
    dense = args.dense_rows is not None
    # without dense rows the kernel never reads ``dense_rows``: any int32 [B, H, Gq] will do
    values["dense_rows"] = dense_int32(args.dense_rows).expand(B, H, gq) if dense else counts
    values["has_dense"] = int(dense)
    slib = _select_library(impl, lib, select_library)
    if impl not in RUNTIME_N_IMPLS:  # simt
        abi.launch(SELECT_KERNELS[impl], {"n_q": args.n_q, "n_k": args.n_k}, values, library=slib)
    else:  # one export for every (n_q, n_k): check_route_args has checked both against ROUTER_N_VALUES
        values = {**values, "n_q": args.n_q, "n_k": args.n_k}
        for phase, splits in select_launches(args, _sm_count(cuda_device_index(dev)), k_splits):
            abi.launch(SELECT_KERNELS[impl], {}, {**values, "phase": phase, "k_splits": splits}, library=slib)
    return idx, counts, scores


def launch(args: RouteArgs, *, library=None, impl: str = "mma", select_library=None, k_splits=None,
           quantize=None):
    """The launches of a checked call, the pooling then :func:`launch_select`'s: ``(index,
    counts, scores, pooled_q, pooled_k, operands)``. ``quantize``: ``(v, with_q)`` (v's canonical
    view): the pooling is the Sage quantizer's pooling variant, which writes the cells in its pass
    over Q and K (``ops/quantize_route.py``), and ``operands`` its outputs as
    ``quantize_canonical`` returns them (no ``q_int8`` / ``q_scale`` without ``with_q``); else
    ``router_pool`` and ``operands`` None."""
    check_impl(impl)
    import torch

    dev = args.q.device
    index = cuda_device_index(dev)
    lib = _library(index, library)
    if quantize is not None:
        check_pooling(lib)
    slib = _select_library(impl, lib, select_library)  # refused before the first launch
    with torch.cuda.device(dev):
        pooled_q, pooled_k = pooled_cells(args)
        operands = None
        if quantize is None:
            abi.launch(POOL_KERNEL, {}, {"q": args.q, "k": args.k, "pooled_q": pooled_q, "pooled_k": pooled_k,
                                         "sub_q": args.sub_q, "sub_k": args.sub_k,
                                         "q_scale": args.softmax_scale * LOG2E}, library=lib)
        else:
            vc, with_q = quantize
            pool = {"pooled_q": pooled_q, "pooled_k": pooled_k, "q_pool_scale": args.softmax_scale * LOG2E}
            operands = quantize_canonical(args.q, args.k, vc, with_q=with_q, pool=pool, library=lib)
        idx, counts, scores = launch_select(args, lib, pooled_q, pooled_k, impl, slib, k_splits)
    return idx, counts, scores, pooled_q, pooled_k, operands


def _plan(args: RouteArgs, idx, counts) -> Plan:
    return Plan(idx, counts, args.topk, args.block_size_k, args.seqlen_k)


def launch_plan(args: RouteArgs, library=None) -> Plan:
    """The launches of a checked call and its :class:`Plan` (``route``'s full path, the one
    ``calls.route`` records)."""
    idx, counts = launch(args, library=library)[:2]
    return _plan(args, idx, counts)


def route_with_scores(q, k, *, library=None, impl: str = "mma", select_library=None, k_splits=None, **kw):
    """``route`` plus the kernels' intermediate tensors (tests): ``(plan, scores float32
    [B, H, Gq, Gk] in natural-log units, pooled_q, pooled_k)``; ``impl``: the score phase
    (``"simt"``: the test library's, passed as ``select_library``); ``k_splits``: forces
    :func:`select_launches`' choice (1: one fused launch)."""
    args = check_route_args(q, k, **kw)
    idx, counts, scores, pq, pk = launch(args, library=library, impl=impl, select_library=select_library,
                                         k_splits=k_splits)[:5]
    return _plan(args, idx, counts), scores, pq, pk


# ---------------------------------------------------------------------------------------------
# startup self-test (diagnostics/probes.py: `subblock-sage check`, validate_startup)

# (Sq, Sk, block_size_k, n_q, n_k, budget granularity, sparsity): ragged tails on both sides,
# both key-block sizes with their default cells and granularities, one dense row in the first
SELF_TEST_CASES = ((300, 1000, 64, 4, 4, 8, 0.75), (150, 1100, 128, 4, 8, 1, 0.6))


def self_test_cases():
    """The self-test's inputs, on the CPU: ``(q, k, dense_rows or None, route keyword arguments)``
    per case of :data:`SELF_TEST_CASES` (tests/cpu/test_router_self_test.py judges its verdict on
    the same cases)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(5)
    for i, (Sq, Sk, bk, n_q, n_k, gran, sparsity) in enumerate(SELF_TEST_CASES):
        H = 2
        # activations-like: a per-channel offset shared by all tokens plus noise (scores spread
        # over a few units, so the selection is decided by the data rather than by rounding)
        q = torch.randn(1, Sq, H, HEAD_DIM, generator=g) + 0.5 * torch.randn(1, 1, H, HEAD_DIM, generator=g)
        k = torch.randn(1, Sk, H, HEAD_DIM, generator=g) + torch.randn(1, 1, H, HEAD_DIM, generator=g)
        dense = None
        if i == 0:
            dense = torch.zeros(ceil_div(Sq, Q_BLOCK), dtype=torch.bool)
            dense[1] = True
        yield q.to(torch.bfloat16), k.to(torch.bfloat16), dense, dict(
            sparsity=sparsity, n_q=n_q, n_k=n_k, block_size_k=bk, budget_granularity=gran)


def self_test(device: int) -> str:
    """Small ragged routes compared with the float64 reference: the same blocks up to the stated
    ties (``reference.router_verdict``)."""
    from .. import deadline
    from ..reference import reference_route, router_verdict

    dev = f"cuda:{device}"
    lines = []
    for q, k, dense, kw in self_test_cases():
        args = check_route_args(q.to(dev), k.to(dev), dense_rows=None if dense is None else dense.to(dev), **kw)
        plan = launch_plan(args)  # the full path, unrecorded: a self-test never repeats a signature
        deadline.wait_stream(device, f"GPU {device} router self-test")  # polls an event: never hangs
        ref_idx, ref_cnt, scores, _ = reference_route(q, k, dense_rows=dense, **kw)
        lines.append(f"{kw['block_size_k']}-key: " + router_verdict(plan.index, plan.counts, ref_idx, ref_cnt,
                                                                     scores))
    return "; ".join(lines)


self_test.supported = lambda lib: all(lib.has_kernel(k) for k in ROUTER_KERNELS)


__all__ = ["route_with_scores", "launch_plan", "dense_int32", "check_route_args", "can_implement", "RouteArgs", "launch",
           "ROUTER_KERNELS", "self_test"]
