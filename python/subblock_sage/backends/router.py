"""The router's launches (``aot/kernels/router``; the method: ``router_spec.py``) on a checked call
(``ops/route.RouteArgs``: every argument and derived size checked before the first launch), on
the caller's current stream, nothing read back: the pooling (``router_pool``, or the Sage
quantizer's pooling variant, which writes the cells in its pass over Q and K), then
``router_select`` in one fused launch or a split score launch and a selection launch
(:func:`select_launches`).

Why here: every launch of a call is a backend's (the pipeline checks and orders, the backend
launches, ``abi`` packs): ``route``'s full path and a routed ``subblock_attention``
(``Backend.subblock``: these launches, then the attention's) reach the router's kernels only
through this module.
"""

from __future__ import annotations

from typing import Optional

from .. import abi
from ..contract import HEAD_DIM, Q_BLOCK, SAGE_QUANT_KERNEL, ceil_div
from ..errors import LaunchError
from ..plan import Plan
from ..router_spec import (LOG2E, PHASE_FUSED, PHASE_SCORES, PHASE_SELECT, POOL_KERNEL, RUNTIME_N_IMPLS,
                           SELECT_IMPLS, SELECT_KERNELS, SELECT_TILE_CELLS, num_cells, valid_cells)
from ..validation import cuda_device_index, sm_count
from .quantizer import POOL_PARAMS, quantize_canonical

SELECT_KERNEL = SELECT_KERNELS[SELECT_IMPLS[0]]  # the shipped score phase (mma)
ROUTER_KERNELS = (POOL_KERNEL, SELECT_KERNEL)  # what a library needs for route / subblock_attention


def dense_int32(dense_rows):
    """Checked ``dense_rows`` (or None) as ``router_select`` reads them: int32, the tensor itself
    when it is int32 already, else a converted copy on the current stream (a device operation
    outside the launches: ``calls.route`` makes it before recording, and again per replayed call)."""
    import torch

    if dense_rows is None or dense_rows.dtype == torch.int32:
        return dense_rows
    return dense_rows.to(torch.int32)


def router_library(index: int, library=None):
    """``library`` or the library of GPU ``index``, after checking that it has the router's kernels
    (:data:`ROUTER_KERNELS`): LaunchError with a Fix otherwise."""
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


def pooled_cells(args):
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


def select_library_for(impl: str, lib, select_library):
    """The library holding ``impl``'s select kernel: ``select_library`` or the call's; ``simt`` is
    compiled only into the sm_90a test library (router_spec.SELECT_KERNELS)."""
    slib = select_library or lib
    if impl == SELECT_IMPLS[0]:  # the shipped kernel: router_library has checked the call's library for it
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
# 0.410, split 2 / 4 / 8: 0.435 / 0.420 / 0.398 (level: the score phase's own time decides there).
# So: ~1000+ CTAs where the query tiles are fewer than 3 per SM.
FUSED_MIN_CTAS_PER_SM = 3
SPLIT_CTAS_PER_SM = 8


def select_launches(args, sms: int, k_splits: Optional[int] = None) -> tuple:
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


def launch_select(args, lib, pooled_q, pooled_k, impl: str = "mma", select_library=None,
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
    slib = select_library_for(impl, lib, select_library)
    if impl not in RUNTIME_N_IMPLS:  # simt
        abi.launch(SELECT_KERNELS[impl], {"n_q": args.n_q, "n_k": args.n_k}, values, library=slib)
    else:  # one export for every (n_q, n_k): check_route_args has checked both against ROUTER_N_VALUES
        values = {**values, "n_q": args.n_q, "n_k": args.n_k}
        for phase, splits in select_launches(args, sm_count(cuda_device_index(dev)), k_splits):
            abi.launch(SELECT_KERNELS[impl], {}, {**values, "phase": phase, "k_splits": splits}, library=slib)
    return idx, counts, scores


def launch(args, *, library=None, impl: str = "mma", select_library=None, k_splits=None,
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
    lib = router_library(index, library)
    if quantize is not None:
        check_pooling(lib)
    slib = select_library_for(impl, lib, select_library)  # refused before the first launch
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


def routed_plan(args, idx, counts) -> Plan:
    """The :class:`~subblock_sage.plan.Plan` of a checked call's routed ``index`` and ``counts``."""
    return Plan(idx, counts, args.topk, args.block_size_k, args.seqlen_k)


def launch_plan(args, library=None) -> Plan:
    """The launches of a checked call and its plan (``route``'s full path, the one ``calls.route``
    records)."""
    idx, counts = launch(args, library=library)[:2]
    return routed_plan(args, idx, counts)
