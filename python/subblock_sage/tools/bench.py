"""`subblock-sage bench`: time our kernels (and torch's SDPA) on the same shapes in one run, on the
current GPU.

Timing: CUDA events around each call after warm-up, median of >= 20 runs.
FLOP conventions (D = 128; t = time per call, one definition for every row):
  dense-equivalent TFLOPS = 4 * Sq * Sk * D * H / t
  kept-block TFLOPS       = 4 * D * (sum over query rows and heads of the kept keys) / t
Rows: sage_fp8 and bf16 `sparse_attention` (whole call, and the kernel alone where the backend
exposes it), PyTorch SDPA dense bf16 with the cuDNN and the flash backends, and the Sage quantizer
alone (GB/s of bf16 read + quantized bytes written; "of_copy": its time vs a torch copy of the same
bytes, held to >= 0.8; GPU time, both from CUDA graphs of 10 calls), and its K/V-only pass
(what a call makes when the sm_90a kernel quantizes Q itself), against a copy of its own bytes. The kernel-only row times the kernel the call
runs (on sm_90a the Q-fused one from 1024 query blocks up: it includes the Q quantization).
Host cost: for the first plan of each shape (block_counts given), each mode and key-block size,
N (``calls``, 20) whole calls back to back (events around all N, the GPU idle before; t = total / N;
median over max(3, reps / 4) repeats) and the same N calls captured once into a CUDA graph (after a
warm-up call) and replayed (t = replay / N); the graph row carries eager/graph. The kernel-only
rows carry whole/kernel; the whole-call and kernel-only rows carry host_us, the median host time
of their isolated calls (the host path runs slower right after a wait, ``time_ms``).
``--shapes sglang`` runs SGLang-like plans (``make_sglang_plan``).
Clocks and power: with nvidia-ml-py installed (the ``[bench]`` extra), every row also shows the
median SM clock (MHz), the board power (W) and how often the clock was held down (power cap,
thermal) while it ran: attention at these sizes runs at the board's power limit, where time follows
energy per call (power.py). ``warm_s`` runs each call for that many seconds before it is timed, so
that every contender is timed in the same steady (power-capped) state.

Other libraries' kernels are not timed here: FlexAttention, cuDNN's FP8 SDPA and block-sparse
attention, and SGLang's and cuDNN's SM90 kernels compiled into the never-shipped test library are
the project's lab (benchmark/lab in a checkout, never in the wheel): ``python -m benchmark.lab.bench``
runs this bench with their rows added through ``run``'s ``extra`` (the hooks of ``Extra``).
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import statistics
import time
from dataclasses import dataclass

from ..contract import HEAD_DIM as D
from ..contract import ceil_div
from .power import Sampler

SHAPES = ((14, 37760), (7, 75776), (14, 75776))
QUICK_SHAPES = ((2, 4096),)
# README's host-cost shapes (benchmark/host_time.py): host-bound (H=4 S=8192), few heads at the
# video length (H=2 S=37760: whole call against kernel) and the standard one (H=14 S=37760)
HOST_SHAPES = ((4, 8192), (2, 37760), (14, 37760))
# the video length SGLang's MiniMax-H3 attends over, with 2, 6 and 14 heads per GPU
SGLANG_SHAPES = ((2, 37760), (6, 37760), (14, 37760))
SHAPE_PRESETS = {"standard": SHAPES, "quick": QUICK_SHAPES, "host": HOST_SHAPES, "sglang": SGLANG_SHAPES}
CALLS = 20  # back-to-back calls of the eager and CUDA-graph rows
# calls per CUDA graph of the quantizer and copy rows (GPU time: one isolated call each
# timed, host path included: 0.32 ms for a 0.22 ms pass at H=14 S=37760)
PASS_CALLS = 10
SDPA_CUDNN = "sdpa cudnn dense bf16"  # the dense baseline of vs_cudnn_dense
FLOPS_LINE = ("dense-equivalent TFLOPS = 4*Sq*Sk*D*H/t; kept-block TFLOPS = 4*D*kept_keys/t; "
              "t = ms per call (xN rows: total of N calls / N)")
# the table's columns, in order (those no row has are left out)
COLUMNS = ("contender", "H", "S", "plan", "ms", "dense_tflops", "kept_tflops", "vs_cudnn_dense", "whole/kernel",
           "host_us", "eager/graph", "GB/s", "of_copy", "MHz", "W", "slowed", "error")


def kernel_only(q, k, v, index, counts, block_size_k: int, compute_mode: str, *, library=None, backend=None):
    """Quantize, prepare the plan and pack once; return a function that launches only the
    attention kernel (the whole call minus quantization, plan preparation and argument packing).
    BSHD bf16 inputs, arguments as ``sparse_attention``'s. ``library`` / ``backend``: default,
    those serving q's device. A documented entry point for benchmarks (benchmark/). On sm_90a
    the kernel is a programmatic dependent launch that waits for the kernel before it on the
    GPU, and the Q-fused kernel loads q before that wait (aot/kernels/sm90/config.py: PDL):
    the kernel launched right before each call on the stream must not write q."""
    import torch

    from ..ops import pipeline
    from ..validation import check_attention_args

    args = check_attention_args(q, k, v, index, counts, block_size_k=block_size_k, compute_mode=compute_mode)
    served = pipeline.serve(args.q.device, args.compute_mode, args.spec.block_size_k, library=library,
                            backend=backend)
    served.backend.check_call(served.lib, args)
    operands, plan = served.backend.stage(served.lib, args)
    plan.verify()
    out = torch.empty_like(q)
    go = served.backend.pack(served.lib, args, plan, operands, args.canonical(out))
    go.keep = (operands, plan, out)  # alive as long as the launcher
    return go


def time_ms(fn, *, warmup: int = 3, reps: int = 20, back_to_back: bool = False, warm_s: float = 0.0,
            host_us: list | None = None, wait=None) -> float:
    """Median ms of ``reps`` isolated calls (events around each call, the GPU idle before it: the
    call's host launch path is inside). ``back_to_back``: the mean of ``reps`` calls queued without
    a sync, so host launch time hides behind the GPU whenever the GPU is the slower side.
    Warm-up: ``warmup`` calls, and more until ``warm_s`` seconds have passed. ``host_us``: gets
    the host time of each isolated call (us, perf_counter around the call): right after the
    host waited for the GPU it was 1.3-6x the back-to-back figure on the H200 hosts lent
    (MEASUREMENTS.md), which is why one-call rows of different runs differ more than their kernels.
    ``wait(end_event)``: how the host waits for each call's end (default ``Event.synchronize``;
    benchmark/host_wait.py compares others)."""
    import torch

    _warm(fn, warmup, warm_s)
    if back_to_back:
        return eager_ms(fn, reps, reps=1, warmup=0)  # already warm: one run of reps queued calls
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        b.record()
        if wait is None:
            b.synchronize()
        else:
            wait(b)
        times.append(a.elapsed_time(b))
        if host_us is not None:
            host_us.append((t1 - t0) * 1e6)
    return statistics.median(times)


def _warm(fn, warmup: int, warm_s: float) -> None:
    import torch

    start = time.monotonic()
    n = 0
    while n < warmup or time.monotonic() - start < warm_s:
        fn()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()  # keep the queue short so that warm_s is GPU time
    torch.cuda.synchronize()


def eager_ms(fn, calls: int = CALLS, *, reps: int = 5, warmup: int = 3, warm_s: float = 0.0) -> float:
    """ms per call of ``calls`` calls queued back to back: events around all of them, the GPU
    idle before; median over ``reps`` repeats (after ``warmup`` calls and ``warm_s`` seconds)."""
    import torch

    _warm(fn, warmup, warm_s)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def capture(fn, calls: int = CALLS):
    """A torch.cuda.CUDAGraph of ``calls`` calls of ``fn``, captured once after a warm-up call on a
    side stream (library loading and first-call allocations stay outside the graph)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return g


