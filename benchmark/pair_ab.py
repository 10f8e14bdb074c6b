"""What the 64-key plan costs the Sage kernel on a dense plan: the paired kernel (two 64-key
entries per 128-key tile) against the 128-key kernel, its ablations and cuDNN's FP8 SDPA,
alternated in one run (twenty-fourth session).

The ablations (``k64_pair{lean,vtile,leanvtile}[_qf]_cnt``, ``aot/kernels/sm90/ablation.py``)
need an experiments build of the library (CMake ``-DSBS_EXPERIMENTS=ON``); without one only the
shipped kernels and cuDNN are timed. ``lean``: entry 2t+1 taken to be block(2t) + 1 (no second id
load, check or refill id); ``vtile``: V of a tile loaded as one 128-key box in the 128-key
kernel's layout; ``leanvtile`` both. They are right only on rows 0, 1, 2, ... (a dense plan,
which plan preparation sorts), so each ablation's output is compared with the shipped paired
kernel's before it is timed (``max |diff|`` column; the run stops if it is not 0).

To run (GPU machine, wheels installed; cuDNN's row needs nvidia-cudnn-frontend):
    python benchmark/pair_ab.py [--json PATH] [--rounds 3] [--warm-s 1] [--shape H,S ...]

Per shape (B=1, D=128, dense plans with block_counts), each round times the attention kernel
alone (``bench.kernel_only``), median of 20 isolated calls each after ``--warm-s`` seconds of
calls (the 700 W cap: METHOD.md), with the SM clock and board power NVML saw. FLOP convention of
`subblock-sage bench`: dense-equivalent TFLOPS = 4*Sq*Sk*D*H/t.
"""

from __future__ import annotations

import argparse

import torch

import subblock_sage
from subblock_sage.backends.sm90 import BACKEND
from subblock_sage.tools import bench, cudnn_fp8, power

from host_time import add_q_choice, apply_q_choice, write_rows  # benchmark/host_time.py (this script's folder)

ABLATIONS = ("lean", "vtile", "leanvtile")


def kernel_with(ablate, q, k, v, idx, cnt, bk):
    """bench.kernel_only with the variant parameter ``pair_ablate`` added (None: shipped)."""
    shipped = BACKEND.params

    def params(mode, block_size_k, q_fused=False):
        p = shipped(mode, block_size_k, q_fused)
        if ablate is not None:
            p["pair_ablate"] = ablate
        return p

    BACKEND.params = params
    try:
        return bench.kernel_only(q, k, v, idx, cnt, bk, "sage_fp8")
    finally:
        BACKEND.params = shipped


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
        for bk in (128, 64):
            idx, cnt = bench.make_plan(1, h, s, s, 1.0, "random", block_size_k=bk)
            contenders.append((f"sage k{bk}", kernel_with(None, q, k, v, idx, cnt, bk)))
            if bk != 64:
                continue
            ref_fn = contenders[-1][1]
            ref_fn()
            ref = ref_fn.keep[2].clone()
            for tag in ABLATIONS:
                try:
                    fn = kernel_with(tag, q, k, v, idx, cnt, bk)
                except Exception as e:  # noqa: BLE001 - a build without the experiments
                    print(f"# k64 pair{tag}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                fn()
                diff = (fn.keep[2].float() - ref.float()).abs().max().item()
                print(f"# k64 pair{tag}: max |diff| vs the shipped paired kernel {diff}")
                if diff != 0.0:
                    raise SystemExit(f"pair{tag} differs from the shipped kernel on the dense plan ({diff})")
                contenders.append((f"sage k64 pair{tag}", fn))
        if cudnn is not None:
            try:
                call, _ = cudnn_fp8.build(cudnn, q, k, v)
                contenders.append((cudnn_fp8.ROW, call))
            except cudnn_fp8.Unavailable as e:
                print(f"# {e}")
        for rnd in range(ns.rounds):
            for name, fn in contenders:
                with sampler:
                    ms = bench.time_ms(fn, reps=20, warm_s=ns.warm_s)
                pw = sampler.summary()
                row = dict(round=rnd, contender=name, q=ns.q, plan="1.0", H=h, S=s, ms=round(ms, 4),
                           dense_tflops=round(flops / ms / 1e9, 1), **(pw.as_row() if pw else {}))
                rows.append(row)
                print(f"{rnd} {name:28} H={h} S={s} {ms:8.4f} ms {row['dense_tflops']:7.1f} TF "
                      f"{row.get('MHz', '-')} MHz {row.get('W', '-')} W", flush=True)
        del contenders
        q = k = v = None
        torch.cuda.empty_cache()
    write_rows(rows, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
