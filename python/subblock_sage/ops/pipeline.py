"""One call pipeline: a validated, frozen call description -> the backend serving its device,
asked once -> the call's launches in order, on the caller's current stream.

    route               router_pool, router_select                                (route.py)
    quantize_and_route  sage_quant_kv (pool variant), router_select               (quantize_route.py)
    sparse_attention    sage_quant_kv with the plan role | plan_prepare; attention    (:func:`attention`)
    subblock_attention  the two above it, then the attention launch               (:func:`subblock`)

Every entry point checks its arguments once, in the function that makes its description
(``validation.check_attention_args``: ``AttentionArgs``; ``route.check_route_args``:
``RouteArgs``; ``quantize_route.check_args``; :func:`check_subblock_args`: :class:`SubblockArgs`),
and the backend's ``can_implement`` runs once, in :func:`serve`. The steps below launch and check
nothing: a description is complete before the first launch, so a bad argument never leaves a
routed plan or a quantized operand behind. ``replay.py`` records the launches one full call made,
whichever entry point it was, and replays them for the next call of the same signature
(``calls.py``).

A routed call (``subblock_attention``) takes the router's plan as a prepared plan: the router
writes each row's ids valid, distinct and ascending and its counts in range, which is what the
plan kernel would make of it, so no plan kernel runs (bf16: router_pool, router_select,
attention). ``sage_fp8`` with 16-token cells reads Q and K once: the pooling quantizer writes the
router's cells in its pass over them (``quantize_route.py``), then router_select and the
attention kernel on its operands. Other cells route in two launches and quantize in a third.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import loader
from ..backends import backend_for
from ..backends.base import Served
from ..contract import BLOCK_SIZES_K
from ..plan import PlanSpec
from ..validation import (AttentionArgs, check_aligned, check_attention_args, check_compute_mode, check_out_aliasing,
                          check_out_shape, check_same_cuda_device, check_v, cuda_device_index)
from .route import RouteArgs, check_route_args


def serve(device, compute_mode: str, block_size_k: int | None = None, *, library=None, backend=None,
          what: str = "this call") -> Served:
    """The call's :class:`~subblock_sage.backends.base.Served`: ``library`` / ``backend`` or those
    of ``device``'s target, asked once (``Backend.serve``: the call's ``can_implement``, ValueError
    naming what the target serves; the loader's UnsupportedGPUError / NoGPUError with their fixes).
    ``block_size_k`` None: a routed call, served in the router's geometry for the mode on this
    target (``Backend.router_geometry``)."""
    lib = library or loader.library_for_device(cuda_device_index(device, what))
    return (backend or backend_for(lib.target)).serve(lib, compute_mode, block_size_k)


def _result(args: AttentionArgs):
    """The caller's ``out``, or the output allocated in q's layout (contiguous)."""
    import torch

    if args.out is not None:
        return args.out
    return torch.empty_like(args.q if args.layout == "BSHD" else args.q.permute(0, 2, 1, 3),
                            memory_format=torch.contiguous_format)


def attention(args: AttentionArgs, served: Served):
    """``sparse_attention``'s launches, in one backend call (``Backend.attention``): the plan and
    the input conversion (``Backend.stage``: the plan kernel, or the quantizer's launch with its
    plan role), then the attention launch (the backend packs it, reads the plan's verdict when
    ``check_plan=True``, where bad values raise and ``out`` is never written, and launches).
    Returns the output in the caller's layout."""
    import torch

    served.backend.check_call(served.lib, args)
    out = _result(args)
    with torch.cuda.device(args.q.device):
        served.backend.attention(served.lib, args, out)
    return out


