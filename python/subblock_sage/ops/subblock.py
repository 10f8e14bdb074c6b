"""`subblock_attention` below its public wrapper: the call's one description
(:class:`SubblockArgs`, from :func:`check_subblock_args`) and its full path
(:func:`subblock_attention`: ``pipeline.subblock``).

One call from q, k, v to the output, on the caller's stream, with nothing read back (no host
wait, CUDA-graph capturable): route, then attend on the routed plan (``pipeline.py`` lists the
launches: three for bf16 and for ``sage_fp8`` with 16-token cells, where the pooling quantizer
reads Q and K once). Every argument of both halves is checked before the first launch, so a bad
``v`` or ``out`` never leaves a routed plan behind.

The key-block size and the budget granularity come from the backend of the device's target
(``Backend.router_geometry``: 128-key blocks for sm_90a Sage, 64 elsewhere; granularity 1 for
Sage, 8 for bf16), the choices SGLang 0.5.23's SubBlock backend makes, so that a plan here is the
plan SGLang's router would make for the same q, k (up to the ties ``reference.py`` states). So
the description is made after the target is known: :func:`check_subblock_args` serves the call
(``pipeline.serve``, the backend's ``can_implement`` once) between the mode's check and the
router's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..contract import BLOCK_SIZES_K
from ..plan import PlanSpec
from ..validation import (AttentionArgs, check_aligned, check_compute_mode, check_out_aliasing, check_out_shape,
                          check_same_cuda_device, check_v)
from . import pipeline
from .route import RouteArgs, check_route_args


@dataclass(frozen=True)
class SubblockArgs:
    """A checked ``subblock_attention`` call: the router's half (:class:`~.route.RouteArgs`), the
    attention's half (``validation.AttentionArgs`` with the routed plan's :class:`PlanSpec` and no
    plan tensors: the router makes them), and the library and backend serving it (None while
    torch.compile traces: the target is decided when the operator runs)."""

    route: RouteArgs
    attention: AttentionArgs
    served: Optional[Any]


def _served(device, compute_mode: str, library=None):
    """(served, block_size_k, budget_granularity) of a routed call on ``device``'s target."""
    served = pipeline.serve(device, compute_mode, library=library, what="subblock_attention")
    bk, g = served.backend.router_geometry(compute_mode)
    return served, bk, g


def geometry(device, compute_mode: str, library=None) -> tuple[int, int]:
    """``(block_size_k, budget_granularity)`` of the router for ``compute_mode`` on ``device``'s
    target, after the backend said it can run the mode there (ValueError naming what it serves;
    UnsupportedGPUError / NoGPUError from the loader, with their fixes)."""
    check_compute_mode(compute_mode)
    return _served(device, compute_mode, library)[1:]


def check_subblock_args(q, k, v, *, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out,
                        library=None, runtime: bool = True) -> SubblockArgs:
    """Every check of a ``subblock_attention`` call, each once, before anything is launched: the
    mode; at run time q's device and the target serving it (``pipeline.serve``: the geometry and
    ``can_implement``); the router's (``check_route_args``: its scalars, q and k); v; ``out`` and
    its aliasing. ``runtime=False`` (a traced call): no target and no pointers; the router's checks
    run with the 64-key geometry, on which they depend only through the defaults they fill in,
    which the operator's real implementation recomputes for the device's target."""
    check_compute_mode(compute_mode)
    served, bk, g = None, BLOCK_SIZES_K[0], None
    if runtime:
        check_same_cuda_device({"q": q})  # the geometry asks q's device for its target
        served, bk, g = _served(q.device, compute_mode, library)
    r = check_route_args(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                         block_size_k=bk, budget_granularity=g, layout=layout, runtime=runtime)
    vc = check_v(q, k, v, layout, runtime=runtime)
    check_out_shape(out, q)
    if out is not None:
        if out.device != q.device:
            raise ValueError(f"out is on {out.device}, q on {q.device}. Fix: allocate out on q's device")
        if runtime:
            check_out_aliasing(out, {"q": q, "k": k, "v": v})
            check_aligned(out, "out")
    spec = PlanSpec(r.capacity, True, r.topk, r.block_size_k, r.seqlen_k)
    att = AttentionArgs(r.q, r.k, vc, out, layout, None, r.softmax_scale, compute_mode, False, spec)
    return SubblockArgs(r, att, served)


def subblock_attention(q, k, v, *, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out=None,
                       library=None):
    """Validate (serving the call), launch: the full path of a call on real tensors (the public
    ``subblock_sage.subblock_attention`` documents the arguments and replays)."""
    call = check_subblock_args(q, k, v, sparsity=sparsity, compute_mode=compute_mode, n_q=n_q, n_k=n_k,
                               softmax_scale=softmax_scale, layout=layout, out=out, library=library)
    return pipeline.subblock(call, call.served)


__all__ = ["SubblockArgs", "check_subblock_args", "geometry", "subblock_attention"]
