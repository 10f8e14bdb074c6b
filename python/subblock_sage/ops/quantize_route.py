"""`quantize_and_route`: the first two launches of a routed Sage call, the quantizer with the
router's pooling in its pass over Q and K (variant ``pool`` of ``sage_quant_kv``,
``aot/kernels/sage_quant/pool.py``: ``router_pool``'s cells, bit for bit) and then
``router_select`` on those cells (``backends/router.py``), returning the quantized operands and the
:class:`~subblock_sage.plan.Plan`. Nothing is read back and every tensor is ``torch.empty`` (the
workspace is the stream's own, ``workspace.sync_buffer``): no host wait, CUDA-graph capturable. The
plan is ``route``'s (ids ascending, valid and distinct, counts in range) in ``block_size_k``-key
blocks, so it goes to the attention launch as a prepared plan.

    torch.ops.subblock_sage.quantize_and_route(q, k, v, sparsity, softmax_scale, n_q, n_k,
        block_size_k, budget_granularity, dense_rows, layout, with_q)
        -> (q_int8, q_scale, k_int8, k_scale, v_fp8, v_scale, k_mean, index, counts)

is the ``torch.library`` operator (fake implementation: shapes only; ``q_int8`` / ``q_scale``
have no rows when ``with_q`` is False).

Cells: the pooling quantizer pools 16-token cells (``router_spec.CELL_TOKENS``), the defaults on
every path (``n_q = 4``; ``n_k = 4`` for 64-key blocks, 8 for 128-key ones). Other ``n_q`` /
``n_k`` are refused before any launch, with the two-launch path as the fix (``route`` then
``quantize_sage``).

Where Q's pooling rides, per target:

* sm_120a / sm_120f (and sm_100a / sm_100f, whose library ships the quantizer): the quantizer
  quantizes Q (``with_q=True``); its Q tiles pool the rows they have loaded for the codes.
* sm_90a with the INT8-Q attention kernels: the same.
* sm_90a with the Q-fused flat kernels (``backends/sm90.py: quantizes_q``, ``with_q=False``): the
  quantizer does not quantize Q, and Q must still be read once for its cells. At H=14 S=37760
  (B=1): (a) the quantizer's Q tiles read Q to pool it only: 135.3 MB read and 8.5 MB of cells
  written, inside the launch that runs anyway, its Q tiles (which wait on nothing) filling the
  K/V CTAs' waits; (b) ``router_pool`` for Q alone: the same 135.3 + 8.5 MB as one more launch
  (a launch costs a Sage call 2-5 us of GPU time: the quantizer's docstring), with its own ramp
  and tail and nothing to overlap. Equal bytes, (a) one launch fewer: (a) is what ``with_q=False``
  does (q keeps its rows, ``q_int8`` has none). A third choice is the backend's, not made here:
  quantize Q too and run the INT8-Q kernel, +67.7 MB of codes written by the quantizer and
  67.7 MB less read by the attention kernel, which then skips its per-CTA Q quantization.

Speed, against the target quantize + route <= 1.10 x quantize alone (H=14 S=37760 on the H200;
arithmetic, nothing here has run on a GPU). Per tensor 135.3 MB of bf16, 67.7 MB of codes, 8.5 MB
of cells (2360 cells of 256 B per head).

* With Q (sm_120a, sm_90a INT8-Q): the quantizer moves 609 MB in 0.185 ms (measured,
  MEASUREMENTS.md 2026-12-02 "V read once by the Sage quantizer": 3.3 TB/s); the cells add
  16.9 MB of writes (+2.8 %, ~5 us at that rate). The pooling variant runs 3 CTAs per SM where the
  plain one runs 4 on sm_90a (``sage_quant.spec.POOL_CTAS_PER_SM``): 96 instead of 128 KiB of loads
  in flight per SM, still ~2.7x the H200's bandwidth-latency product per SM (4.8 TB/s x ~1 us /
  132 SMs = ~36 KiB); unmeasured.
* ``router_select``: 14 x 2360^2 cell pairs of 128 channels = 20 GFLOP on tensor cores, >= 20 us at
  the H200's 989 TFLOPS bf16 peak (mma.sync reaches less), ~98 M exp2/log2 on 132 x 16 MUFU
  lanes at 1.98 GHz (~23 us), pooled K re-read from L2 by each of 518 CTAs (0.31 GB); the router's
  docstring estimates 0.15-0.2 ms for its two launches.
* So quantize + route >= 0.185 + 0.005 + 0.020 ms = 0.210 ms = 1.14x with the select phase at
  tensor peak and nothing else: **the 1.10x target is out of reach** for a router that scores
  every block pair from 16 cell pairs; 1.10x leaves 18.5 us for the select launch and the
  cells. The fused pooling's own share is ~3 % (the cell writes), the rest is the select launch.
* sm_90a Q-fused: quantize alone is the K/V pass, 406 MB in 0.1425 ms (same entry); routing adds
  Q's read (135.3 MB, >= 28 us at 4.8 TB/s) and the cells: >= (0.1425 + 0.028 + 0.004 + 0.020) /
  0.1425 = 1.36x, whatever the router, because the pass it is compared with never reads Q.
"""

