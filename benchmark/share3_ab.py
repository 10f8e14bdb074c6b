"""The Sage kernel with three warpgroups per CTA (``flat_wgs=3``: K/V loads shared by identical
plan rows) against the one-warpgroup flat kernel and cuDNN's FP8 SDPA, alternated in one run.

The flat_wgs=3 kernels are timing experiments: the library must be an experiments build (CMake
``-DSBS_EXPERIMENTS=ON``; selected by ``SelectionPolicy(label="f3")``), except with
``--flat-only``, which times only the shipped default kernel (any build).

To run (GPU machine, wheels installed; cuDNN's row needs nvidia-cudnn-frontend):
    python benchmark/share3_ab.py [--json PATH] [--rounds 3] [--warm-s 1] [--shape H,S ...] [--flat-only]

Per shape and plan (B=1, D=128, 128-key plans with block_counts: dense, 0.25 random, 0.25
local+random, each as given and with its rows sorted by the caller), each round times the kernel alone (``bench.kernel_only``: the attention launch,
quantizer and plan prepared once) for the default policy and ``label="f3"``, and cuDNN's FP8
SDPA on the dense shape, median of 20 isolated calls each after ``--warm-s`` seconds of calls
(the 700 W cap: METHOD.md), with the SM clock and board power NVML saw. ``--q``: Q as the runtime
chooses (auto: the Q-fused kernels at these shapes), always Q-fused, or INT8 Q from the quantizer. FLOP convention of `subblock-sage bench`: dense-equivalent
TFLOPS = 4*Sq*Sk*D*H/t.
"""

from __future__ import annotations



from subblock_sage.backends.sm90 import BACKEND
from subblock_sage.tools import bench

from host_time import run_ab  # benchmark/host_time.py (this script's folder)

# (name, density, kind of bench.make_plan): each also as "<name> sorted" (ids sorted in each row
# by the caller). make_plan's dense rows list every block in a random order of their own, so the
# three rows of a CTA never match and flat_wgs=3 runs on its own buffers (ncu sees the same L2
# bytes as the flat kernel); the sorted dense plan is the one whose rows are identical, the case
# the shared ring is for. The plan preparation sorts every row itself (aot/kernels/plan_prepare.py),
# so "as given" and "sorted" rows time the same kernel on the same prepared plan.
PLANS = (("1.0", 1.0, "random"), ("0.25 random", 0.25, "random"), ("0.25 local+random", 0.25, "local"))


def contenders(ns, h, s, q, k, v, rows) -> list:
    kernels = {}
    for base_name, density, kind in PLANS:
        given, cnt = bench.make_plan(1, h, s, s, density, kind, block_size_k=128)
        for plan_name, idx in ((base_name, given), (f"{base_name} sorted", given.sort(dim=-1).values.contiguous())):
            for share in (False,) if ns.flat_only else (False, True):
                # the experiments build's three-warpgroup kernel, or the default selection
                be = BACKEND.with_policy(label="f3") if share else BACKEND
                kernels[(plan_name, share)] = bench.kernel_only(q, k, v, idx, cnt, 128, "sage_fp8", backend=be)
    return [(f"sage kernel {'flat_wgs=3' if sh else 'flat'}", p, fn) for (p, sh), fn in kernels.items()]


def main(argv=None) -> int:
    def flat_only(ap):
        ap.add_argument("--flat-only", action="store_true",
                        help="only the shipped flat kernel (any build): plans as given against sorted by the caller")

    return run_ab(argv, __doc__.splitlines()[0], ((14, 37760),), contenders, "dense", flat_only)


if __name__ == "__main__":
    raise SystemExit(main())
