"""The dense Sage kernel and cuDNN's FP8 SDPA under a profiler (ncu), one launch each: where the
energy of a call goes (the dense kernel runs at 0.95-0.97x cuDNN's FP8 SDPA at H=14 S=37760
under the 700 W cap, with the same cycles and a 3-5 % lower clock, i.e. more energy per cycle).

Makes the inputs and every contender (``bench.kernel_only``: the attention launch alone, the
quantizer and plan prepared once; cuDNN's ``sdpa_fp8`` through nvidia-cudnn-frontend when
installed), warms each up, then runs each once between ``cudaProfilerStart/Stop``, in the order
printed, so that ``ncu --profile-from-start off`` sees exactly one launch per contender. Counts to
compare (ncu locks the clock, so cycles are comparable): instructions executed per pipe, L2 and
shared-memory traffic, tensor-pipe activity, stall reasons. No disassembly: counters only.

To run (GPU machine, wheels installed):
    ncu --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section InstructionStats --section WarpStateStats \
        python benchmark/kernel_profile.py [--shape H,S] [--q auto|fused|int8]

Contenders (B=1, D=128, dense plans with block_counts): the flat Sage kernel on a 128-key plan, the
paired one on a 64-key plan, the three-warpgroup kernel (``SelectionPolicy(label="f3")``; only in an
experiments build, else skipped) and cuDNN's FP8 SDPA (FP8 output).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from subblock_sage.backends.sm90 import BACKEND
from subblock_sage.errors import LaunchError
from subblock_sage.tools import bench

from host_time import add_q_choice, apply_q_choice  # benchmark/host_time.py (this script's folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmark.lab
from benchmark.lab import cudnn_fp8  # noqa: E402


def contenders(q, k, v, h: int, s: int):
    """(name, launch) pairs; a contender that this build or machine lacks is reported and skipped."""
    out = []
    for bk in (128, 64):
        idx, cnt = bench.make_plan(1, h, s, s, 1.0, "random", block_size_k=bk)
        out.append((f"sage flat dense bk{bk}", bench.kernel_only(q, k, v, idx, cnt, bk, "sage_fp8")))
    idx, cnt = bench.make_plan(1, h, s, s, 1.0, "random", block_size_k=128)
    f3 = BACKEND.with_policy(label="f3")
    try:
        # make_plan's dense rows are in random orders (no two alike: own buffers); sorted, they are
        # identical and the three warpgroups of a CTA share the K/V ring
        out.append(("sage flat_wgs=3 dense bk128", bench.kernel_only(q, k, v, idx, cnt, 128, "sage_fp8", backend=f3)))
        srt = idx.sort(dim=-1).values.contiguous()
        out.append(("sage flat_wgs=3 dense sorted bk128",
                    bench.kernel_only(q, k, v, srt, cnt, 128, "sage_fp8", backend=f3)))
        out.append(("sage flat dense sorted bk128", bench.kernel_only(q, k, v, srt, cnt, 128, "sage_fp8")))
    except (LookupError, LaunchError) as e:  # not an experiments build
        print(f"# flat_wgs=3 skipped: {str(e).splitlines()[0]}")
    try:
        call, _ = cudnn_fp8.build(cudnn_fp8.load(), q, k, v)
        out.append((cudnn_fp8.ROW, call))
    except cudnn_fp8.Unavailable as e:
        print(f"# {e}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="14,37760", metavar="H,S")
    add_q_choice(ap)
    ns = ap.parse_args(argv)
    apply_q_choice(ns.q)
    h, s = (int(x) for x in ns.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    runs = contenders(q, k, v, h, s)
    for name, fn in runs:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    for i, (name, fn) in enumerate(runs):
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled launch {i}: {name} (H={h} S={s}, dense)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
