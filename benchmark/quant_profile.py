"""The Sage quantizer's launches under a profiler (ncu): what limits it (issue 19 asks >= 80 % of copy
bandwidth). Makes the inputs, warms up, then runs `quantize_sage` once per shape between
`cudaProfilerStart/Stop` so that `ncu --profile-from-start off` sees only the quantizer's kernels.

To run (GPU machine, wheels installed):
    ncu --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum,\
dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,\
launch__grid_size,launch__occupancy_limit_registers python benchmark/quant_profile.py
"""

from __future__ import annotations

import argparse

import torch

import subblock_sage


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, metavar="H,S")
    ap.add_argument("--kv-only", action="store_true",
                    help="the K/V-only pass a Q-fused Sage call makes (quantize_canonical(with_q=False))")
    ns = ap.parse_args(argv)
    if ns.kv_only:
        from subblock_sage.ops import quantize as Q

        def call(q, k, v):
            return Q.quantize_canonical(q, k, v, with_q=False)
    else:
        call = subblock_sage.quantize_sage
    shapes = [tuple(int(x) for x in s.split(",")) for s in (ns.shape or ["14,37760", "2,37760"])]
    for h, s in shapes:
        q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for _ in range(3):
            call(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        call(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"H={h} S={s}: profiled one {'K/V-only' if ns.kv_only else 'quantize_sage'} call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
