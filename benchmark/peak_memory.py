"""Peak GPU memory of a sequence of attention calls at the SGLang shapes: ours in both modes (the
per-stream workspace held between calls, as in serving), SGLang's own SM90 bf16 kernel (the AOT
contender of the test library) and cuDNN's dense bf16 SDPA, each on the same inputs.

To run (GPU machine, wheels installed; SGLang's row needs the test library):
    python benchmark/peak_memory.py [--json PATH] [--calls 8] [--shape H,S ...] [--test-libs DIR]

Method, per shape (B=1, D=128, BSHD bf16 q/k/v allocated once) and contender: release every
per-stream workspace (``subblock_sage.release_workspaces``) and torch's cache
(``torch.cuda.empty_cache``), build the contender's plan (SGLang's geometry: bf16 64-key blocks,
budget granularity 8; Sage 128-key blocks, granularity 1; ``bench.make_sglang_plan``), reset the
peak statistics, then ``--calls`` calls in a row, each result dropped when the next one exists
(a layer's output lives until the next layer's attention). Reported, as the increase over the
memory held before the sequence (inputs and plan): torch's ``max_memory_reserved`` (what the
process takes from the GPU: the figure a server's memory budget sees) and ``max_memory_allocated``,
what is still reserved after the sequence with the last result dropped (ours: the per-stream
workspace, quantizer buffer and spare result), and after ``subblock_sage.release_workspaces()`` +
``torch.cuda.empty_cache()`` (what a server calls to give it back). The first contender of a
shape is timed once more at the end (``order-check``) so that the allocator's state from the other
contenders does not decide a row. Sizes in GiB (2^30 bytes).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

import subblock_sage
from subblock_sage.tools import bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmark.lab
from benchmark.lab import contenders as ctd  # noqa: E402

GIB = float(1 << 30)
SCALE = 128 ** -0.5


def _reset():
    subblock_sage.release_workspaces()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _ours(mode: str, bk: int):
    def make(q, k, v, h, s):
        idx, cnt = bench.make_sglang_plan(1, h, s, s, block_size_k=bk)
        return lambda: subblock_sage.sparse_attention(q, k, v, idx, cnt, block_size_k=bk, compute_mode=mode)
    return make


def _sglang(kernel):
    def make(q, k, v, h, s):
        idx, cnt = bench.make_sglang_plan(1, h, s, s, block_size_k=64)
        return lambda: kernel.run(q, k, v, idx, cnt, SCALE)
    return make


def _cudnn_dense(q, k, v, h, s):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call():
        # SGLang's dense path hands SDPA [B, H, S, D] views of its BSHD activations
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return call


def measure(name, make, q, k, v, h, s, calls: int) -> dict:
    _reset()
    fn = make(q, k, v, h, s)
    torch.cuda.synchronize()
    base_res, base_alloc = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = None
    for _ in range(calls):
        nxt = fn()
        out = nxt  # the previous result is dropped once the next exists
    torch.cuda.synchronize()
    del out, nxt
    gc.collect()
    held = torch.cuda.memory_reserved() - base_res
    peak_res = torch.cuda.max_memory_reserved() - base_res
    peak_alloc = torch.cuda.max_memory_allocated() - base_alloc
    _reset()  # the contender (its plan: part of the base) stays alive
    after_release = torch.cuda.memory_reserved() - base_res
    del fn
    row = dict(contender=name, H=h, S=s, calls=calls, peak_reserved_gib=round(peak_res / GIB, 4),
               peak_allocated_gib=round(peak_alloc / GIB, 4), held_after_gib=round(held / GIB, 4),
               after_release_gib=round(after_release / GIB, 4), base_reserved_gib=round(base_res / GIB, 4))
    print(f"H={h:2d} S={s} {name:32s} peak reserved +{row['peak_reserved_gib']:.3f} GiB, "
          f"peak allocated +{row['peak_allocated_gib']:.3f}, held after +{row['held_after_gib']:.3f}, "
          f"after release {row['after_release_gib']:+.3f}", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--calls", type=int, default=8, help="calls in the sequence (default 8)")
    ap.add_argument("--shape", action="append", help="H,S (default: the SGLang shapes)")
    ap.add_argument("--test-libs", help="folder of the test libraries (SGLang's SM90 kernel)")
    ns = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("peak_memory.py needs a CUDA GPU. Fix: run it on the GPU machine.", file=sys.stderr)
        return 2
    shapes = [tuple(int(x) for x in sh.split(",")) for sh in ns.shape] if ns.shape else list(bench.SGLANG_SHAPES)
    contenders = [("ours bf16 (64-key, g=8)", _ours("bf16", 64)),
                  ("ours sage_fp8 (128-key, g=1)", _ours("sage_fp8", 128))]
    try:
        contenders.append((ctd.SGLANG_SM90, _sglang(ctd.load_sglang_sm90(ctd.test_libs_dir(ns.test_libs)))))
    except ctd.Unavailable as e:
        print(f"# {e}")
    contenders.append((bench.SDPA_CUDNN, _cudnn_dense))
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} subblock_sage {subblock_sage.__version__}; "
          f"{ns.calls} calls per sequence; GiB over the inputs' and plan's memory")
    rows = []
    for h, s in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, s, h, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        for name, make in contenders:
            rows.append(measure(name, make, q, k, v, h, s, ns.calls))
        name, make = contenders[0]
        rows.append(measure(name + " (order-check)", make, q, k, v, h, s, ns.calls))
        del q, k, v
        _reset()
    by = {(r["contender"], r["H"]): r for r in rows}
    print("# differences of peak reserved (GiB)")
    for h, s in shapes:
        bf, sg = by[(contenders[0][0], h)], by[(contenders[1][0], h)]
        line = f"H={h:2d} S={s}: ours sage - ours bf16 {sg['peak_reserved_gib'] - bf['peak_reserved_gib']:+.3f}"
        for other in (ctd.SGLANG_SM90, bench.SDPA_CUDNN):
            if (other, h) in by:
                line += (f"; ours bf16 - {other} {bf['peak_reserved_gib'] - by[(other, h)]['peak_reserved_gib']:+.3f}"
                         f"; ours sage - {other} {sg['peak_reserved_gib'] - by[(other, h)]['peak_reserved_gib']:+.3f}")
        print(line)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
