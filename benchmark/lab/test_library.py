"""The never-shipped sm_90a test library (``SBS_TEST_LIBS=ON ./wheels/build.sh`` installs it under
``wheels/test-libs/<cpu>/test_libs/test_sm90a/``): where the bench contenders compiled into it
(``sglang_sm90.py``, ``cudnn_sm90.py``) and the sm_90a bench-only attention variants
(:func:`sm90_backend`) find it, and how they open it. One place, so that every
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
        from subblock_sage.loader import Library

        lib = Library(path)
        missing = [k for k in kernels if not lib.has_kernel(k)]
    except Exception as e:  # noqa: BLE001 - any load failure is a one-line note for the bench
        return None, f"{what}: skipped: cannot load {path}: {type(e).__name__}: {e}"
    if missing:
        return None, (f"{what}: skipped: {path} has no {', '.join(missing)} (a test library built before "
                      "they were added). Fix: rebuild with SBS_TEST_LIBS=ON ./wheels/build.sh")
    return lib, ""


SM90_KERNELS = ("sm90_bsa_bf16", "sm90_bsa_sage")  # its bench-only exports (aot/kernels/sm90/variants.py)


def sm90_backend(test_libs_dir=None, **policy):
    """``(backend, "")``: the sm_90a backend running ``policy`` (``SelectionPolicy`` fields) that
    launches the exports only benchmarks select (the alternative Sage CTA shapes, bf16
    ``bf16_cluster=4``) from the test library, every other one from the installed library; or
    ``(None, why)`` as :func:`open_library` says it."""
    lib, why = open_library("the sm_90a bench-only attention kernels", SM90_KERNELS, test_libs_dir)
    if lib is None:
        return None, why
    from subblock_sage.backends.sm90 import BACKEND

    return BACKEND.with_policy(**policy).with_library(lib), ""


def check_bshd(tensors: dict, data_align: int, bad) -> None:
    """The layout every contender of the test library loads with TMA: each tensor of ``tensors``
    (name -> tensor or None) bf16 ``[B, S, H, 128]`` (BSHD), a unit head-dim stride, the other
    strides multiples of 8 elements (16 bytes) and its data aligned to ``data_align`` bytes (what
    the export was compiled for). ``bad(what, fix)`` makes the contender's own ValueError."""
    import torch

    from subblock_sage.contract import HEAD_DIM

    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16 or t.dim() != 4 or t.shape[-1] != HEAD_DIM:
            raise bad(f"{name} must be a bf16 [B, S, H, {HEAD_DIM}] tensor (BSHD), got "
                      f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}",
                      f"pass bf16 BSHD tensors with head dim {HEAD_DIM}")
        if t.stride(-1) != 1 or any(s % 8 for s in t.stride()[:-1]) or t.data_ptr() % data_align:
            raise bad(f"{name} needs a unit head-dim stride, 16-byte aligned strides and {data_align}-byte "
                      f"aligned data (the export's), strides {tuple(t.stride())}",
                      "pass a freshly allocated .contiguous() tensor")


__all__ = ["LIBRARY", "ENV", "ENV_LIB_DIR", "SM90_KERNELS", "find", "open_library", "sm90_backend", "check_bshd"]
