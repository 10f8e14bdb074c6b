"""sm_100a / sm_100f backend: FlashInfer's SM100 blk64 bf16 class, AOT-built
(``aot/kernels/flashinfer_sm100.py``, docs/design/kernels-flashinfer.md).

Tensors go in as ``[B,H,S,128]`` views; the only copies are zero-padded K/V when Sk is not a
multiple of 64 (see :func:`sm100_bf16_launch`). The scheduler choice and the Int64 stride rule
are upstream's, restated here because the variant is chosen at run time.
"""

from __future__ import annotations

from typing import Any, Optional

from ..contract import BF16, HEAD_DIM, Q_BLOCK, ceil_div, family_kernels
from .base import Backend, Launch

FAMILY = "sm100"  # contract.Target.family of the targets served
KERNELS = family_kernels(FAMILY)  # compute mode -> kernel (contract.ATTENTION)

BLOCK = Q_BLOCK  # FlashInfer's sparse tiles: 64 query rows by 64 keys (128-key plans arrive as 64-key pairs)
# Upstream sm100_blk64_requires_int64_kv_strides: the rank-6 Int32 TMA coordinate basis is unsafe
# once a block or batch stride reaches 2**27 elements or any stride leaves int32.
_SM100_COORD_STRIDE_LIMIT = 1 << 27
_INT32_MAX = 2**31 - 1


def sm100_requires_int64_kv_strides(k, v) -> bool:
    """Upstream ``sm100_blk64_requires_int64_kv_strides`` on ``[B,H,Sk,D]`` views."""
    for t in (k, v):
        batch, heads, seqlen_k, _ = t.shape
        sb, sh, ss, sd = (int(s) for s in t.stride())
        nblk = ceil_div(seqlen_k, BLOCK)
        rank6_stride = (ss, sd, 64 * sd, sh, 64 * ss, sb)
        if any(s < 0 or s > _INT32_MAX for s in rank6_stride):
            return True
        if nblk > 1 and rank6_stride[4] >= _SM100_COORD_STRIDE_LIMIT:
            return True
        if batch > 1 and rank6_stride[5] >= _SM100_COORD_STRIDE_LIMIT:
            return True
    return False


def sm100_use_clc(B: int, H: int, Sq: int, topk: int, per_row_counts: bool) -> bool:
    """Upstream ``choose_sm100_blk64_use_clc`` (the scheduler heuristic)."""
    if per_row_counts:
        return True
    num_m_blocks = ceil_div(Sq, BLOCK)
    total_tiles = B * H * num_m_blocks
    if total_tiles >= 8192 and topk >= 256:
        return True
    if H == 1:
        return False
    enough_tiles = num_m_blocks >= 128 and total_tiles >= 512
    light_tile = topk <= (64 if H == 2 else 128)
    return enough_tiles and light_tile


def sm100_block_sizes(seqlen_k: int, device):
    """``[ceil(Sk/64)]`` int32: 64 everywhere but the partial last block (graph-capturable)."""
    import torch

    Gk = ceil_div(seqlen_k, BLOCK)
    bs = torch.full((Gk,), BLOCK, dtype=torch.int32, device=device)
    last = seqlen_k - (Gk - 1) * BLOCK
    if last != BLOCK:
        bs[Gk - 1 :].fill_(last)
    return bs


def _pad_keys(x, rows: int):
    import torch

    B, H, S, D = x.shape
    padded = torch.zeros((B, H, rows, D), dtype=x.dtype, device=x.device)
    padded[:, :, :S].copy_(x)
    return padded


def sm100_bf16_launch(q, k, v, plan, out_bhsd, out, *, softmax_scale: float = HEAD_DIM**-0.5,
                      lse: Optional[Any] = None, use_clc: Optional[bool] = None,
                      unaligned_keys: str = "pad") -> Launch:
    """``fi_sm100_bf16_fwd`` arguments; bf16 ``[B,H,S,128]`` views with a contiguous head dim and
    every other stride a multiple of 8 elements.

    Sk not a multiple of 64: the kernel's fast (Int32) K/V views read whole 64-key blocks and it
    masks keys only through ``block_sizes``. ``unaligned_keys="pad"`` copies K/V into zero-padded
    ``[B,H,round_up(Sk,64),128]`` buffers (the upstream-tested view); ``"int64"`` keeps them in place
    and selects the Int64 (bounds-checked rank-5 TMA) variant instead. Either way the last block's
    valid-token count goes in through ``block_sizes``.
    """
    import torch

    if unaligned_keys not in ("pad", "int64"):
        raise ValueError(f"unaligned_keys must be 'pad' or 'int64', got {unaligned_keys!r}")
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    Gk = ceil_div(Sk, BLOCK)
    if lse is None:
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    scratch: list = [lse]
    unaligned = Sk % BLOCK != 0
    if unaligned and unaligned_keys == "pad":
        k, v = _pad_keys(k, Gk * BLOCK), _pad_keys(v, Gk * BLOCK)
        scratch += [k, v]
    i64 = sm100_requires_int64_kv_strides(k, v) or (unaligned and unaligned_keys == "int64")
    rows = plan.counts is not None
    # Upstream forces block sizes with per-row counts; we also need them for a partial last block.
    has_bs = rows or unaligned
    clc = True if rows else (sm100_use_clc(B, H, Sq, plan.topk, False) if use_clc is None else use_clc)
    params = {"use_clc_scheduler": clc, "has_block_nums": rows, "allow_empty_block_nums": rows,
              "has_block_sizes": has_bs, "use_int64_kv_strides": i64}
    values: dict[str, Any] = {
        "q": q, "k": k, "v": v, "out": out_bhsd, "lse": lse,
        "softmax_scale": float(softmax_scale),
        "q2k_block_index": plan.index,
    }
    if has_bs:
        values["block_sizes"] = sm100_block_sizes(Sk, q.device)
        scratch.append(values["block_sizes"])
    values["block_sparse_num"] = int(plan.topk)
    if rows:
        values["block_counts"] = plan.counts
    return Launch(KERNELS[BF16.name], params, values, out, scratch=scratch).finish(plan)


class SM100Backend(Backend):
    """FlashInfer SM100 blk64 bf16 class (sm_100a / sm_100f library)."""

    target_family = FAMILY
    kernels = KERNELS

    def plan_block_size_k(self, block_size_k: int) -> int:
        return BLOCK  # 128-key plans are split into 64-key block pairs by the plan kernel

    def launch(self, args, plan, operands, out_c) -> Launch:
        q, k, v = (t.permute(0, 2, 1, 3) for t in (args.q, args.k, args.v))
        return sm100_bf16_launch(q, k, v, plan, out_c.permute(0, 2, 1, 3), out_c, softmax_scale=args.scale)


BACKEND = SM100Backend()
