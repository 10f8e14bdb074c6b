"""subblock-sage: ahead-of-time compiled SubBlock block-sparse attention.

    import subblock_sage
    subblock_sage.check()                       # is this machine served? (report)
    out = subblock_sage.sparse_attention(q, k, v, q2k_block_index, block_counts)

Importing never touches the GPU and never fails for lack of one; the first kernel call (or
``check()``) says why the machine cannot run.
"""

from __future__ import annotations

import logging

from ._version import __version__

logging.getLogger("subblock_sage").addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "check",
    "manifest",
    "quantize_sage",
    "sparse_attention",
    "validate_startup",
]

# Public functions live in submodules that import torch; load them on first use so that
# `import subblock_sage` works anywhere.
_LAZY = {
    "manifest": ("loader", "manifest"),
    "quantize_sage": ("ops.quantize", "quantize_sage"),
    "sparse_attention": ("ops.attention", "sparse_attention"),
    "check": ("check", "check"),
    "validate_startup": ("check", "validate_startup"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{mod}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'subblock_sage' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
