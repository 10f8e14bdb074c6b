"""Our kernels and their contenders under a profiler (ncu), one launch each. Three sets:

- ``sage`` (default): the dense Sage kernel and cuDNN's FP8 SDPA: where the energy of a call goes
  (the dense kernel runs at 0.95-0.97x cuDNN's FP8 SDPA at H=14 S=37760 under the 700 W cap, with
  the same cycles and a 3-5 % lower clock, i.e. more energy per cycle);
- ``bf16``: our bf16 kernel and cuDNN frontend's SM90 bf16 block-sparse kernel (AOT, the test
  library in $SUBBLOCK_SAGE_TEST_LIBS) on the same 64-key plans, 0.25 random and dense: cuDNN's
  is 3-10 % faster at H=2 (MEASUREMENTS.md, 2026-12-07); counters say whether by occupancy,
  memory traffic or instructions;
- ``router``: one ``route`` per geometry (64-key bf16 and 128-key Sage cells): ``router_pool`` and
  ``router_select``, the latter latency-bound at four warps per scheduler at H=14 S=37760.

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


def bf16_contenders(q, k, v, h: int, s: int):
    """Our bf16 kernel alone and cuDNN's SM90 bf16 block-sparse kernel on the same plans (per-row
    counts); cuDNN's is reported and skipped where the test library is absent."""
    from benchmark.lab import contenders as ctd

    try:
        cudnn = ctd.load_cudnn_sm90(ctd.test_libs_dir(None))
    except ctd.Unavailable as e:
        print(f"# {e}")
        cudnn = None
    out = []
    for density in (0.25, 1.0):
        idx, cnt = bench.make_plan(1, h, s, s, density, "random", block_size_k=64)
        out.append((f"bf16 {density} random bk64", bench.kernel_only(q, k, v, idx, cnt, 64, "bf16")))
        if cudnn is not None:
            out.append((f"cudnn bsa bf16 {density} random bk64",
                        ctd.build_cudnn_bsa_bf16(cudnn, q, k, v, idx, cnt).call))
    return out


def router_contenders(q, k, v, h: int, s: int):
    """One ``route`` per geometry of this GPU's modes (its pooling and select launches)."""
    import subblock_sage
    from subblock_sage.ops.pipeline import geometry
    from subblock_sage.router_spec import default_n_k

    out = []
    for mode in ("bf16", "sage_fp8"):
        bk, g = geometry("cuda:0", mode)
        kw = dict(sparsity=0.75, n_q=4, n_k=default_n_k(bk), block_size_k=bk, budget_granularity=g)
        out.append((f"route {mode} bk{bk}", lambda kw=kw: subblock_sage.route(q, k, **kw)))
    return out


SETS = {"sage": contenders, "bf16": bf16_contenders, "router": router_contenders}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="14,37760", metavar="H,S")
    ap.add_argument("--set", choices=SETS, default="sage", help="which kernels (the module docstring)")
    add_q_choice(ap)
    ns = ap.parse_args(argv)
    apply_q_choice(ns.q)
    h, s = (int(x) for x in ns.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    runs = SETS[ns.set](q, k, v, h, s)
    for name, fn in runs:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    for i, (name, fn) in enumerate(runs):
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled call {i}: {name} (H={h} S={s}, set {ns.set})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
