"""Which variants the runtime can select, and what each kernel serves (issue 22).

A kernel module describes every compile-time variant its class supports; the build exports only
the ones a public call can reach, because an export nobody can launch costs build time (the SM100
variants are 9-33 s each) and wheel size, and is shipped untested. Read off the runtime's selection
code (verified by tests/cpu/test_serving.py, which drives that code):

- ``ops/attention.py`` always hands the backends a plan prepared by the ``plan_prepare`` kernel
  (``ops/plan.py``): per-row counts (``PreparedPlan.counts`` is never None), and the public API
  takes no FlashInfer per-key-block ``block_sizes``.
- SM120 (``ops/flashinfer_marshal.py``, ``SM120Backend.run``): ``_sm120_plan_values`` picks
  ``rows_bs0`` (counts given, no block sizes) for both the Sage and the bf16 class.
- SM100 (``SM100Backend.run`` -> ``sm100_bf16_launch``): per-row counts force the CLC scheduler
  and block sizes (``clc_rows_bs_*``); Int32 or Int64 K/V strides by upstream's rule on the
  caller's strides, so both ``clc_rows_bs_i32`` and ``clc_rows_bs_i64`` are reachable.
- SM90 (``ops/sm90.py``): ``SM90Backend.variant`` gives ``k{64,128}_cnt`` (counts always given);
  ``subblock-sage bench`` switches ``sage_shape`` to the other CTA shape, ``k64_ws_cnt`` /
  ``k128_flat_cnt`` (in general every ``*_cnt`` variant of the module).
- ``plan_prepare``: ``cnt`` when the caller gave ``block_counts``, ``topk`` otherwise. The Sage
  quantizer's one launch ``sage_quant_kv``: ``noplan`` (``quantize_sage``, ``ops/quantize.py``)
  and ``cnt`` / ``topk`` by the same rule as ``plan_prepare`` (its plan role, when a Sage
  attention call passes its plan: ``quantize_canonical(..., plan_values=...)``). All are used by
  every target.

Kernels not listed here (test fixtures, new kernels) ship every variant until listed.
"""

from __future__ import annotations

import re
from typing import Mapping

# kernel name -> (regex a served variant name fully matches, what the kernel serves)
SERVED: Mapping[str, tuple[str, str]] = {
    "fi_sm120_sage_fwd": (r"rows_bs0", "sparse_attention compute_mode='sage_fp8'"),
    "fi_sm120_bf16_fwd": (r"rows_bs0", "sparse_attention compute_mode='bf16'"),
    "fi_sm100_bf16_fwd": (r"clc_rows_bs_i(32|64)", "sparse_attention compute_mode='bf16'"),
    "sm90_bsa_sage": (r"k(64|128)(_\w+)?_cnt",
                      "sparse_attention compute_mode='sage_fp8' (and bench's alternative CTA shapes)"),
    "sm90_bsa_bf16": (r"k(64|128)(_\w+)?_cnt", "sparse_attention compute_mode='bf16'"),
    "plan_prepare": (r"cnt|topk", "plan preparation of every sparse_attention call"),
    "sage_quant_kv": (r"noplan|cnt|topk",
                      "quantize_sage (noplan) and the Sage input of sparse_attention (with its plan: "
                      "cnt / topk, as plan_prepare)"),
    "sglang_sm90_bf16": (r"bsa64", "bench contender only (test library): SGLang's own SM90 bf16 kernel, "
                         "python/subblock_sage/tools/sglang_sm90.py"),
    "router_pool": (r"bf16", "route (ops/route.py): the pooled cells"),
    "router_select": (r"(mma|simt)_q[1248]k[1248]", "route (ops/route.py): every allowed n_q x n_k; mma "
                      "by default, simt selectable (route_with_scores(impl=...))"),
}


def is_served(kernel: str, variant: str) -> bool:
    """True if the runtime can select ``kernel``/``variant`` (unlisted kernels: every variant)."""
    rule = SERVED.get(kernel)
    return rule is None or re.fullmatch(rule[0], variant) is not None


def serves(kernel: str) -> str:
    """What ``kernel`` serves, for the manifest and ``subblock-sage check``."""
    rule = SERVED.get(kernel)
    return rule[1] if rule else f"{kernel} (not in aot/serving.py)"
