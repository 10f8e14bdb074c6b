"""The build's name for the runtime contract: every public name of ``python/subblock_sage/contract.py``
(``from aot.contract import ABI_VERSION``), loaded once as ``aot.runtime.contract``
(``aot/runtime/__init__.py`` says how and why). The values live only in that file."""

from __future__ import annotations

from aot.runtime.contract import *  # noqa: F401,F403
