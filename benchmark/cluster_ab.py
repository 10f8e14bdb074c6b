"""The Sage kernel in two-CTA clusters (``cluster=2``: each K/V tile loaded once for query blocks
2c and 2c+1 by TMA multicast) against the one-CTA flat kernel and cuDNN's FP8 SDPA, alternated in
one run, on the dense plan (the case it is for) and two sparse ones (where no cluster shares: the
cost of the cluster launch and of the second code path).

The cluster kernel is the default Sage kernel of each key block (64: the paired kernel); the
one-CTA kernel ships beside it (``k{64,128}_c1[qf]_cnt``, ``SelectionPolicy(sage_cluster=1)``).

``--mode bf16``: the bf16 kernel whose CTA (producer + two consumers, query blocks 2c and 2c+1)
loads each K/V tile once into one ring for both consumers when both rows are dense
(``k{64,128}_kvs_cnt``, ``SelectionPolicy(bf16_cluster=2)``), the same in two-CTA clusters (four
dense rows per load by TMA multicast, ``k{64,128}_c2kvs_cnt`` of the test library, ``bf16_cluster=4``) and the default
bf16 kernel (one ring per row, ``bf16_cluster=1``), with cuDNN's dense bf16 SDPA as the reference
row instead of its FP8 one.

To run (GPU machine, wheels installed; cuDNN's row needs nvidia-cudnn-frontend):
    python benchmark/cluster_ab.py [--json PATH] [--rounds 3] [--warm-s 1] [--shape H,S ...] [--q auto|fused|int8]
        [--bk 128 64] [--hetero] [--mode sage_fp8|bf16]

Per shape (B=1, D=128, plans of each ``--bk`` with block_counts, prepared by the runtime: dense
rows are then identical), each round times the kernel alone (``bench.kernel_only``: the attention
launch, quantizer and plan prepared once) for ``SelectionPolicy.sage_cluster`` 1 / 2 (bf16:
``bf16_cluster`` 1 / 2 / 4) and cuDNN's FP8 (bf16: bf16) SDPA, median of 20 isolated calls each after ``--warm-s`` seconds of calls (the 700 W cap:
METHOD.md), with the SM clock and board power NVML saw; first, the two kernels' outputs are
compared (bit-identical expected). FLOP convention of `subblock-sage bench`: dense-equivalent
TFLOPS = 4*Sq*Sk*D*H/t.
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
from benchmark.lab import test_library  # noqa: E402

# per compute mode: the policy field that forces the query blocks per K/V load, its values (1:
# every row its own), and the kernel's row label
SHARING = {"sage_fp8": ("sage_cluster", (1, 2), "sage k{bk} kernel cluster={cl}"),
           "bf16": ("bf16_cluster", (1, 2, 4), "bf16 k{bk} kernel rows-per-load={cl}")}
CUDNN_BF16 = "cuDNN SDPA bf16 (dense)"

PLANS = (("1.0", 1.0, "random"), ("0.25 random", 0.25, "random"), ("0.25 local+random", 0.25, "local"))
# SGLang's heterogeneous plans (its SubBlock backend with a sparse query-block mask): every row of
# full capacity, the selected query blocks sparse (here: 0.25 random), the others dense; the
# dense ones here the first fraction of the query blocks, as one run
HETERO = (("0.25 + 10 % dense rows", 0.10), ("0.25 + 25 % dense rows", 0.25))


def hetero_plan(h: int, s: int, bk: int, dense_frac: float):
    """(index, counts) of a heterogeneous plan (``HETERO``): capacity = every key block, the
    first ``dense_frac`` of the query blocks dense, the rest a random 0.25 plan."""
    idx, cnt = bench.make_plan(1, h, s, s, 0.25, "random", block_size_k=bk)
    gk = -(-s // bk)
    full = torch.arange(gk, device=idx.device, dtype=idx.dtype).expand(*idx.shape[:3], gk).clone()
    full[..., : idx.shape[-1]] = idx
    n_dense = round(dense_frac * idx.shape[2])
    full[:, :, :n_dense] = torch.arange(gk, device=idx.device, dtype=idx.dtype)
    cnt = cnt.clone()
    cnt[:, :, :n_dense] = gk
    return full, cnt


def cudnn_bf16_contender(q, k, v) -> list:
    """cuDNN's dense bf16 SDPA (PyTorch's cuDNN backend) as an A/B contender, or nothing (with a
    note) when PyTorch refuses it on this shape."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt)

    try:
        call()
    except RuntimeError as e:
        print(f"# {CUDNN_BF16}: unavailable ({str(e).splitlines()[0][:80]})")
        return []
    return [(CUDNN_BF16, "dense", call)]


