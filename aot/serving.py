"""Which variants the runtime can select, and what each kernel serves.

A kernel module describes every compile-time variant its class supports; the build exports only
the ones a public call can reach, because an export nobody can launch costs build time (the SM100
variants are 9-33 s each) and wheel size, and is shipped untested. Read off the runtime's selection
code (verified by tests/cpu/test_flashinfer_adapters.py and tests/cpu/test_variant_selection.py,
which drive it, and tests/cpu/test_registry.py):

- ``ops/attention.py`` always hands the backends a plan prepared by the ``plan_prepare`` kernel
  (``ops/plan.py``): per-row counts (the prepared plan's ``counts`` is never None), and the public
  API takes no FlashInfer per-key-block ``block_sizes``.
- SM120 (``backends/sm120.py``): ``_plan_values`` picks ``rows_bs0`` (counts given, no block
  sizes) for both the Sage and the bf16 class.
- SM100 (``backends/sm100.py``, ``sm100_bf16_launch``): per-row counts force the CLC scheduler and
  block sizes (``clc_rows_bs_*``); Int32 or Int64 K/V strides by upstream's rule on the caller's
  strides, so both ``clc_rows_bs_i32`` and ``clc_rows_bs_i64`` are reachable.
- SM100 Sage (``backends/sm100.py``, ``sage_launches``): cuDNN's SM100 class with the static
  scheduler (its wrapper's FP8 setting), ``short`` or ``long`` by upstream's capacity rule: both
  reachable; its quantizer's one variant.
- SM90 (``backends/sm90.py``): a predicate on the export's recorded config, not on its name:
  ``contract.sm90_selectable``, true for exactly the configs that ``contract.sm90_request`` asks
  for under some ``SelectionPolicy`` (per-row counts, the default or the alternative CTA shape,
  one CTA or two-CTA clusters, bf16 with one K/V ring per row or one shared by a CTA's two dense
  rows, Q quantized by the kernel or not; never a labelled export of a build outside the release).
  The sm90 kernels' ``test_variants`` (the alternative Sage shapes, bf16 ``bf16_cluster=4``: only
  benchmarks and GPU tests select them) go to the test library unfiltered, never into a release.
- ``plan_prepare``: ``cnt`` when the caller gave ``block_counts``, ``topk`` otherwise. The Sage
  quantizer's one launch ``sage_quant_kv``: ``noplan`` (``quantize_sage``, ``ops/quantize.py``)
  and ``cnt`` / ``topk`` by the same rule as ``plan_prepare`` (its plan role, when a Sage
  attention call passes its plan: ``quantize_canonical(..., plan_values=...)``), and ``pool``
  (``quantize_and_route``, ``ops/quantize_route.py``: the router's pooling in the quantizer's
  pass). All are used by every target.

Kernels not listed here (test fixtures, new kernels) ship every variant until listed.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Optional, Union

from aot.contract import (ATTENTION, PLAN_KERNEL, SAGE_FP8, SAGE_QUANT_KERNEL, UNVALIDATED, attention_kernel,
                          family_targets, sm90_selectable)


def _attention_serves(k) -> str:
    what = f"sparse_attention compute_mode={k.mode!r}"
    gated = [t for t in family_targets(k.family) if k.mode in UNVALIDATED.get(t, {})]
    if gated:  # built, never run by this project: opt-in (contract.UNVALIDATED)
        what += f" (UNVALIDATED on {', '.join(gated)}: opt-in)"
    return what


# The attention kernels' rule per family, or per kernel where a family has kernels of two
# upstreams (their names and modes: contract.ATTENTION). SM100 Sage (cuDNN's class): the
# wrapper's short_tile_opt choice, both reachable (docs/design/sage-sm100.md).
ATTENTION_SERVED: Mapping[str, Union[str, Callable[[Mapping[str, Any]], bool]]] = {
    "sm120": r"rows_bs0",
    "sm100": r"clc_rows_bs_i(32|64)",
    attention_kernel("sm100", SAGE_FP8.name): r"short|long",
    "sm90": sm90_selectable,
}
# kernel name -> (a regex that a served variant's name fully matches, or a predicate on its
# recorded params; what the kernel serves)
SERVED: Mapping[str, tuple[Union[str, Callable[[Mapping[str, Any]], bool]], str]] = {
    **{k.name: (ATTENTION_SERVED.get(k.name, ATTENTION_SERVED[k.family]), _attention_serves(k)) for k in ATTENTION},
    **{k.quantizer: (r"bhsd", f"the Sage input of sparse_attention on {', '.join(family_targets(k.family))} "
                              f"({k.name}'s E4M3 operands)") for k in ATTENTION if k.quantizer},
    PLAN_KERNEL: (r"cnt|topk", "plan preparation of every sparse_attention call"),
    SAGE_QUANT_KERNEL: (r"noplan|cnt|topk|pool",
                      "quantize_sage (noplan) and the Sage input of sparse_attention (with its plan: "
                      "cnt / topk, as plan_prepare); quantize_and_route (pool: the router's pooled cells)"),
    "sglang_sm90_bf16": (r"bsa64", "bench contender only (test library): SGLang's own SM90 bf16 kernel, "
                         "benchmark/lab/sglang_sm90.py"),
    # bench contenders only (test library): cuDNN frontend's SM90 block-sparse forwards,
    # benchmark/lab/cudnn_sm90.py
    "cudnn_bsa_sm90_bf16": (r"blk64", "bench contender only (test library): cuDNN's SM90 bf16 BSA"),
    "cudnn_sage_sm90_fp8": (r"blk64|blk128", "bench contender only (test library): cuDNN's SM90 Sage FP8 BSA"),
    "cudnn_sage_quant_sm90": (r"bhds", "bench contender only (test library): cuDNN's SM90 Sage quantizer"),
    "router_pool": (r"bf16", "route (ops/route.py): the pooled cells"),
    "router_select": (r"mma", "route (ops/route.py): every allowed n_q x n_k (runtime arguments)"),
    "router_select_simt": (r"q[1248]k[1248]", "GPU cross-check of router_select only (test library): "
                           "route_with_scores(impl='simt', select_library=...), tests/gpu/test_router.py"),
}


def is_served(kernel: str, variant: str, params: Optional[Mapping[str, Any]] = None) -> bool:
    """True if the runtime can select ``kernel``/``variant`` (unlisted kernels: every variant);
    ``params``: the variant's recorded parameters, which a predicate rule judges."""
    rule = SERVED.get(kernel)
    if rule is None:
        return True
    if callable(rule[0]):
        return rule[0](params or {})
    return re.fullmatch(rule[0], variant) is not None


def serves(kernel: str) -> str:
    """What ``kernel`` serves, for the manifest and ``subblock-sage check``."""
    rule = SERVED.get(kernel)
    return rule[1] if rule else f"{kernel} (not in aot/serving.py)"
