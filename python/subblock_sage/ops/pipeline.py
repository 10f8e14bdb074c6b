"""One call pipeline: a validated, frozen call description -> the backend serving its device,
asked once -> the call's launches in order, on the caller's current stream.

    route               router_pool, router_select                                (route.py)
    quantize_and_route  sage_quant_kv (pool variant), router_select               (quantize_route.py)
    sparse_attention    sage_quant_kv with the plan role | plan_prepare; attention    (:func:`attention`)
    subblock_attention  the two above it, then the attention launch               (:func:`subblock`)

Every entry point checks its arguments once, in the function that makes its description
(``validation.check_attention_args``: ``AttentionArgs``; ``route.check_route_args``:
``RouteArgs``; ``quantize_route.check_args``; ``subblock.check_subblock_args``: ``SubblockArgs``),
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
from typing import Any

from .. import loader
from ..backends import backend_for
from ..plan import Plan, prepare_plan
from ..router_spec import CELL_TOKENS
from ..validation import AttentionArgs, capturing, cuda_device_index


@dataclass(frozen=True)
class Served:
    """The library and backend serving one call, after the backend's ``can_implement`` said yes
    for its mode and key-block size."""

    lib: Any
    backend: Any
    compute_mode: str
    block_size_k: int


def serve(device, compute_mode: str, block_size_k: int | None = None, *, library=None, backend=None,
          what: str = "this call") -> Served:
    """The call's :class:`Served`: ``library`` / ``backend`` or those of ``device``'s target, and
    the one ``can_implement`` of the call (ValueError naming what the target serves; the
    loader's UnsupportedGPUError / NoGPUError with their fixes). ``block_size_k`` None: a routed
    call, whose key blocks are the router's for the mode on this target
    (``Backend.router_block_size_k``)."""
    lib = library or loader.library_for_device(cuda_device_index(device, what))
    be = backend or backend_for(lib.target)
    bk = be.router_block_size_k(compute_mode) if block_size_k is None else block_size_k
    be.can_implement(lib, compute_mode, bk)
    return Served(lib, be, compute_mode, bk)


def _result(args: AttentionArgs):
    """The caller's ``out``, or the output allocated in q's layout (contiguous)."""
    import torch

    if args.out is not None:
        return args.out
    return torch.empty_like(args.q if args.layout == "BSHD" else args.q.permute(0, 2, 1, 3),
                            memory_format=torch.contiguous_format)


def stage(args: AttentionArgs, served: Served):
    """The steps before the attention launch of a call with the caller's plan: the input
    conversion and the plan. Sage: the quantizer's launch also prepares the plan (its plan role),
    so the call is two launches (each launch costs host time and a GPU gap, which dominate at small
    shapes); bf16: the plan kernel. Returns (operands, prepared plan); bad plan values raise in
    ``plan.verify()``."""
    lib, be = served.lib, served.backend
    box: dict = {}
    fuse = None
    if be.fuses_plan(lib, args.compute_mode):
        def fuse(values):
            box["operands"] = be.prepare(args, lib, plan_values=values)
    plan = prepare_plan(args.plan, block_size_k_out=be.plan_block_size_k(args.spec.block_size_k),
                        check_index=args.check_plan, capturing=capturing(), library=lib, fuse=fuse)
    operands = box["operands"] if "operands" in box else be.prepare(args, lib)  # PyTorch plan fallback
    return operands, plan


def attention(args: AttentionArgs, served: Served):
    """``sparse_attention``'s launches: :func:`stage`, then the attention launch (the backend
    packs it, reads the plan's verdict when ``check_plan=True``, where bad values raise and
    ``out`` is never written, and launches). Returns the output in the caller's layout."""
    import torch

    served.backend.check_call(served.lib, args)
    out = _result(args)
    with torch.cuda.device(args.q.device):
        operands, plan = stage(args, served)
        served.backend.run(served.lib, args, plan, operands, args.canonical(out))
    return out


def pools_in_quantizer(served: Served, route_args) -> bool:
    """Whether a routed Sage call reads Q and K once: 16-token cells (the pooling quantizer's
    only size), a backend that takes the plan in the router's key blocks, and a library whose
    quantizer has the pooling variant (an older one has not: the call then routes in two
    launches, with the same result)."""
    from ..contract import MODES, SAGE_QUANT_KERNEL
    from ..errors import LaunchError
    from .quantize_route import POOL_PARAMS

    if not MODES[served.compute_mode].quantizes or route_args.sub_q != CELL_TOKENS or route_args.sub_k != CELL_TOKENS:
        return False
    if not served.backend.fuses_plan(served.lib, served.compute_mode):  # its Sage operands are not ours
        return False
    if served.backend.plan_block_size_k(route_args.block_size_k) != route_args.block_size_k:
        return False
    try:
        served.lib.kernel(SAGE_QUANT_KERNEL, **POOL_PARAMS)
    except LaunchError:
        return False
    return True


def subblock(call, served: Served):
    """``subblock_attention``'s launches for a checked call (``subblock.SubblockArgs``): the
    router's (or the pooling quantizer's and router_select's), then the attention launch on the
    routed plan. Returns the output in the caller's layout."""
    import torch

    from . import quantize_route as QR
    from . import route as R

    r, att = call.route, call.attention
    lib, be = served.lib, served.backend
    be.check_call(lib, att)
    bk, Sk = r.block_size_k, r.seqlen_k
    out = _result(att)
    with torch.cuda.device(att.q.device):
        if pools_in_quantizer(served, r):
            operands, idx, counts = QR.launch(r, att.v, with_q=not be.quantizes_q(lib, att), library=lib)[:3]
            plan = Plan(idx, counts, 0, bk, Sk)  # prepared by construction (the module docstring)
        else:
            idx, counts = R.launch(r, library=lib)[:2]
            if be.plan_block_size_k(bk) == bk:
                plan = Plan(idx, counts, 0, bk, Sk)
                operands = be.prepare(att, lib)  # Sage: the quantizer alone; bf16: nothing
            else:  # a backend taking other key blocks: the plan kernel rewrites the routed plan
                import dataclasses

                operands, plan = stage(dataclasses.replace(att, plan=Plan(idx, counts, r.topk, bk, Sk)), served)
        be.run(lib, att, plan, operands, att.canonical(out))
    return out


__all__ = ["Served", "serve", "stage", "attention", "subblock", "pools_in_quantizer"]
