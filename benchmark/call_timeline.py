"""Where one timed call's time goes: a torch.profiler (CUPTI) timeline of isolated calls, the GPU
idle before each, as `subblock-sage bench` times its "whole call" row (issue 19: the one-call
ratio at H=2 S=37760 is the whole call's host path up to the first kernel plus the kernels).

To run (GPU machine, wheels installed):
    python benchmark/call_timeline.py [--json PATH] [--shape H,S ...] [--mode sage_fp8 ...] [--calls 30]

For each shape and mode (B=1, D=128, a random 0.25 plan with block_counts; Sage with 128-key
blocks, bf16 with 64-key blocks) it times ``calls`` calls, each ``a.record(); call(); b.record();
b.synchronize()``, and prints the medians, in us from the host entering ``a.record()``: when
the host entered the first launch API and left the last one, when each kernel
started and how long it ran, the gaps between kernels, and when the last kernel ended; the same
for the attention kernel alone (``bench.kernel_only``: one launch), whose one-call time is the
bench's "kernel only" row. GPU timestamps are CUPTI's, on the host clock. Before the timeline of
each case, ``host_stages``: the replayed call's host stages timed with perf_counter, and the
fifteenth session's path beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

import subblock_sage
from subblock_sage.tools import bench

from host_time import add_q_choice, apply_q_choice, before_call, call_cases, write_rows  # benchmark/host_time.py (this script's folder)

MODES = (("sage_fp8", 128), ("bf16", 64))
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
               "cudaLaunchKernelEx", "cudaLaunchCooperativeKernel")


def _trace(fn, calls: int):
    """Chrome-trace events of ``calls`` isolated, event-timed calls of ``fn``. Only the CUDA
    activity is traced (runtime API calls and kernels, CUPTI), so that the host path runs at its
    own speed (the CPU activity's per-operator records cost several us each)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            a.record()
            fn()
            b.record()
            b.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]
    finally:
        os.unlink(path)


def _windows(events):
    """Per call: its start (the host entering the first event record), the host leaving the
    second, its launch API events and its GPU kernels (host clock, us)."""
    recs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and e.get("name", "").startswith("cudaEventRecord"))
    apis = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and e.get("name", "").split("_")[0] in LAUNCH_APIS)
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") == "kernel")
    out = []
    starts = recs[0::2]
    for i, (t0, _) in enumerate(starts):
        t1 = recs[2 * i + 1][1] if 2 * i + 1 < len(recs) else t0
        nxt = starts[i + 1][0] if i + 1 < len(starts) else float("inf")
        out.append((t0, t1, [x for x in apis if t0 <= x[0] < t1], [k for k in kernels if t0 <= k[0] < nxt]))
    return out


