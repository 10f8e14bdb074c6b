"""subblock-sage: ahead-of-time compiled SubBlock block-sparse attention.

    import subblock_sage
    subblock_sage.check()                       # is this machine served? (report)
    out = subblock_sage.subblock_attention(q, k, v, sparsity=0.75)   # route + attend
    plan = subblock_sage.route(q, k, sparsity=0.75)                   # the plan alone
    out = subblock_sage.sparse_attention(q, k, v, q2k_block_index, block_counts)

Importing never touches the GPU and never fails for lack of one (nor of torch); the first kernel
call (or ``check()``) says why the machine cannot run. The ops need PyTorch in the range that
``torch_support.py`` states: without it, using one raises TorchNotInstalledError (an ImportError)
with the install command.
"""

from __future__ import annotations

import logging

from ._version import __version__

logging.getLogger("subblock_sage").addHandler(logging.NullHandler())


def _log_level_from_env() -> None:
    """SUBBLOCK_SAGE_LOG_LEVEL=DEBUG|INFO|WARNING|... sets the level of the "subblock_sage"
    logger (no handler is added: the application's logging configuration decides the output)."""
    import os

    level = os.environ.get("SUBBLOCK_SAGE_LOG_LEVEL")
    if level:
        try:
            logging.getLogger("subblock_sage").setLevel(level.strip().upper())
        except ValueError:
            logging.getLogger("subblock_sage").warning(
                "ignoring SUBBLOCK_SAGE_LOG_LEVEL=%r (not a logging level)", level)


_log_level_from_env()


def _register_torch_ops() -> None:
    """Register torch.ops.subblock_sage.* now if torch is already imported (cheap then);
    otherwise the first use of a public op (or `import subblock_sage.torch_ops`) does it."""
    import sys

    if "torch" in sys.modules:
        try:
            from . import torch_ops  # noqa: F401
        except Exception as e:  # never fail the import; the first call reports it
            logging.getLogger("subblock_sage").debug("torch ops not registered: %s", e)


_register_torch_ops()

__all__ = [
    "__version__",
    "check",
    "manifest",
    "preload",
    "quantize_sage",
    "release_workspaces",
    "route",
    "sparse_attention",
    "subblock_attention",
    "validate_startup",
]

# Public functions live in submodules that may import torch; load them on first use so that
# `import subblock_sage` works anywhere. The api ones check torch first (torch_support.py):
# a missing or too old torch is one error with its fix, not a ModuleNotFoundError or an
# AttributeError from deep inside torch.library.
_LAZY = {
    "manifest": ("loader", "manifest"),
    "quantize_sage": ("api", "quantize_sage"),
    "sparse_attention": ("api", "sparse_attention"),
    "route": ("api", "route"),
    "subblock_attention": ("api", "subblock_attention"),
    "preload": ("api", "preload"),
    "release_workspaces": ("workspace", "release_workspaces"),
    "check": ("diagnostics.probes", "check"),
    "validate_startup": ("diagnostics.probes", "validate_startup"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        if mod == "api":
            from .torch_support import require_torch

            require_torch(f"subblock_sage.{name}")
        value = getattr(importlib.import_module(f".{mod}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'subblock_sage' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
