"""`subblock-sage bench`: time every contender on the same shapes in one run, on the current GPU.

Timing: CUDA events around each call after warm-up, median of >= 20 runs.
FLOP conventions (D = 128):
  dense-equivalent TFLOPS = 4 * Sq * Sk * D * H / t
  kept-block TFLOPS       = 4 * D * (sum over query rows and heads of the kept keys) / t
Contenders: sage_fp8 and bf16 `sparse_attention` (whole call, and the kernel alone where the
backend exposes it), PyTorch SDPA dense bf16 with the cuDNN and the flash backends, and the Sage
quantizer alone (GB/s of bf16 read + quantized bytes written).
Clocks and power: with nvidia-ml-py installed, every row also shows the median SM clock (MHz),
the board power (W) and how often the clock was held down (power cap, thermal) while it ran:
attention at these sizes runs at the board's power limit, where time follows energy per call
(power.py). ``warm_s`` runs each call for that many seconds before it is timed, so that every
contender is timed in the same steady (power-capped) state.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time

from ..contract import HEAD_DIM as D
from ..contract import ceil_div
from .power import Sampler

SHAPES = ((14, 37760), (7, 75776), (14, 75776))
QUICK_SHAPES = ((2, 4096),)


def kernel_only(q, k, v, index, counts, block_size_k: int, compute_mode: str, *, library=None, backend=None):
    """Quantize, prepare the plan and pack once; return a function that launches only the
    attention kernel (the whole call minus quantization, plan preparation and argument packing).
    BSHD bf16 inputs, arguments as ``sparse_attention``'s. ``library`` / ``backend``: default,
    those serving q's device. A documented entry point for benchmarks (benchmark/)."""
    import torch

    from ..ops.attention import resolve, stage
    from ..validation import check_attention_args

    args = check_attention_args(q, k, v, index, counts, block_size_k=block_size_k, compute_mode=compute_mode)
    lib, be = resolve(args, library, backend)
    operands, plan = stage(args, lib, be)
    plan.verify()
    out = torch.empty_like(q)
    go = be.pack(lib, args, plan, operands, args.canonical(out))
    go.keep = (operands, plan, out)  # alive as long as the launcher
    return go


def time_ms(fn, *, warmup: int = 3, reps: int = 20, back_to_back: bool = False, warm_s: float = 0.0) -> float:
    """Median ms of ``reps`` isolated calls (events around each call, the GPU idle before it: the
    call's host launch path is inside). ``back_to_back``: the mean of ``reps`` calls queued without
    a sync, so host launch time hides behind the GPU whenever the GPU is the slower side.
    Warm-up: ``warmup`` calls, and more until ``warm_s`` seconds have passed."""
    import torch

    start = time.monotonic()
    n = 0
    while n < warmup or time.monotonic() - start < warm_s:
        fn()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()  # keep the queue short so that warm_s is GPU time
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
    gq, gk = ceil_div(Sq, 64), ceil_div(Sk, block_size_k)
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


def result_row(name, shape, plan, ms, dense_flops, kept, base_ms, power=None):
    """One table row: ms, dense-equivalent and kept-block TFLOPS, speedup vs the cuDNN baseline,
    and the clock / power state while it ran (a power.PowerSummary, when NVML was readable)."""
    row = {
        "contender": name, "H": shape[0], "S": shape[1], "plan": plan, "ms": round(ms, 4),
        "dense_tflops": round(dense_flops / ms / 1e9, 1),
        "kept_tflops": round(kept / ms / 1e9, 1) if kept else None,
        "vs_cudnn_dense": round(base_ms / ms, 2) if base_ms else None,
    }
    if power is not None:
        row.update(power.as_row())
    return row


def run(shapes=SHAPES, *, reps=20, plans=PLANS, warm_s=0.0):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .. import quantize_sage, sparse_attention
    from ..loader import library_for_device
    from ..backends import backend_for

    dev = torch.cuda.current_device()
    lib = library_for_device(dev)
    sampler = Sampler(dev)

    def timed(fn):
        """(median ms, power summary) of one contender; the sampler covers warm-up and timing."""
        with sampler:
            ms = time_ms(fn, reps=reps, warm_s=warm_s)
        return ms, sampler.summary()

    try:
        backend = backend_for(lib.target)
        modes = list(backend.modes(lib))
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
                    ms, pw = timed(lambda: F.scaled_dot_product_attention(qt, kt, vt))
            except RuntimeError as e:
                rows.append({"contender": name, "H": H, "S": S, "plan": "dense", "error": str(e)[:80]})
                continue
            base.setdefault("ms", ms)
            rows.append(result_row(name, (H, S), "dense", ms, dense_flops, dense_flops, base["ms"], pw))
        base_ms = base.get("ms")
        nbytes = 3 * q.numel() * 2 + 3 * q.numel()  # bf16 in, ~1 byte/element out
        try:
            ms, pw = timed(lambda: quantize_sage(q, k, v))
            rows.append({"contender": "sage quantizer alone", "H": H, "S": S, "plan": "-",
                         "ms": round(ms, 4), "GB/s": round(nbytes / ms / 1e6, 1), **(pw.as_row() if pw else {})})
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
                    ms, pw = timed(fn)
                except Exception as e:  # noqa: BLE001
                    rows.append({"contender": mode, "H": H, "S": S, "plan": plan_name, "error": str(e)[:80]})
                    continue
                rows.append(result_row(f"{mode} (whole call)", (H, S), plan_name, ms, dense_flops, kept, base_ms, pw))
                if backend is not None:
                    ms_k, pw = timed(kernel_only(q, k, v, index, counts, bk, mode, library=lib, backend=backend))
                    r = result_row(f"{mode} (kernel only)", (H, S), plan_name, ms_k, dense_flops, kept, base_ms, pw)
                    r["whole/kernel"] = round(ms / ms_k, 3)
                    rows.append(r)
        q = k = v = qt = kt = vt = None  # free the inputs before the next shape
        torch.cuda.empty_cache()
    return rows


def format_table(rows) -> str:
    cols = ["contender", "H", "S", "plan", "ms", "dense_tflops", "kept_tflops", "vs_cudnn_dense",
            "whole/kernel", "GB/s", "MHz", "W", "slowed", "error"]
    cols = [c for c in cols if any(c in r for r in rows)]
    data = [[str(r.get(c, "")) if r.get(c) is not None else "" for c in cols] for r in rows]
    widths = [max(len(c), *(len(d[i]) for d in data)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(d) for d in data])


def main(quick: bool = False, json_path: str | None = None, shapes=None, warm_s: float = 0.0) -> int:
    import torch

    if not torch.cuda.is_available():
        print("subblock-sage bench needs a CUDA GPU; none is visible.")
        return 1
    rows = run(shapes or (QUICK_SHAPES if quick else SHAPES), reps=5 if quick else 20, warm_s=warm_s)
    warm = f"{warm_s:g} s of warm-up" if warm_s else "warm-up"
    print(f"GPU: {torch.cuda.get_device_name()}  (median of {'5' if quick else '20'} runs after {warm}, CUDA events)")
    print("dense-equivalent TFLOPS = 4*Sq*Sk*D*H/t; kept-block TFLOPS = 4*D*kept_keys/t")
    if any("MHz" in r for r in rows):
        print("MHz / W: median SM clock and board power while the row ran; slowed: share of that time the "
              "clock was held down, and why")
    else:
        print("(install nvidia-ml-py, e.g. pip install \"subblock-sage[bench]\", to see SM clocks and power per row)")
    print(format_table(rows))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "warm_s": warm_s, "rows": rows}, f, indent=1)
    return 0