def contenders(ns, h, s, q, k, v, rows) -> list:
    """Both kernels on each plan, after a check that their outputs are bit-identical (a row of
    ``rows``); bf16: cuDNN's dense bf16 SDPA joins (the run's reference is then FP8 and bf16)."""
    out = []
    field, values, label = SHARING[ns.mode]
    backend = BACKEND
    if 4 in values:  # bf16_cluster=4's kernels are in the test library only ($SUBBLOCK_SAGE_TEST_LIBS)
        backend, why = test_library.sm90_backend()
        if backend is None:
            print(f"# {why}")
            backend, values = BACKEND, values[:-1]
    plans = [(name, lambda bk, d=density, kd=kind: bench.make_plan(1, h, s, s, d, kd, block_size_k=bk))
             for name, density, kind in PLANS]
    if ns.hetero:
        plans += [(name, lambda bk, f=frac: hetero_plan(h, s, bk, f)) for name, frac in HETERO]
    for bk in ns.bk:
        for plan, make in plans:
            idx, cnt = make(bk)
            outs = {}
            for cl in values:
                be = backend.with_policy(**{field: cl})  # forced (the default: by the plan)
                # check_plan=True: the full path (a replay would repeat the other kernel's launch)
                outs[cl] = subblock_sage.sparse_attention(q, k, v, idx, cnt, block_size_k=bk, check_plan=True,
                                                          compute_mode=ns.mode, backend=be)
                out.append((label.format(bk=bk, cl=cl), plan,
                            bench.kernel_only(q, k, v, idx, cnt, bk, ns.mode, backend=be)))
            torch.cuda.synchronize()
            for cl in values[1:]:
                same = torch.equal(outs[1], outs[cl])
                diff = float((outs[1].float() - outs[cl].float()).abs().max())
                print(f"# H={h} S={s} k{bk} {plan}: {field}={cl} output {'bit-identical to' if same else 'DIFFERS from'} "
                      f"{field}=1 (max |diff| {diff})", flush=True)
                rows.append(dict(contender="check", mode=ns.mode, share=cl, bk=bk, plan=plan, H=h, S=s,
                                 identical=same, max_diff=diff))
    if ns.mode == "bf16":
        out += cudnn_bf16_contender(q, k, v)
    return out


def _bk_arg(ap) -> None:
    ap.add_argument("--bk", type=int, nargs="+", choices=(64, 128), default=[128, 64],
                    help="the plans' key-block sizes (default: 128 64)")
    ap.add_argument("--mode", choices=tuple(SHARING), default="sage_fp8",
                    help="sage_fp8 (default): the two-CTA cluster Sage kernel; bf16: the shared-ring bf16 kernel")
    ap.add_argument("--hetero", action="store_true",
                    help="also SGLang-like heterogeneous plans (full capacity, some rows dense: HETERO)")


def main(argv=None) -> int:
    return run_ab(argv, __doc__.splitlines()[0], ((14, 37760), (2, 37760)), contenders, "dense", _bk_arg)


if __name__ == "__main__":
    raise SystemExit(main())
