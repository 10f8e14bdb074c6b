"""Whole call against kernel, the three ways issue 19 reads it: one timed call (the GPU idle
before it, so the host path up to the first launch counts), 20 calls back to back, and the same
20 calls replayed from a CUDA graph; each against one timed call of the attention kernel alone.
A short A/B harness for changes to the gaps between a call's launches (programmatic dependent
launch, thirteenth session): run it once per installed build, alternating, in one device run.

To run (GPU machine, wheels installed):
    python benchmark/call_gaps.py [--json PATH] [--warm-s 0.5] [--shape H,S ...] [--mode sage_fp8 ...] [--path before]

``--path before``: replayed calls take the host path as it was before the sixteenth session (two
``torch.empty`` per call, the workspace and the result, then every launch in one ``run_steps``),
for an A/B against the current one (the stream's workspace, the launches that do not write the
result before it is allocated) in one device run.

Shapes: README's host-cost shapes (`subblock-sage bench --shapes host`), B=1, D=128, a random
0.25-density plan with block_counts; Sage with 128-key blocks, bf16 with 64- and 128-key blocks. Timers:
`subblock_sage.tools.bench` (CUDA events; medians).
"""

from __future__ import annotations

import argparse

import torch

import subblock_sage
from subblock_sage import replay
from subblock_sage.tools import bench

from host_time import add_q_choice, apply_q_choice, before_call, call_cases, write_rows  # benchmark/host_time.py (this script's folder)

MODES = (("sage_fp8", 128), ("bf16", 64), ("bf16", 128))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--warm-s", type=float, default=0.5, help="seconds of calls before each timed row")
    ap.add_argument("--shape", action="append", metavar="H,S", help="only these shapes (default: the host shapes)")
    ap.add_argument("--mode", action="append", choices=[m for m, _ in MODES], help="only these modes")
    ap.add_argument("--path", choices=("current", "before"), default="current",
                    help="the replayed calls' host path (see the module docstring)")
    add_q_choice(ap)
    ns = ap.parse_args(argv)
    apply_q_choice(ns.q)
    if ns.path == "before":
        replay.Replay.launch = before_call
    rows = []
    print(f"# {torch.cuda.get_device_name()} subblock_sage {subblock_sage.__version__}; ms; ratios against 'kernel'; "
          f"Sage Q: {ns.q}; host path: {ns.path}")
    print(f"{'mode':9} {'H':>3} {'S':>6} {'bk':>4} {'kernel':>8} {'single':>8} {'eager20':>8} {'graph20':>8} "
          f"{'single/k':>8} {'eager/k':>8} {'graph/k':>8}")
    for h, s, mode, bk, (q, k, v, idx, cnt), call in call_cases(ns.shape, ns.mode, MODES):
        kern = bench.kernel_only(q, k, v, idx, cnt, bk, mode)
        t_k = bench.time_ms(kern, reps=30, warm_s=ns.warm_s)
        t_1 = bench.time_ms(call, reps=30, warm_s=ns.warm_s)
        t_e = bench.eager_ms(call, 20, warm_s=ns.warm_s)
        t_g = bench.graph_ms(bench.capture(call, 20), 20, warm_s=ns.warm_s)
        row = dict(mode=mode, q=ns.q, path=ns.path, H=h, S=s, block_size_k=bk, kernel_ms=round(t_k, 4), single_ms=round(t_1, 4),
                   eager20_ms=round(t_e, 4), graph20_ms=round(t_g, 4))
        rows.append(row)
        print(f"{mode:9} {h:>3} {s:>6} {bk:>4} {t_k:8.4f} {t_1:8.4f} {t_e:8.4f} {t_g:8.4f} "
              f"{t_1 / t_k:8.3f} {t_e / t_k:8.3f} {t_g / t_k:8.3f}", flush=True)
    write_rows(rows, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
