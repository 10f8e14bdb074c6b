"""Our sm_90a Sage kernel against SpargeAttn's SM90 Sage kernel, same GPU, shapes and plans, one run.

SpargeAttn's kernel (the peer of issue 3) is built from a user-supplied checkout by ``build.sh``
next to this file; nothing of it is in this repository. Usage on a Hopper GPU with the
subblock-sage wheels installed:

    SPARGEATTN_SRC=/path/to/SpargeAttn bash benchmark/peer_spargeattn/build.sh   # any machine with nvcc
    python3 benchmark/peer_spargeattn/compare.py [--shape 14,37760] [--rounds 5] [--json out.json]

What is compared (B=1, D=128, 128-key plan blocks, the plans of ``subblock-sage bench``):
- ``ours kernel``: the attention kernel alone on pre-quantized inputs (``bench``'s kernel-only);
- ``ours whole call``: ``sparse_attention(..., compute_mode="sage_fp8")`` incl. quantization;
- ``spargeattn kernel``: its SM90 kernel without the PV threshold, and ``spargeattn kernel (pv
  threshold)``: the variant ``spas_sage_attn``'s Python API launches (threshold 50 per head: no
  tile is skipped on these inputs, so both do the same work). Its quantizers are not run
  (they are Triton/CUDA code of its package), so only its kernel time is measured;
- ``sdpa cudnn dense bf16`` for the ``vs cuDNN`` column.
Inputs for SpargeAttn: our INT8 Q (its per-16-row scales from our per-32-row ones), K re-quantized
per 128-key block from the mean-smoothed bf16 K, our FP8 V^T and per-channel V scales (its kernel
takes the same token permutation: its outputs match the float reference, column ``cos``).
Timing: CUDA events, warm-up, median of ``--reps`` launches per contender; the contenders are
interleaved round by round and the table gives the median over rounds and the range.
FLOPs: dense-equivalent 4*Sq*Sk*D*H/t, kept-block 4*D*kept_keys/t (kept_keys summed over rows).
MHz / W / slowed: SM clock, board power and clock-slowdown share while each contender ran, pooled
over the rounds (NVML, `subblock_sage.tools.power`): on an H200 both kernels run at the 700 W cap, so a
comparison is fair only when both rows show the same state.
"""

import argparse
import ctypes
import functools
import json
import math
import pathlib
import statistics

import torch
import torch.nn.functional as F

from subblock_sage import quantize_sage, sparse_attention
from subblock_sage.tools import bench, power

HERE = pathlib.Path(__file__).resolve().parent


def load_peer():
    path = HERE / "libsparge_sm90.so"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run SPARGEATTN_SRC=<checkout> bash {HERE / 'build.sh'} first")
    lib = ctypes.CDLL(str(path))
    lib.sparge_run.restype = ctypes.c_int
    return lib


class Peer:
    """SpargeAttn's inputs for one (q, k, v, plan), built from ours; ``launch(mode)`` runs its kernel."""

    def __init__(self, lib, q, k, v, index, counts, scale):
        B, S, H, D = q.shape
        z = quantize_sage(q, k, v)
        self.lib, self.B, self.S, self.H, self.scale = lib, B, S, H, scale
        self.q_i8, self.v_f8, self.v_s = z["q_int8"], z["v_fp8"], z["v_scale"]
        self.q_s = z["q_scale"].repeat_interleave(2, dim=-1)[..., : math.ceil(S / 64) * 4].contiguous()
        nkb = math.ceil(S / 128)
        kh = k.permute(0, 2, 1, 3).float()
        kh = kh - kh.mean(dim=2, keepdim=True)
        kb = F.pad(kh, (0, 0, 0, nkb * 128 - S)).view(B, H, nkb, 128, D)
        self.k_s = (kb.abs().amax(dim=(3, 4)).clamp_min(1e-8) / 127).contiguous()
        k_i8 = (kb / self.k_s[..., None, None]).round().clamp(-127, 127).to(torch.int8)
        self.k_i8 = k_i8.view(B, H, nkb * 128, D)[:, :, :S].contiguous()
        self.lut = torch.zeros(B, H, index.shape[2], nkb, dtype=torch.int32, device=q.device)
        self.set_plan(index, counts)
        self.pvt = torch.full((H,), 50.0, device=q.device)
        self.out = torch.empty(B, H, S, D, device=q.device, dtype=torch.bfloat16)
        assert self.v_f8.shape[-1] >= nkb * 128

    def set_plan(self, index, counts):
        """Its LUT for a plan, written into the buffer made at construction: first id, then deltas,
        ascending ids; the row's block count separately. Each row's ids are sorted whole, so the
        capacity must be the count (the plans here; SGLang's router's: ``benchmark/sglang_step.py``
        calls this per step on them)."""
        self.ids = index.long().sort(dim=-1).values
        cap = self.ids.shape[-1]
        self.lut[..., 0] = self.ids[..., 0].int()
        self.lut[..., 1:cap] = (self.ids[..., 1:] - self.ids[..., :-1]).int()
        self.valid = counts.int().contiguous()

    def launch(self, mode):
        ptrs = [ctypes.c_void_p(t.data_ptr()) for t in (self.q_i8, self.k_i8, self.v_f8, self.out, self.lut,
                                                          self.valid, self.q_s, self.k_s, self.v_s)]
        rc = self.lib.sparge_run(*ptrs, self.B, self.S, self.S, self.v_f8.shape[-1], self.H,
                                 ctypes.c_float(self.scale), mode, ctypes.c_void_p(self.pvt.data_ptr()))
        if rc:
            raise RuntimeError(f"SpargeAttn launch failed: cudaError {rc}")


