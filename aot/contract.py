"""The build's view of the runtime contract: ``python/subblock_sage/contract.py``, loaded by path.

The build environment never installs the runtime package, and importing ``subblock_sage`` would
run its package ``__init__``; the contract module is dependency-free, so it is executed here on
its own and its names re-exported (``from aot.contract import ABI_VERSION``). There is exactly
one definition of each constant: that file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PATH = Path(__file__).resolve().parent.parent / "python" / "subblock_sage" / "contract.py"

_spec = importlib.util.spec_from_file_location("subblock_sage_contract", PATH)
_mod = importlib.util.module_from_spec(_spec)
# registered (before it runs: its dataclasses look their module up) so that the export cache's
# input scan (aot/export/identity.py repo_inputs: every imported module's file) sees
# python/subblock_sage/contract.py as an input of every export
_mod = sys.modules.setdefault("subblock_sage_contract", _mod)
_spec.loader.exec_module(_mod)

# re-exported names (``from aot.contract import X``); the values live only in the file above
NAMES = ("ABI_VERSION", "SYMBOL_PREFIX", "RUNTIME_DIST", "KERNELS_DIST", "KERNELS_PACKAGE",
         "MANIFEST_SCHEMA", "HEAD_DIM", "LOG2E", "Q_BLOCK", "BLOCK_SIZES_K", "MAX_KEY_BLOCKS", "SAGE_STATS_GROUP",
         "SAGE_KV_UNIT_BLOCKS", "SAGE_SYNC_ROW0", "SAGE_SYNC_KROW_WORDS", "SAGE_SYNC_VROW_WORDS", "SAGE_SYNC_EPOCHS", "SAGE_SYNC_VTAG_MASK", "sage_sync_tag", "sage_sync_v0", "SAGE_K_MEAN_ROWS", "SAGE_K_MEAN_SPLIT", "sage_k_mean_rows", "sage_kv_units", "sage_stats_rows", "sage_v_rows", "SAGE_V_BOUND_MARGIN", "SAGE_V_BOUND_MAX", "sage_sync_words", "COMPUTE_MODES",
         "UNVALIDATED", "modes_served", "select_variant", "ceil_div",
         "SM90_SELECT_AXES", "SM90_KERNELS", "SM90_SHAPES", "SelectionPolicy", "sm90_request", "sm90_selectable")
globals().update({name: getattr(_mod, name) for name in NAMES})
