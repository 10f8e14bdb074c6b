"""Public-API calls on hostile plans, for compute-sanitizer: the source of README's "memcheck
clean" (issue 21: every figure comes from a committed command).

To run (GPU machine, wheels installed):
    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmark/memcheck.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python benchmark/memcheck.py --quick
    (--q int8: the sm_90a Sage kernels on the quantizer's INT8 Q instead of the Q-fused ones;
     --bf16-cluster 2 / 4: bf16 only, on the shared-ring kernels ``k{64,128}_kvs_cnt`` /
     ``k{64,128}_c2kvs_cnt``, SelectionPolicy.bf16_cluster, which the default policy does not select)

Every case goes through `subblock_sage.sparse_attention` in both compute modes and both key-block
sizes, on ragged shapes (Sq, Sk not multiples of 64/128), with plan ids -1, Gk, +-10^6, repeated
ids, counts outside 0..capacity (clamped by default, each call twice so that the replay path runs
too), empty and dense rows, a V outlier off the quantizer's sample (its redo path), strided views and `out=`; with check_plan=True bad counts and bad ids
must raise ValueError; nothing may touch memory outside the tensors. Prints one line per case and a summary; exit status 1 if a case misbehaves.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

import subblock_sage

from host_time import add_q_choice, apply_q_choice  # benchmark/host_time.py (this script's folder)


def _plan(b, h, gq, gk, cap, gen, dev):
    idx = torch.randint(0, gk, (b, h, gq, cap), generator=gen, device=dev, dtype=torch.int32)
    counts = torch.randint(0, cap + 1, (b, h, gq), generator=gen, device=dev, dtype=torch.int32)
    counts[..., 0] = 0                        # empty rows
    if gq > 1:
        counts[..., 1] = min(cap, gk)         # dense-ish rows
        idx[..., 1, : min(cap, gk)] = torch.arange(min(cap, gk), device=dev, dtype=torch.int32)
    bad = torch.tensor([-1, gk, 10**6, -(10**6)], device=dev, dtype=torch.int32)
    idx[..., -1, :4] = bad[: min(4, cap)]     # out-of-range ids in the last row
    idx[..., 0, :] = idx[..., 0, :1]          # repeated ids
    return idx, counts


def run(quick: bool, modes=("sage_fp8", "bf16")) -> int:
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(1)
    # Sk > 512 (the sample's size): the V outlier below lies off the sample, so the quantizer's redo
    # tickets run (a V unit quantized twice, the second time after its done slot)
    shapes = [(1, 2, 200, 333), (1, 1, 70, 700)] if quick else [
        (1, 2, 200, 333), (2, 3, 64, 33), (1, 1, 17, 1000), (1, 2, 130, 130), (1, 2, 100, 1500)]
    failures = 0
    for (b, h, sq, sk), mode, bk, layout in (
        (sh, m, k, lay) for sh in shapes for m in modes for k in (64, 128) for lay in ("BSHD", "BHSD")
    ):
        shape_q = (b, sq, h, 128) if layout == "BSHD" else (b, h, sq, 128)
        shape_k = (b, sk, h, 128) if layout == "BSHD" else (b, h, sk, 128)
        q = torch.randn(*shape_q, device=dev, dtype=torch.bfloat16, generator=gen)
        kv = torch.randn(2, *shape_k, device=dev, dtype=torch.bfloat16, generator=gen)
        k, v = kv[0], kv[1]
        v.select(-3 if layout == "BHSD" else -2, 0)[..., sk - 1, 5] = 50.0  # head 0, last key, channel 5
        gq, gk = -(-sq // 64), -(-sk // bk)
        cap = gk + 3
        idx, counts = _plan(b, h, gq, gk, cap, gen, dev)
        name = f"{mode} bk{bk} {layout} B{b} H{h} Sq{sq} Sk{sk}"
        try:
            out = torch.full_like(q, float("nan"))
            subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=bk, compute_mode=mode,
                                           layout=layout, out=out)
            torch.cuda.synchronize()
            ok = bool(torch.isfinite(out).all())
            print(f"{name}: {'ok' if ok else 'NON-FINITE OUTPUT'}")
            failures += not ok
            # a dense plan: the paired kernel's whole-tile V loads (dense rows only), the partial
            # last key block inside a 128-key box
            dense = torch.arange(gk, device=dev, dtype=torch.int32).expand(b, h, gq, gk).contiguous()
            o3 = torch.full_like(q, float("nan"))
            subblock_sage.sparse_attention(q, k, v, dense, torch.full((b, h, gq), gk, device=dev, dtype=torch.int32),
                                           block_size_k=bk, compute_mode=mode, layout=layout, out=o3)
            torch.cuda.synchronize()
            if not bool(torch.isfinite(o3).all()):
                print(f"{name}: dense plan NON-FINITE OUTPUT")
                failures += 1
            for bad_counts in (-5, cap + 100):
                c2 = counts.clone()
                c2[..., -1] = bad_counts
                # default: clamped on the GPU (twice: the full path, then its replay)
                for _ in range(2):
                    o2 = subblock_sage.sparse_attention(q, k, v, idx, c2, block_size_k=bk, compute_mode=mode,
                                                        layout=layout)
                torch.cuda.synchronize()
                if not bool(torch.isfinite(o2).all()):
                    print(f"{name}: counts={bad_counts} NON-FINITE OUTPUT")
                    failures += 1
                try:
                    subblock_sage.sparse_attention(q, k, v, idx, c2, block_size_k=bk, compute_mode=mode,
                                                   layout=layout, check_plan=True)
                    torch.cuda.synchronize()
                    print(f"{name}: counts={bad_counts} with check_plan=True NOT REJECTED")
                    failures += 1
                except ValueError:
                    pass
            try:
                subblock_sage.sparse_attention(q, k, v, idx, counts.clamp(min=1), block_size_k=bk,
                                               compute_mode=mode, layout=layout, check_plan=True)
                torch.cuda.synchronize()
                print(f"{name}: bad ids with check_plan=True NOT REJECTED")
                failures += 1
            except ValueError:
                pass
        except Exception as e:  # noqa: BLE001 - report every case, then fail
            print(f"{name}: {type(e).__name__}: {e}")
            failures += 1
    print(f"cases with a problem: {failures}")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one shape (racecheck is slow)")
    add_q_choice(ap, "fused", " (default fused: these shapes are below the runtime's size bound for them)")
    ap.add_argument("--bf16-cluster", type=int, choices=(1, 2, 4), default=None,
                    help="bf16 only, with SelectionPolicy.bf16_cluster forced to this value (2: the "
                         "shared-ring kernels, 4: the same in two-CTA clusters)")
    ns = ap.parse_args(argv)
    if ns.bf16_cluster is not None:
        from benchmark.lab.test_library import sm90_backend
        from subblock_sage import backends

        # bf16_cluster=4's kernels are in the test library only ($SUBBLOCK_SAGE_TEST_LIBS)
        be, why = sm90_backend(bf16_cluster=ns.bf16_cluster)
        if be is None:
            print(why)
            return 1
        _POLICY.enter_context(backends.using(be))
        print(f"sm_90a bf16 rows per K/V load: {ns.bf16_cluster} (bf16 only)")
        return run(ns.quick, modes=("bf16",))
    apply_q_choice(ns.q)
    print(f"sm_90a Sage Q: {ns.q}")
    return run(ns.quick)


_POLICY = contextlib.ExitStack()  # the --bf16-cluster policy, for the whole run


if __name__ == "__main__":
    sys.exit(main())
