"""Import FlashInfer's CuTe-DSL block-sparse attention classes without running ``flashinfer/__init__.py``.

FlashInfer is a build-time dependency only, pinned exactly (:data:`UPSTREAM`). Its top-level
``__init__`` imports torch and JIT machinery; the kernel classes themselves need only CuTe-DSL.
So we register *stub parent packages* in ``sys.modules`` whose ``__path__`` points at the installed
directories, and import the kernel modules under them: the files are read from the installed,
pinned wheel (never copied here) and nothing but those modules (and their relative imports) runs.

One SM100 helper module (``sm100_blk64/cute_dsl_utils.py``) does ``import torch`` at module level
for a dtype table it never uses on our path; when torch is not installed (the build env has none)
a placeholder ``torch`` module is present in ``sys.modules`` only while that import runs.

The two SM120 kernel modules are compiled from a *patched* text (:mod:`aot.upstream.patches`: the
upstream fence fix of the K/V stage-reuse race, applied in memory after a sha256 check): a finder
on ``sys.meta_path`` serves those module names, so every import of them (including the Sage
module's ``from .flash_fwd_sm120 import ...``) gets the patched code.

Every class we compile is pinned by signature (:data:`SIGNATURE_PINS`): if the installed version
or a signature differs, the build fails with :class:`UpstreamMismatch` naming what changed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.abc
import importlib.util
import linecache
import sys
import types
from pathlib import Path
from typing import Any

from aot.upstream import patches, stubs
from aot.upstream.stubs import STUB_MARK as _STUB_MARK, UpstreamMismatch, signature_of  # noqa: F401

DIST = "flashinfer-python"
VERSION = "0.7.2.post1"
UPSTREAM = f"{DIST}=={VERSION}"

_PKG = "flashinfer"
_STUB_PACKAGES = ("flashinfer", "flashinfer.cute_dsl", "flashinfer.cute_dsl.sparse")
_SPARSE = "flashinfer.cute_dsl.sparse"

# key -> (module, class name)
CLASSES: dict[str, tuple[str, str]] = {
    "sm120_sage": (f"{_SPARSE}.sm120_blk64.flash_fwd_sm120_sage", "BlockSparseAttnForwardSageSm120Blk64"),
    "sm120_bf16": (f"{_SPARSE}.sm120_blk64.flash_fwd_sm120", "BlockSparseAttnForwardSm120Blk64"),
    "sm100_bf16": (f"{_SPARSE}.sm100_blk64.bsa_fwd_sm100", "BlockSparseAttnForwardSm100Blk64"),
    "sm100_combine": (f"{_SPARSE}.sm100_blk64.bsa_fwd_combine", "BlockSparseAttnForwardCombine"),
}

# Pinned signatures: method -> ((parameter name, default repr or None when required), ...).
# Annotations are deliberately not pinned (their reprs depend on the DSL version); names, order and
# defaults are what our compile specs rely on. Generated from 0.7.2.post1 by `signature_of()`.
SIGNATURE_PINS: dict[str, dict[str, tuple[tuple[str, str | None], ...]]] = {
    "sm120_sage": {
        "__init__": (
            ("self", None), ("gqa_ratio", "1"), ("head_dim", "128"), ("value_dim", "128"),
            ("blocksparse_blocksize_q", "64"), ("blocksparse_blocksize_k", "64"),
            ("has_block_sizes", "True"), ("has_block_nums", "True"), ("block_sizes_mode", "0"),
        ),
        "__call__": (
            ("self", None), ("mQ", None), ("mK", None), ("mV", None), ("mO", None),
            ("mQScale", None), ("mKScale", None), ("mVScale", None),
            ("blocksparse_indices_q2k", None), ("blocksparse_num_blocks_q2k", None),
            ("block_sparse_num", None), ("blocksparse_varblk", None), ("softmax_scale", None),
            ("stream", None),
        ),
    },
    "sm120_bf16": {
        "__init__": (
            ("self", None), ("gqa_ratio", "1"), ("head_dim", "128"), ("value_dim", "128"),
            ("blocksparse_blocksize_q", "64"), ("blocksparse_blocksize_k", "64"),
            ("dtype", "<class 'cutlass.base_dsl.typing.BFloat16'>"),
            ("acc_dtype", "<class 'cutlass.base_dsl.typing.Float32'>"),
            ("has_block_sizes", "True"), ("has_block_nums", "True"), ("block_sizes_mode", "0"),
        ),
        "__call__": (
            ("self", None), ("mQ", None), ("mK", None), ("mV", None), ("mO", None), ("mLSE", None),
            ("blocksparse_indices_q2k", None), ("blocksparse_num_blocks_q2k", None),
            ("block_sparse_num", None), ("blocksparse_varblk", None), ("softmax_scale", None),
            ("stream", None),
        ),
    },
    "sm100_bf16": {
        "__init__": (
            ("self", None), ("head_dim", None), ("head_dim_v", "None"), ("qhead_per_kvhead", "1"),
            ("pack_gqa", "False"), ("m_block_size", "64"), ("n_block_size", "256"),
            ("sparse_block_size", "64"), ("is_persistent", "True"), ("use_clc_scheduler", "False"),
            ("allow_empty_block_nums", "False"), ("has_block_sizes", "True"), ("num_splits", "1"),
            ("use_int64_kv_strides", "False"),
        ),
        "__call__": (
            ("self", None), ("mQ", None), ("mK", None), ("mV", None), ("mO", None), ("mLSE", None),
            ("mQScale", None), ("mKScale", None), ("mVScale", None), ("softmax_scale", None),
            ("mBlockIndex", None), ("mBlockSizes", None), ("block_sparse_num", None),
            ("mBlockNums", None), ("mSplitOffsets", None), ("stream", None),
        ),
    },
    "sm100_combine": {
        "__init__": (
            ("self", None), ("dtype", None), ("head_dim", None), ("tile_m", "8"),
            ("k_block_size", "64"), ("log_max_splits", "4"), ("num_threads", "256"), ("stages", "4"),
        ),
        "__call__": (
            ("self", None), ("mO_partial", None), ("mLSE_partial", None), ("mO", None),
            ("mLSE", "None"), ("cu_seqlens", "None"), ("seqused", "None"),
            ("num_splits_dynamic_ptr", "None"), ("varlen_batch_idx", "None"),
            ("semaphore_to_reset", "None"), ("stream", "None"),
        ),
    },
}


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version() -> None:
    got = installed_version()
    if got != VERSION:
        what = "is not installed" if got is None else f"is {got}"
        raise UpstreamMismatch(
            f"{DIST} {what}; the build needs exactly {UPSTREAM} (kernel classes only, no torch): "
            f"run `pip install --no-deps {UPSTREAM}` in the build environment"
        )


def package_dir() -> Path:
    """Installed ``flashinfer/`` directory, found without importing the package."""
    spec = importlib.util.find_spec(_PKG) if _PKG not in sys.modules else sys.modules[_PKG].__spec__
    if spec is None or not spec.submodule_search_locations:
        raise UpstreamMismatch(f"cannot locate the installed {_PKG!r} package; install {UPSTREAM}")
    return Path(list(spec.submodule_search_locations)[0])


def _install_stub_packages(root: Path) -> None:
    # A package already imported stays: our stub from an earlier call or the real, fully imported
    # package (an env with torch that already imported flashinfer): both resolve submodules from
    # the same files.
    stubs.install_stub_packages(root.parent, _STUB_PACKAGES, UPSTREAM)


def _placeholder_torch() -> types.ModuleType:
    mod = types.ModuleType("torch", "placeholder: torch is not installed in the build environment")
    setattr(mod, _STUB_MARK, True)

    class _Sentinel:
        def __init__(self, name: str) -> None:
            self._name = name

        def __repr__(self) -> str:
            return f"<placeholder torch.{self._name}>"

        def __hash__(self) -> int:
            return hash(("placeholder-torch", self._name))

    cache: dict[str, Any] = {}

    def __getattr__(name: str) -> Any:  # module-level __getattr__ (PEP 562)
        if name.startswith("__"):
            raise AttributeError(name)
        return cache.setdefault(name, type(name, (), {}) if name[:1].isupper() else _Sentinel(name))

    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return mod


def _torch_placeholder_if_missing():
    return stubs.torch_placeholder_if_missing(_placeholder_torch)


def check_signatures(key: str, cls: type) -> None:
    stubs.check_signatures(SIGNATURE_PINS[key], cls, UPSTREAM,
                           "this build's compile specs (aot/kernels/flashinfer_*.py) no longer match it")


_PATCH_MARK = "__subblock_sage_patch__"


class _PatchedLoader(importlib.abc.Loader):
    """Executes the patched text of one upstream module; serves it to ``inspect``/``linecache``
    (the DSL's AST preprocessor reads kernel source through them), so no file is written."""

    def __init__(self, patch: patches.SourcePatch, path: Path, result: patches.PatchResult) -> None:
        self.patch, self.path, self.result = patch, path, result
        self.filename = f"{path} [patched in memory by subblock-sage: {result.status}]"

    def create_module(self, spec):  # default module creation
        return None

    def get_source(self, fullname: str) -> str:
        return self.result.text

    def exec_module(self, module: types.ModuleType) -> None:
        text = self.result.text
        linecache.cache[self.filename] = (len(text), None, text.splitlines(keepends=True), self.filename)
        module.__file__ = self.filename
        setattr(module, _PATCH_MARK, {"file": str(self.path), "status": self.result.status,
                                      "original_sha256": self.result.original_sha256,
                                      "patched_sha256": self.result.patched_sha256})
        exec(compile(text, self.filename, "exec", dont_inherit=True), module.__dict__)


class _PatchFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        patch = patches.BY_MODULE.get(fullname)
        if patch is None:
            return None
        file, result = patches.apply_installed(patch, self.root)
        loader = _PatchedLoader(patch, file, result)
        return importlib.util.spec_from_loader(fullname, loader, origin=loader.filename)


def _install_patch_finder(root: Path) -> None:
    for name in patches.BY_MODULE:
        mod = sys.modules.get(name)
        if mod is not None and not hasattr(mod, _PATCH_MARK):
            raise UpstreamMismatch(
                f"{name} was already imported unpatched (from {getattr(mod, '__file__', '?')}), so "
                "the build cannot compile the patched SM120 classes. Fix: run the export in a "
                "process that has not imported flashinfer's SM120 modules (the build env has no torch)"
            )
    if not any(isinstance(f, _PatchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchFinder(root))


def patch_status(module: str) -> dict | None:
    """The patch record of an imported patched module (None: the module is not patched)."""
    return getattr(sys.modules.get(module), _PATCH_MARK, None)


def import_module(module: str) -> types.ModuleType:
    check_version()
    root = package_dir()
    _install_stub_packages(root)
    _install_patch_finder(root)
    with _torch_placeholder_if_missing():
        return importlib.import_module(module)


def load_class(key: str) -> type:
    """The pinned upstream class ``key`` (see :data:`CLASSES`), signature-checked."""
    if key not in CLASSES:
        raise KeyError(f"unknown upstream class {key!r}; known: {sorted(CLASSES)}")
    module, name = CLASSES[key]
    mod = import_module(module)
    cls = getattr(mod, name, None)
    if cls is None:
        raise UpstreamMismatch(f"{UPSTREAM}: {module} no longer defines {name}")
    check_signatures(key, cls)
    return cls


def load_unpatched_class(key: str) -> type:
    """Class ``key`` compiled from the installed file *as is* (tests only: shows that the fence
    in the generated code comes from the patch). Imported under a private alias module name in the
    same package, so it never replaces the patched module; use it in a separate process from
    patched compiles (the DSL may cache compiled functions by name)."""
    module, name = CLASSES[key]
    if module not in patches.BY_MODULE:
        return load_class(key)
    import_module(module.rpartition(".")[0])  # parent package (stubs, finder)
    alias = module + "__unpatched"
    if alias not in sys.modules:
        path = package_dir() / patches.BY_MODULE[module].relpath
        spec = importlib.util.spec_from_file_location(alias, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[alias] = mod
        with _torch_placeholder_if_missing():
            spec.loader.exec_module(mod)
    return getattr(sys.modules[alias], name)


def source_sha256(key: str) -> str:
    """sha256 of the source text compiled for class ``key``: the patched text for a patched
    module (see :mod:`aot.upstream.patches`), else the installed file (cache keys, manifest)."""
    module, _ = CLASSES[key]
    if module in patches.BY_MODULE:
        return patches.apply_installed(patches.BY_MODULE[module], package_dir())[1].patched_sha256
    rel = Path(*module.split(".")[1:]).with_suffix(".py")
    return hashlib.sha256((package_dir() / rel).read_bytes()).hexdigest()