def graph_ms(g, calls: int = CALLS, *, reps: int = 5, warmup: int = 2, warm_s: float = 0.0) -> float:
    """ms per call of one replay of ``g`` (a graph of ``calls`` calls): eager_ms of the replay / calls."""
    return eager_ms(g.replay, 1, reps=reps, warmup=warmup, warm_s=warm_s) / calls


def make_plan(B, H, Sq, Sk, density, kind, block_size_k=64, device="cuda", seed=0):
    """(index, counts): each row keeps ceil(density * Gk) distinct blocks; kind "random" or
    "local" (a +-2 block window around the diagonal, then random blocks), or "sglang"
    (``make_sglang_plan`` at sparsity 1 - density)."""
    import torch

    if kind == "sglang":
        return make_sglang_plan(B, H, Sq, Sk, 1.0 - density, block_size_k, device, seed)
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
# SGLang's backend defaults: sparsity 0.75 (density 0.25 of routed rows); its non-video query
# blocks (text tokens) run dense through block_counts: here the first tenth of the query blocks
SGLANG_SPARSITY = 0.75
SGLANG_DENSE_FRACTION = 0.10
SGLANG_PLANS = (("sglang 0.75", 1.0 - SGLANG_SPARSITY, "sglang"), ("0.25 random", 0.25, "random"),
                ("1.0", 1.0, "random"))
