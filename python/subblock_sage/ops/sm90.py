"""sm_90a backend of `sparse_attention`: this project's own Hopper kernels
(``aot/kernels/sm90_attention.py``: TMA + warp-specialised WGMMA, bf16 and Sage).

Sage: ``quantize_sage`` (the same quantizer and layout as the SM120 path) then INT8 Q·Kᵀ / FP8 P·V.
The plan arrives prepared (``ops/plan.py``: one launch; ids valid and distinct, counts in
range, in units of the caller's block_size_k). The kernels would also skip ids outside
``[0, ceil(Sk/bk))`` and clamp counts themselves, but count a repeated id once per occurrence,
while the contract (and the reference) counts it once.
"""

from __future__ import annotations

from .. import marshal
from .plan import prepare_plan
from .quantize import quantize_canonical

LOG2E = 1.4426950408889634


class SM90Backend:
    modes = ("sage_fp8", "bf16")
    block_sizes_k = (64, 128)
    # Sage CTA shape per key-block size: "" = the variant built as default (DEFAULT_WGS in
    # aot/kernels/sm90_attention.py); "flat" / "ws" = the other shape, shipped as k{bk}_{shape}_cnt
    # (bench and tests compare / cover both).
    sage_shape = {64: "", 128: ""}

    def variant(self, compute_mode: str, block_size_k: int) -> str:
        shape = self.sage_shape.get(block_size_k, "") if compute_mode == "sage_fp8" else ""
        return f"k{block_size_k}{'_' + shape if shape else ''}_cnt"

    def plan_block_size_k(self, block_size_k: int) -> int:
        return block_size_k

    def _plan(self, plan):
        return {"q2k_block_index": plan.index, "block_counts": plan.counts}

    def prepare(self, qc, kc, vc, compute_mode: str):
        """Enqueue the Sage quantizer (nothing for bf16); its output feeds ``run``."""
        return quantize_canonical(qc, kc, vc) if compute_mode == "sage_fp8" else None

    def _values(self, qc, kc, vc, plan_values, scale, compute_mode, out_c, operands=None):
        common = {"out": out_c, **plan_values, "scale_log2": scale * LOG2E, "topk": 0}
        if compute_mode == "bf16":
            return "sm90_bsa_bf16", {"q": qc, "k": kc, "v": vc, **common}
        z = operands if operands is not None else self.prepare(qc, kc, vc, compute_mode)
        return "sm90_bsa_sage", {
            "q": z["q_int8"].permute(0, 2, 1, 3),
            "k": z["k_int8"].permute(0, 2, 1, 3),
            "v": z["v_fp8"],
            "q_scale": z["q_scale"],
            "k_scale": z["k_scale"],
            "v_scale": z["v_scale"],
            **common,
        }

    def run(self, lib, qc, kc, vc, plan, scale, compute_mode, out_c, operands=None) -> None:
        kernel, values = self._values(qc, kc, vc, self._plan(plan), scale, compute_mode, out_c, operands)
        # packed before the wait, so that only the launch itself follows it
        go = marshal.prepare(kernel, self.variant(compute_mode, plan.block_size_k), values, library=lib)
        plan.verify()  # after the quantizer and plan launches, before the attention launch
        go()

    def kernel_only(self, lib, q, k, v, index, counts, block_size_k, compute_mode):
        """For `subblock-sage bench`: quantize, sanitise and pack once, return a function that
        launches only the attention kernel (the whole call minus quantization, plan repair and
        argument packing)."""
        import torch

        from ..validation import check_plan, check_scale

        vplan = check_plan(index, counts, None, B=q.shape[0], H=q.shape[2], Sq=q.shape[1],
                           Sk=k.shape[1], block_size_k=block_size_k, device=q.device,
                           check_values=False, enqueue_checks=False)
        plan = prepare_plan(vplan, block_size_k_out=block_size_k, seqlen_k=k.shape[1],
                            check_index=False, capturing=False, library=lib)
        plan.verify()
        out = torch.empty_like(q)
        kernel, values = self._values(q, k, v, self._plan(plan), check_scale(None), compute_mode, out)
        return marshal.prepare(kernel, self.variant(compute_mode, plan.block_size_k), values, library=lib)


BACKEND = SM90Backend()
