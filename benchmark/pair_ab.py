"""The 64-key plan on the Sage kernel (the paired kernel: two 64-key entries per 128-key tile)
against the 128-key kernel and cuDNN's FP8 SDPA, alternated in one run.

Ablations of the paired kernel timed here (an experiments build) show that its second entry's id
loads and checks cost nothing and that loading V as one 128-key box (the 128-key kernel's V layout)
recovers all of the 1.6 % it loses on a dense plan otherwise; the shipped paired kernel does that
for the tiles of a dense row whose ids are 2j, 2j+1 (``producer.whole_pair``). This script times a
build against an older one through ``benchmark/device_run.sh pairab`` (old, new[, alt], old,
new[, alt]: any builds).

To run (GPU machine, wheels installed; cuDNN's row needs nvidia-cudnn-frontend):
    python benchmark/pair_ab.py [--json PATH] [--rounds 3] [--warm-s 1] [--shape H,S ...]

Per shape (B=1, D=128, plans with block_counts: the 128-key dense plan, the 64-key dense, 0.25
random and 0.25 local+random plans), each round times the attention kernel alone
(``bench.kernel_only``), median of 20 isolated calls each after ``--warm-s`` seconds of calls
(the 700 W cap: METHOD.md), with the SM clock and board power NVML saw. FLOP convention of
`subblock-sage bench`: dense-equivalent TFLOPS = 4*Sq*Sk*D*H/t.
"""

from __future__ import annotations



from subblock_sage.tools import bench

from host_time import run_ab  # benchmark/host_time.py (this script's folder)

# (plan name, block_size_k, density, kind of bench.make_plan)
PLANS = (("1.0", 128, 1.0, "random"), ("1.0", 64, 1.0, "random"), ("0.25 random", 64, 0.25, "random"),
         ("0.25 local+random", 64, 0.25, "local"))


def contenders(ns, h, s, q, k, v, rows) -> list:
    out = []
    for plan_name, bk, density, kind in PLANS:
        idx, cnt = bench.make_plan(1, h, s, s, density, kind, block_size_k=bk)
        out.append((f"sage k{bk}", plan_name, bench.kernel_only(q, k, v, idx, cnt, bk, "sage_fp8")))
    return out


def main(argv=None) -> int:
    return run_ab(argv, __doc__.splitlines()[0], ((14, 37760),), contenders, "1.0")


if __name__ == "__main__":
    raise SystemExit(main())
