"""The ``torch.library`` custom operators of the public entry points, and nothing else:

    torch.ops.subblock_sage.sparse_attention(q, k, v, q2k_block_index, block_counts, topk,
                                             block_size_k, softmax_scale, compute_mode, layout,
                                             check_plan) -> Tensor
    torch.ops.subblock_sage.sparse_attention_out(..., out) -> ()        (writes ``out``)
    torch.ops.subblock_sage.quantize_sage(q, k, v, layout) -> (q_int8, q_scale, k_int8, k_scale,
                                                                v_fp8, v_scale, k_mean)
    torch.ops.subblock_sage.subblock_attention(q, k, v, sparsity, compute_mode, n_q, n_k,
                                               softmax_scale, layout) -> Tensor
    torch.ops.subblock_sage.subblock_attention_out(..., out) -> ()      (writes ``out``)
    torch.ops.subblock_sage.route(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k,
                                  budget_granularity, dense_rows, layout) -> (index, counts)

(``quantize_and_route``, which has no public wrapper above ``ops``, registers its own beside its
steps in ``ops/quantize_route.py``; all through ``oplib.define``, which says why not
``custom_op``.) Each
has a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces a call as one opaque node, and a real one that launches
on the caller's current stream (so CUDA-graph capture records it; call ``preload`` or run once
eagerly before capturing). The real ones are the entry points' real calls (``calls.py``), replay
included: torch.compile without CUDA graphs calls them once per step, and a step's call replays
like an eager one. The public wrappers that call these operators while tracing are in ``api.py``.
"""

import torch

from . import calls
from .contract import ceil_div
from .ops.route import check_route_args
from .oplib import NAMESPACE, define

QUANT_KEYS = ("q_int8", "q_scale", "k_int8", "k_scale", "v_fp8", "v_scale", "k_mean")

_ATTENTION_ARGS = ("Tensor q, Tensor k, Tensor v, Tensor q2k_block_index, Tensor? block_counts, int? topk, "
                   "int block_size_k, float softmax_scale, str compute_mode, str layout, bool check_plan")
_SUBBLOCK_ARGS = ("Tensor q, Tensor k, Tensor v, float sparsity, str compute_mode, int n_q, int? n_k, "
                  "float softmax_scale, str layout")


# ---------------------------------------------------------------------------------------------
# sparse_attention


def _attention(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale, compute_mode, layout,
               check_plan):
    res = None if check_plan else calls.attention(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k,
                                                  softmax_scale, compute_mode, layout)
    if res is None:
        res = calls.attention_full(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale,
                                   compute_mode, layout, check_plan)
    return res


def _sparse_attention(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale, compute_mode,
                      layout, check_plan):
    return _attention(q, k, v, q2k_block_index, block_counts, None, topk, block_size_k, softmax_scale,
                      compute_mode, layout, check_plan)


def _sparse_attention_fake(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale, compute_mode,
                           layout, check_plan):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _sparse_attention_out(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale, compute_mode,
                          layout, check_plan, out):
    _attention(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale, compute_mode, layout,
               check_plan)


def _none_fake(*args):
    return None


# ---------------------------------------------------------------------------------------------
# quantize_sage


def _quantize_sage(q, k, v, layout):
    from .ops.quantize import quantize_sage as impl

    res = impl(q, k, v, layout=layout)
    return tuple(res[key] for key in QUANT_KEYS)


def _quantize_sage_fake(q, k, v, layout):
    qc = q if layout == "BSHD" else q.permute(0, 2, 1, 3)
    kc = k if layout == "BSHD" else k.permute(0, 2, 1, 3)
    B, Sq, H, D = qc.shape
    Sk = kc.shape[1]
    nbk = ceil_div(Sk, 64)
    f32 = dict(dtype=torch.float32, device=q.device)
    return (
        q.new_empty((B, H, Sq, D), dtype=torch.int8),
        q.new_empty((B, H, ceil_div(Sq, 128) * 4), **f32),
        q.new_empty((B, H, Sk, D), dtype=torch.int8),
        q.new_empty((B, H, nbk), **f32),
        q.new_empty((B, H, D, nbk * 64), dtype=torch.float8_e4m3fn),
        q.new_empty((B, H, D), **f32),
        q.new_empty((B, H, D), **f32),
    )


# ---------------------------------------------------------------------------------------------
# subblock_attention


def _subblock_attention(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout):
    return calls.subblock(q, k, v, None, sparsity, compute_mode, n_q, n_k, softmax_scale, layout)


def _subblock_attention_fake(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _subblock_attention_out(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out):
    calls.subblock(q, k, v, out, sparsity, compute_mode, n_q, n_k, softmax_scale, layout)


# ---------------------------------------------------------------------------------------------
# route


def _route(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows, layout):
    plan = calls.route(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows, layout)
    return plan.index, plan.counts


def _route_fake(q, k, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, dense_rows, layout):
    args = check_route_args(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=n_q, n_k=n_k,
                            block_size_k=block_size_k, budget_granularity=budget_granularity,
                            dense_rows=dense_rows, layout=layout, runtime=False)
    gq = args.num_query_blocks
    idx = q.new_empty((args.B, args.H, gq, args.capacity), dtype=torch.int32)
    return idx, q.new_empty((args.B, args.H, gq), dtype=torch.int32)


define("sparse_attention", f"({_ATTENTION_ARGS}) -> Tensor", _sparse_attention, _sparse_attention_fake)
define("sparse_attention_out", f"({_ATTENTION_ARGS}, Tensor(a!) out) -> ()", _sparse_attention_out, _none_fake)
define("quantize_sage", "(Tensor q, Tensor k, Tensor v, str layout) -> "
       "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", _quantize_sage, _quantize_sage_fake)
define("subblock_attention", f"({_SUBBLOCK_ARGS}) -> Tensor", _subblock_attention, _subblock_attention_fake)
define("subblock_attention_out", f"({_SUBBLOCK_ARGS}, Tensor(a!) out) -> ()", _subblock_attention_out,
       _none_fake)
define("route", "(Tensor q, Tensor k, float sparsity, float softmax_scale, int n_q, int n_k, int block_size_k, "
       "int budget_granularity, Tensor? dense_rows, str layout) -> (Tensor, Tensor)", _route, _route_fake)

__all__ = ["NAMESPACE", "QUANT_KEYS"]
