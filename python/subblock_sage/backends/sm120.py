"""sm_120a / sm_120f backend: FlashInfer's SM120 block-sparse classes (Sage INT8/FP8 and bf16),
AOT-built (``aot/kernels/flashinfer_sm120.py``, docs/design/kernels-flashinfer.md); the sm_90a
test library carries the same classes so that an H200 can check this marshalling numerically.

Tensors go in as permuted *views* in the kernels' mode order (FlashInfer's
``_prepare_sm120_sparse_metadata``: ``(B, H, Q, K) -> (K, Q, H, B)``), never copied. The plan
arrives prepared in 64-key blocks (the classes' block size; 128-key plans are split into block
pairs by the plan kernel), so the per-row-counts variants are the ones launched.
"""

from __future__ import annotations

from typing import Any, Optional

from ..contract import BF16, HEAD_DIM, MODES, Q_BLOCK, SAGE_FP8, family_kernels
from .base import Backend, Launch

FAMILY = "sm120"  # contract.Target.family of the targets served
KERNELS = family_kernels(FAMILY)  # compute mode -> kernel (contract.ATTENTION)

BLOCK = Q_BLOCK  # FlashInfer's sparse tiles: 64 query rows by 64 keys (128-key plans arrive as 64-key pairs)
Q_SCALE_ROWS = 32  # SM120 Sage: one Q scale per 32 rows, 4 per 128-row group


def last_contiguous(x):
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _block_sizes(block_sizes, B: int, H: int, Gk: int):
    """(mode, kernel view) of optional per-key-block valid-token counts (FlashInfer semantics;
    not reachable from the public API, which masks keys by Sk)."""
    import torch

    if block_sizes is None:
        return 0, None
    if block_sizes.dtype != torch.int32:
        raise TypeError(f"block_sizes must be int32, got {block_sizes.dtype}")
    shapes = {1: (Gk,), 2: (B, Gk), 3: (B, H, Gk)}
    mode = block_sizes.dim()
    if mode not in shapes or tuple(block_sizes.shape) != shapes[mode]:
        raise ValueError(
            f"block_sizes must have shape [{Gk}], [{B}, {Gk}] or [{B}, {H}, {Gk}], "
            f"got {tuple(block_sizes.shape)}"
        )
    return mode, last_contiguous(block_sizes).permute(*reversed(range(mode)))


def _plan_values(plan, block_sizes, B, H) -> tuple[dict, dict[str, Any]]:
    # (B, H, Q, K) -> (K, Q, H, B); counts (Q, H, B)
    values: dict[str, Any] = {"q2k_block_index": plan.index.permute(3, 2, 1, 0)}
    if plan.counts is not None:
        values["block_counts"] = plan.counts.permute(2, 1, 0)
    values["block_sparse_num"] = int(plan.topk)
    mode, bs = _block_sizes(block_sizes, B, H, plan.num_key_blocks)
    if bs is not None:
        values["block_sizes"] = bs
    return {"has_block_nums": plan.counts is not None, "block_sizes_mode": mode}, values


def sm120_sage_launch(q_int8, k_int8, v_fp8, q_scale, k_scale, v_scale, plan, out_bhsd, out, *,
                      softmax_scale: float = HEAD_DIM**-0.5, block_sizes=None) -> Launch:
    """``fi_sm120_sage_fwd`` arguments from the Sage quantizer's outputs.

    ``q_int8``/``k_int8``: ``[B,H,S,128]`` int8 views with a contiguous head dim (BHSD or BSHD
    memory); ``v_fp8``: HDS ``[B,H,128,round_up(Sk,64)]`` float8_e4m3fn; ``q_scale
    [B,H,ceil(Sq/128)*4]``, ``k_scale [B,H,ceil(Sk/64)]``, ``v_scale [B,H,128]`` float32;
    ``out_bhsd`` a bf16 ``[B,H,Sq,128]`` view of ``out``.
    """
    B, H = q_int8.shape[:2]
    params, pv = _plan_values(plan, block_sizes, B, H)
    values = {
        "q": q_int8.permute(2, 3, 1, 0),
        "k": k_int8.permute(2, 3, 1, 0),
        "v": v_fp8.permute(2, 3, 1, 0),
        "out": out_bhsd.permute(2, 3, 1, 0),
        "q_scale": last_contiguous(q_scale).permute(2, 1, 0),
        "k_scale": last_contiguous(k_scale).permute(2, 1, 0),
        "v_scale": last_contiguous(v_scale).permute(2, 1, 0),
        **pv,
        "softmax_scale": float(softmax_scale),
    }
    return Launch(KERNELS[SAGE_FP8.name], params, values, out).finish(plan)


def sm120_bf16_launch(q, k, v, plan, out_bhsd, out, *, softmax_scale: float = HEAD_DIM**-0.5,
                      block_sizes=None, lse: Optional[Any] = None) -> Launch:
    """``fi_sm120_bf16_fwd`` arguments; ``q``/``k``/``v``/``out_bhsd``: bf16 ``[B,H,S,128]`` views
    with a contiguous head dim. The kernel always writes a float32 LSE ``[B,H,Sq]`` (a scratch
    buffer when ``lse`` is omitted)."""
    import torch

    B, H, Sq, _ = q.shape
    if lse is None:
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    params, pv = _plan_values(plan, block_sizes, B, H)
    values = {
        "q": q.permute(2, 3, 1, 0),  # (Sq, D, H, B)
        "k": k.permute(2, 3, 1, 0),  # (Sk, D, H, B)
        "v": v.permute(3, 2, 1, 0),  # (D, Sk, H, B)
        "out": out_bhsd.permute(2, 3, 1, 0),
        "lse": lse.permute(2, 1, 0),  # (Sq, H, B)
        **pv,
        "softmax_scale": float(softmax_scale),
    }
    return Launch(KERNELS[BF16.name], params, values, out, scratch=[lse]).finish(plan)


class SM120Backend(Backend):
    """FlashInfer SM120 classes (sm_120a / sm_120f library, or the sm_90a test library)."""

    target_family = FAMILY
    kernels = KERNELS

    def plan_block_size_k(self, block_size_k: int) -> int:
        return BLOCK  # 128-key plans are split into 64-key block pairs by the plan kernel

    def launch(self, args, plan, operands, out_c) -> Launch:
        out_bhsd = out_c.permute(0, 2, 1, 3)
        if MODES[args.compute_mode].quantizes:
            z = operands
            L = sm120_sage_launch(z["q_int8"], z["k_int8"], z["v_fp8"], z["q_scale"], z["k_scale"],
                                  z["v_scale"], plan, out_bhsd, out_c, softmax_scale=args.scale)
            L.scratch.append(z)
            return L
        q, k, v = (t.permute(0, 2, 1, 3) for t in (args.q, args.k, args.v))
        return sm120_bf16_launch(q, k, v, plan, out_bhsd, out_c, softmax_scale=args.scale)


BACKEND = SM120Backend()
