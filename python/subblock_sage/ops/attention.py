"""`sparse_attention`: SubBlock block-sparse attention, Sage (INT8 Q·Kᵀ, FP8 P·V) or bf16.

This module validates, allocates the output in q's layout and hands canonical (B, S, H, 128)
views to the backend that serves the device's target:

    sm_90a  -> ops/sm90.py              (this project's own Hopper kernels)
    sm_120a -> ops/flashinfer_marshal   (FlashInfer's SM120 Sage / bf16 classes, AOT-built)
    sm_100a -> ops/flashinfer_marshal   (FlashInfer's SM100 blk64 bf16 class, AOT-built)
    sm_100f, sm_120f: the same classes built for the family targets (B300; DGX Spark)

A backend is an object with ``modes`` (compute modes it serves), ``block_sizes_k``,
``plan_block_size_k(block_size_k)`` (the key-block size its kernels take the plan in),
``prepare(qc, kc, vc, compute_mode)`` (enqueues the input conversion, e.g. the Sage quantizer,
and returns its operands; it needs no plan, so it runs first) and
``run(lib, qc, kc, vc, plan, scale, compute_mode, out_c, operands)`` that writes ``out_c``;
``plan`` is an ``ops.plan.PreparedPlan`` (ids valid and distinct, counts in range), made by one
launch of the plan kernel. ``run`` must call ``plan.verify()`` (bad plan values raise there; it
waits on an event for the plan kernel only) before its attention launch.
"""

from __future__ import annotations

import importlib

from .. import deadline, loader
from ..validation import COMPUTE_MODES, capturing, check_out, check_qkv, check_scale, checked_plan
from ..validation import check_plan as validate_plan
from .plan import prepare_plan

# target -> (module, attribute) of its backend; resolved on first use
BACKENDS: dict[str, tuple[str, str]] = {
    "sm_90a": ("subblock_sage.ops.sm90", "BACKEND"),
    "sm_100a": ("subblock_sage.ops.flashinfer_marshal", "SM100_BACKEND"),
    "sm_120a": ("subblock_sage.ops.flashinfer_marshal", "SM120_BACKEND"),
    "sm_100f": ("subblock_sage.ops.flashinfer_marshal", "SM100_BACKEND"),
    "sm_120f": ("subblock_sage.ops.flashinfer_marshal", "SM120_BACKEND"),
}


def backend_for(target: str):
    try:
        mod, attr = BACKENDS[target]
        return getattr(importlib.import_module(mod), attr)
    except (KeyError, ImportError, AttributeError) as e:
        raise loader.UnsupportedGPUError(
            f"this build of subblock-sage has no sparse-attention backend for {target} ({e})"
        ) from e