PLAN_SETS = {"standard": PLANS, "sglang": SGLANG_PLANS}


def sglang_granularity(block_size_k: int) -> int:
    """SGLang's top-k budget granularity: 8 on its 64-key paths (bf16 included; its SM100/SM120
    FlashInfer kernels pad rows to multiples of 8), 1 on the 128-key sm_90a Sage path."""
    return 8 if block_size_k == 64 else 1


def sglang_topk(gk: int, sparsity: float, g: int) -> int:
    """SGLang's routed budget: min(Gk, ceil(ceil((1 - sparsity) * Gk) / g) * g)."""
    return min(gk, math.ceil(math.ceil((1.0 - sparsity) * gk) / g) * g)


def make_sglang_plan(B, H, Sq, Sk, sparsity=SGLANG_SPARSITY, block_size_k=64, device="cuda", seed=0,
                     dense_fraction=SGLANG_DENSE_FRACTION):
    """(index, counts) as SGLang's backend hands them over: capacity Gk (every key block), the
    first ``dense_fraction`` of query blocks dense (count Gk, ids 0..Gk-1), every other row routed
    to ``sglang_topk`` blocks (random scores standing in for the router's). Each row is a
    permutation of the key blocks whose first ``count`` entries are the kept ones; on 64-key
    plans those are sorted ascending, as SGLang's caller does for its SM90 kernel."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    gq, gk = ceil_div(Sq, 64), ceil_div(Sk, block_size_k)
    topk = sglang_topk(gk, sparsity, sglang_granularity(block_size_k))
    n_dense = math.ceil(dense_fraction * gq)
    scores = torch.rand(B, H, gq, gk, generator=g, device=device)
    index = scores.argsort(dim=-1, descending=True).int()
    if block_size_k == 64:
        index[..., :topk] = index[..., :topk].sort(dim=-1).values
    index[:, :, :n_dense] = torch.arange(gk, dtype=torch.int32, device=device)
    counts = torch.full((B, H, gq), topk, dtype=torch.int32, device=device)
    counts[:, :, :n_dense] = gk
    return index.contiguous(), counts


def kept_flops(counts, block_size_k, Sq, Sk, H):
    """4 * D * kept_keys, kept_keys summed over query rows (64 per plan row), capped at dense."""
    return 4 * D * min(float(counts.sum()) * block_size_k * 64, Sq * Sk * H)


def result_row(name, shape, plan, ms, dense_flops, kept, base_ms, power=None, host_us=None):
    """One table row: ms, dense-equivalent and kept-block TFLOPS, speedup vs the cuDNN baseline,
    the clock / power state while it ran (a power.PowerSummary, when NVML was readable) and,
    when given, the host time of its isolated calls (``host_us``)."""
    row = {
        "contender": name, "H": shape[0], "S": shape[1], "plan": plan, "ms": round(ms, 4),
        "dense_tflops": round(dense_flops / ms / 1e9, 1),
        "kept_tflops": round(kept / ms / 1e9, 1) if kept else None,
        "vs_cudnn_dense": round(base_ms / ms, 2) if base_ms else None,
    }
    if host_us is not None:
        row["host_us"] = host_us
    if power is not None:
        row.update(power.as_row())
    return row


def host_rows(mode, shape, plan, eager, graph, calls, dense_flops, kept, base_ms, eager_pw=None, graph_pw=None):
    """The eager back-to-back row and the CUDA-graph row of one mode and plan (ms per call);
    the graph row carries eager/graph."""
    e = result_row(f"{mode} (eager x{calls})", shape, plan, eager, dense_flops, kept, base_ms, eager_pw)
    g = result_row(f"{mode} (cuda graph x{calls})", shape, plan, graph, dense_flops, kept, base_ms, graph_pw)
    g["eager/graph"] = round(eager / graph, 2)
    return [e, g]


def resolve_shapes(preset=None, shapes=None, quick=False):
    """The shapes to run: those of ``preset`` (a SHAPE_PRESETS name), then the explicit ``shapes``
    (H, S) in order, without repeats; neither given: quick or standard."""
    if preset is not None and preset not in SHAPE_PRESETS:
        raise ValueError(f"unknown shape preset {preset!r}; one of {', '.join(SHAPE_PRESETS)}")
    out = list(SHAPE_PRESETS[preset]) if preset else []
    out += [tuple(s) for s in shapes or ()]
    if not out:
        out = list(QUICK_SHAPES if quick else SHAPES)
    return tuple(dict.fromkeys(out))


@dataclass
class Context:
    """What ``run`` hands its ``extra``: the library and backend serving the GPU (backend None
    where none takes it), the modes they run, the timing settings, the power sampler and the notes;
    per shape (from ``Extra.shape_rows`` on) its (H, S), the BSHD bf16 inputs, the dense FLOPs and
    the dense baseline's ms (vs_cudnn_dense; None when cuDNN's SDPA failed)."""

    lib: object
    backend: object
    modes: list
    sampler: Sampler
    reps: int
    warm_s: float
    notes: list
    shape: tuple = (0, 0)
    q: object = None
    k: object = None
    v: object = None
    dense_flops: float = 0.0
    base_ms: float | None = None

    def timed(self, fn, measure=None):
        """(ms, power summary) of one contender: ``measure()`` (default: time_ms of ``fn``);
        the sampler covers warm-up and timing."""
        with self.sampler:
            ms = measure() if measure is not None else time_ms(fn, reps=self.reps, warm_s=self.warm_s)
        return ms, self.sampler.summary()


class Extra:
    """Rows another bench adds to ``run``'s (benchmark/lab/bench.py: the lab's contenders). Each
    hook returns the rows to insert where it is called; this base class adds none, prints the
    table with ``COLUMNS`` and adds no header line."""

    columns = COLUMNS

    def start(self, ctx: Context) -> None:
        """Once, before the first shape (load what the rows need; a note for what cannot run)."""

    def shape_rows(self, ctx: Context) -> list:
        """After each shape's dense SDPA rows."""
        return []

    def kernel_rows(self, ctx: Context, mode: str, plan: str, density: float, kernel) -> list:
        """After each kernel-only row (``kernel``: its launcher, ``kernel_only``)."""
        return []

    def plan_rows(self, ctx: Context, index, counts, block_size_k: int, plan: str) -> list:
        """After the rows of each plan and key-block size."""
        return []

    def end_shape(self, ctx: Context) -> None:
        """After each shape, before its inputs are released."""

    def header_lines(self, rows) -> list[str]:
        """Lines printed above the table, before the clocks-and-power line."""
        return []


