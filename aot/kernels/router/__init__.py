"""The SubBlock router as two CuTe-DSL launches: ``router_pool`` (Q and K -> pooled cells) and
``router_select`` (block scores + per-row top-k). Method, pooled-cell layout and budget:
``spec.py`` (``python/subblock_sage/router_spec.py``); runtime: ``ops/route.py`` (the checks),
``backends/router.py`` (the launches).

``router_select`` scores, then selects each row's top-k, in one launch (or a score launch and a
selection launch: ``mma.py``). Two score phases, each a kernel of its own (names:
``spec.SELECT_KERNELS``): ``mma`` (``router_select``, the one shipped: bf16 ``mma.sync``, the
key-side fold in registers) and ``simt`` (``router_select_simt``, float32 FFMA, per (n_q, n_k):
the GPU cross-check, in the sm_90a test library only).

Both: bf16 x bf16 products are exact in float32, so either gives SGLang's score (its ``tl.dot`` on
the same bf16 cells) up to the float32 summation order. Cells with no real token are left out
(NEG, SGLang's sentinel).

Why tensor cores, with the arithmetic (H200, H=14 S=37760, n_q = n_k = 4: 2360 cells per head and
side): the pair dots are ``14 x 2360^2 x 128`` = 10.0 G multiply-adds. SIMT float32 peaks at 67
TFLOPS (132 SMs x 128 lanes x 1.98 GHz x 2): >= 0.30 ms, ~0.5 ms at a realistic 60 %, 2-3x
SGLang's whole router (its pooling ~2 x 40 us, its score kernel on tensor cores, top-k ~30 us).
bf16 ``mma.sync`` runs the same 20 GFLOP at several hundred TFLOPS: ~40-60 us. The epilogue is
~78 M exp2 + ~20 M log2 over 132 x 16 MUFU lanes/clk (~20-30 us), and pooled K is re-read once per
CTA: ``Gk n_k x 256 B`` = 0.6 MB x 516 CTAs = 0.31 GB from L2 (~40 us at ~8 TB/s), overlapping the
MMAs of the other CTAs on the SM (shared memory 39 KB per CTA, 4+ CTAs per SM). Selection: 8260
rows x 5 passes over 590 scores. Estimated ~0.15-0.2 ms with the pooling; measured (H100, H=14):
pooling ~100 us, the fused select launch ~257 us with 128-key blocks (~306 us with 64-key
blocks) under ncu's clocks: one wave of 4 CTAs per SM, 45.7 % of the issue slots busy at 8.0
warp-cycles per issued instruction, so latency with four warps per scheduler bounds it
(MEASUREMENTS.md, 2026-12-08).

Limits (checked before any launch by ``can_implement`` and ``check_route_args`` in ``ops/route.py``):
head dim 128; ``n_q``, ``n_k`` in {1, 2, 4, 8}; H, B <= 65535 (grid y, z); ``1 <= topk <= Gk``;
capacity >= ``topk`` (>= ``Gk`` with dense rows); S * 128 < 2^31 (int32 token arithmetic). No
host wait: every value is an argument, nothing is read back, so the launches are CUDA-graph
capturable.

Layout of the package, by role (importing the package does not import CuTe-DSL):

- ``config.py``: CTA shapes and staged-tile geometry; ``variants.py``: argument specs and
  compile specs; this file: the registry entries (``KERNELS``).
- CuTe-DSL: ``ptx.py`` (the order key, bf16 ``mma.sync``), ``pool.py`` (``router_pool``),
  ``fold.py`` (the score phase's log-sum-exp folds on the accumulators), ``mma.py``
  (``router_select``: launch shapes, staged tiles, score loop),
  ``simt.py`` (``router_select_simt``), ``topk.py`` (the per-row exact selection, every kernel's).
"""

from aot.contract import TARGET_NAMES as TARGETS  # every target ships the router
from aot.kernels.router.spec import POOL_KERNEL, ROUTER_N_VALUES, SELECT_KERNELS
from aot.registry import Kernel, Variant

from .variants import pool_args, pool_spec, select_args, select_spec, simt_spec

KERNELS: list[Kernel] = [
    Kernel(POOL_KERNEL, "SubBlock router: Q and K -> pooled bf16 cells (mean of the real tokens; Q times "
           "softmax_scale*log2 e)", TARGETS, (Variant("bf16", {}),), pool_spec),
    Kernel(SELECT_KERNELS["mma"], "SubBlock router: block scores (log-sum-exp over the n_q x n_k cell pairs on "
           "bf16 mma.sync accumulators; n_q, n_k runtime arguments) + exact per-row top-k -> q2k_block_index, "
           "block_counts", TARGETS, (Variant("mma", {}),), select_spec),
    # the GPU cross-check of the shipped kernel (tests/gpu/test_router.py): never shipped
    Kernel(SELECT_KERNELS["simt"], "SubBlock router, test library: router_select's scores in float32 FFMA, "
           "compiled per (n_q, n_k)", (), tuple(Variant(f"q{nq}k{nk}", {"n_q": nq, "n_k": nk})
                                              for nq in ROUTER_N_VALUES for nk in ROUTER_N_VALUES),
           simt_spec, test_targets=("sm_90a",)),
]

__all__ = ["KERNELS", "TARGETS", "pool_args", "select_args"]
