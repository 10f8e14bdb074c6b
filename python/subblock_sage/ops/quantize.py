"""`quantize_sage`: bf16 Q/K/V -> the Sage operands (INT8 Q/K with scales, K smoothed by its
per-channel mean, FP8-E4M3 V with per-channel scale) in the layout of the SM120 Sage kernel.

Kernels: ``aot/kernels/sage_quant.py`` (contract, layouts and sizes in its docstring). Two launches
on the caller's stream: ``sage_quant_prep`` (K/V statistics partials + Q; optionally the plan
role, which does what the ``plan_prepare`` kernel does, so that a Sage attention call needs three
launches in all) and ``sage_quant_kv`` (reduces the partials, then quantizes K and V). The bf16
inputs are never copied (BHSD inputs go in as permuted views). Every temporary is a
``torch.empty`` (launch 1 writes each workspace row that launch 2 reads) and no torch compute op
runs, so a call is exactly its two launches.
"""

from __future__ import annotations

from .. import abi, deadline
from ..contract import SAGE_PREP_KERNEL, SAGE_QUANT_KERNELS, SAGE_STATS_CHUNK, ceil_div
from ..validation import check_qkv, cuda_device_index

Q_TILE = 128  # q_scale holds 4 groups (of 32 rows) per 128 query rows
K_BLOCK = 64
# sage_quant_kv: 64-key blocks per CTA. Every KV CTA re-reads all ceil(Sk/2048) partial rows of its
# (b, h) (1 KiB each, from L2) before quantizing bpc blocks (32 KiB of K/V each). Two blocks per CTA
# measured fastest once there is work for more than ~4096 CTAs, one below that (H200,
# benchmark/quant_sweep.py, runs 16 and 19, outputs bit-identical for every setting): at B=1 H=14
# S=37760 the quantizer took 0.327 / 0.289 / 0.264 / 0.246 / 0.255 ms with 16 / 5 / 3 / 2 / 1 blocks
# per CTA, at H=14 S=75776 0.640 / 0.570 / 0.534 / 0.515 / 0.520 with 16 / 5 / 3 / 2 / 1; flat at
# H=2 S=37760 and H=4 S=8192.
KV_TARGET_CTAS = 4096
KV_MAX_BLOCKS_PER_CTA = 2
PLAN_PARAMS = {True: "counts", False: "topk"}  # sage_quant_prep's "plan" parameter, by counts given


def kv_blocks_per_cta(B: int, H: int, num_blocks: int) -> int:
    """64-key blocks each ``sage_quant_kv`` CTA quantizes (a function of the shape only, so a
    recorded launch replays with the same grid)."""
    return max(1, min(KV_MAX_BLOCKS_PER_CTA, ceil_div(B * H * num_blocks, KV_TARGET_CTAS)))


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


def quantize_canonical(qc, kc, vc, plan_values=None, plan_counts=None) -> dict:
    """quantize_sage on already validated canonical (B, S, H, 128) views (the attention
    backends call this: their inputs were checked once by sparse_attention).

    ``plan_values``: the values the ``plan_prepare`` launch takes (``plan.prepare_plan``:
    ``q2k_block_index``, ``block_counts`` or ``topk``, ``out_index``, ``out_counts``, ``summary``
    (zeroed by the caller when it is read), ``num_key_blocks``, ``split``, ``num_out_blocks``); its
    B and H must be q's. Given, launch 1 also prepares the plan (the plan role of
    ``sage_quant_prep``, the same contract as ``plan_prepare``) and the plan kernel must not be
    launched. ``plan_counts``: whether ``block_counts`` is given (default: read off the dict).
    The quantizer outputs are the same with and without a plan.
    """
    import torch

    B, Sq, H, D = qc.shape
    Sk = kc.shape[1]
    dev = qc.device
    f32 = dict(dtype=torch.float32, device=dev)
    nbk = ceil_div(Sk, K_BLOCK)
    chunks = ceil_div(Sk, SAGE_STATS_CHUNK)
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
    prep = {"q": qc, "k": kc, "v": vc, "q_int8": canon(res["q_int8"]), "q_scale": res["q_scale"],
            "k_part": k_part, "v_part": v_part}
    plan = "none"
    if plan_values is not None:
        has_counts = "block_counts" in plan_values
        if plan_counts is not None and bool(plan_counts) != has_counts:
            raise ValueError(f"plan_counts={plan_counts} but plan_values "
                             f"{'has' if has_counts else 'lacks'} block_counts. Fix: pass the plan "
                             f"kernel's values unchanged and leave plan_counts out")
        plan = PLAN_PARAMS[has_counts]
        prep.update(plan_values)
    index = cuda_device_index(dev)
    with torch.cuda.device(dev):
        abi.launch(SAGE_PREP_KERNEL, {"plan": plan}, prep, device=index)
        abi.launch("sage_quant_kv", {},
                   {"k": kc, "v": vc, "k_part": k_part, "v_part": v_part, "k_mean": res["k_mean"],
                    "v_scale": res["v_scale"], "k_int8": canon(res["k_int8"]), "k_scale": res["k_scale"],
                    "v_fp8": res["v_fp8"], "blocks_per_cta": kv_blocks_per_cta(B, H, nbk)}, device=index)
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
