"""Input validation shared by every public op: clear ValueError/TypeError before any launch.

Everything is normalised to *canonical* views: bf16 tensors as (B, S, H, 128) views of the
caller's memory (a BHSD tensor is passed as its permuted view, never copied).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEAD_DIM = 128
Q_BLOCK = 64  # query rows per routing block
LAYOUTS = ("BSHD", "BHSD")
COMPUTE_MODES = ("sage_fp8", "bf16")
BLOCK_SIZES_K = (64, 128)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def to_canonical(x, layout: str, name: str):
    """(B, S, H, 128) view of a BSHD or BHSD bf16 CUDA tensor, after checking it."""
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"{name} must be torch.bfloat16, got {x.dtype} (convert with .to(torch.bfloat16))")
    if x.dim() != 4:
        dims = "[B, S, H, 128]" if layout == "BSHD" else "[B, H, S, 128]"
        raise ValueError(f"{name} must be rank 4 {dims} for layout={layout!r}, got shape {tuple(x.shape)}")
    if x.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got {x.device} (move it with .cuda())")
    if x.shape[-1] != HEAD_DIM:
        raise ValueError(f"{name} must have head_dim {HEAD_DIM} (last dim), got {x.shape[-1]}")
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}); every extent must be >= 1")
    if x.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last (head) dim, got strides {tuple(x.stride())}; "
            f"pass .contiguous() or a view whose head dim has stride 1"
        )
    for mode, st in enumerate(x.stride()[:-1]):
        if st % 8 and x.shape[mode] > 1:
            raise ValueError(
                f"{name}: stride {st} of dim {mode} is not a multiple of 8 elements (16 bytes), "
                f"which the kernels' 16-byte loads need; pass .contiguous()"
            )
    if x.data_ptr() % 16:
        raise ValueError(f"{name}: data pointer is not 16-byte aligned; pass .clone()")
    return x if layout == "BSHD" else x.permute(0, 2, 1, 3)


def check_qkv(q, k, v, layout: str):
    """Canonical (B,S,H,128) views of q, k, v after checking they agree."""
    qc, kc, vc = (to_canonical(t, layout, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if kc.shape != vc.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if qc.shape[0] != kc.shape[0]:
        raise ValueError(f"q and k must have the same batch size, got {qc.shape[0]} and {kc.shape[0]}")
    if qc.shape[2] != kc.shape[2]:
        raise ValueError(
            f"q and k must have the same number of heads (MHA), got {qc.shape[2]} and {kc.shape[2]}"
        )
    return qc, kc, vc


@dataclass
class Plan:
    """A validated routing plan, in the form every backend consumes."""

    index: object  # int32 [B, H, Gq, capacity], contiguous
    counts: object  # int32 [B, H, Gq], contiguous, values in 0..capacity
    capacity: int
    block_size_k: int
    num_key_blocks: int  # ceil(Sk / block_size_k)


def check_plan(q2k_block_index, block_counts, topk, *, B, H, Sq, Sk, block_size_k, device,
               check_values: bool) -> Plan:
    import torch

    if block_size_k not in BLOCK_SIZES_K:
        raise ValueError(f"block_size_k must be one of {BLOCK_SIZES_K}, got {block_size_k!r}")
    gq = _ceil_div(Sq, Q_BLOCK)
    gk = _ceil_div(Sk, block_size_k)
    idx = q2k_block_index
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"q2k_block_index must be a torch.Tensor, got {type(idx).__name__}")
    if idx.dtype != torch.int32:
        raise TypeError(f"q2k_block_index must be torch.int32, got {idx.dtype}")
    if idx.dim() != 4 or tuple(idx.shape[:3]) != (B, H, gq):
        raise ValueError(
            f"q2k_block_index must have shape [B, H, ceil(Sq/64), capacity] = [{B}, {H}, {gq}, capacity], "
            f"got {tuple(idx.shape)}"
        )
    if idx.device != device:
        raise ValueError(f"q2k_block_index must be on {device}, got {idx.device}")
    capacity = idx.shape[3]
    if capacity < 1:
        raise ValueError("q2k_block_index has capacity 0; give at least one slot per row")
    idx = idx.contiguous()
    capturing = torch.cuda.is_current_stream_capturing()
    if block_counts is None:
        k_use = capacity if topk is None else topk
        if not isinstance(k_use, int) or isinstance(k_use, bool) or not 0 <= k_use <= capacity:
            raise ValueError(f"topk must be an int in 0..capacity ({capacity}), got {topk!r}")
        counts = torch.full((B, H, gq), k_use, dtype=torch.int32, device=device)
    else:
        if not isinstance(block_counts, torch.Tensor):
            raise TypeError(f"block_counts must be a torch.Tensor or None, got {type(block_counts).__name__}")
        if block_counts.dtype != torch.int32:
            raise TypeError(f"block_counts must be torch.int32, got {block_counts.dtype}")
        if tuple(block_counts.shape) != (B, H, gq):
            raise ValueError(
                f"block_counts must have shape [B, H, ceil(Sq/64)] = [{B}, {H}, {gq}], got {tuple(block_counts.shape)}"
            )
        if block_counts.device != device:
            raise ValueError(f"block_counts must be on {device}, got {block_counts.device}")
        counts = block_counts.contiguous()
        if not capturing:
            # One tiny reduction and a sync; skipped under CUDA-graph capture, where the kernels'
            # own clamping keeps out-of-range counts from reading past the index rows.
            lo, hi = int(counts.min()), int(counts.max())
            if lo < 0 or hi > capacity:
                raise ValueError(
                    f"block_counts values must be in 0..capacity ({capacity}), got min {lo} max {hi}"
                )
    if check_values and not capturing:
        cols = torch.arange(capacity, device=device, dtype=torch.int32)
        live = cols.view(1, 1, 1, -1) < counts.unsqueeze(-1)
        bad = live & ((idx < 0) | (idx >= gk))
        if bool(bad.any()):
            pos = tuple(int(i) for i in bad.nonzero()[0].tolist())
            raise ValueError(
                f"q2k_block_index{list(pos)} = {int(idx[pos])} is outside [0, {gk}) "
                f"(ceil(Sk/block_size_k) = ceil({Sk}/{block_size_k})); such entries are skipped "
                f"unless check_plan=True"
            )
    return Plan(idx, counts, capacity, block_size_k, gk)


def check_scale(softmax_scale) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(HEAD_DIM)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    return float(softmax_scale)


def check_out(out, q, name: str = "out"):
    import torch

    if out is None:
        return None
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype != torch.bfloat16 or out.shape != q.shape or out.device != q.device:
        raise ValueError(
            f"{name} must be bfloat16 with q's shape {tuple(q.shape)} on {q.device}, got "
            f"{out.dtype} {tuple(out.shape)} on {out.device}"
        )
    return out