def cosine_on_rows(out_bhsd, q, k, v, ids, counts, scale, rows):
    """Cosine similarity against a float32 reference with the same plan, on a few (head, q-block)."""
    S = q.shape[1]
    got, ref = [], []
    for h, qb in rows:
        r = slice(qb * 64, min(S, qb * 64 + 64))
        keys = torch.cat([torch.arange(b * 128, min(S, b * 128 + 128), device=q.device)
                          for b in ids[0, h, qb, : int(counts[0, h, qb])].tolist()])
        s = q[0, r, h].float() @ k[0, keys, h].float().T * scale
        ref.append((torch.softmax(s, -1) @ v[0, keys, h].float()).flatten())
        got.append(out_bhsd[0, h, r].float().flatten())
    return F.cosine_similarity(torch.cat(got), torch.cat(ref), dim=0).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="14,37760", help="H,S (B=1, D=128, Sq=Sk=S)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--plans", default="all", help="comma list of: random, local, dense")
    ap.add_argument("--back-to-back", action="store_true",
                    help="time --reps launches queued without a sync (GPU time when host launch is faster)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    H, S = (int(x) for x in a.shape.split(","))
    lib = load_peer()
    sampler = power.Sampler(0)  # SM clock / board power per contender (needs nvidia-ml-py)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, S, H, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k = k + 5 * torch.randn(1, 1, 1, 128, device="cuda", dtype=torch.bfloat16)  # per-channel K bias
    scale = 128 ** -0.5
    want = {"random": "0.25 random", "local": "0.25 local+random", "dense": "1.0"}
    plans = bench.PLANS if a.plans == "all" else [p for p in bench.PLANS if p[0] in {want[x] for x in a.plans.split(",")}]
    gq = math.ceil(S / 64)
    sample = [(0, 0), (H // 2, gq // 3), (H - 1, gq - 1)]
    dense_flops = 4 * S * S * 128 * H
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    cudnn = {}
    rows = []
    for name, density, kind in plans:
        index, counts = bench.make_plan(1, H, S, S, density, kind, block_size_k=128)
        kept = bench.kept_flops(counts, 128, S, S, H)
        peer = Peer(lib, q, k, v, index, counts, scale)
        ours_k = bench.kernel_only(q, k, v, index, counts, 128, "sage_fp8")
        out = torch.empty_like(q)
        fns = {
            "ours kernel": ours_k,
            "ours whole call": lambda: sparse_attention(q, k, v, index, counts, block_size_k=128,
                                                        compute_mode="sage_fp8", out=out),
            "spargeattn kernel": functools.partial(peer.launch, 0),
            "spargeattn kernel (pv threshold)": functools.partial(peer.launch, 1),
        }
        if not cudnn:
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                sd = lambda: F.scaled_dot_product_attention(qh, kh, vh)  # noqa: E731
                cudnn["ms"] = statistics.median(bench.time_ms(sd, warmup=3, reps=a.reps) for _ in range(2))
        cos = {}
        for mode in (0, 1):
            peer.out.fill_(float("nan"))
            peer.launch(mode)
            cos[f"spargeattn kernel{' (pv threshold)' if mode else ''}"] = cosine_on_rows(
                peer.out, q, k, v, peer.ids, counts, scale, sample)
        out.fill_(float("nan"))
        sparse_attention(q, k, v, index, counts, block_size_k=128, compute_mode="sage_fp8", out=out)
        cos["ours whole call"] = cosine_on_rows(out.transpose(1, 2), q, k, v, peer.ids, counts, scale, sample)
        times = {n: [] for n in fns}
        readings = {n: [] for n in fns}  # clock / power samples pooled over the rounds
        for _ in range(a.rounds):
            for n, fn in fns.items():
                with sampler:
                    times[n].append(bench.time_ms(fn, warmup=3, reps=a.reps, back_to_back=a.back_to_back))
                readings[n] += sampler.samples
        for n, ts in times.items():
            ms = statistics.median(ts)
            pw = power.summarize(readings[n])
            rows.append({**bench.result_row(n, (H, S), name, ms, dense_flops, kept, cudnn["ms"], pw),
                         "range": f"{min(ts):.3f}-{max(ts):.3f}", "cos": round(cos[n], 5) if n in cos else None})
        del peer, fns, ours_k
        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, H={H} S={S} B=1 D=128, 128-key blocks; sdpa cudnn dense bf16 {cudnn['ms']:.3f} ms; "
          f"median over {a.rounds} rounds of " + (f"mean of {a.reps} back-to-back" if a.back_to_back
                                                  else f"median-of-{a.reps}"))
    print("| plan | contender | ms | range | dense TFLOPS | kept TFLOPS | vs cuDNN | cos | MHz | W | slowed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['plan']} | {r['contender']} | {r['ms']:.3f} | {r['range']} | {r['dense_tflops']} | "
              f"{r['kept_tflops']} | {r['vs_cudnn_dense']} | {r['cos'] if r['cos'] is not None else ''} | "
              f"{r.get('MHz', '')} | {r.get('W', '')} | {r.get('slowed', '')} |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"device": dev, "H": H, "S": S, "cudnn_ms": cudnn["ms"], "rows": rows},
                                                   indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
