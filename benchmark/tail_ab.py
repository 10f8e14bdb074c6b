"""The test library's tail-split bf16 kernel (``SelectionPolicy.bf16_tail``: the pairs of a part-full
last wave split, as many as ``contract.sm90_tail_pairs`` says) against the shipped bf16 kernel and
cuDNN frontend's SM90 bf16 block-sparse kernel (AOT, the test library), alternated in one run.

Why: our bf16 CTA holds two query blocks at one CTA per SM, so at H=2 S=37760 its 590 CTAs run
4.47 waves on 132 SMs as 5 CTA-times, while cuDNN's 64-row CTAs, three per SM, run 2.98 waves of
396 (ncu, MEASUREMENTS.md 2026-12-08, "bf16 against cuDNN's SM90 bf16 block-sparse kernel under
ncu"). Split, each of the last wave's pairs is two CTAs of one query block whose two consumers walk
half of its plan row each and merge in shared memory (``aot/kernels/sm90/kernel.py`` ``ws_split``).

To run (GPU machine, wheels installed; cuDNN's rows need the test library in
$SUBBLOCK_SAGE_TEST_LIBS, built with SBS_TEST_LIBS=ON):
    python benchmark/tail_ab.py [--json PATH] [--rounds 3] [--warm-s 1] [--shape H,S ...]

Per shape (B=1, D=128, 64-key plans with block_counts: 0.25 random and dense), each round times the
kernel alone (``bench.kernel_only``): the shipped kernel, the tail kernel with nothing split (its 1-D
grid's cost), split by the rule and, where the rule splits nothing, with every pair split (a bound),
then cuDNN's kernel on the same plan;
median of 20 isolated calls each after ``--warm-s`` seconds of calls, with SM clock and board power.
First, each output is compared with the shipped kernel's (a split one is not bit-identical: the two
halves' sums meet in another order; max |diff| printed). FLOP convention of `subblock-sage bench`:
dense-equivalent TFLOPS = 4*Sq*Sk*D*H/t.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import subblock_sage
from subblock_sage.backends.sm90 import BACKEND
from subblock_sage.tools import bench

from host_time import run_ab  # benchmark/host_time.py (this script's folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmark.lab
from benchmark.lab import contenders as ctd  # noqa: E402
from benchmark.lab import test_library  # noqa: E402

PLANS = (("0.25 random", 0.25), ("1.0", 1.0))


def contenders(ns, h, s, q, k, v, rows) -> list:
    from subblock_sage.contract import SelectionPolicy, sm90_tail_pairs
    from subblock_sage.validation import sm_count

    try:
        cudnn = ctd.load_cudnn_sm90(ctd.test_libs_dir(None))
    except ctd.Unavailable as e:
        print(f"# {e}")
        cudnn = None
    nqb = -(-s // 64)
    pairs = h * -(-nqb // 2)
    rule = sm90_tail_pairs(SelectionPolicy(bf16_tail="rule"), pairs, sm_count(torch.cuda.current_device()))
    print(f"# H={h} S={s}: {pairs} pairs of query blocks, the rule splits {rule}", flush=True)
    tails = [("shipped", None), ("tail kernel, split 0", 0), (f"tail kernel, split {rule} (the rule)", "rule")]
    if not rule:
        tails.append((f"tail kernel, split all {pairs}", pairs))
    backends = {}
    for name, tail in tails:
        be, why = (BACKEND, "") if tail is None else test_library.sm90_backend(bf16_tail=tail)
        if be is None:
            print(f"# {name}: {why}")
            continue
        backends[name] = be
    out = []
    for plan, density in PLANS:
        idx, cnt = bench.make_plan(1, h, s, s, density, "random", block_size_k=64)
        base = None
        for name, be in backends.items():
            got = subblock_sage.sparse_attention(q, k, v, idx, cnt, block_size_k=64, check_plan=True,
                                                 compute_mode="bf16", backend=be)
            if base is None:
                base = got
            else:
                diff = float((base.float() - got.float()).abs().max())
                print(f"# H={h} S={s} {plan}: {name} max |diff| against the shipped kernel {diff}", flush=True)
                rows.append(dict(contender="check", plan=plan, H=h, S=s, tail=name, max_diff=diff))
            out.append((f"bf16 k64 {name}", plan, bench.kernel_only(q, k, v, idx, cnt, 64, "bf16", backend=be)))
        if cudnn is not None:
            out.append((ctd.CUDNN_BSA_BF16, plan, ctd.build_cudnn_bsa_bf16(cudnn, q, k, v, idx, cnt).call))
    return out


def main(argv=None) -> int:
    return run_ab(argv, __doc__.splitlines()[0], ((2, 37760), (6, 37760), (14, 37760)), contenders, "dense")


if __name__ == "__main__":
    raise SystemExit(main())
