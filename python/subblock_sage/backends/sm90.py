"""sm_90a backend: this project's own Hopper kernels (``aot/kernels/sm90/``: TMA +
warp-specialised WGMMA, bf16 and Sage).

Sage: ``quantize_sage`` (the same quantizer and layout as the SM120 path) then INT8 Q·Kᵀ / FP8
P·V; with the default flat kernels the quantizer skips Q and the kernel quantizes its own Q tile
(the quantizer's numerics: the same codes and scales) for calls large enough
(``SelectionPolicy.q_fused_min_ctas``). The plan arrives prepared in the caller's key-block size.
The kernels would also skip ids outside ``[0, ceil(Sk/bk))`` and clamp counts themselves, but
count a repeated id once per occurrence, while the contract (and the reference) counts it once.

Which export runs is decided by the backend's :class:`~subblock_sage.contract.SelectionPolicy`, a
frozen value (its docstring gives the measured reasons); tests and benchmarks run another policy
with :meth:`SM90Backend.with_policy`, never by changing the backend. The exports only a benchmark
or a GPU test selects (the alternative Sage shapes, bf16 ``bf16_cluster=4``) are built into the
never-shipped sm_90a test library; :meth:`SM90Backend.with_library` runs them from there.
"""

from __future__ import annotations

import dataclasses

from .. import abi
from ..contract import (LOG2E, MODES, SM90_KERNELS, SelectionPolicy, ceil_div, sm90_request, sm90_tail_pairs,
                        sm90_takes_tail)
from ..errors import LaunchError
from ..validation import cuda_device_index, sm_count
from .base import Backend, Launch

class SM90Backend(Backend):
    target_family = "sm90"
    kernels = {mode: kernel for mode, (kernel, _) in SM90_KERNELS.items()}

    def __init__(self, policy: SelectionPolicy = SelectionPolicy(), library=None):
        if not isinstance(policy, SelectionPolicy):
            raise TypeError(f"policy must be a SelectionPolicy, not {type(policy).__name__}. "
                            "Fix: pass subblock_sage.contract.SelectionPolicy(...).")
        object.__setattr__(self, "_policy", policy)
        object.__setattr__(self, "_library", library)

    def __setattr__(self, name, value):
        raise AttributeError(f"SM90Backend.{name}: a backend's selection is its frozen policy. "
                             "Fix: run backend.with_policy(...) (a new backend) instead.")

    @property
    def policy(self) -> SelectionPolicy:
        return self._policy

    def with_policy(self, policy: SelectionPolicy | None = None, **changes) -> "SM90Backend":
        """A new backend running ``policy`` (or this one's with ``changes``, e.g.
        ``with_policy(sage_cluster=1)``); pass it as ``sparse_attention(..., backend=...)``."""
        base = self._policy if policy is None else policy
        return SM90Backend(dataclasses.replace(base, **changes) if changes else base, self._library)

    @property
    def library(self):
        """The library of :meth:`with_library` (None: every export from the call's library)."""
        return self._library

    def with_library(self, library) -> "SM90Backend":
        """A new backend that launches the attention export of a call from ``library`` (a
        ``loader.Library``: the test library, which holds the exports only benchmarks select) where
        that library has the selected export, else from the call's library."""
        return SM90Backend(self._policy, library)

    def library_for(self, lib, kernel: str, params: dict):
        """The library to launch ``kernel`` / ``params`` from: :meth:`with_library`'s if it has it."""
        if self._library is not None:
            try:
                self._library.kernel(kernel, **params)
                return self._library
            except LaunchError:
                pass
        return lib

    def params(self, compute_mode: str, block_size_k: int, q_fused: bool = False, dense_rows: bool = True) -> dict:
        """The complete variant selection of a call (``contract.sm90_request`` under this
        backend's policy). ``dense_rows``: a row of the plan can list every key block
        (``Plan.rows_can_be_dense``: block_counts with a capacity that holds every key block, or a
        ``topk`` that does)."""
        return sm90_request(self._policy, compute_mode, block_size_k, q_fused=q_fused, dense_rows=dense_rows)

    def quantizes_q(self, lib, args) -> bool:
        """Whether the call runs the Q-fused kernel: Sage, a policy that allows it, at least
        ``q_fused_min_ctas`` query blocks (B x H x ceil(Sq/64), one CTA each), and a library that
        has the Q-fused export of the selection."""
        policy = self._policy
        if not MODES[args.compute_mode].quantizes or not policy.q_fused:
            return False
        B, Sq, H, _ = args.q.shape
        if B * H * ceil_div(Sq, 64) < policy.q_fused_min_ctas:
            return False
        want = self.params(args.compute_mode, args.spec.block_size_k, True, args.spec.rows_can_be_dense)
        kernel = self.kernels[args.compute_mode]
        try:
            self.library_for(lib, kernel, want).kernel(kernel, **want)  # cached per selection
        except LaunchError:  # no such export: an older library, or a shape without one
            return False
        return True

    def values(self, q, k, v, plan_values: dict, scale: float, compute_mode: str, out_c, operands=None) -> dict:
        """The kernel's argument values from canonical views (``operands``: the quantizer's;
        without ``q_int8`` the kernel takes bf16 ``q`` and quantizes it itself)."""
        common = {"out": out_c, **plan_values, "scale_log2": scale * LOG2E, "topk": 0}
        if not MODES[compute_mode].quantizes:
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
        q_fused = MODES[mode].quantizes and "q_int8" not in operands  # the quantizer skipped Q (prepare)
        dense_rows = args.spec.rows_can_be_dense  # the call's plan: the prepared one has no topk
        return Launch(self.kernels[mode], self.params(mode, plan.block_size_k, q_fused, dense_rows), values, out_c)

    def tail_pairs(self, args) -> int:
        """``tail_pairs`` of a bf16 call (``contract.sm90_tail_pairs`` under this backend's policy):
        its pairs of query blocks, B x H x ceil(ceil(Sq/64) / 2), on the SMs of q's device."""
        B, Sq, H, _ = args.q.shape
        pairs = B * H * ceil_div(ceil_div(Sq, 64), 2)
        return sm90_tail_pairs(self._policy, pairs, sm_count(cuda_device_index(args.q.device)))

    def pack(self, lib, args, plan, operands, out_c):
        L = self.launch(args, plan, operands, out_c)
        if L.zero_output:
            return lambda: None
        src = lib if self._library is None else self.library_for(lib, L.kernel, L.params)
        params = L.params
        if params.get("label") is not None:  # a labelled export records its own shape
            params = src.kernel(L.kernel, **params).params
        if sm90_takes_tail(params):
            L.values["tail_pairs"] = self.tail_pairs(args)
        return abi.prepare(L.kernel, L.params, L.values, library=src)


BACKEND = SM90Backend()
"""The backend the runtime uses for sm_90a, with the default policy."""
