"""sm_90a backend: this project's own Hopper kernels (``aot/kernels/sm90_attention.py``: TMA +
warp-specialised WGMMA, bf16 and Sage).

Sage: ``quantize_sage`` (the same quantizer and layout as the SM120 path) then INT8 Q·Kᵀ / FP8
P·V; with the default flat kernels the quantizer skips Q and the kernel quantizes its own Q tile
(``q_fused``, the quantizer's numerics: the same codes and scales) for calls of at least
``q_fused_min_ctas`` query blocks. The plan arrives prepared in the caller's key-block size. The
kernels would also skip ids
outside ``[0, ceil(Sk/bk))`` and clamp counts themselves, but count a repeated id once per
occurrence, while the contract (and the reference) counts it once.
"""

from __future__ import annotations

from ..contract import ceil_div
from .base import Backend, Launch

LOG2E = 1.4426950408889634


class SM90Backend(Backend):
    target_family = "sm90"
    kernels = {"sage_fp8": "sm90_bsa_sage", "bf16": "sm90_bsa_bf16"}
    # Sage CTA shape per key-block size, as the variant parameter ``wgs``: None = the variant
    # built as the default (DEFAULT_WGS in aot/kernels/sm90_attention.py); an int selects the
    # other shape the build ships (``subblock-sage bench`` and the GPU tests compare both).
    sage_wgs: dict[int, int | None] = {64: None, 128: None}
    # Sage in the default (flat) CTA shape: the kernel that quantizes its own Q tile (variants
    # ``k{64,128}_qf_cnt``) when the library has it and the call is large enough
    # (:meth:`quantizes_q`), so that the quantizer moves K and V only. False: the INT8-Q kernels.
    q_fused: bool = True
    q_fused_min_ctas: int = 1024
    # Sage, 128-key plans, default shape: the flat kernel with three warpgroups per CTA that
    # share their K/V loads when their plan rows are identical (variants ``k128_f3[qf]_cnt`` of
    # an experiments build, aot/kernels/sm90/flat3.py). Off: measured 4-7 % slower than the flat
    # kernel on dense and sparse plans (MEASUREMENTS.md, fifteenth session).
    sage_share3: bool = False
    # Sage, default shape (the flat kernel on 128-key tiles; paired for 64-key plans): 2 = the
    # kernel in two-CTA clusters that load each K/V tile once for two dense rows
    # (aot/kernels/sm90/config.py FLAT_CLUSTER; variants k{64,128}[_qf]_cnt), 1 = the one-CTA flat
    # kernel shipped beside it (k{64,128}_c1[qf]_cnt), None = by whether a row of the plan can be
    # dense (:meth:`params`)
    sage_cluster: int | None = None

    def params(self, compute_mode: str, block_size_k: int, q_fused: bool = False, dense_rows: bool = True) -> dict:
        """The variant selection of a call. ``dense_rows``: a row of the plan can list every key
        block (``Plan.rows_can_be_dense``: block_counts with a capacity that holds every key
        block, or a ``topk`` that does). Sage in the default shape runs the two-CTA cluster kernel
        only then (``sage_cluster`` None): dense row pairs load K/V once (H200, 128-key plans,
        runs 118-120, MEASUREMENTS.md twenty-fifth session: dense H=14 S=37760 12.0 vs 12.55 ms;
        64-key plans on the paired kernel: twenty-sixth session), while on sparse plans, where no
        pair shares, it was 1.3-2.2 % slower than the one-CTA kernel (the cluster launch); a plan
        whose rows cannot be dense never shares. On SGLang-like heterogeneous plans (full
        capacity, some query blocks dense) it is level from a tenth of the rows dense and ahead
        beyond (run 129: 0.992-0.997 / 0.971-0.986 of the one-CTA time at 10 / 25 %)."""
        wgs = self.sage_wgs.get(block_size_k) if compute_mode == "sage_fp8" else None
        p = {"block_k": block_size_k, "counts": True, "wgs": wgs}
        if compute_mode == "sage_fp8" and block_size_k == 128 and wgs is None and self.sage_share3:
            p.update(wgs=0, flat_wgs=3)
        elif compute_mode == "sage_fp8" and wgs is None:
            cluster = self.sage_cluster if self.sage_cluster is not None else (2 if dense_rows else 1)
            p["cluster"] = None if cluster == 2 else cluster  # the cluster kernels do not set it
        if q_fused:
            p["q_fused"] = True
        return p

    def quantizes_q(self, lib, args) -> bool:
        """Whether the call runs the Q-fused kernel: Sage, the default (flat) shape, a library
        that has it, and at least ``q_fused_min_ctas`` query blocks (B x H x ceil(Sq/64), one CTA
        each). Why the bound (H200, `benchmark/call_gaps.py`, run 54, MEASUREMENTS.md fourteenth
        session): each CTA then spends ~1.5-2.5 us loading and quantizing its 16 KiB of bf16 Q
        before its first MMA, which the quantizer's saved Q pass pays for only when there are
        several waves of CTAs: at H=14 S=37760 (8260 CTAs) a whole call took 3.49-3.51 ms
        against 3.52 with INT8 Q, at H=2 S=37760 (1180) 0.539 against 0.548-0.572 (one timed
        call), but at H=4 S=8192 (512 CTAs, 1.3 waves) 0.0816-0.0829 against 0.0800-0.0804 ms
        (20 back to back)."""
        bk = args.plan.block_size_k
        if not (args.compute_mode == "sage_fp8" and self.q_fused and self.sage_wgs.get(bk) is None):
            return False
        B, Sq, H, _ = args.q.shape
        if B * H * ceil_div(Sq, 64) < self.q_fused_min_ctas:
            return False
        kernel = self.kernels[args.compute_mode]
        return any(k == kernel and e.params.get("block_k") == bk and e.params.get("q_fused")
                   for (k, _), e in lib.kernels.items())

    def values(self, q, k, v, plan_values: dict, scale: float, compute_mode: str, out_c, operands=None) -> dict:
        """The kernel's argument values from canonical views (``operands``: the quantizer's;
        without ``q_int8`` the kernel takes bf16 ``q`` and quantizes it itself)."""
        common = {"out": out_c, **plan_values, "scale_log2": scale * LOG2E, "topk": 0}
        if compute_mode == "bf16":
            return {"q": q, "k": k, "v": v, **common}
        z = operands
        sage = {
            "k": z["k_int8"].permute(0, 2, 1, 3),
            "v": z["v_fp8"],
            "k_scale": z["k_scale"],
            "v_scale": z["v_scale"],
            **common,
        }
        if "q_int8" not in z:
            return {"q": q, **sage}
        return {"q": z["q_int8"].permute(0, 2, 1, 3), "q_scale": z["q_scale"], **sage}

    def launch(self, args, plan, operands, out_c) -> Launch:
        mode = args.compute_mode
        values = self.values(args.q, args.k, args.v, {"q2k_block_index": plan.index, "block_counts": plan.counts},
                             args.scale, mode, out_c, operands)
        q_fused = mode == "sage_fp8" and "q_int8" not in operands  # the quantizer skipped Q (prepare)
        dense_rows = args.plan.rows_can_be_dense  # the caller's plan: the prepared one has no topk
        return Launch(self.kernels[mode], self.params(mode, plan.block_size_k, q_fused, dense_rows), values, out_c)


BACKEND = SM90Backend()
