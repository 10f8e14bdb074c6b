"""`route`: the SubBlock router (method: ``router_spec.py``) on the AOT kernels, q and k -> a
:class:`~subblock_sage.plan.Plan` that ``sparse_attention`` takes.

Every argument is checked here, in plain Python, before any launch (:func:`check_route_args`:
the frozen :class:`RouteArgs`); the launches are the backend layer's (``backends/router.py``):
``router_pool`` (Q and K -> pooled bf16 cells, ``router_spec``'s layout) and ``router_select``
(block scores, log-sum-exp over the cell pairs in registers, and an exact per-row top-k ->
``q2k_block_index``, ``block_counts``) on the caller's current stream, nothing read back
(CUDA-graph capturable). Kernels: ``aot/kernels/router`` (design and limits in its docstring).

The public function (``api.route``) and its ``torch.library`` operator (``torch_ops.py``) are
above this module; a plain eager call replays its signature's launches (``calls.route``).
``route_with_scores`` (tests) always takes the full path.
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass, field
from typing import Any, Optional

from ..backends import router as BR
from ..contract import HEAD_DIM, MAX_GRID_YZ, Q_BLOCK, ceil_div
from ..router_spec import (DEFAULT_GRANULARITY, DEFAULT_N_Q, ROUTER_BLOCK_SIZES_K, ROUTER_N_VALUES, default_n_k,
                           router_budget)
from ..validation import check_aligned, check_bf16_4d, check_layout, check_same_cuda_device, check_scale


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


def route_with_scores(q, k, *, library=None, impl: str = "mma", select_library=None, k_splits=None, **kw):
    """``route`` plus the kernels' intermediate tensors (tests): ``(plan, scores float32
    [B, H, Gq, Gk] in natural-log units, pooled_q, pooled_k)``; ``impl``: the score phase
    (``"simt"``: the test library's, passed as ``select_library``); ``k_splits``: forces
    :func:`~subblock_sage.backends.router.select_launches`' choice (1: one fused launch)."""
    args = check_route_args(q, k, **kw)
    idx, counts, scores, pq, pk = BR.launch(args, library=library, impl=impl, select_library=select_library,
                                            k_splits=k_splits)[:5]
    return BR.routed_plan(args, idx, counts), scores, pq, pk


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
        plan = BR.launch_plan(args)  # the full path, unrecorded: a self-test never repeats a signature
        deadline.wait_stream(device, f"GPU {device} router self-test")  # polls an event: never hangs
        ref_idx, ref_cnt, scores, _ = reference_route(q, k, dense_rows=dense, **kw)
        lines.append(f"{kw['block_size_k']}-key: " + router_verdict(plan.index, plan.counts, ref_idx, ref_cnt,
                                                                     scores))
    return "; ".join(lines)


self_test.supported = lambda lib: all(lib.has_kernel(k) for k in BR.ROUTER_KERNELS)


__all__ = ["route_with_scores", "check_route_args", "can_implement", "RouteArgs", "self_test"]
