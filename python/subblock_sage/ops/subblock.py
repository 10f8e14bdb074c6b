"""`subblock_attention`'s steps below its public wrapper (``torch_ops.subblock_attention``): the
router's geometry for the device and mode, every check of the call, and the plan.

One call from q, k, v to the output, on the caller's stream, with nothing read back (no host
wait, CUDA-graph capturable):

* ``sage_fp8`` with the default 16-token cells, where the library has the pooling quantizer:
  :func:`attend_fused`, three launches: the quantizer pooling the router's cells in its pass over
  Q and K (``ops/quantize_route.py``: Q and K read once), ``router_select``, then the attention
  kernel on the quantized operands and the routed plan (already what the plan kernel would make:
  ids valid, distinct, ascending);
* otherwise route (``ops/route.py``: two launches) then ``sparse_attention`` (its replayed
  launches) on the plan: :func:`plan`.

Both give the same output bit for bit (the pooling quantizer's operands and cells are the plain
quantizer's and ``router_pool``'s). Every argument of both halves is checked here before the
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
                        block_size_k=None, budget_granularity=None, runtime: bool = True):
    """Every check of a ``subblock_attention`` call, before anything is launched: the attention's
    (mode, q/k/v, out and its aliasing) and the router's (``check_route_args``). ``block_size_k``
    None (a traced call: the target is decided when the operator runs): the router's checks run
    with the 64-key geometry; they depend on the block size only through the defaults they fill
    in, which the operator's real implementation recomputes for the device's target. Returns
    ``(args, vc)``: the router's :class:`RouteArgs` and v's canonical (B, S, H, 128) view."""
    check_compute_mode(compute_mode)
    # the router's checks first: its scalars, then q and k (every scalar error shows on any tensor)
    args = check_route_args(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                            block_size_k=BLOCK_SIZES_K[0] if block_size_k is None else block_size_k,
                            budget_granularity=budget_granularity, layout=layout, runtime=runtime)
    _, _, vc = check_qkv(q, k, v, layout, runtime=runtime)
    check_out_shape(out, q)
    if out is not None:
        if out.device != q.device:
            raise ValueError(f"out is on {out.device}, q on {q.device}. Fix: allocate out on q's device")
        if runtime:
            check_out_aliasing(out, {"q": q, "k": k, "v": v})
            check_aligned(out, "out")
    return args, vc


def plan(args: RouteArgs, library=None) -> Plan:
    """The plan of a checked call, on the current stream (no host wait).

    The router's two launches over q and k, for the two-launch path (bf16; ``sage_fp8`` where
    :func:`attend_fused` does not apply: other cells, a library without the pooling quantizer)."""
    idx, counts = launch(args, library=library)[:2]
    return Plan(idx, counts, args.topk, args.block_size_k, args.seqlen_k)


def attend_fused(args: RouteArgs, vc, out, layout: str, library=None):
    """``sage_fp8`` in three launches, Q and K read once: the pooling quantizer, ``router_select``
    on its cells, the attention kernel on its operands and the plan. Returns the output (in
    ``layout``), or None when the fused path does not apply (cells other than 16 tokens, a
    library without the pooling variant, a backend taking the plan in other key blocks): the
    caller then routes and attends in the two-launch path, with the same result."""
    import dataclasses

    import torch

    from ..contract import SAGE_QUANT_KERNEL
    from ..errors import LaunchError
    from ..router_spec import CELL_TOKENS
    from ..validation import AttentionArgs
    from . import quantize_route as QR
    from .attention import resolve

    if args.sub_q != CELL_TOKENS or args.sub_k != CELL_TOKENS:
        return None
    B, H, gq, bk, Sk = args.B, args.H, args.num_query_blocks, args.block_size_k, args.seqlen_k
    # the attention call's arguments before the plan exists: the plan's shapes (on the meta
    # device: nothing allocated) are all the backend's choices read (quantizes_q, can_implement)
    shapes = Plan(torch.empty((B, H, gq, args.capacity), dtype=torch.int32, device="meta"),
                  torch.empty((B, H, gq), dtype=torch.int32, device="meta"), args.topk, bk, Sk)
    att = AttentionArgs(args.q, args.k, vc, out, layout, shapes, args.softmax_scale, "sage_fp8", False)
    lib, be = resolve(att, library)
    if be.plan_block_size_k(bk) != bk:
        return None
    try:
        lib.kernel(SAGE_QUANT_KERNEL, **QR.POOL_PARAMS)
    except LaunchError:  # an older library: the two-launch path
        return None
    with_q = not be.quantizes_q(lib, att)
    res = out
    if res is None:
        res = torch.empty_like(args.q if layout == "BSHD" else args.q.permute(0, 2, 1, 3),
                               memory_format=torch.contiguous_format)
    with torch.cuda.device(args.q.device):
        operands, idx, counts = QR.launch(args, vc, with_q=with_q, library=lib)[:3]
        att = dataclasses.replace(att, plan=Plan(idx, counts, args.topk, bk, Sk))
        # the routed plan is what the plan kernel would make of it (ids valid, distinct, ascending;
        # counts in range): it goes to the attention launch as the prepared plan
        be.run(lib, att, Plan(idx, counts, 0, bk, Sk), operands, att.canonical(res))
    return res


__all__ = ["attend_fused", "check_subblock_args", "geometry", "plan"]
