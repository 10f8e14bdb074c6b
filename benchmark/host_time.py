"""Host (CPU) time per `sparse_attention` call, measured while the GPU is busy, and the eager vs
CUDA-graph cost of back-to-back calls: the figures behind README's "host cost" line (issue 21:
every figure comes from a committed command).

To run (on a GPU machine with the wheels installed):
    python benchmark/host_time.py [--json PATH]

Method: the GPU is first given a long spinning kernel (`torch.cuda._sleep`) so that every call
only enqueues; the host time of N calls (time.perf_counter around the loop) divided by N is the
host cost per call, whatever the kernels cost (N small enough that the launches stay far below the
GPU's queue of pending launches; one warm round, then the median of 7), for the public call (a replay after its
first call, `replay.py`) and for the full path (`library=` given: validation, backend, plan and
packing in Python each call); and the launches per call (the replay's steps). Then N calls back to back with the GPU free
(CUDA events, end-to-end) against the same N calls replayed from one CUDA graph: the ratio is
how much of a call's wall time the host path adds at that shape. Shapes: B=1, D=128, density
0.25 plans, `block_counts` given (SGLang's normal path) and `topk` only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import subblock_sage
from subblock_sage import loader, replay
from subblock_sage.tools.bench import capture, eager_ms, graph_ms

SHAPES = ((4, 8192), (2, 37760), (14, 37760))
MODES = ("sage_fp8", "bf16")


def add_q_choice(ap: argparse.ArgumentParser, default: str = "auto", why: str = "") -> None:
    """``--q auto|fused|int8``: which sm_90a Sage kernels the run uses (call_gaps.py, memcheck.py)."""
    ap.add_argument("--q", choices=("auto", "fused", "int8"), default=default,
                    help="sm_90a Sage: the runtime's choice (auto), always the Q-fused kernels, or always the "
                         "INT8-Q kernels (the quantizer quantizes Q)" + why)


def apply_q_choice(q: str) -> None:
    """Serve sm_90a with the policy of ``--q`` (``add_q_choice``) for the rest of the run (called
    before the first call: ``backends.using``)."""
    from subblock_sage import backends
    from subblock_sage.backends.sm90 import BACKEND

    if q == "int8":
        _RUN.enter_context(backends.using(BACKEND.with_policy(q_fused=False)))
    elif q == "fused":
        _RUN.enter_context(backends.using(BACKEND.with_policy(q_fused_min_ctas=0)))


_RUN = contextlib.ExitStack()  # what apply_q_choice puts in place, for the whole run


def before_call(self, ptrs, out):
    """``replay.Replay.launch`` as of the fifteenth session (two ``torch.empty`` per call, then
    every launch in one ``run_steps``; ``ptrs``: the inputs' pointers, ``replay.keyed``): the
    "before" side of call_gaps.py ``--path before`` and of call_timeline.py's host stages."""
    from subblock_sage import replay, workspace

    ws = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=self.alloc_device)
    if out is None:
        shape, stride, dtype = self.result
        res = torch.empty_strided(shape, stride, dtype=dtype, device=self.alloc_device)
    else:
        res = out
    stream = workspace.current_stream(self.device)
    sync = workspace.stream_sync(self.alloc_device, stream, self.sync_words, False).data_ptr() if self.sync_words else 0
    roots = replay._pack_roots(*ptrs, stream, res.data_ptr(), ws.data_ptr(), sync)
    rc = self.lib._run_steps(self._address, self._n, self.device, roots, replay.N_ROOTS)
    return None if rc else res


def call_cases(shape_args, mode_args, modes):
    """The (H, S, mode, block_size_k, inputs, call) of each case of call_gaps.py and
    call_timeline.py: ``--shape H,S`` (default: the bench's host shapes) x ``--mode`` (default:
    all of ``modes``, (mode, block_size_k) pairs); B=1, D=128, fresh random bf16 inputs, a random
    0.25 plan with block_counts; ``call()`` is the public ``sparse_attention`` on them."""
    from subblock_sage.tools import bench

    shapes = [tuple(int(x) for x in sh.split(",")) for sh in shape_args] if shape_args else bench.HOST_SHAPES
    for (h, s), (mode, bk) in ((sh, m) for sh in shapes for m in modes if not mode_args or m[0] in mode_args):
        q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        idx, cnt = bench.make_plan(1, h, s, s, 0.25, "random", block_size_k=bk)

        def call(q=q, k=k, v=v, idx=idx, cnt=cnt, mode=mode, bk=bk):
            return subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode, block_size_k=bk)

        yield h, s, mode, bk, (q, k, v, idx, cnt), call