def attention_full(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale, compute_mode,
                   layout, check_plan=False, library=None, backend=None):
    """``sparse_attention``'s full path on real tensors: every check once (``AttentionArgs``),
    the backend once (:func:`serve`), the launches (:func:`attention`); ``calls.attention``
    records it and replays it."""
    args = check_attention_args(q, k, v, q2k_block_index, block_counts, topk=topk, block_size_k=block_size_k,
                                softmax_scale=softmax_scale, compute_mode=compute_mode, layout=layout, out=out,
                                check_plan=check_plan)
    return attention(args, serve(args.q.device, args.compute_mode, args.spec.block_size_k, library=library,
                                 backend=backend))


def subblock(call: "SubblockArgs", served: Served):
    """``subblock_attention``'s launches for a checked call (:class:`SubblockArgs`), in one backend
    call (``Backend.subblock``: the router's launches, then the attention's on the routed plan).
    Returns the output in the caller's layout."""
    import torch

    att = call.attention
    served.backend.check_call(served.lib, att)
    out = _result(att)
    with torch.cuda.device(att.q.device):
        served.backend.subblock(served, call.route, att, out)
    return out


# ---------------------------------------------------------------------------------------------
# subblock_attention: its description, made after the target is known, and its full path


@dataclass(frozen=True)
class SubblockArgs:
    """A checked ``subblock_attention`` call: the router's half (:class:`~.route.RouteArgs`), the
    attention's half (``validation.AttentionArgs`` with the routed plan's :class:`PlanSpec` and no
    plan tensors: the router makes them), and the library and backend serving it (None while
    torch.compile traces: the target is decided when the operator runs)."""

    route: RouteArgs
    attention: AttentionArgs
    served: Optional[Served]


def geometry(device, compute_mode: str, library=None) -> tuple[int, int]:
    """``(block_size_k, budget_granularity)`` of the router for ``compute_mode`` on ``device``'s
    target, after the backend said it can run the mode there (ValueError naming what it serves;
    UnsupportedGPUError / NoGPUError from the loader, with their fixes)."""
    check_compute_mode(compute_mode)
    served = serve(device, compute_mode, library=library, what="subblock_attention")
    return served.block_size_k, served.granularity


def check_subblock_args(q, k, v, *, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out,
                        library=None, runtime: bool = True) -> SubblockArgs:
    """Every check of a ``subblock_attention`` call, each once, before anything is launched: the
    mode; at run time q's device and the target serving it (:func:`serve`: the geometry and
    ``can_implement``); the router's (``check_route_args``: its scalars, q and k); v; ``out`` and
    its aliasing. Why the target first: the key-block size and the budget granularity are the
    backend's (``Backend.router_geometry``: 128-key blocks for sm_90a Sage, 64 elsewhere;
    granularity 1 for Sage, 8 for bf16), the choices SGLang 0.5.23's SubBlock backend makes, so a
    plan here is the plan SGLang's router would make for the same q, k (up to the ties
    ``reference.py`` states). ``runtime=False`` (a traced call): no target and no pointers; the
    router's checks run with the 64-key geometry, on which they depend only through the defaults
    they fill in, which the operator's real implementation recomputes for the device's target."""
    check_compute_mode(compute_mode)
    served, bk, g = None, BLOCK_SIZES_K[0], None
    if runtime:
        check_same_cuda_device({"q": q})  # the geometry asks q's device for its target
        served = serve(q.device, compute_mode, library=library, what="subblock_attention")
        bk, g = served.block_size_k, served.granularity
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


def subblock_full(q, k, v, *, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out=None, library=None):
    """``subblock_attention``'s full path on real tensors: validated once (serving the call), then
    :func:`subblock`'s launches (the public ``subblock_sage.subblock_attention`` documents the
    arguments; ``calls.subblock`` records this path and replays it)."""
    call = check_subblock_args(q, k, v, sparsity=sparsity, compute_mode=compute_mode, n_q=n_q, n_k=n_k,
                               softmax_scale=softmax_scale, layout=layout, out=out, library=library)
    return subblock(call, call.served)


__all__ = ["Served", "serve", "attention", "attention_full", "subblock", "SubblockArgs", "check_subblock_args",
           "geometry", "subblock_full"]