from __future__ import annotations

from ..oplib import define
from ..plan import Plan
from ..backends import router as BR
from ..backends.quantizer import POOL_PARAMS, output_specs
from ..router_spec import CELL_TOKENS, DEFAULT_N_Q
from ..validation import check_v, eager
from . import route as R



def check_args(q, k, v, *, sparsity, softmax_scale=None, n_q=DEFAULT_N_Q, n_k=None, block_size_k=64,
               budget_granularity=None, dense_rows=None, layout="BSHD", runtime: bool = True):
    """``route``'s checks, then v's and the fused path's own limit (16-token cells): ``(args,
    vc)``, ``args`` a :class:`~subblock_sage.ops.route.RouteArgs`, ``vc`` v's canonical view."""
    args = R.check_route_args(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                              block_size_k=block_size_k, budget_granularity=budget_granularity,
                              dense_rows=dense_rows, layout=layout, runtime=runtime)
    vc = check_v(q, k, v, layout, runtime=runtime)
    if args.sub_q != CELL_TOKENS or args.sub_k != CELL_TOKENS:
        raise ValueError(
            f"n_q={args.n_q}, n_k={args.n_k} with block_size_k={args.block_size_k} make cells of {args.sub_q} "
            f"query rows and {args.sub_k} keys; the quantizer pools {CELL_TOKENS}-token cells only (n_q=4, "
            f"n_k=block_size_k // {CELL_TOKENS}, the defaults). Fix: leave n_q and n_k at their defaults, or "
            f"route with subblock_sage.route(...) and quantize with quantize_sage(...) (two launches more)")
    return args, vc


def _library(index: int, library):
    return BR.check_pooling(BR.router_library(index, library))


def launch(args, vc, *, with_q: bool = True, library=None):
    """The two launches of a checked call: ``(operands, index, counts, scores, pooled_q,
    pooled_k)``; ``operands`` as ``quantize_canonical`` returns them (no ``q_int8`` /
    ``q_scale`` when ``with_q`` is False). The select launch is the shipped ``router_select``
    (route's; tests/gpu/test_quantize_route.py compares the two paths bit for bit)."""
    idx, counts, scores, pooled_q, pooled_k, operands = BR.launch(args, library=library, quantize=(vc, with_q))
    return operands, idx, counts, scores, pooled_q, pooled_k


