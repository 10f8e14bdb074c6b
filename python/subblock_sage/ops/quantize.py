"""`quantize_sage`: bf16 Q/K/V -> the Sage operands (INT8 Q/K with scales, K smoothed by its
per-channel mean, FP8-E4M3 V with per-channel scale) in the layout of the SM120 Sage kernel.

Kernels: ``aot/kernels/sage_quant.py`` (contract and layouts in its docstring). Four launches on
the caller's stream: Q; K/V statistics (partial sums / amax per 512 keys); their reduction;
K/V quantization. The bf16 inputs are never copied (BHSD inputs go in as permuted views).
"""

from __future__ import annotations

from .. import abi, deadline
from ..contract import SAGE_QUANT_KERNELS, ceil_div
from ..validation import check_qkv, cuda_device_index

STATS_CHUNK = 512
Q_TILE = 128
K_BLOCK = 64


def quantize_sage(q, k, v, layout: str = "BSHD") -> dict:
    """Quantize bf16 Q, K, V for Sage attention.

    Args:
        q: bf16 ``[B, Sq, H, 128]`` (``layout="BSHD"``) or ``[B, H, Sq, 128]`` (``"BHSD"``);
           strided views are accepted (head dim contiguous, other strides multiples of 8).
        k, v: bf16, same layout, ``Sk`` keys.
    Returns:
        dict with ``q_int8`` int8 ``[B,H,Sq,128]``, ``q_scale`` f32 ``[B,H,ceil(Sq/128)*4]``,
        ``k_int8`` int8 ``[B,H,Sk,128]`` (K minus its per-channel mean), ``k_scale`` f32
        ``[B,H,ceil(Sk/64)]``, ``v_fp8`` float8_e4m3fn ``[B,H,128,round_up(Sk,64)]`` (transposed,
        16-token row permutation, zero padding), ``v_scale`` f32 ``[B,H,128]``, ``k_mean`` f32
        ``[B,H,128]``.
    """
    qc, kc, vc = check_qkv(q, k, v, layout)
    return quantize_canonical(qc, kc, vc)


def quantize_canonical(qc, kc, vc) -> dict:
    """quantize_sage on already validated canonical (B, S, H, 128) views (the attention
    backends call this: their inputs were checked once by sparse_attention)."""
    import torch

    B, Sq, H, D = qc.shape
    Sk = kc.shape[1]
    dev = qc.device
    f32 = dict(dtype=torch.float32, device=dev)
    nbk = ceil_div(Sk, K_BLOCK)
    chunks = ceil_div(Sk, STATS_CHUNK)
    res = {
        "q_int8": torch.empty(B, H, Sq, D, dtype=torch.int8, device=dev),
        "q_scale": torch.empty(B, H, ceil_div(Sq, Q_TILE) * 4, **f32),
        "k_int8": torch.empty(B, H, Sk, D, dtype=torch.int8, device=dev),
        "k_scale": torch.empty(B, H, nbk, **f32),
        "v_fp8": torch.empty(B, H, D, nbk * K_BLOCK, dtype=torch.float8_e4m3fn, device=dev),
        "v_scale": torch.empty(B, H, D, **f32),
        "k_mean": torch.empty(B, H, D, **f32),
    }
    k_part = torch.empty(B, H, chunks, D, **f32)
    v_part = torch.empty(B, H, chunks, D, **f32)
    canon = lambda t: t.permute(0, 2, 1, 3)  # noqa: E731  (B,H,S,D) storage as (B,S,H,D) view
    index = cuda_device_index(dev)
    with torch.cuda.device(dev):
        abi.launch("sage_quant_q", {},
                       {"q": qc, "q_int8": canon(res["q_int8"]), "q_scale": res["q_scale"]}, device=index)
        abi.launch("sage_quant_kv_stats", {},
                       {"k": kc, "v": vc, "k_part": k_part, "v_part": v_part}, device=index)
        abi.launch("sage_quant_kv_finalize", {},
                       {"k_part": k_part, "v_part": v_part, "k_mean": res["k_mean"],
                        "v_scale": res["v_scale"], "seqlen_k": Sk}, device=index)
        abi.launch("sage_quant_kv", {},
                       {"k": kc, "v": vc, "k_mean": res["k_mean"], "v_scale": res["v_scale"],
                        "k_int8": canon(res["k_int8"]), "k_scale": res["k_scale"],
                        "v_fp8": res["v_fp8"]}, device=index)
    return res


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
