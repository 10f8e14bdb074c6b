"""The Sage kernel with three warpgroups per CTA (``flat_wgs=3``: K/V loads shared by identical
plan rows) against the one-warpgroup flat kernel and cuDNN's FP8 SDPA, alternated in one run.

The flat_wgs=3 kernels are timing experiments: the library must be an experiments build (CMake
``-DSBS_EXPERIMENTS=ON``; run 62 measured a build that listed them as shipped variants), except
with ``--flat-only``, which times only the shipped flat kernel (any build).

To run (GPU machine, wheels installed; cuDNN's row needs nvidia-cudnn-frontend):
    python benchmark/share3_ab.py [--json PATH] [--rounds 3] [--warm-s 1] [--shape H,S ...] [--flat-only]

Per shape and plan (B=1, D=128, 128-key plans with block_counts: dense, 0.25 random, 0.25
local+random, each as given and with its rows sorted by the caller), each round times the kernel alone (``bench.kernel_only``: the attention launch,
quantizer and plan prepared once) for ``SM90Backend.sage_share3`` False / True, and cuDNN's FP8
SDPA on the dense shape, median of 20 isolated calls each after ``--warm-s`` seconds of calls
(the 700 W cap: METHOD.md), with the SM clock and board power NVML saw. ``--q``: Q as the runtime
chooses (auto: the Q-fused kernels at these shapes), always Q-fused, or INT8 Q from the quantizer. FLOP convention of `subblock-sage bench`: dense-equivalent
TFLOPS = 4*Sq*Sk*D*H/t.
"""

from __future__ import annotations

import argparse

import torch

import subblock_sage
from subblock_sage.backends.sm90 import BACKEND
from subblock_sage.tools import bench, cudnn_fp8, power

from host_time import add_q_choice, apply_q_choice, write_rows  # benchmark/host_time.py (this script's folder)

# (name, density, kind of bench.make_plan): each also as "<name> sorted" (ids sorted in each row
# by the caller). make_plan's dense rows list every block in a random order of their own, so the
# three rows of a CTA never match and flat_wgs=3 runs on its own buffers (twenty-second session:
# ncu saw the same L2 bytes as the flat kernel); the sorted dense plan is the one whose rows are
# identical, the case the shared ring is for. Since the twenty-third session the plan preparation
# sorts every row itself (aot/kernels/plan_prepare.py), so "as given" and "sorted" rows time the
# same kernel on the same prepared plan with such a build, and differ with an older one.
PLANS = (("1.0", 1.0, "random"), ("0.25 random", 0.25, "random"), ("0.25 local+random", 0.25, "local"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-s", type=float, default=1.0, help="seconds of calls before each timed row")
    ap.add_argument("--shape", action="append", metavar="H,S", help="default: 14,37760")
    ap.add_argument("--flat-only", action="store_true",
                    help="only the shipped flat kernel (any build): plans as given against sorted by the caller")
    add_q_choice(ap)
    ns = ap.parse_args(argv)
    apply_q_choice(ns.q)
    shapes = [tuple(int(x) for x in sh.split(",")) for sh in ns.shape] if ns.shape else [(14, 37760)]
    try:
        cudnn = cudnn_fp8.load()
    except cudnn_fp8.Unavailable as e:
        print(f"# {e}")
        cudnn = None
    sampler = power.Sampler(torch.cuda.current_device())
    rows = []
    print(f"# {torch.cuda.get_device_name()} subblock_sage {subblock_sage.__version__}; ms (median of 20), "
          f"dense-equivalent TFLOPS, MHz, W")
    for h, s in shapes:
        q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * s * s * 128 * h
        kernels = {}
        for base_name, density, kind in PLANS:
            given, cnt = bench.make_plan(1, h, s, s, density, kind, block_size_k=128)
            for plan_name, idx in ((base_name, given), (f"{base_name} sorted", given.sort(dim=-1).values.contiguous())):
                for share in (False,) if ns.flat_only else (False, True):
                    BACKEND.sage_share3 = share
                    kernels[(plan_name, share)] = bench.kernel_only(q, k, v, idx, cnt, 128, "sage_fp8")
                BACKEND.sage_share3 = False
        contenders = [(f"sage kernel {'flat_wgs=3' if sh else 'flat'}", p, fn) for (p, sh), fn in kernels.items()]
        if cudnn is not None:
            try:
                call, _ = cudnn_fp8.build(cudnn, q, k, v)
                contenders.append((cudnn_fp8.ROW, "dense", call))
            except cudnn_fp8.Unavailable as e:
                print(f"# {e}")
        for rnd in range(ns.rounds):
            for name, plan, fn in contenders:
                with sampler:
                    ms = bench.time_ms(fn, reps=20, warm_s=ns.warm_s)
                pw = sampler.summary()
                row = dict(round=rnd, contender=name, q=ns.q, plan=plan, H=h, S=s, ms=round(ms, 4),
                           dense_tflops=round(flops / ms / 1e9, 1), **(pw.as_row() if pw else {}))
                rows.append(row)
                print(f"{rnd} {name:32} {plan:18} H={h} S={s} {ms:8.4f} ms {row['dense_tflops']:7.1f} TF "
                      f"{row.get('MHz', '-')} MHz {row.get('W', '-')} W", flush=True)
        del kernels, contenders
        q = k = v = None
        torch.cuda.empty_cache()
    write_rows(rows, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
