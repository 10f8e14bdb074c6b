"""Bad-input cases shared by tests/cpu/test_bad_input.py (meta / CPU tensors) and
tests/gpu/test_bad_input_gpu.py (the same cases on CUDA tensors): (builder, exception, message)."""

from __future__ import annotations

import math

import torch

BF16, I32 = torch.bfloat16, torch.int32
META = "meta"


def t(*shape, dtype=BF16, device=META):
    return torch.empty(*shape, dtype=dtype, device=device)


def qkv(B=1, Sq=200, Sk=300, H=2, D=128, device=META, layout="BSHD"):
    if layout == "BSHD":
        return t(B, Sq, H, D, device=device), t(B, Sk, H, D, device=device), t(B, Sk, H, D, device=device)
    return t(B, H, Sq, D, device=device), t(B, H, Sk, D, device=device), t(B, H, Sk, D, device=device)


def plan(B=1, H=2, Sq=200, cap=3, device=META, counts=True):
    gq = -(-Sq // 64)
    idx = torch.zeros(B, H, gq, cap, dtype=I32, device=device)
    cnt = torch.ones(B, H, gq, dtype=I32, device=device) if counts else None
    return idx, cnt


# ---------------------------------------------------------------------------------------------
# sparse_attention: one case per mistake. (kwargs builder, exception, message fragment)


def _case(**over):
    q, k, v = qkv()
    idx, cnt = plan()
    args = dict(q=q, k=k, v=v, idx=idx, cnt=cnt)
    args.update(over)
    return args


ATTN_CASES = {
    # dtype
    "q_fp16": (lambda: _case(q=t(1, 200, 2, 128, dtype=torch.float16)), TypeError, "q must be torch.bfloat16"),
    "k_fp32": (lambda: _case(k=t(1, 300, 2, 128, dtype=torch.float32)), TypeError, "k must be torch.bfloat16"),
    "v_int8": (lambda: _case(v=t(1, 300, 2, 128, dtype=torch.int8)), TypeError, "v must be torch.bfloat16"),
    "v_fp8": (lambda: _case(v=t(1, 300, 2, 128, dtype=torch.float8_e4m3fn)), TypeError, "v must be torch.bfloat16"),
    "q_not_tensor": (lambda: _case(q=[[1.0]]), TypeError, "q must be a torch.Tensor"),
    "idx_int64": (lambda: _case(idx=torch.zeros(1, 2, 4, 3, dtype=torch.int64, device=META)), TypeError, "int32"),
    "idx_not_tensor": (lambda: _case(idx=[[0]]), TypeError, "q2k_block_index must be a torch.Tensor"),
    "counts_int64": (lambda: _case(cnt=torch.ones(1, 2, 4, dtype=torch.int64, device=META)), TypeError, "block_counts must be torch.int32"),
    "counts_not_tensor": (lambda: _case(cnt=3), TypeError, "block_counts must be a torch.Tensor"),
    # rank
    "q_rank3": (lambda: _case(q=t(200, 2, 128)), ValueError, "rank 4"),
    "k_rank5": (lambda: _case(k=t(1, 1, 300, 2, 128)), ValueError, "rank 4"),
    "idx_rank3": (lambda: _case(idx=torch.zeros(1, 2, 4, dtype=I32, device=META)), ValueError, "q2k_block_index must have shape"),
    # head_dim
    "head_dim_64": (lambda: _case(**dict(zip(("q", "k", "v"), qkv(D=64)))), ValueError, "head_dim 128"),
    "head_dim_256": (lambda: _case(**dict(zip(("q", "k", "v"), qkv(D=256)))), ValueError, "head_dim 128"),
    "v_head_dim_64": (lambda: _case(v=t(1, 300, 2, 64)), ValueError, "head_dim 128"),
    # shapes that disagree
    "kv_len_differ": (lambda: _case(v=t(1, 301, 2, 128)), ValueError, "k and v must have the same shape"),
    "kv_heads_differ": (lambda: _case(v=t(1, 300, 3, 128)), ValueError, "k and v must have the same shape"),
    "batch_differ": (lambda: _case(k=t(2, 300, 2, 128), v=t(2, 300, 2, 128)), ValueError, "same batch size"),
    "heads_differ_gqa": (lambda: _case(k=t(1, 300, 1, 128), v=t(1, 300, 1, 128)), ValueError, "same number of heads"),
    "idx_wrong_gq": (lambda: _case(idx=torch.zeros(1, 2, 3, 3, dtype=I32, device=META)), ValueError, r"ceil\(Sq/64\)"),
    "idx_wrong_heads": (lambda: _case(idx=torch.zeros(1, 3, 4, 3, dtype=I32, device=META)), ValueError, "q2k_block_index must have shape"),
    "idx_capacity_0": (lambda: _case(idx=torch.zeros(1, 2, 4, 0, dtype=I32, device=META)), ValueError, "capacity 0"),
    "counts_wrong_shape": (lambda: _case(cnt=torch.ones(1, 2, 5, dtype=I32, device=META)), ValueError, "block_counts must have shape"),
    "counts_rank4": (lambda: _case(cnt=torch.ones(1, 2, 4, 1, dtype=I32, device=META)), ValueError, "block_counts must have shape"),
    # empty
    "q_empty_seq": (lambda: _case(q=t(1, 0, 2, 128)), ValueError, "empty"),
    "kv_empty_seq": (lambda: _case(k=t(1, 0, 2, 128), v=t(1, 0, 2, 128)), ValueError, "empty"),
    "batch_0": (lambda: _case(**dict(zip(("q", "k", "v"), qkv(B=0)))), ValueError, "empty"),
    "heads_0": (lambda: _case(**dict(zip(("q", "k", "v"), qkv(H=0)))), ValueError, "empty"),
    # strides
    "q_head_dim_strided": (lambda: _case(q=t(1, 200, 128, 2).transpose(2, 3)), ValueError, "contiguous in its last"),
    "k_every_other_elem": (lambda: _case(k=t(1, 300, 2, 256)[..., ::2]), ValueError, "contiguous in its last"),
    "q_row_stride_not_x8": (lambda: _case(q=t(1, 200, 2, 130)[..., :128]), ValueError, "multiple of 8"),
    "v_seq_stride_odd": (lambda: _case(v=t(1, 300, 2 * 128 + 4)[..., :256].unflatten(-1, (2, 128))), ValueError, "multiple of 8"),
    # int32 extents
    "seq_over_int32": (lambda: _case(**dict(zip(("q", "k", "v"), qkv(Sq=2**31, Sk=2**31, H=1)))), ValueError, "does not fit int32"),
}


SCALAR_CASES = {
    "scale_nan": (dict(softmax_scale=float("nan")), ValueError, "finite"),
    "scale_inf": (dict(softmax_scale=float("inf")), ValueError, "finite"),
    "scale_neg_inf": (dict(softmax_scale=-math.inf), ValueError, "finite"),
    "scale_negative": (dict(softmax_scale=-0.1), ValueError, "> 0"),
    "scale_zero": (dict(softmax_scale=0.0), ValueError, "> 0"),
    "scale_str": (dict(softmax_scale="0.1"), TypeError, "softmax_scale must be a float"),
    "scale_bool": (dict(softmax_scale=True), TypeError, "softmax_scale must be a float"),
    "scale_tensor": (dict(softmax_scale=torch.tensor(0.1)), TypeError, "softmax_scale must be a float"),
    "layout_bad": (dict(layout="BHDS"), ValueError, "layout must be one of"),
    "layout_lower": (dict(layout="bshd"), ValueError, "layout must be one of"),
    "mode_bad": (dict(compute_mode="fp8"), ValueError, "compute_mode must be one of"),
    "mode_none": (dict(compute_mode=None), ValueError, "compute_mode must be one of"),
    "block_size_32": (dict(block_size_k=32), ValueError, "block_size_k must be one of"),
    "block_size_256": (dict(block_size_k=256), ValueError, "block_size_k must be one of"),
    "block_size_true": (dict(block_size_k=True), ValueError, "block_size_k must be one of"),
}

QUANT_CASES = {k: ATTN_CASES[k] for k in ATTN_CASES if not k.startswith(("idx", "counts"))}