def ab_arguments(ap: argparse.ArgumentParser, default_shapes: str) -> None:
    """The options of the kernel A/B scripts (pair_ab.py, share3_ab.py, cluster_ab.py)."""
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-s", type=float, default=1.0, help="seconds of calls before each timed row")
    ap.add_argument("--shape", action="append", metavar="H,S", help=f"default: {default_shapes}")
    add_q_choice(ap)


def cudnn_contender(q, k, v, plan: str) -> list:
    """cuDNN's FP8 SDPA on (q, k, v) as an A/B contender ``(name, plan, call)``, or nothing (with
    a note) when nvidia-cudnn-frontend is missing or refuses the shape."""
    root = str(Path(__file__).resolve().parents[1])  # the repository root: benchmark.lab
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmark.lab import cudnn_fp8

    try:
        call, _ = cudnn_fp8.build(cudnn_fp8.load(), q, k, v)
    except cudnn_fp8.Unavailable as e:
        print(f"# {e}")
        return []
    return [(cudnn_fp8.ROW, plan, call)]


def time_rounds(contenders: list, rounds: int, warm_s: float, shape: tuple, q_choice: str, rows: list,
                sampler) -> None:
    """Each round, each ``(name, plan, call)`` in turn: the median of 20 isolated calls after
    ``warm_s`` seconds of calls (``bench.time_ms``) with the SM clock and board power of
    ``sampler``, printed and appended to ``rows`` (dense-equivalent TFLOPS = 4*S*S*128*H/t)."""
    from subblock_sage.tools import bench

    h, s = shape
    flops = 4 * s * s * 128 * h
    for rnd in range(rounds):
        for name, plan, fn in contenders:
            with sampler:
                ms = bench.time_ms(fn, reps=20, warm_s=warm_s)
            pw = sampler.summary()
            row = dict(round=rnd, contender=name, q=q_choice, plan=plan, H=h, S=s, ms=round(ms, 4),
                       dense_tflops=round(flops / ms / 1e9, 1), **(pw.as_row() if pw else {}))
            rows.append(row)
            print(f"{rnd} {name:32} {plan:18} H={h} S={s} {ms:8.4f} ms {row['dense_tflops']:7.1f} TF "
                  f"{row.get('MHz', '-')} MHz {row.get('W', '-')} W", flush=True)


def run_ab(argv, description: str, default_shapes: tuple, contenders_of, cudnn_plan: str, more_args=None) -> int:
    """The kernel A/B scripts' main (pair_ab.py, share3_ab.py, cluster_ab.py): per shape (B=1,
    D=128, random bf16 q/k/v), ``contenders_of(ns, h, s, q, k, v, rows)`` gives the
    ``(name, plan, call)`` rows to time (and may append check rows to ``rows``), cuDNN's FP8 SDPA
    joins as plan ``cudnn_plan``, and :func:`time_rounds` times them in turn. ``more_args(ap)``:
    the script's own options."""
    from subblock_sage.tools import power

    ap = argparse.ArgumentParser(description=description)
    ab_arguments(ap, " and ".join(f"{h},{s}" for h, s in default_shapes))
    if more_args is not None:
        more_args(ap)
    ns = ap.parse_args(argv)
    apply_q_choice(ns.q)
    shapes = [tuple(int(x) for x in sh.split(",")) for sh in ns.shape] if ns.shape else list(default_shapes)
    sampler = power.Sampler(torch.cuda.current_device())
    rows: list = []
    print(f"# {torch.cuda.get_device_name()} subblock_sage {subblock_sage.__version__}; ms (median of 20), "
          f"dense-equivalent TFLOPS, MHz, W")
    for h, s in shapes:
        q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        contenders = contenders_of(ns, h, s, q, k, v, rows) + cudnn_contender(q, k, v, cudnn_plan)
        time_rounds(contenders, ns.rounds, ns.warm_s, (h, s), ns.q, rows, sampler)
        del contenders
        q = k = v = None
        torch.cuda.empty_cache()
    write_rows(rows, ns.json)
    return 0


