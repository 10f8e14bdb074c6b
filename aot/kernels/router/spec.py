"""The build's view of the router's method and pooled-cell layout:
``python/subblock_sage/router_spec.py``, loaded by path (as ``aot/contract.py`` loads the
contract: the build never installs the runtime, and that file has no dependencies). One
definition of each constant: that file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import aot.contract  # noqa: F401  (registers the contract, which router_spec.py reads)

PATH = Path(__file__).resolve().parents[3] / "python" / "subblock_sage" / "router_spec.py"

_spec = importlib.util.spec_from_file_location("subblock_sage_router_spec", PATH)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
# registered so that the export cache's input scan (every imported module's file) sees the file
sys.modules.setdefault("subblock_sage_router_spec", _mod)

NAMES = ("Q_BLOCK", "ROUTER_N_VALUES", "POOL_KERNEL", "SELECT_KERNELS", "SELECT_IMPLS", "ROUTER_BLOCK_SIZES_K",
         "CELL_TOKENS", "LOG2E", "LN2", "DEFAULT_GRANULARITY", "default_n_k", "router_budget", "cell_tokens", "valid_cells", "num_cells")
globals().update({name: getattr(_mod, name) for name in NAMES})
