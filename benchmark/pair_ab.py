"""The 64-key plan on the Sage kernel (the paired kernel: two 64-key entries per 128-key tile)
against the 128-key kernel and cuDNN's FP8 SDPA, alternated in one run (twenty-fourth session).

Run 110 timed ablations of the paired kernel here (commit aeb7cb6, an experiments build): taking
out its second entry's id loads and checks bought nothing, loading V as one 128-key box (the
128-key kernel's V layout) bought all of the 1.6 % it lost on a dense plan. Since then the
shipped paired kernel does that for the tiles of a dense row whose ids are 2j, 2j+1
(``producer.whole_pair``: runs 111-114); this script times a build against an older one through
``benchmark/device_run.sh pairab`` (old, new[, alt], old, new[, alt]: any builds).

To run (GPU machine, wheels installed; cuDNN's row needs nvidia-cudnn-frontend):
    python benchmark/pair_ab.py [--json PATH] [--rounds 3] [--warm-s 1] [--shape H,S ...]

Per shape (B=1, D=128, plans with block_counts: the 128-key dense plan, the 64-key dense, 0.25
random and 0.25 local+random plans), each round times the attention kernel alone
(``bench.kernel_only``), median of 20 isolated calls each after ``--warm-s`` seconds of calls
(the 700 W cap: METHOD.md), with the SM clock and board power NVML saw. FLOP convention of
`subblock-sage bench`: dense-equivalent TFLOPS = 4*Sq*Sk*D*H/t.
"""

from __future__ import annotations

import argparse

import torch

import subblock_sage
from subblock_sage.tools import bench, cudnn_fp8, power

from host_time import add_q_choice, apply_q_choice, write_rows  # benchmark/host_time.py (this script's folder)

# (plan name, block_size_k, density, kind of bench.make_plan)
PLANS = (("1.0", 128, 1.0, "random"), ("1.0", 64, 1.0, "random"), ("0.25 random", 64, 0.25, "random"),
         ("0.25 local+random", 64, 0.25, "local"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-s", type=float, default=1.0, help="seconds of calls before each timed row")
    ap.add_argument("--shape", action="append", metavar="H,S", help="default: 14,37760")
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
        contenders = []
        for plan_name, bk, density, kind in PLANS:
            idx, cnt = bench.make_plan(1, h, s, s, density, kind, block_size_k=bk)
            contenders.append((f"sage k{bk}", plan_name, bench.kernel_only(q, k, v, idx, cnt, bk, "sage_fp8")))
        if cudnn is not None:
            try:
                call, _ = cudnn_fp8.build(cudnn, q, k, v)
                contenders.append((cudnn_fp8.ROW, "1.0", call))
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
