"""The real calls of the three entry points that replay (``sparse_attention``,
``subblock_attention``, ``route``), on real tensors: a plain eager call of the public functions in
``api.py``, or the real implementation of their ``torch.ops.subblock_sage`` operators in
``torch_ops.py``. A signature seen before replays the launches its first call made
(``replay.py``); any other call takes the full path, which validates once into the call's
description, serves it once and runs ``ops/pipeline.py`` (``route``: ``ops/route.py``'s
launches), recorded when it can be replayed.

Both entry points take the same route through the replay, so a repeated ``subblock_attention``
call costs what a repeated ``sparse_attention`` call costs on the host (``benchmark/host_stub.py``
times both): its key (every tensor's shape, strides, dtype, device and the scalars), one lookup,
the pointer-dependent checks (``out`` against the inputs) and one ``run_steps`` call. The full
path goes to the recorder as a ``functools.partial``, not a lambda: a lambda over the arguments
makes each of them a cell, created on every call (build machine, CPU stubs for the CUDA pieces:
8.3 -> 7.7 us per replayed call).
"""

from __future__ import annotations

import dataclasses
from functools import partial

from . import replay
from .backends import router as _BR
from .backends.router import dense_int32
from .ops import pipeline
from .ops import route as _R
from .ops.pipeline import attention_full
from .validation import check_out_inputs


def attention(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale, compute_mode, layout):
    """A ``sparse_attention`` call through the replay: a replay of its signature's recorded
    launches, or the full path recorded; None when the caller must take the full path itself (a
    signature that cannot be keyed or replayed, or a misaligned pointer: nothing was launched,
    the full path names it)."""
    got = replay.keyed(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k,
                       softmax_scale, compute_mode, layout)
    if got is None:
        return None
    key, ptrs = got
    hit = replay.lookup(key)
    if hit.__class__ is replay.Replay:
        if out is not None:
            check_out_inputs(out, {"q": q, "k": k, "v": v, "q2k_block_index": q2k_block_index,
                                   "block_counts": block_counts})
        return hit.launch(ptrs, out)
    if hit is None:
        return replay.record(key, (q, k, v, q2k_block_index, block_counts, out),
                             partial(attention_full, q, k, v, q2k_block_index, block_counts, out, topk, block_size_k,
                                     softmax_scale, compute_mode, layout))
    return None


def subblock(q, k, v, out, sparsity, compute_mode, n_q, n_k, softmax_scale, layout):
    """A ``subblock_attention`` call on real tensors: the replay of its signature's launches, or
    the full path (``pipeline.subblock_full``: validated once, served once, launched), recorded
    the first time."""
    got = replay.keyed_subblock(q, k, v, out, sparsity, compute_mode, n_q, n_k, softmax_scale, layout)
    if got is not None:
        key, ptrs = got
        hit = replay.lookup(key)
        if hit.__class__ is replay.Replay:
            if out is not None:
                check_out_inputs(out, {"q": q, "k": k, "v": v})
            res = hit.launch(ptrs, out)
            if res is not None:
                return res
        elif hit is None:
            return replay.record(key, (q, k, v, None, None, out), partial(
                pipeline.subblock_full, q, k, v, sparsity=sparsity, compute_mode=compute_mode, n_q=n_q, n_k=n_k,
                softmax_scale=softmax_scale, layout=layout, out=out))
    return pipeline.subblock_full(q, k, v, sparsity=sparsity, compute_mode=compute_mode, n_q=n_q, n_k=n_k,
                          softmax_scale=softmax_scale, layout=layout, out=out)


def route(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows, layout):
    """A plain eager ``route`` call (``api.route`` without ``library``, or the ``route`` operator's
    real implementation): the replay of its signature's launches (a
    :class:`~subblock_sage.plan.Plan`), or the full path (:func:`route_full`), recorded when it can
    be replayed (not when the signature cannot be keyed, nor after a misaligned pointer, which the
    full path names).

    ``dense_rows`` of another dtype than int32 (bool, the documented type) is converted to int32
    here, on the current stream, before the recording (the full path's conversion is a device
    operation outside its launches, which would make the signature unreplayable) and again per
    replayed call; the replay patches the converted tensor's pointer in."""
    got = replay.keyed_route(q, k, dense_rows, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity,
                             layout)
    if got is not None:
        key, ptrs = got
        hit = replay.lookup(key)
        if hit.__class__ is replay.PlanReplay:
            if dense_rows is None:
                res = hit.launch(ptrs)
            else:
                dense = dense_int32(dense_rows)  # referenced until the launches are enqueued
                res = hit.launch(ptrs if dense is dense_rows else (ptrs[0], ptrs[1], dense.data_ptr()) + ptrs[3:])
            if res is not None:
                return res
        elif hit is None:
            args = _R.check_route_args(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                                       block_size_k=block_size_k, budget_granularity=budget_granularity,
                                       dense_rows=dense_rows, layout=layout)
            dense = dense_int32(args.dense_rows)
            if dense is not args.dense_rows:
                args = dataclasses.replace(args, dense_rows=dense)
            return replay.record(key, (q, k, dense, None, None, None), partial(_BR.launch_plan, args))
    return route_full(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows, layout)


def route_full(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows, layout,
               library=None):
    """``route``'s full path on real tensors: every check once (``RouteArgs``), the launches and
    the :class:`~subblock_sage.plan.Plan` (``ops/route.py`` checks, ``backends/router.py`` launches)."""
    args = _R.check_route_args(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                               block_size_k=block_size_k, budget_granularity=budget_granularity,
                               dense_rows=dense_rows, layout=layout)
    return _BR.launch_plan(args, library)



__all__ = ["attention", "attention_full", "subblock", "route", "route_full"]
