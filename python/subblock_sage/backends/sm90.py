"""sm_90a backend: this project's own Hopper kernels (``aot/kernels/sm90_attention.py``: TMA +
warp-specialised WGMMA, bf16 and Sage).

Sage: ``quantize_sage`` (the same quantizer and layout as the SM120 path) then INT8 Q·Kᵀ / FP8
P·V. The plan arrives prepared in the caller's key-block size. The kernels would also skip ids
outside ``[0, ceil(Sk/bk))`` and clamp counts themselves, but count a repeated id once per
occurrence, while the contract (and the reference) counts it once.
"""

from __future__ import annotations

from .base import Backend, Launch

LOG2E = 1.4426950408889634


class SM90Backend(Backend):
    target_family = "sm90"
    kernels = {"sage_fp8": "sm90_bsa_sage", "bf16": "sm90_bsa_bf16"}
    # Sage CTA shape per key-block size, as the variant parameter ``wgs``: None = the variant
    # built as the default (DEFAULT_WGS in aot/kernels/sm90_attention.py); an int selects the
    # other shape the build ships (``subblock-sage bench`` and the GPU tests compare both).
    sage_wgs: dict[int, int | None] = {64: None, 128: None}

    def params(self, compute_mode: str, block_size_k: int) -> dict:
        wgs = self.sage_wgs.get(block_size_k) if compute_mode == "sage_fp8" else None
        return {"block_k": block_size_k, "counts": True, "wgs": wgs}

    def values(self, q, k, v, plan_values: dict, scale: float, compute_mode: str, out_c, operands=None) -> dict:
        """The kernel's argument values from canonical views (``operands``: the quantizer's)."""
        common = {"out": out_c, **plan_values, "scale_log2": scale * LOG2E, "topk": 0}
        if compute_mode == "bf16":
            return {"q": q, "k": k, "v": v, **common}
        z = operands
        return {
            "q": z["q_int8"].permute(0, 2, 1, 3),
            "k": z["k_int8"].permute(0, 2, 1, 3),
            "v": z["v_fp8"],
            "q_scale": z["q_scale"],
            "k_scale": z["k_scale"],
            "v_scale": z["v_scale"],
            **common,
        }

    def launch(self, args, plan, operands, out_c) -> Launch:
        mode = args.compute_mode
        values = self.values(args.q, args.k, args.v, {"q2k_block_index": plan.index, "block_counts": plan.counts},
                             args.scale, mode, out_c, operands)
        return Launch(self.kernels[mode], self.params(mode, plan.block_size_k), values, out_c)


BACKEND = SM90Backend()