def write_rows(rows: list, path: str | None) -> None:
    """The result rows as JSON at ``path`` (``--json``; nothing when None): every benchmark
    script of this folder ends with it."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def _inputs(h: int, s: int, block: int, counts: bool, gen: torch.Generator):
    dev = "cuda"
    q, k, v = (torch.randn(1, s, h, 128, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(3))
    gq, gk = -(-s // 64), -(-s // block)
    keep = max(1, gk // 4)
    idx = torch.rand(1, h, gq, gk, device=dev, generator=gen).topk(keep, dim=-1).indices.int().contiguous()
    bc = torch.full((1, h, gq), keep, dtype=torch.int32, device=dev) if counts else None
    return q, k, v, idx, bc, keep


def host_us_per_call(call, n: int, rounds: int = 7) -> tuple[float, float]:
    """Median over ``rounds`` of (host time of ``n`` calls) / n, each round behind a fresh spinning
    kernel. ``n`` must keep the launches of one round well under the GPU's queue of pending
    launches (about a thousand): past it a launch blocks until the queue drains, and the figure
    becomes the spinning kernel's length (seen on the H200 with 200 Sage calls = ~1,400 launches:
    5.1 ms "per call", exactly 1 s / 200)."""
    for _ in range(n):  # warm: allocator pools, caches, branch predictors (the first round ran high)
        call()
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(1e9))  # ~0.5 s of GPU time at H200 clocks: the calls below only enqueue
        t = time.perf_counter()
        for _ in range(n):
            call()
        out.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return min(out), statistics.median(out)  # min: the path's own cost; median: with the host's noise


def eager_vs_graph_ms(call, n: int) -> tuple[float, float]:
    """ms per call of ``n`` calls back to back and of the same calls replayed from one CUDA graph
    (`subblock-sage bench`'s own timers: tools/bench.py)."""
    g = capture(call, n)
    return eager_ms(call, n, warmup=3), graph_ms(g, n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--calls", type=int, default=60, help="calls per round (keep calls x launches << 1000)")
    ns = ap.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} subblock_sage {subblock_sage.__version__}")
    print("host us/call: median of 7 rounds (min in parentheses); full path: library= given, no replay")
    print(f"{'mode':9} {'H':>3} {'S':>6} {'bk':>4} {'plan':7} {'launches':>8} {'host us/call':>14} "
          f"{'full path us':>15} {'eager ms':>9} {'graph ms':>9} {'eager/graph':>11}")
    for (h, s), mode, counts in ((sh, m, c) for sh in SHAPES for m in MODES for c in (True, False)):
        block = 128 if mode == "sage_fp8" else 64
        q, k, v, idx, bc, keep = _inputs(h, s, block, counts, gen)

        def call():
            return subblock_sage.sparse_attention(q, k, v, idx, bc, topk=None if counts else keep,
                                                  compute_mode=mode, block_size_k=block)

        lib = loader.library_for_device(torch.cuda.current_device())

        def full():
            return subblock_sage.sparse_attention(q, k, v, idx, bc, topk=None if counts else keep,
                                                  compute_mode=mode, block_size_k=block, library=lib)

        call()
        rep = replay.lookup(replay.signature(q, k, v, idx, bc, None, None if counts else keep, block,
                                             None, mode, "BSHD"))
        launches = len(rep.kernels) if isinstance(rep, replay.Replay) else None
        host_min, host = host_us_per_call(call, ns.calls)
        full_min, host_full = host_us_per_call(full, ns.calls)
        eager, graph = eager_vs_graph_ms(call, 20)
        row = dict(mode=mode, H=h, S=s, block_size_k=block, plan="counts" if counts else "topk",
                   launches=launches, replayed=isinstance(rep, replay.Replay),
                   host_us_per_call=round(host, 1), host_us_per_call_min=round(host_min, 1),
                   full_path_host_us_per_call=round(host_full, 1), full_path_host_us_per_call_min=round(full_min, 1),
                   eager_ms=round(eager, 4), graph_ms=round(graph, 4), eager_over_graph=round(eager / graph, 3))
        rows.append(row)
        print(f"{mode:9} {h:>3} {s:>6} {block:>4} {row['plan']:7} {launches!s:>8} {host:>7.1f} ({host_min:4.1f}) "
              f"{host_full:>7.1f} ({full_min:5.1f}) "
              f"{eager:>9.4f} {graph:>9.4f} {eager / graph:>11.2f}", flush=True)
    write_rows(rows, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
