"""The build's view of the runtime files it reads: ``aot.runtime.<name>`` is
``python/subblock_sage/<name>.py``.

Why: the kernels, the runtime ops and the float64 references must read one definition of the
contract (``contract.py``: ABI version, symbol prefix, plan limits, sm90 selection) and of the
router's method (``router_spec.py``); but the build environment never installs the runtime, and
importing ``subblock_sage`` would run its package ``__init__`` (torch checks, the loader). So this
package's search path is the runtime's source folder: Python's import system finds, executes and
caches each file once, under one name (``aot.runtime.contract``), and a relative import inside one
(``router_spec.py``: ``from .contract import ...``) resolves to its sibling here exactly as it does
in the installed runtime. No file depends on which of them the build imports first.

Only the files in :data:`FILES` belong here: dependency-free (the standard library and each other),
so that they run anywhere (tests/cpu/test_runtime_view.py checks both, and that the kernels
sdist carries them). The export cache sees them as inputs of every export that imports them
(``aot/export/identity.py``: every imported module's file).
"""

from __future__ import annotations

from pathlib import Path

FILES = ("contract", "router_spec")

__path__ = [str(Path(__file__).resolve().parents[2] / "python" / "subblock_sage")]
