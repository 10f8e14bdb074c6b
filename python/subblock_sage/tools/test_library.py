"""The never-shipped sm_90a test library (``SBS_TEST_LIBS=ON ./wheels/build.sh`` installs it under
``wheels/test-libs/<cpu>/test_libs/test_sm90a/``): where the bench contenders compiled into it
(``sglang_sm90.py``, ``cudnn_sm90.py``) find it, and how they open it. One place, so that every
contender looks in the same folders under the same variables and fails with the same fix.
"""

from __future__ import annotations

import os
from pathlib import Path

LIBRARY = "libsubblock_sage_test_sm90a.so"
ENV = "SUBBLOCK_SAGE_TEST_LIBS"  # the test-libs folder (wheels/test-libs/<cpu>) or any folder below it
ENV_LIB_DIR = "SUBBLOCK_SAGE_TEST_LIB_DIR"  # the library's own folder, as tests/gpu/device.sh exports it


def find(test_libs_dir: str | os.PathLike | None) -> Path | None:
    """The library under ``test_libs_dir`` (else ``$SUBBLOCK_SAGE_TEST_LIBS``, then
    ``$SUBBLOCK_SAGE_TEST_LIB_DIR``): in that folder, its install prefix (test_libs/test_sm90a) or
    its test_libs folder; None when none holds it."""
    roots = [test_libs_dir] if test_libs_dir else [os.environ.get(ENV), os.environ.get(ENV_LIB_DIR)]
    for root in filter(None, roots):
        for sub in ("", "test_sm90a", "test_libs/test_sm90a"):
            path = Path(root) / sub / LIBRARY
            if path.is_file():
                return path
    return None


def open_library(what: str, kernels, test_libs_dir=None):
    """``(library, "")`` holding every kernel of ``kernels``, or ``(None, why)``: one line naming
    ``what`` (the contender), the cause and the fix, for the bench to print."""
    path = find(test_libs_dir)
    if path is None:
        where = test_libs_dir or os.environ.get(ENV) or os.environ.get(ENV_LIB_DIR)
        return None, (f"{what}: skipped: no {LIBRARY} in {where or f'${ENV} (unset)'}. Fix: build it with "
                      f"SBS_TEST_LIBS=ON ./wheels/build.sh and set {ENV}=wheels/test-libs/<cpu>")
    try:
        from ..loader import Library

        lib = Library(path)
        missing = [k for k in kernels if not lib.has_kernel(k)]
    except Exception as e:  # noqa: BLE001 - any load failure is a one-line note for the bench
        return None, f"{what}: skipped: cannot load {path}: {type(e).__name__}: {e}"
    if missing:
        return None, (f"{what}: skipped: {path} has no {', '.join(missing)} (a test library built before "
                      "they were added). Fix: rebuild with SBS_TEST_LIBS=ON ./wheels/build.sh")
    return lib, ""


__all__ = ["LIBRARY", "ENV", "ENV_LIB_DIR", "find", "open_library"]