def sparse_attention(q, k, v, q2k_block_index, block_counts=None, *, topk=None, block_size_k=64,
                     softmax_scale=None, compute_mode="sage_fp8", layout="BSHD", out=None,
                     check_plan=False, library=None, backend=None, _checked=False):
    """Block-sparse attention over 64-row query blocks.

    Args:
        q: bf16 ``[B, Sq, H, 128]`` (``layout="BSHD"``) or ``[B, H, Sq, 128]`` (``"BHSD"``).
        k, v: bf16, same layout with ``Sk`` keys. Strided views (e.g. slices of a packed QKV
            tensor) are used in place.
        q2k_block_index: int32 ``[B, H, ceil(Sq/64), capacity]``: key-block ids (units of
            ``block_size_k``), any order; only the first ``block_counts[b,h,i]`` are read.
            Ids outside ``[0, ceil(Sk/block_size_k))`` are skipped (``check_plan=True`` raises).
        block_counts: int32 ``[B, H, ceil(Sq/64)]`` in ``0..capacity``; ``None``: every row uses
            ``topk`` blocks (default: capacity). A row with 0 blocks returns exact zeros.
        block_size_k: 64 or 128 (the key-block size the plan is written in).
        softmax_scale: default ``1/sqrt(128)``.
        compute_mode: ``"sage_fp8"`` (quantizes inside the call) or ``"bf16"``.
        out: optional bf16 output with q's shape.
        check_plan: raise ValueError on index values outside ``[0, ceil(Sk/block_size_k))``
            instead of skipping them (costs a device sync).
        library, backend: override the loaded library / backend (tests of test-only builds).
        _checked: the public wrapper (``torch_ops.sparse_attention``) has just run
            ``check_attention_args`` on these very arguments (then ``softmax_scale`` is a float);
            the metadata checks are not repeated (~20 us of host time per call).
    Returns:
        bf16 tensor in q's layout.
    """
    import torch

    if _checked:
        qc, kc, vc = (q, k, v) if layout == "BSHD" else (t.permute(0, 2, 1, 3) for t in (q, k, v))
        Sk = kc.shape[1]
        scale = softmax_scale
        plan = checked_plan(q2k_block_index, block_counts, topk, Sk=Sk, block_size_k=block_size_k)
    else:
        if compute_mode not in COMPUTE_MODES:
            raise ValueError(f"compute_mode must be one of {COMPUTE_MODES}, got {compute_mode!r}")
        qc, kc, vc = check_qkv(q, k, v, layout)
        B, Sq, H, _ = qc.shape
        Sk = kc.shape[1]
        scale = check_scale(softmax_scale)
        plan = validate_plan(q2k_block_index, block_counts, topk, B=B, H=H, Sq=Sq, Sk=Sk,
                             block_size_k=block_size_k, device=q.device, check_values=bool(check_plan),
                             enqueue_checks=False)
        out = check_out(out, q)
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    lib = library or loader.library_for_device(device)
    be = backend or backend_for(lib.target)
    if compute_mode not in be.modes:
        raise ValueError(
            f"compute_mode={compute_mode!r} is not available on {lib.target}; it serves {be.modes}"
        )
    if block_size_k not in be.block_sizes_k:
        raise ValueError(
            f"block_size_k={block_size_k} is not supported on {lib.target}; use one of "
            f"{be.block_sizes_k} (rewrite the plan in {be.block_sizes_k[0]}-token key blocks)"
        )
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    out_c = out if layout == "BSHD" else out.permute(0, 2, 1, 3)
    with torch.cuda.device(q.device):
        # Every host-side check has passed. The quantizer goes first (it needs no plan), so the
        # GPU works while the host prepares the plan launch; the backend calls prepared.verify()
        # (bad plan values raise there: one wait on an event for the plan kernel) right before
        # its attention launch, and the output is never written on that path.
        operands = be.prepare(qc, kc, vc, compute_mode)
        prepared = prepare_plan(plan, block_size_k_out=be.plan_block_size_k(block_size_k), seqlen_k=Sk,
                                check_index=bool(check_plan), capturing=capturing(), library=lib)
        be.run(lib, qc, kc, vc, prepared, scale, compute_mode, out_c, operands)
    return out


def _self_test(device: int, compute_mode: str) -> str:
    """Small launch on a ragged shape with empty, dense and random rows vs the float64 reference."""
    import torch

    from ..reference import attention_verdict, reference_sparse_attention

    g = torch.Generator(device="cpu").manual_seed(7)
    B, H, Sq, Sk, bk = 1, 2, 150, 200, 64
    dev = f"cuda:{device}"
    q, k, v = (torch.randn(B, S, H, 128, generator=g).to(torch.bfloat16).to(dev) for S in (Sq, Sk, Sk))
    gq, gk = -(-Sq // 64), -(-Sk // bk)
    index = torch.stack([torch.randperm(gk, generator=g) for _ in range(B * H * gq)]).view(B, H, gq, gk)
    counts = torch.randint(0, gk + 1, (B, H, gq), generator=g)
    counts[0, 0, 0], counts[0, 1, 1] = 0, gk  # one empty row, one dense row
    index, counts = index.int().to(dev), counts.int().to(dev)
    got = sparse_attention(q, k, v, index, counts, compute_mode=compute_mode, block_size_k=bk)
    deadline.wait_stream(device, f"GPU {device} {compute_mode} self-test")  # polls an event: never hangs (deadline.py)
    ref = reference_sparse_attention(q, k, v, index, counts, block_size_k=bk).to(got.device)
    return attention_verdict(got, ref, compute_mode)  # thresholds: reference.SELF_TEST_LIMITS


def _supported(mode):
    def check(lib) -> bool:
        try:
            return mode in backend_for(lib.target).modes
        except loader.UnsupportedGPUError:
            return False

    return check


def self_test_sage_fp8(device: int) -> str:
    return _self_test(device, "sage_fp8")


def self_test_bf16(device: int) -> str:
    return _self_test(device, "bf16")


self_test_sage_fp8.supported = _supported("sage_fp8")
self_test_bf16.supported = _supported("bf16")
