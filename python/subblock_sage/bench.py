"""`subblock-sage bench`: time every contender on the same shapes in one run, on the current GPU.

Timing: CUDA events around each call after warm-up, median of >= 20 runs.
FLOP conventions (D = 128):
  dense-equivalent TFLOPS = 4 * Sq * Sk * D * H / t
  kept-block TFLOPS       = 4 * D * (sum over query rows and heads of the kept keys) / t
Contenders: sage_fp8 and bf16 `sparse_attention` (whole call, and the kernel alone where the
backend exposes it), PyTorch SDPA dense bf16 with the cuDNN and the flash backends, and the Sage
quantizer alone (GB/s of bf16 read + quantized bytes written).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics

D = 128
SHAPES = ((14, 37760), (7, 75776), (14, 75776))
QUICK_SHAPES = ((2, 4096),)


def _ceil_div(a, b):
    return -(-a // b)


def time_ms(fn, *, warmup: int = 3, reps: int = 20, back_to_back: bool = False) -> float:
    """Median ms of ``reps`` isolated calls (events around each call, the GPU idle before it: the
    call's host launch path is inside). ``back_to_back``: the mean of ``reps`` calls queued without
    a sync, so host launch time hides behind the GPU whenever the GPU is the slower side."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if back_to_back:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / reps
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def make_plan(B, H, Sq, Sk, density, kind, block_size_k=64, device="cuda", seed=0):
    """(index, counts): each row keeps ceil(density * Gk) distinct blocks; kind "random" or
    "local" (a +-2 block window around the diagonal, then random blocks)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    gq, gk = _ceil_div(Sq, 64), _ceil_div(Sk, block_size_k)
    keep = min(gk, math.ceil(density * gk))
    scores = torch.rand(B, H, gq, gk, generator=g, device=device)
    if kind == "local":
        rows = torch.arange(gq, device=device).view(-1, 1) * 64 // block_size_k
        cols = torch.arange(gk, device=device).view(1, -1)
        scores = scores + ((cols - rows).abs() <= 2).float() * 2.0
    index = scores.topk(keep, dim=-1).indices.int().contiguous()
    counts = torch.full((B, H, gq), keep, dtype=torch.int32, device=device)
    return index, counts


# the plans of every benchmark row: (name, density, kind of make_plan)
PLANS = (("0.25 random", 0.25, "random"), ("0.25 local+random", 0.25, "local"), ("1.0", 1.0, "random"))


def kept_flops(counts, block_size_k, Sq, Sk, H):
    """4 * D * kept_keys, kept_keys summed over query rows (64 per plan row), capped at dense."""
    return 4 * D * min(float(counts.sum()) * block_size_k * 64, Sq * Sk * H)


def result_row(name, shape, plan, ms, dense_flops, kept, base_ms):
    """One table row: ms, dense-equivalent and kept-block TFLOPS, speedup vs the cuDNN baseline."""
    return {
        "contender": name, "H": shape[0], "S": shape[1], "plan": plan, "ms": round(ms, 4),
        "dense_tflops": round(dense_flops / ms / 1e9, 1),
        "kept_tflops": round(kept / ms / 1e9, 1) if kept else None,
        "vs_cudnn_dense": round(base_ms / ms, 2) if base_ms else None,
    }


def run(shapes=SHAPES, *, reps=20, plans=PLANS):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from . import quantize_sage, sparse_attention
    from .loader import library_for_device
    from .ops.attention import backend_for

    dev = torch.cuda.current_device()
    lib = library_for_device(dev)
    try:
        backend = backend_for(lib.target)
        modes = [m for m in ("sage_fp8", "bf16") if m in backend.modes]
    except Exception:
        backend, modes = None, []
    rows = []
    for H, S in shapes:
        q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k += torch.randn(1, 1, H, D, device="cuda", dtype=torch.bfloat16) * 5  # per-channel bias
        dense_flops = 4 * S * S * D * H
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        base = {}
        for name, be in (("sdpa cudnn dense bf16", SDPBackend.CUDNN_ATTENTION),
                         ("sdpa flash dense bf16", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    ms = time_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt), reps=reps)
            except RuntimeError as e:
                rows.append({"contender": name, "H": H, "S": S, "plan": "dense", "error": str(e)[:80]})
                continue
            base.setdefault("ms", ms)
            rows.append(result_row(name, (H, S), "dense", ms, dense_flops, dense_flops, base["ms"]))
        base_ms = base.get("ms")
        nbytes = 3 * q.numel() * 2 + 3 * q.numel()  # bf16 in, ~1 byte/element out
        try:
            ms = time_ms(lambda: quantize_sage(q, k, v), reps=reps)
            rows.append({"contender": "sage quantizer alone", "H": H, "S": S, "plan": "-",
                         "ms": round(ms, 4), "GB/s": round(nbytes / ms / 1e6, 1)})
        except Exception as e:  # noqa: BLE001 - reported in the table
            rows.append({"contender": "sage quantizer alone", "H": H, "S": S, "error": str(e)[:80]})
        for (plan_name, density, kind), bk in itertools.product(plans, getattr(backend, "block_sizes_k", (64,))):
            index, counts = make_plan(1, H, S, S, density, kind, block_size_k=bk)
            kept = kept_flops(counts, bk, S, S, H)
            plan_name = f"{plan_name} bk{bk}"
            for mode in modes:
                fn = lambda: sparse_attention(q, k, v, index, counts, block_size_k=bk,  # noqa: E731
                                              compute_mode=mode)
                try:
                    ms = time_ms(fn, reps=reps)
                except Exception as e:  # noqa: BLE001
                    rows.append({"contender": mode, "H": H, "S": S, "plan": plan_name, "error": str(e)[:80]})
                    continue
                rows.append(result_row(f"{mode} (whole call)", (H, S), plan_name, ms, dense_flops, kept, base_ms))
                kernel_only = getattr(backend, "kernel_only", None)
                if kernel_only is not None:
                    launch = kernel_only(lib, q, k, v, index, counts, bk, mode)
                    ms_k = time_ms(launch, reps=reps)
                    r = result_row(f"{mode} (kernel only)", (H, S), plan_name, ms_k, dense_flops, kept, base_ms)
                    r["whole/kernel"] = round(ms / ms_k, 3)
                    rows.append(r)
        q = k = v = qt = kt = vt = None  # free the inputs before the next shape
        torch.cuda.empty_cache()
    return rows


def format_table(rows) -> str:
    cols = ["contender", "H", "S", "plan", "ms", "dense_tflops", "kept_tflops", "vs_cudnn_dense",
            "whole/kernel", "GB/s", "error"]
    cols = [c for c in cols if any(c in r for r in rows)]
    data = [[str(r.get(c, "")) if r.get(c) is not None else "" for c in cols] for r in rows]
    widths = [max(len(c), *(len(d[i]) for d in data)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(d) for d in data])


def main(quick: bool = False, json_path: str | None = None, shapes=None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("subblock-sage bench needs a CUDA GPU; none is visible.")
        return 1
    rows = run(shapes or (QUICK_SHAPES if quick else SHAPES), reps=5 if quick else 20)
    print(f"GPU: {torch.cuda.get_device_name()}  (median of {'5' if quick else '20'} runs after warm-up, CUDA events)")
    print("dense-equivalent TFLOPS = 4*Sq*Sk*D*H/t; kept-block TFLOPS = 4*D*kept_keys/t")
    print(format_table(rows))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0