def api_names(events) -> list:
    return sorted({e.get("name", "") for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")})


def summarize(events) -> dict:
    """Medians over the calls (us from the call's start: the host entering its first event record)."""
    wins = [w for w in _windows(events) if w[2] and w[3]]
    if not wins:
        return {"error": "no launches or kernels in the trace", "apis": api_names(events)}
    nk = statistics.mode(len(w[3]) for w in wins)
    wins = [w for w in wins if len(w[3]) == nk]
    med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
    t0, t1 = wins[len(wins) // 2][:2]
    seq = [e["name"] for e in sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                                      and t0 <= e["ts"] <= t1), key=lambda e: e["ts"])]
    row = {"calls": len(wins), "kernels": nk, "names": [k[2][:60] for k in wins[0][3]], "api_sequence": seq,
           "host_us": med([t1 - t0 for t0, t1, _, _ in wins]),
           "first_launch_api_us": med([apis[0][0] - t0 for t0, _, apis, _ in wins]),
           "last_launch_api_end_us": med([apis[-1][1] - t0 for t0, _, apis, _ in wins]),
           "launch_api_us": med([sum(x[1] - x[0] for x in apis) / len(apis) for _, _, apis, _ in wins]),
           "kernel_start_us": [med([ks[j][0] - t0 for t0, _, _, ks in wins]) for j in range(nk)],
           "kernel_us": [med([ks[j][1] - ks[j][0] for _, _, _, ks in wins]) for j in range(nk)],
           "gaps_us": [med([ks[j + 1][0] - ks[j][1] for _, _, _, ks in wins]) for j in range(nk - 1)],
           "last_end_us": med([ks[-1][1] - t0 for t0, _, _, ks in wins])}
    return row


def host_stages(q, k, v, idx, cnt, mode: str, bk: int, calls: int) -> dict:
    """The replay path's host time for one call, the GPU idle before it (as in a one-call
    timing), timed with perf_counter: the key and pointers (``replay.keyed``), the cache lookup
    and the replay itself (``Replay.launch``: the stream's workspace and spare, the launches, the
    next spare); and, for comparison in the same run, the replay as it was before the sixteenth
    session (``host_time.before_call``; run 68 timed its parts one by one). Medians in us."""
    import time

    from subblock_sage import replay

    subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode=mode, block_size_k=bk)  # recorded
    now = time.perf_counter_ns
    stages = {n: [] for n in ("signature", "lookup", "replay", "total", "before: replay")}
    keyed = getattr(replay, "keyed", None)  # None: a runtime before the twenty-seventh session (timelineab)
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = now()
        if keyed is not None:
            key, ptrs = keyed(q, k, v, idx, cnt, None, None, bk, None, mode, "BSHD")
        else:
            key = replay.signature(q, k, v, idx, cnt, None, None, bk, None, mode, "BSHD")
        t1 = now()
        hit = replay.lookup(key)
        t2 = now()
        if keyed is not None:
            assert hit.launch(ptrs, None) is not None
        else:
            assert hit(q, k, v, idx, cnt, None) is not None
            ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), idx.data_ptr(), cnt.data_ptr(), 0)
        t3 = now()
        for n, a, b in (("signature", t0, t1), ("lookup", t1, t2), ("replay", t2, t3), ("total", t0, t3)):
            stages[n].append((b - a) / 1e3)
        torch.cuda.synchronize()
        t4 = now()
        assert before_call(hit, ptrs, None) is not None
        stages["before: replay"].append((now() - t4) / 1e3)
    torch.cuda.synchronize()
    return {n: round(statistics.median(x), 2) for n, x in stages.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--shape", action="append", metavar="H,S", help="only these shapes (default: the host shapes)")
    ap.add_argument("--mode", action="append", choices=[m for m, _ in MODES], help="only these modes")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--bk", type=int, action="append", choices=(64, 128),
                    help="key block sizes to run every mode at (default: Sage 128, bf16 64)")
    add_q_choice(ap)
    ns = ap.parse_args(argv)
    apply_q_choice(ns.q)
    modes = MODES if not ns.bk else tuple((m, bk) for m, _ in MODES for bk in ns.bk)
    rows = []
    print(f"# {torch.cuda.get_device_name()} subblock_sage {subblock_sage.__version__}; us from the call's start; "
          f"Sage Q: {ns.q}")
    for h, s, mode, bk, (q, k, v, idx, cnt), call in call_cases(ns.shape, ns.mode, modes):
        rows.append({"mode": mode, "H": h, "S": s, "block_size_k": bk, "what": "host stages, us",
                     **host_stages(q, k, v, idx, cnt, mode, bk, ns.calls)})
        print(json.dumps(rows[-1]), flush=True)
        kern = bench.kernel_only(q, k, v, idx, cnt, bk, mode)
        for what, fn in (("whole", call), ("kernel", kern)):
            row = {"mode": mode, "H": h, "S": s, "block_size_k": bk, "what": what, **summarize(_trace(fn, ns.calls))}
            rows.append(row)
            print(json.dumps(row), flush=True)
    write_rows(rows, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
