"""The SubBlock router's method and its pooled-cell layout, stated once (no dependency but the contract).

Imported by the runtime (``subblock_sage.router_spec``: ``ops/route.py``, ``reference.py``) and
by the build (as ``aot.runtime.router_spec``: ``aot/runtime/__init__.py``), so that the kernels,
the runtime op and the float64 reference read one definition.

The method (SGLang 0.5.23's ``SubBlockRouter``, read for its facts):

* Each ``Q_BLOCK`` (64)-row query block is cut into ``n_q`` cells of ``64 / n_q`` tokens, each key
  block (``block_size_k`` = 64 or 128 keys) into ``n_k`` cells of ``block_size_k / n_k`` tokens;
  ``n_q``, ``n_k`` in :data:`ROUTER_N_VALUES`. Cell ``c`` holds tokens ``[c*sub, (c+1)*sub)``.
* A cell is the float32 mean of its *real* tokens (tokens ``< S``), query cells multiplied by
  ``softmax_scale * log2(e)`` after the mean, then rounded to bf16 (SGLang stores its pooled
  cells in bf16 and multiplies them on tensor cores with float32 accumulation: bf16 x bf16
  products are exact in float32, so a float32 dot product of the same bf16 cells gives the same
  score up to the summation order). A cell with no real token is zero and *invalid*: it is left
  out of every log-sum-exp (scored as zero it would add an ``exp(0) = 1`` term).
* ``score(i, j) = ln 2 * log2 sum_{a < n_q, b < n_k} 2 ** (qbar_{i,a} . kbar_{j,b})`` over the
  valid pairs, float32: the log-sum-exp over the ``n_q * n_k`` cell pairs, in natural-log units
  (computed base 2: the scale folded into Q makes ``2 ** dot`` the softmax weight). SGLang folds
  the key cells first (one log-sum-exp per query cell), then the query cells; so do the kernels.
* Each routed row keeps its :func:`router_budget` highest-scoring key blocks. Ties at the
  threshold go to the lower key-block id (SGLang's compaction keeps the first in column order
  too); the kernels select exactly (radix select), SGLang's Triton selector approximately (a
  secant search of 16-32 steps, its docstring: ~1.6 % of rows differ among near-ties).
* Dense rows (``dense_rows``) list every key block; the plan then has capacity ``Gk`` and per-row
  counts (``block_counts``): ``Gk`` on dense rows, the budget elsewhere.

Pooled-cell layout (what ``router_pool`` writes and the Sage quantizer may write in its own pass
over Q and K): bf16 ``[B, H, cells, HEAD_DIM]``, contiguous, ``cells = ceil(S / Q_BLOCK) * n_q``
for Q (``ceil(S / block_size_k) * n_k`` for K): every cell of the last block, those wholly past
``S`` zero. Query cells carry ``softmax_scale * log2(e)``, key cells no scale. The number of
valid cells is ``ceil(S / sub)`` (:func:`valid_cells`).
"""

from __future__ import annotations

import math

# re-exported (part of the method); the runtime's subblock_sage.contract or the build's
# aot.runtime.contract: the same file
from .contract import BLOCK_SIZES_K as ROUTER_BLOCK_SIZES_K, LOG2E, Q_BLOCK  # noqa: F401
from .contract import DEFAULT_COMPUTE_MODE, MODES, TARGETS
ROUTER_N_VALUES = (1, 2, 4, 8)  # cells per query / key block
# The router's kernels, by name (the build registers them under these, the runtime launches them).
# ``router_select``'s score phase, one kernel each: ``mma`` (bf16 mma.sync, the key tile staged so
# a lane's accumulator columns are whole key blocks; n_q and n_k runtime arguments, so one export
# per target serves all 16 pairs) ships in every target's library; ``simt`` (float32 FFMA,
# compiled per (n_q, n_k)) only in the sm_90a test library, where a GPU run checks the shipped
# kernel against it (aot/kernels/router says why).
POOL_KERNEL = "router_pool"
SELECT_KERNELS = {"mma": "router_select", "simt": "router_select_simt"}
SELECT_IMPLS = tuple(SELECT_KERNELS)  # the shipped (default) score phase first
RUNTIME_N_IMPLS = ("mma",)  # n_q, n_k, phase and k_splits are launch arguments (simt: compiled)
DEFAULT_N_Q = 4
# ``router_select``'s launches (its ``phase`` argument): one launch scores each query tile against
# every key tile and selects its rows (FUSED); or a launch scores a share of the key tiles per CTA
# (SCORES, ``k_splits`` CTAs per query tile) and a second one selects (SELECT), where the query
# tiles alone leave the GPU idle (``backends/router.py``: ``select_launches`` chooses). A tile is
# SELECT_TILE_CELLS cells on either side.
PHASE_FUSED, PHASE_SCORES, PHASE_SELECT = 0, 1, 2
SELECT_TILE_CELLS = 64
CELL_TOKENS = 16  # the default cell: 64/4 query rows, 64/4 or 128/8 keys
LN2 = 0.6931471805599453
# The budget's granularity per compute mode (``ComputeMode.budget_granularity``), as SGLang 0.5.23's
# SubBlock backend sets it (``budget_granularity = 1 if compute_mode == "sage_fp8" else 8``): its
# bf16 consumers on sm_100 / sm_120 (FlashInfer's blk64 classes) pad a row's count to a multiple of
# 8 anyway, so a budget rounded up to 8 blocks costs nothing; its Sage paths keep exact counts.
# ``Backend.router_geometry`` (subblock_attention) reads it by mode, ``route`` by key-block size.
BUDGET_GRANULARITY = {m.name: m.budget_granularity for m in MODES.values()}
# ``route``'s default for a key-block size (it takes no mode): the granularity of the mode that
# routes in such blocks by default: the default mode where it routes in them (64-key blocks: bf16,
# everywhere), else the mode that does (128-key blocks: sm_90a Sage's only).
def _default_granularity() -> dict[int, int]:
    out: dict[int, int] = {}
    for m in sorted(MODES.values(), key=lambda m: m.name != DEFAULT_COMPUTE_MODE):  # the default first
        for t in TARGETS.values():
            out.setdefault(m.router_block_size_k(t.family), m.budget_granularity)
    return dict(sorted(out.items()))


DEFAULT_GRANULARITY = _default_granularity()


def default_n_k(block_size_k: int) -> int:
    """``n_k`` giving 16-key cells: 4 for 64-key blocks, 8 for 128-key blocks (SGLang's)."""
    return block_size_k // CELL_TOKENS


def router_budget(num_key_blocks: int, sparsity: float, granularity: int) -> int:
    """Key blocks kept per routed row: ``min(Gk, max(1, ceil(ceil((1 - sparsity) * Gk) / g)) * g)``.
    ``sparsity`` is then an upper bound on the dropped fraction (0.75 of 590 blocks keeps 152)."""
    want = math.ceil((1.0 - sparsity) * num_key_blocks)
    return min(num_key_blocks, max(1, -(-want // granularity)) * granularity)


def cell_tokens(block: int, n: int) -> int:
    """Tokens per cell of a ``block``-token block cut into ``n`` cells."""
    return block // n


def valid_cells(seqlen: int, sub: int) -> int:
    """Cells holding at least one real token (cells are ordered, so validity is a prefix)."""
    return -(-int(seqlen) // int(sub))


def num_cells(seqlen: int, block: int, n: int) -> int:
    """Cells of the pooled tensor: every cell of ``ceil(seqlen / block)`` blocks."""
    return -(-int(seqlen) // int(block)) * n
