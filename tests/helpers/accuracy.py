"""Accuracy checks of attention outputs, shared by the GPU tests and the CPU mutation tests.

Why not one number for the whole tensor: a relative L1 over the whole output (the old check,
< 0.06 for Sage whose correct error is ~0.037) lets one wrong 64-row query block out of ~100
through, and a swapped head or a wrong per-channel scale can hide the same way. So every check
here also bounds, separately:

* every (batch, head, 64-row query block): relative L1, and the gain ``<got, ref> / <ref, ref>``
  (a scale error moves the gain; random rounding noise does not, so the gain bound is tight);
* every (batch, head, channel): the gain (a wrong per-channel V scale shows up there);
* blocks whose reference is exactly zero (rows with no valid key block) must be exactly zero.

Why a second reference for Sage: against float64 attention on the bf16 inputs, Sage's own
quantization noise (INT8 Q/K, FP8 V, FP8 P) is ~0.037 relative L1, enough to hide a layout or
scale bug that costs a few percent. :func:`dequantized_reference` is exact attention on the
quantizer's own outputs mapped back to float (``subblock_sage.reference.dequantize_sage``): the
only error left is the kernel's FP8 rounding of P (and bf16 output rounding), so
:data:`DEQUANT_BOUNDS` is much tighter, and the gains are bounded at 1%.

The bounds were calibrated on CPU with :func:`emulate_sage` (the Sage numerics in float64 with P
rounded to FP8-E4M3 the way the kernels do; its whole-tensor error vs float64, 0.034-0.038, is
what the real kernel measures, 0.036-0.037) on the shapes and plans of tests/gpu/test_sm90_attention.py,
3 seeds each. Worst values seen, vs float64 / vs dequantized: whole relative L1 0.038 / 0.024,
block relative L1 0.043 / 0.032, block gain 0.011 / 0.009, channel gain 0.042 / 0.012 (the channel
gain vs float64 carries V's FP8 noise, shared by all rows: 0.77 with one key, so it is not bounded).
``tests/cpu/test_mutation.py`` shows that each bound rejects the faults it is for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

Q_BLOCK = 64


@dataclass(frozen=True)
class Bounds:
    """Limits of one comparison (relative L1 = sum|got - ref| / sum|ref|)."""

    rel_l1: float  # whole tensor
    cosine: float  # whole tensor (lower limit)
    block_rel_l1: float  # every (b, h, 64-row query block)
    block_gain: float  # |gain - 1| per (b, h, query block)
    channel_gain: float  # |gain - 1| per (b, h, channel)


# Against float64 attention on the (bf16) inputs of the call.
BOUNDS = {
    "bf16": Bounds(rel_l1=0.01, cosine=0.9999, block_rel_l1=0.02, block_gain=0.01, channel_gain=0.01),
    # channel gain: not bounded against float64 for Sage. FP8 V quantization noise is shared by
    # every row that reads the same keys, so with few keys (Sk = 129 with one key block left: one
    # key) a channel whose values are small next to its scale is off by tens of percent in a
    # correct kernel. Per-channel scale bugs are caught against the dequantized operands instead.
    "sage_fp8": Bounds(rel_l1=0.06, cosine=0.998, block_rel_l1=0.08, block_gain=0.03, channel_gain=math.inf),
}
# Sage against exact attention on its own dequantized operands (only P's FP8 rounding left).
DEQUANT_BOUNDS = Bounds(rel_l1=0.035, cosine=0.9995, block_rel_l1=0.05, block_gain=0.02, channel_gain=0.025)


def to_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BSHD":
        return x.permute(0, 2, 1, 3)
    if layout != "BHSD":
        raise ValueError(f"layout must be 'BSHD' or 'BHSD', got {layout!r}")
    return x


def from_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.permute(0, 2, 1, 3) if layout == "BSHD" else x


def attention_errors(got: torch.Tensor, ref: torch.Tensor, layout: str = "BSHD") -> dict:
    """Error statistics of ``got`` against ``ref`` (same shape and layout), in float64 on got's
    device: ``rel_l1``, ``cosine`` (whole tensor), ``block_rel_l1`` / ``block_gain``
    ``[B, H, ceil(Sq/64)]``, ``channel_gain`` ``[B, H, 128]``, ``zero_blocks`` (bool, the
    reference block is exactly zero) and ``finite``. A block whose reference is zero has relative
    error 0 if it is exactly zero too, else inf (and gain 1 / inf likewise)."""
    g = to_bhsd(got, layout).double()
    r = to_bhsd(ref, layout).to(g.device).double()
    if g.shape != r.shape:
        raise ValueError(f"shapes differ: got {tuple(g.shape)}, reference {tuple(r.shape)}")
    B, H, Sq, D = g.shape
    gq = -(-Sq // Q_BLOCK)
    pad = gq * Q_BLOCK - Sq
    gp = torch.nn.functional.pad(g, (0, 0, 0, pad)).view(B, H, gq, Q_BLOCK, D)
    rp = torch.nn.functional.pad(r, (0, 0, 0, pad)).view(B, H, gq, Q_BLOCK, D)
    diff = (gp - rp).abs().sum(dim=(3, 4))
    den = rp.abs().sum(dim=(3, 4))
    zero = den == 0
    inf = torch.full_like(diff, math.inf)
    block_rel = torch.where(zero, torch.where(diff > 0, inf, torch.zeros_like(diff)), diff / den.clamp_min(1e-300))
    rr = (rp * rp).sum(dim=(3, 4))
    block_gain = torch.where(zero, torch.where(diff > 0, inf, torch.ones_like(diff)),
                             (gp * rp).sum(dim=(3, 4)) / rr.clamp_min(1e-300))
    crr = (r * r).sum(dim=2)
    channel_gain = torch.where(crr == 0, torch.ones_like(crr), (g * r).sum(dim=2) / crr.clamp_min(1e-300))
    gf, rf = g.flatten(), r.flatten()
    rel = float((gf - rf).abs().sum() / rf.abs().sum().clamp_min(1e-300))
    cos = float(torch.nn.functional.cosine_similarity(gf, rf, dim=0)) if rf.abs().sum() > 0 else 1.0
    return {
        "rel_l1": rel,
        "cosine": cos,
        "block_rel_l1": block_rel,
        "block_gain": block_gain,
        "channel_gain": channel_gain,
        "zero_blocks": zero,
        "finite": bool(torch.isfinite(g).all()),
    }


def _worst(t: torch.Tensor, dev: bool) -> tuple[float, tuple]:
    """(worst value, its index) of t (of |t - 1| when dev)."""
    x = (t - 1).abs() if dev else t
    x = torch.nan_to_num(x, nan=math.inf)
    i = int(torch.argmax(x.flatten()))
    idx = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), t.shape))
    return float(t.flatten()[i]), idx


def problems(err: dict, bounds: Bounds) -> list[str]:
    """Every bound ``err`` (from :func:`attention_errors`) violates, with the worst location."""
    out = []
    if not err["finite"]:
        out.append("output has NaN/inf")
    if not err["rel_l1"] < bounds.rel_l1:
        out.append(f"whole-tensor relative L1 {err['rel_l1']:.4f} >= {bounds.rel_l1}")
    if not err["cosine"] > bounds.cosine:
        out.append(f"whole-tensor cosine {err['cosine']:.6f} <= {bounds.cosine}")
    v, at = _worst(err["block_rel_l1"], dev=False)
    if not v < bounds.block_rel_l1:
        what = "not exactly zero where the reference is" if math.isinf(v) else f"relative L1 {v:.4f}"
        out.append(f"query block (b, h, block) = {at}: {what} (bound {bounds.block_rel_l1})")
    v, at = _worst(err["block_gain"], dev=True)
    if not abs(v - 1) < bounds.block_gain:
        out.append(f"query block (b, h, block) = {at}: gain {v:.4f} (bound 1 +- {bounds.block_gain})")
    v, at = _worst(err["channel_gain"], dev=True)
    if not abs(v - 1) < bounds.channel_gain:
        out.append(f"channel (b, h, d) = {at}: gain {v:.4f} (bound 1 +- {bounds.channel_gain})")
    return out


def check_attention(got, ref, bounds, layout: str = "BSHD", what: str = "") -> dict:
    """Assert ``got`` is within ``bounds`` (a :class:`Bounds` or a compute mode name) of ``ref``
    on the whole tensor, every query block, every head and every channel; returns the errors."""
    if isinstance(bounds, str):
        bounds = BOUNDS[bounds]
    err = attention_errors(got, ref, layout)
    bad = problems(err, bounds)
    assert not bad, f"{what or 'attention'}: " + "; ".join(bad)
    return err


def dequantized_reference(quant: dict, q2k_block_index, block_counts=None, *, topk=None,
                          block_size_k: int = 64, softmax_scale=None, layout: str = "BSHD",
                          seqlen_k: int | None = None) -> torch.Tensor:
    """Exact (float64) block-sparse attention on the Sage quantizer's own outputs mapped back to
    float: Q and the *smoothed* K (the kernel's Q·Kᵀ is on K minus its mean; softmax does not see
    the difference) and V. Returned in ``layout``."""
    from subblock_sage.reference import dequantize_sage, reference_sparse_attention

    dq = dequantize_sage(quant, seqlen_k)
    out = reference_sparse_attention(dq["q"], dq["k_centered"], dq["v"], q2k_block_index, block_counts,
                                     topk=topk, block_size_k=block_size_k, softmax_scale=softmax_scale,
                                     layout="BHSD")
    return from_bhsd(out, layout)


def check_sage(got, q, k, v, quant, q2k_block_index, block_counts=None, *, topk=None,
               block_size_k: int = 64, softmax_scale=None, layout: str = "BSHD", what: str = "") -> None:
    """The two Sage checks: against float64 attention on q, k, v (:data:`BOUNDS` ``sage_fp8``)
    and against exact attention on ``quant``'s dequantized operands (:data:`DEQUANT_BOUNDS`)."""
    from subblock_sage.reference import reference_sparse_attention

    ref = reference_sparse_attention(q, k, v, q2k_block_index, block_counts, topk=topk,
                                     block_size_k=block_size_k, softmax_scale=softmax_scale, layout=layout)
    check_attention(got, ref, "sage_fp8", layout, what=f"{what} vs float64 on the inputs")
    dref = dequantized_reference(quant, q2k_block_index, block_counts, topk=topk, block_size_k=block_size_k,
                                 softmax_scale=softmax_scale, layout=layout)
    check_attention(got, dref, DEQUANT_BOUNDS, layout, what=f"{what} vs exact on the dequantized operands")


