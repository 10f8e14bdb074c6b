"""`subblock_attention`'s steps below its public wrapper (``torch_ops.subblock_attention``): the
router's geometry for the device and mode, every check of the call, and the plan.

One call from q, k, v to the output is route (``ops/route.py``: two launches) then
``sparse_attention`` (its replayed launches) on the caller's stream, with nothing read back: no
host wait, CUDA-graph capturable. Every argument of both halves is checked here before the
first launch, so a bad ``v`` or ``out`` never leaves a routed plan behind.

The key-block size and the budget granularity come from the backend of the device's target
(``Backend.router_geometry``: 128-key blocks for sm_90a Sage, 64 elsewhere; granularity 1 for
Sage, 8 for bf16), the choices SGLang 0.5.23's SubBlock backend makes, so that a plan here is the
plan SGLang's router would make for the same q, k (up to the ties ``reference.py`` states).
"""

from __future__ import annotations

from .. import loader
from ..backends import backend_for
from ..contract import BLOCK_SIZES_K
from ..plan import Plan
from ..validation import (check_aligned, check_compute_mode, check_out_aliasing, check_out_shape, check_qkv,
                          cuda_device_index)
from .route import RouteArgs, check_route_args, launch


def geometry(device, compute_mode: str, library=None) -> tuple[int, int]:
    """``(block_size_k, budget_granularity)`` of the router for ``compute_mode`` on ``device``'s
    target, after the backend said it can run the mode there (ValueError naming what it serves;
    UnsupportedGPUError / NoGPUError from the loader, with their fixes)."""
    check_compute_mode(compute_mode)
    lib = library or loader.library_for_device(cuda_device_index(device, "subblock_attention"))
    be = backend_for(lib.target)
    bk, g = be.router_geometry(compute_mode)
    be.can_implement(lib, compute_mode, bk)
    return bk, g


def check_subblock_args(q, k, v, *, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out,
                        block_size_k=None, budget_granularity=None, runtime: bool = True) -> RouteArgs:
    """Every check of a ``subblock_attention`` call, before anything is launched: the attention's
    (mode, q/k/v, out and its aliasing) and the router's (``check_route_args``). ``block_size_k``
    None (a traced call: the target is decided when the operator runs): the router's checks run
    with the 64-key geometry; they depend on the block size only through the defaults they fill
    in, which the operator's real implementation recomputes for the device's target."""
    check_compute_mode(compute_mode)
    # the router's checks first: its scalars, then q and k (every scalar error shows on any tensor)
    args = check_route_args(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                            block_size_k=BLOCK_SIZES_K[0] if block_size_k is None else block_size_k,
                            budget_granularity=budget_granularity, layout=layout, runtime=runtime)
    check_qkv(q, k, v, layout, runtime=runtime)
    check_out_shape(out, q)
    if out is not None:
        if out.device != q.device:
            raise ValueError(f"out is on {out.device}, q on {q.device}. Fix: allocate out on q's device")
        if runtime:
            check_out_aliasing(out, {"q": q, "k": k, "v": v})
            check_aligned(out, "out")
    return args


def plan(args: RouteArgs, library=None) -> Plan:
    """The plan of a checked call, on the current stream (no host wait).

    The one place a plan for ``subblock_attention`` is made: today the router's two launches over
    q and k for every mode. In ``sage_fp8`` the quantizer reads Q and K once more right after
    (``sparse_attention``'s first launch); a quantizer pass that also writes the router's pooled
    cells (``router_spec``'s layout) replaces the pooling launch here, leaving the selection."""
    idx, counts = launch(args, library=library)[:2]
    return Plan(idx, counts, args.topk, args.block_size_k, args.seqlen_k)


__all__ = ["check_subblock_args", "geometry", "plan"]
