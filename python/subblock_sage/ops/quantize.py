"""`quantize_sage`: bf16 Q/K/V -> the Sage operands (INT8 Q/K with scales, K smoothed by its
per-channel mean, FP8-E4M3 V with per-channel scale) in the layout of the SM120 Sage kernel.

Kernel: ``aot/kernels/sage_quant/`` (contract, layouts and sizes in its docstring). One launch
on the caller's stream, ``sage_quant_kv``: ticket-ordered CTAs that take the K mean's partial sums
over 512 strided keys, then Q tiles interleaved with one pass over K/V (each K unit smoothed and
quantized in its only read; each V unit likewise, with a per-channel scale bound from V's sample,
its amax a statistics row reduced per head by the CTA of the last unit; a head whose exact amax
exceeds the bound quantized again by redo tickets at the end), and,
given a plan, the plan role (what the ``plan_prepare`` kernel does), so that a Sage attention call
is two launches in all. The bf16 inputs are never copied (BHSD inputs go in as permuted views).
The launch itself, which the backends share: ``backends/quantizer.py``.
"""

from __future__ import annotations

from .. import deadline
from ..contract import SAGE_QUANT_KERNELS
from ..backends.quantizer import K_BLOCK, PLAN_PARAMS, Q_TILE, quantize_canonical
from ..validation import check_qkv

__all__ = ["K_BLOCK", "PLAN_PARAMS", "Q_TILE", "quantize_canonical", "quantize_sage", "self_test"]


def quantize_sage(q, k, v, layout: str = "BSHD") -> dict:
    """Quantize bf16 Q, K, V for Sage attention.

    Args:
        q: bf16 ``[B, Sq, H, 128]`` (``layout="BSHD"``) or ``[B, H, Sq, 128]`` (``"BHSD"``);
           strided views are accepted (head dim contiguous, other strides multiples of 8).
        k, v: bf16, same layout, ``Sk`` keys.
    Returns:
        dict with ``q_int8`` int8 ``[B,H,Sq,128]``, ``q_scale`` f32 ``[B,H,ceil(Sq/128)*4]``,
        ``k_int8`` int8 ``[B,H,Sk,128]`` (K minus ``k_mean``: the per-channel mean of 512 strided
        keys, all keys up to 512; softmax does not depend on it), ``k_scale`` f32
        ``[B,H,ceil(Sk/64)]``, ``v_fp8`` float8_e4m3fn ``[B,H,128,round_up(Sk,64)]`` (transposed,
        16-token row permutation, zero padding), ``v_scale`` f32 ``[B,H,128]``, ``k_mean`` f32
        ``[B,H,128]``.
    """
    qc, kc, vc = check_qkv(q, k, v, layout)
    return quantize_canonical(qc, kc, vc)


def self_test(device: int) -> str:
    """Small launch compared with the reference (used by `subblock-sage check`)."""
    import torch

    from ..reference import quantizer_verdict, reference_quantize_sage

    g = torch.Generator(device="cpu").manual_seed(1234)
    B, S, H = 1, 200, 2
    x = torch.randn(B, S, 3, H, 128, generator=g).to(torch.bfloat16).to(f"cuda:{device}")
    x[:, :, 1] += 3.0  # K bias: exercises the smoothing
    q, k, v = x[:, :, 0], x[:, :, 1], x[:, :, 2]
    got = quantize_sage(q, k, v)
    deadline.wait_stream(device, f"GPU {device} quantizer self-test")  # polls an event: never hangs (deadline.py)
    ref = reference_quantize_sage(q, k, v)
    return quantizer_verdict(got, ref)


self_test.supported = lambda lib: all(lib.has_kernel(k) for k in SAGE_QUANT_KERNELS)
