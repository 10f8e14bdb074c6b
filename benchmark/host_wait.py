"""How the host waits for the GPU before one timed call, and what that does to the call's host
path: `subblock-sage bench`'s one-call rows (``bench.time_ms``: events around one call, the GPU
idle before it) block on the end event of the previous call, and right after such a wait the host
ran the call's Python path 1.3-6x slower than back to back on the lent H200 hosts (runs 68-69),
which decides the one-call whole/kernel ratio at H=2 S=37760 (issue 19's 1.10 bar: 1.058-1.125
from run to run, 1.005 back to back; MEASUREMENTS.md twenty-sixth session).

To run (GPU machine, wheels installed):
    python benchmark/host_wait.py [--json PATH] [--rounds 3] [--shape H,S ...] [--mode sage_fp8|bf16 ...]

Per shape (B=1, D=128, a random 0.25 plan with block_counts, 128-key blocks) and mode, the whole
call (public ``sparse_attention``, a replay) and the kernel alone (``bench.kernel_only``) are
timed as ``bench.time_ms`` does (median of 20 isolated calls, start event, call, end event; the
host time of each call by perf_counter), with three ways to wait for each call's end event before
the next: ``sync`` (``Event.synchronize``, the bench's), ``poll`` (a loop of ``Event.query``: the
thread never leaves the CPU) and ``sleep`` (``time.sleep(0.002)`` then ``synchronize``: the
thread sleeps first). The ways alternate within each round, so all share one power state.
Prints ms, whole/kernel and host us per row.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from subblock_sage.tools import bench

from host_time import call_cases, write_rows  # benchmark/host_time.py (this script's folder)


def _poll(ev) -> None:
    while not ev.query():
        pass


def _sleep(ev) -> None:
    time.sleep(0.002)
    ev.synchronize()


# how each call's end event is waited for; None: bench.time_ms's own Event.synchronize
WAITS = {"sync": None, "poll": _poll, "sleep": _sleep}


def isolated_ms(fn, how: str, reps: int = 20) -> tuple[float, float]:
    """(median ms, median host us) of ``reps`` isolated calls of ``fn`` (``bench.time_ms``, no
    further warm-up), each after waiting for the previous one ``how`` (``WAITS``)."""
    host: list = []
    ms = bench.time_ms(fn, warmup=0, reps=reps, host_us=host, wait=WAITS[how])
    return ms, statistics.median(host)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-s", type=float, default=1.0, help="seconds of calls before each case")
    ap.add_argument("--shape", action="append", metavar="H,S", help="default: 2,37760")
    ap.add_argument("--mode", action="append", choices=("sage_fp8", "bf16"))
    ns = ap.parse_args(argv)
    rows: list = []
    print(f"# {torch.cuda.get_device_name()}; ms: median of 20 isolated calls; host us: perf_counter around each")
    for h, s, mode, bk, (q, k, v, idx, cnt), call in call_cases(ns.shape or ["2,37760"], ns.mode,
                                                                  (("sage_fp8", 128), ("bf16", 128))):
        kernel = bench.kernel_only(q, k, v, idx, cnt, bk, mode)
        for name, fn in (("whole", call), ("kernel", kernel)):
            bench._warm(fn, 3, ns.warm_s)
        for rnd in range(ns.rounds):
            for how in WAITS:
                got = {name: isolated_ms(fn, how) for name, fn in (("whole", call), ("kernel", kernel))}
                (w, wh), (kk, kh) = got["whole"], got["kernel"]
                row = dict(round=rnd, wait=how, mode=mode, H=h, S=s, bk=bk, whole_ms=round(w, 4),
                           kernel_ms=round(kk, 4), ratio=round(w / kk, 3), whole_host_us=round(wh, 1),
                           kernel_host_us=round(kh, 1))
                rows.append(row)
                print(f"{rnd} {mode:8} H={h} S={s} bk{bk} wait={how:5} whole {w:.4f} ms (host {wh:6.1f} us)  "
                      f"kernel {kk:.4f} ms (host {kh:5.1f} us)  whole/kernel {w / kk:.3f}", flush=True)
    write_rows(rows, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
