"""The Sage kernel in two-CTA clusters (``cluster=2``: each K/V tile loaded once for query blocks
2c and 2c+1 by TMA multicast) against the one-CTA flat kernel and cuDNN's FP8 SDPA, alternated in
one run, on the dense plan (the case it is for) and two sparse ones (where no cluster shares: the
cost of the cluster launch and of the second code path).

The cluster kernel is the default 128-key Sage kernel; the one-CTA kernel ships beside it
(``k128_c1[qf]_cnt``, ``SM90Backend.sage_cluster = 1``): any build since the twenty-fifth session.

To run (GPU machine, wheels installed; cuDNN's row needs nvidia-cudnn-frontend):
    python benchmark/cluster_ab.py [--json PATH] [--rounds 3] [--warm-s 1] [--shape H,S ...] [--q auto|fused|int8]

Per shape (B=1, D=128, 128-key plans with block_counts, prepared by the runtime: dense rows are
then identical), each round times the kernel alone (``bench.kernel_only``: the attention
launch, quantizer and plan prepared once) for ``SM90Backend.sage_cluster`` 1 / 2 and cuDNN's FP8
SDPA, median of 20 isolated calls each after ``--warm-s`` seconds of calls (the 700 W cap:
METHOD.md), with the SM clock and board power NVML saw; first, the two kernels' outputs are
compared (bit-identical expected). FLOP convention of `subblock-sage bench`: dense-equivalent
TFLOPS = 4*Sq*Sk*D*H/t.
"""

from __future__ import annotations

import argparse

import torch

import subblock_sage
from subblock_sage.backends.sm90 import BACKEND
from subblock_sage.tools import bench, cudnn_fp8, power

from host_time import add_q_choice, apply_q_choice, write_rows  # benchmark/host_time.py (this script's folder)

PLANS = (("1.0", 1.0, "random"), ("0.25 random", 0.25, "random"), ("0.25 local+random", 0.25, "local"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-s", type=float, default=1.0, help="seconds of calls before each timed row")
    ap.add_argument("--shape", action="append", metavar="H,S", help="default: 14,37760 and 2,37760")
    add_q_choice(ap)
    ns = ap.parse_args(argv)
    apply_q_choice(ns.q)
    shapes = [tuple(int(x) for x in sh.split(",")) for sh in ns.shape] if ns.shape else [(14, 37760), (2, 37760)]
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
        contenders = []
        for plan, density, kind in PLANS:
            idx, cnt = bench.make_plan(1, h, s, s, density, kind, block_size_k=128)
            outs = {}
            for cl in (1, 2):
                BACKEND.sage_cluster = cl  # forced either way (the default picks by the plan's capacity)
                # check_plan=True: the full path (a replay would repeat the other kernel's launch)
                outs[cl] = subblock_sage.sparse_attention(q, k, v, idx, cnt, block_size_k=128, check_plan=True)
                contenders.append((f"sage kernel cluster={cl}", plan,
                                   bench.kernel_only(q, k, v, idx, cnt, 128, "sage_fp8")))
            BACKEND.sage_cluster = None
            torch.cuda.synchronize()
            same = torch.equal(outs[1], outs[2])
            diff = float((outs[1].float() - outs[2].float()).abs().max())
            print(f"# H={h} S={s} {plan}: cluster=2 output {'bit-identical to' if same else 'DIFFERS from'} "
                  f"cluster=1 (max |diff| {diff})", flush=True)
            rows.append(dict(contender="check", plan=plan, H=h, S=s, identical=same, max_diff=diff))
            del outs
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
        del contenders
        q = k = v = None
        torch.cuda.empty_cache()
    write_rows(rows, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