# ---------------------------------------------------------------------------------------------
# A CPU stand-in for the Sage kernel (calibration and the mutation tests)


def fp8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to FP8-E4M3 (nearest even, saturating at 448) and back to x's dtype."""
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(x.dtype)


def emulate_sage(quant: dict, q2k_block_index, block_counts=None, *, topk=None, block_size_k: int = 64,
                 softmax_scale=None, layout: str = "BSHD") -> torch.Tensor:
    """What a correct Sage kernel computes from ``quant``, in float64 on CPU: S = Q·Kᵀ on the
    dequantized INT8 operands, P = exp(S - rowmax) scaled by 448 and rounded to FP8-E4M3, O =
    P·V (FP8 codes) times the V scale over the row sum of P; rows with no valid block are zero;
    output rounded to bf16. (The kernels use a running max per key tile, so their rounding points
    differ; the statistics of the error are the same.)"""
    from subblock_sage.reference import dequantize_sage

    dq = dequantize_sage({n: t.cpu() for n, t in quant.items()})
    qd, kd = dq["q"].double(), dq["k_centered"].double()
    v8 = quant["v_fp8"].cpu().float()
    B, H, Sq, D = qd.shape
    Sk = kd.shape[2]
    from subblock_sage.reference import SAGE_PERM16

    perm = torch.tensor(SAGE_PERM16)
    vcodes = v8.transpose(2, 3).reshape(B, H, -1, 16, D)[:, :, :, perm].reshape(B, H, -1, D)[:, :, :Sk].double()
    mask = plan_mask(q2k_block_index.cpu(), None if block_counts is None else block_counts.cpu(), topk=topk,
                     Sq=Sq, Sk=Sk, block_size_k=block_size_k)
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    s = (qd @ kd.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, -math.inf)
    any_key = mask.any(dim=-1, keepdim=True)
    m = torch.where(any_key, s.amax(dim=-1, keepdim=True), torch.zeros_like(s[..., :1]))
    p = torch.where(mask, torch.exp(s - m), torch.zeros_like(s))
    p8 = fp8_e4m3(p * 448.0)
    o = (p8 @ vcodes) * quant["v_scale"].cpu().double()[:, :, None, :]
    o = torch.where(any_key, o / (p.sum(dim=-1, keepdim=True) * 448.0).clamp_min(1e-300), torch.zeros_like(o))
    return from_bhsd(o.to(torch.bfloat16).double(), layout)


def plan_mask(q2k_block_index, block_counts=None, *, topk=None, Sq: int, Sk: int, block_size_k: int = 64):
    """bool [B, H, Sq, Sk]: which keys each query row attends to under the plan contract
    (first ``count`` entries of a row; ids outside [0, ceil(Sk/bk)) skipped; keys past Sk never).
    Written independently of ``subblock_sage.reference`` (plain loops over the plan rows)."""
    idx = q2k_block_index.long()
    B, H, gq, cap = idx.shape
    gk = -(-Sk // block_size_k)
    mask = torch.zeros(B, H, gq * Q_BLOCK, Sk, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for i in range(gq):
                n = (cap if topk is None else topk) if block_counts is None else int(block_counts[b, h, i])
                for j in idx[b, h, i, :max(0, min(n, cap))].tolist():
                    if 0 <= j < gk:
                        mask[b, h, i * Q_BLOCK:(i + 1) * Q_BLOCK, j * block_size_k:(j + 1) * block_size_k] = True
    return mask[:, :, :Sq]