def quantize_and_route(q, k, v, *, sparsity, softmax_scale=None, n_q=DEFAULT_N_Q, n_k=None, block_size_k=64,
                       budget_granularity=None, dense_rows=None, layout="BSHD", with_q: bool = True,
                       library=None) -> tuple[dict, Plan]:
    """Quantize q, k, v for Sage attention and route q against k, reading Q and K once.

    Args:
        q, k, v: bf16 in ``layout`` ("BSHD" ``[B, S, H, 128]`` or "BHSD"), as ``quantize_sage``
            and ``route`` take them.
        sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows: as
            ``subblock_sage.route`` (``api.route``); ``n_q`` / ``n_k`` must give 16-token cells
            (the defaults do).
        with_q: False for an attention kernel that quantizes its own Q tile (sm_90a's Q-fused
            kernels: ``not backend.quantizes_q(lib, args)``): Q is then read only to pool it and
            no ``q_int8`` / ``q_scale`` is returned.
        library: the kernel library (default: the device's).
    Returns:
        ``(operands, plan)``: ``operands`` as ``quantize_sage`` returns them (``q_int8``,
        ``q_scale``, ``k_int8``, ``k_scale``, ``v_fp8``, ``v_scale``, ``k_mean``; the first two
        only with ``with_q``), bit for bit; ``plan`` as ``route`` returns it, bit for bit.
    """
    import torch

    # traced (torch.compile, a dispatch mode, tensor subclasses): through the operator, whose real
    # implementation checks the pointers; eager: the launches directly (``validation.eager``)
    traced = library is None and (torch.compiler.is_compiling() or not eager(q, k, v, dense_rows))
    args, vc = check_args(q, k, v, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                          block_size_k=block_size_k, budget_granularity=budget_granularity, dense_rows=dense_rows,
                          layout=layout, runtime=not traced)
    if traced:
        out = torch.ops.subblock_sage.quantize_and_route(q, k, v, args.sparsity, args.softmax_scale, args.n_q,
                                                         args.n_k, args.block_size_k, args.granularity,
                                                         dense_rows, layout, bool(with_q))
        names = list(output_specs(1, 1, 1, 1))
        operands = dict(zip(names, out[:len(names)]))
        if not with_q:
            del operands["q_int8"], operands["q_scale"]
        return operands, BR.routed_plan(args, *out[len(names):])
    operands, idx, counts = launch(args, vc, with_q=with_q, library=library)[:3]
    return operands, BR.routed_plan(args, idx, counts)


def quantize_and_route_with_cells(q, k, v, *, library=None, with_q: bool = True, **kw):
    """:func:`quantize_and_route` plus the intermediate tensors (tests): ``(operands, plan,
    scores, pooled_q, pooled_k)``."""
    args, vc = check_args(q, k, v, **kw)
    operands, idx, counts, scores, pq, pk = launch(args, vc, with_q=with_q, library=library)
    return operands, BR.routed_plan(args, idx, counts), scores, pq, pk


# ---------------------------------------------------------------------------------------------
# torch.library operator


def _op(q, k, v, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows, layout, with_q):
    import torch

    args, vc = check_args(q, k, v, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                          block_size_k=block_size_k, budget_granularity=budget_granularity,
                          dense_rows=dense_rows, layout=layout)
    operands, idx, counts = launch(args, vc, with_q=with_q)[:3]
    if not with_q:  # (the schema's fixed outputs: Q's with no rows)
        empty = output_specs(args.B, args.H, 0, 0)
        operands = {**{n: q.new_empty(empty[n][0], dtype=getattr(torch, empty[n][1]))
                       for n in ("q_int8", "q_scale")}, **operands}
    names = list(output_specs(1, 1, 1, 1))
    return (*(operands[n] for n in names), idx, counts)


def _fake(q, k, v, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows, layout,
          with_q):
    import torch

    args, _ = check_args(q, k, v, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                         block_size_k=block_size_k, budget_granularity=budget_granularity,
                         dense_rows=dense_rows, layout=layout, runtime=False)
    specs = output_specs(args.B, args.H, args.seqlen_q if with_q else 0, args.seqlen_k)
    gq = args.num_query_blocks
    return (*(q.new_empty(shape, dtype=getattr(torch, dtype)) for shape, dtype in specs.values()),
            q.new_empty((args.B, args.H, gq, args.capacity), dtype=torch.int32),
            q.new_empty((args.B, args.H, gq), dtype=torch.int32))


try:
    import torch as _torch  # noqa: F401
except ImportError:  # the runtime imports without torch (``subblock-sage check``)
    pass
else:
    define("quantize_and_route",
           "(Tensor q, Tensor k, Tensor v, float sparsity, float softmax_scale, int n_q, int n_k, int block_size_k, "
           "int budget_granularity, Tensor? dense_rows, str layout, bool with_q) -> "
           "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", _op, _fake)


__all__ = ["quantize_and_route", "quantize_and_route_with_cells", "check_args", "launch", "POOL_PARAMS"]