def run(shapes=SHAPES, *, reps=20, plans=PLANS, warm_s=0.0, calls=CALLS, notes=None, extra: Extra | None = None):
    """Every row of every (H, S) of ``shapes``; the table's rows (dicts). One-line notes
    (something that cannot run here) are appended to ``notes`` when a list is given. ``extra``:
    an ``Extra`` whose hooks add rows (the lab's contenders)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .. import quantize_sage, sparse_attention
    from ..ops.quantize import quantize_canonical
    from ..loader import library_for_device
    from ..backends import backend_for

    notes = [] if notes is None else notes
    extra = extra or Extra()
    dev = torch.cuda.current_device()
    lib = library_for_device(dev)
    try:
        backend = backend_for(lib.target)
        modes = list(backend.modes(lib))
    except Exception:
        backend, modes = None, []
    ctx = Context(lib, backend, modes, Sampler(dev), reps, warm_s, notes)
    timed = ctx.timed

    def timed_host(fn):
        """``timed(fn)`` plus the median host time of its isolated calls (us, ``time_ms``)."""
        host: list = []
        ms, pw = timed(fn, lambda: time_ms(fn, reps=reps, warm_s=warm_s, host_us=host))
        return ms, pw, round(statistics.median(host), 1)

    def gpu_timed(fn):
        """``timed`` of the GPU time alone: a CUDA graph of PASS_CALLS calls, replayed (the
        quantizer and copy rows: a bandwidth, not a host path)."""
        return timed(fn, lambda: graph_ms(capture(fn, PASS_CALLS), PASS_CALLS, warm_s=warm_s))

    extra.start(ctx)
    rows = []
    for H, S in shapes:
        q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k += torch.randn(1, 1, H, D, device="cuda", dtype=torch.bfloat16) * 5  # per-channel bias
        dense_flops = 4 * S * S * D * H
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        base = {}
        for name, be in ((SDPA_CUDNN, SDPBackend.CUDNN_ATTENTION),
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
        ctx.shape, ctx.q, ctx.k, ctx.v, ctx.dense_flops, ctx.base_ms = (H, S), q, k, v, dense_flops, base_ms
        rows += extra.shape_rows(ctx)
        nbytes = 3 * q.numel() * 2 + 3 * q.numel()  # bf16 in, ~1 byte/element out
        # the copy bandwidth the quantizer is held to (>= 80 %): a torch copy moving
        # the same number of bytes (half read, half written)
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device=q.device)
        dst = torch.empty_like(src)
        copy_ms, copy_pw = gpu_timed(lambda: dst.copy_(src))
        copy_gbs = nbytes / copy_ms / 1e6
        rows.append({"contender": "copy_ (torch, same bytes)", "H": H, "S": S, "plan": "-",
                     "ms": round(copy_ms, 4), "GB/s": round(copy_gbs, 1), **(copy_pw.as_row() if copy_pw else {})})
        src = dst = None  # free before the quantizer runs
        try:
            ms, pw = gpu_timed(lambda: quantize_sage(q, k, v))
            rows.append({"contender": "sage quantizer alone", "H": H, "S": S, "plan": "-",
                         "ms": round(ms, 4), "GB/s": round(nbytes / ms / 1e6, 1),
                         "of_copy": round(copy_ms / ms, 3), **(pw.as_row() if pw else {})})
        except Exception as e:  # noqa: BLE001 - reported in the table
            rows.append({"contender": "sage quantizer alone", "H": H, "S": S, "error": str(e)[:80]})
        # the pass a Sage call makes when its kernel quantizes Q itself (sm_90a q_fused): K and V
        # only, held to a copy of its own bytes (2/3 of the above)
        kv_bytes = nbytes * 2 // 3
        src = torch.empty(kv_bytes // 2, dtype=torch.uint8, device=q.device)
        dst = torch.empty_like(src)
        kv_copy_ms, _ = gpu_timed(lambda: dst.copy_(src))
        src = dst = None
        try:
            ms, pw = gpu_timed(lambda: quantize_canonical(q, k, v, with_q=False))
            rows.append({"contender": "sage quantizer, K/V only", "H": H, "S": S, "plan": "-",
                         "ms": round(ms, 4), "GB/s": round(kv_bytes / ms / 1e6, 1),
                         "of_copy": round(kv_copy_ms / ms, 3), **(pw.as_row() if pw else {})})
        except Exception as e:  # noqa: BLE001 - reported in the table
            rows.append({"contender": "sage quantizer, K/V only", "H": H, "S": S, "error": str(e)[:80]})
        for (plan_name, density, kind), bk in itertools.product(plans, getattr(backend, "block_sizes_k", (64,))):
            index, counts = make_plan(1, H, S, S, density, kind, block_size_k=bk)
            kept = kept_flops(counts, bk, S, S, H)
            first_plan = plan_name == plans[0][0]
            plan_name = f"{plan_name} bk{bk}"
            for mode in modes:
                fn = lambda: sparse_attention(q, k, v, index, counts, block_size_k=bk,  # noqa: E731
                                              compute_mode=mode)
                try:
                    ms, pw, host = timed_host(fn)
                except Exception as e:  # noqa: BLE001
                    rows.append({"contender": mode, "H": H, "S": S, "plan": plan_name, "error": str(e)[:80]})
                    continue
                rows.append(result_row(f"{mode} (whole call)", (H, S), plan_name, ms, dense_flops, kept, base_ms, pw,
                                       host))
                if backend is not None:
                    kern = kernel_only(q, k, v, index, counts, bk, mode, library=lib, backend=backend)
                    ms_k, pw, host = timed_host(kern)
                    r = result_row(f"{mode} (kernel only)", (H, S), plan_name, ms_k, dense_flops, kept, base_ms, pw,
                                   host)
                    r["whole/kernel"] = round(ms / ms_k, 3)
                    rows.append(r)
                    rows += extra.kernel_rows(ctx, mode, plan_name, density, kern)
                    kern = None
                if first_plan and calls:
                    rows += _host_rows(mode, fn, (H, S), plan_name, timed, reps, warm_s, calls, dense_flops,
                                       kept, base_ms)
            rows += extra.plan_rows(ctx, index, counts, bk, plan_name)
        # what the extra keeps of the shape released here, not by a later garbage collection that
        # could run inside the CUDA-graph capture of the next shape's host-cost rows
        extra.end_shape(ctx)
        q = k = v = qt = kt = vt = ctx.q = ctx.k = ctx.v = None  # free the inputs before the next shape
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def _host_rows(mode, fn, shape, plan, timed, reps, warm_s, calls, dense_flops, kept, base_ms):
    """The eager x``calls`` and CUDA-graph x``calls`` rows of one mode and plan (error rows when
    a measurement fails: the table goes on)."""
    import torch

    reps = max(3, reps // 4)  # each repeat is ``calls`` calls
    try:
        eager, eager_pw = timed(None, lambda: eager_ms(fn, calls, reps=reps, warm_s=warm_s))
    except Exception as e:  # noqa: BLE001 - reported in the table
        return [{"contender": f"{mode} (eager x{calls})", "H": shape[0], "S": shape[1], "plan": plan,
                 "error": str(e)[:80]}]
    g = None
    try:
        g = capture(fn, calls)
        graph, graph_pw = timed(None, lambda: graph_ms(g, calls, reps=reps, warm_s=warm_s))
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        return [result_row(f"{mode} (eager x{calls})", shape, plan, eager, dense_flops, kept, base_ms, eager_pw),
                {"contender": f"{mode} (cuda graph x{calls})", "H": shape[0], "S": shape[1], "plan": plan,
                 "error": str(e)[:80]}]
    finally:
        g = None  # noqa: F841 - the graph's memory pool goes back before the next capture
    return host_rows(mode, shape, plan, eager, graph, calls, dense_flops, kept, base_ms, eager_pw, graph_pw)


def format_table(rows, columns=COLUMNS) -> str:
    """The rows as a text table: the ``columns`` some row has, in that order."""
    cols = [c for c in columns if any(c in r for r in rows)]
    data = [[str(r.get(c, "")) if r.get(c) is not None else "" for c in cols] for r in rows]
    widths = [max(len(c), *(len(d[i]) for d in data)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(d) for d in data])


def header(gpu: str, reps: int, warm_s: float, calls: int, rows, extra_lines=()) -> list[str]:
    """The lines printed above the table: what was timed and how, the FLOP convention, the
    columns that need explaining (``extra_lines``: an extra's, before the clocks-and-power line)."""
    warm = f"{warm_s:g} s of warm-up" if warm_s else "warm-up"
    lines = [f"GPU: {gpu}  (median of {reps} runs after {warm}, CUDA events)", FLOPS_LINE]
    if calls:
        lines.append(f"eager x{calls}: {calls} whole calls back to back, block_counts given (the first plan); "
                     f"cuda graph x{calls}: the same calls captured once into a CUDA graph and replayed; "
                     "eager/graph on the graph row")
    if any("host_us" in r for r in rows):
        lines.append("host_us: median host time of the row's isolated calls (the GPU idle before each), "
                     "perf_counter around the call; it sets most of whole/kernel where kernels are short")
    lines += extra_lines
    if any("MHz" in r for r in rows):
        lines.append("MHz / W: median SM clock and board power while the row ran; slowed: share of that time the "
                     "clock was held down, and why")
    else:
        lines.append("(install nvidia-ml-py, e.g. pip install \"subblock-sage[bench]\", to see SM clocks and power per row)")
    return lines


def resolve_plans(preset=None, plans=None):
    """The plan set's name: ``plans`` when given, else that of the shape preset ("sglang" runs
    SGLang-like plans), else "standard"."""
    if plans is not None:
        if plans not in PLAN_SETS:
            raise ValueError(f"unknown plan set {plans!r}; one of {', '.join(PLAN_SETS)}")
        return plans
    return preset if preset in PLAN_SETS else "standard"


def main(quick: bool = False, json_path: str | None = None, shapes=None, warm_s: float = 0.0,
         preset: str | None = None, calls: int = CALLS, plans: str | None = None, extra: Extra | None = None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("subblock-sage bench needs a CUDA GPU; none is visible.")
        return 1
    shapes = resolve_shapes(preset, shapes, quick)
    plan_set = resolve_plans(preset, plans)
    reps = 5 if quick else 20
    extra = extra or Extra()
    notes: list[str] = []
    rows = run(shapes, reps=reps, plans=PLAN_SETS[plan_set], warm_s=warm_s, calls=calls, notes=notes, extra=extra)
    gpu = torch.cuda.get_device_name()
    print("\n".join(header(gpu, reps, warm_s, calls, rows, extra.header_lines(rows))))
    print(f"plans: {plan_set} ({'; '.join(name for name, _, _ in PLAN_SETS[plan_set])})" + (
        f"; sglang: sparsity {SGLANG_SPARSITY}, capacity Gk, the first {SGLANG_DENSE_FRACTION:.0%} of query blocks "
        "dense, the rest routed to min(Gk, ceil(ceil((1 - sparsity) Gk) / g) g) blocks, g = 8 (64-key) / 1 (128-key)"
        if plan_set == "sglang" else ""))
    print(format_table(rows, extra.columns))
    for note in notes:
        print(f"note: {note}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"gpu": gpu, "warm_s": warm_s, "reps": reps, "calls": calls, "flops": FLOPS_LINE,
                       "shapes": [list(s) for s in shapes], "plans": plan_set, "notes": notes, "rows": rows},
                      f, indent=1)
    return 0
