"""The ``torch.library`` custom operators of the attention entry points, and nothing else:

    torch.ops.subblock_sage.sparse_attention(q, k, v, q2k_block_index, block_counts, topk,
                                             block_size_k, softmax_scale, compute_mode, layout,
                                             check_plan) -> Tensor
    torch.ops.subblock_sage.sparse_attention_out(..., out) -> ()        (writes ``out``)
    torch.ops.subblock_sage.quantize_sage(q, k, v, layout) -> (q_int8, q_scale, k_int8, k_scale,
                                                                v_fp8, v_scale, k_mean)
    torch.ops.subblock_sage.subblock_attention(q, k, v, sparsity, compute_mode, n_q, n_k,
                                               softmax_scale, layout) -> Tensor
    torch.ops.subblock_sage.subblock_attention_out(..., out) -> ()      (writes ``out``)

(``route`` and ``quantize_and_route`` register theirs beside their steps: ``ops/route.py``,
``ops/quantize_route.py``.) Each has a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces a call as one opaque node, and a real one that launches
on the caller's current stream (so CUDA-graph capture records it; call ``preload`` or run once
eagerly before capturing). The real ones are the entry points' real calls (``calls.py``), replay
included: torch.compile without CUDA graphs calls them once per step, and a step's call replays
like an eager one. The public wrappers that call these operators while tracing are in ``api.py``.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import calls
from .contract import ceil_div

NAMESPACE = "subblock_sage"
QUANT_KEYS = ("q_int8", "q_scale", "k_int8", "k_scale", "v_fp8", "v_scale", "k_mean")


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


@torch.library.custom_op(f"{NAMESPACE}::sparse_attention", mutates_args=())
def _sparse_attention_op(q: Tensor, k: Tensor, v: Tensor, q2k_block_index: Tensor,
                         block_counts: Optional[Tensor], topk: Optional[int], block_size_k: int,
                         softmax_scale: float, compute_mode: str, layout: str,
                         check_plan: bool) -> Tensor:
    return _attention(q, k, v, q2k_block_index, block_counts, None, topk, block_size_k, softmax_scale,
                      compute_mode, layout, check_plan)


@_sparse_attention_op.register_fake
def _(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale, compute_mode,
      layout, check_plan):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{NAMESPACE}::sparse_attention_out", mutates_args=("out",))
def _sparse_attention_out_op(q: Tensor, k: Tensor, v: Tensor, q2k_block_index: Tensor,
                             block_counts: Optional[Tensor], topk: Optional[int], block_size_k: int,
                             softmax_scale: float, compute_mode: str, layout: str,
                             check_plan: bool, out: Tensor) -> None:
    _attention(q, k, v, q2k_block_index, block_counts, out, topk, block_size_k, softmax_scale, compute_mode, layout,
               check_plan)


@_sparse_attention_out_op.register_fake
def _(q, k, v, q2k_block_index, block_counts, topk, block_size_k, softmax_scale, compute_mode,
      layout, check_plan, out):
    return None


# ---------------------------------------------------------------------------------------------
# quantize_sage


@torch.library.custom_op(f"{NAMESPACE}::quantize_sage", mutates_args=())
def _quantize_sage_op(q: Tensor, k: Tensor, v: Tensor,
                      layout: str) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    from .ops.quantize import quantize_sage as impl

    res = impl(q, k, v, layout=layout)
    return tuple(res[key] for key in QUANT_KEYS)


@_quantize_sage_op.register_fake
def _(q, k, v, layout):
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


@torch.library.custom_op(f"{NAMESPACE}::subblock_attention", mutates_args=())
def _subblock_attention_op(q: Tensor, k: Tensor, v: Tensor, sparsity: float, compute_mode: str, n_q: int,
                           n_k: Optional[int], softmax_scale: float, layout: str) -> Tensor:
    return calls.subblock(q, k, v, None, sparsity, compute_mode, n_q, n_k, softmax_scale, layout)


@_subblock_attention_op.register_fake
def _(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{NAMESPACE}::subblock_attention_out", mutates_args=("out",))
def _subblock_attention_out_op(q: Tensor, k: Tensor, v: Tensor, sparsity: float, compute_mode: str, n_q: int,
                               n_k: Optional[int], softmax_scale: float, layout: str, out: Tensor) -> None:
    calls.subblock(q, k, v, out, sparsity, compute_mode, n_q, n_k, softmax_scale, layout)


@_subblock_attention_out_op.register_fake
def _(q, k, v, sparsity, compute_mode, n_q, n_k, softmax_scale, layout, out):
    return None
