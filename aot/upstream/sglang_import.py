"""Import SGLang's SM90 FlashAttention forward class without running ``sglang/__init__.py``.

SGLang (``sglang==0.5.23``) vendors FlashAttention's CuTe-DSL forward kernels and, on H100/H200,
runs its bf16 SubBlock attention through ``flash_attn_func`` with block-sparse tensors. We compile
that class ahead of time into the *test* library only (a bench contender, never shipped). SGLang
and its kernel dependencies are build-time packages of the test-library export only: pinned in
``wheels/test-build-requirements.txt``, installed with ``--no-deps`` into a folder of their own
(``SBS_SGLANG_BUILD_SITE``), never into the build environment and never copied into this
repository.

``sglang/__init__.py`` imports the whole serving stack (numpy, transformers, ...), and ``quack``'s
``__init__`` imports its torch-bound kernels; the FlashAttention class needs neither. So, as for
FlashInfer (:mod:`aot.upstream.flashinfer_import`), *stub parent packages* whose ``__path__``
points at the installed folders stand in for those ``__init__`` files, and only the kernel module
and what it imports run. ``quack/__init__`` has one side effect the kernels rely on: importing
``quack.dsl`` installs CuTe tensor-indexing sugar; it is imported explicitly.

Two kernel helper modules (``block_sparsity.py``, ``cute_dsl_utils.py``) import torch at module
level for annotations and a dtype table that the compile never reads; without torch (the build env
has none) a placeholder module stands in while the import runs. ``apache-tvm-ffi`` (imported by the
DSL's TVM-FFI builder through ``quack.cute_dsl_utils``) probes torch at import, so it is imported
before the placeholder exists and sees no torch.

Versions are pinned exactly (:data:`PINS`), and so are the signatures our compile spec relies on
(:data:`SIGNATURE_PINS`): a different install fails the build with :class:`UpstreamMismatch`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import types
from pathlib import Path
from typing import Any

from aot.upstream import stubs
from aot.upstream.stubs import STUB_MARK as _STUB_MARK, UpstreamMismatch

# Folder holding the pinned packages (pip install --no-deps --target ...); put on sys.path by
# :func:`activate`. Only the SGLang export process reads it, so no other export sees SGLang.
SITE_ENV = "SBS_SGLANG_BUILD_SITE"
REQUIREMENTS = "wheels/test-build-requirements.txt"

# distribution -> version (the pins of wheels/test-build-requirements.txt; tested equal)
PINS: dict[str, str] = {
    "sglang": "0.5.23",
    "quack-kernels": "0.6.5",
    "apache-tvm-ffi": "0.1.11",
}
UPSTREAM = f"sglang=={PINS['sglang']}"

_CUTE = "sglang.kernels.ops.attention.flash_attn.cute"
_STUB_PACKAGES = ("quack", "sglang", "sglang.kernels", "sglang.kernels.ops",
                  "sglang.kernels.ops.attention", "sglang.kernels.ops.attention.flash_attn", _CUTE)

# key -> (module, class name)
CLASSES: dict[str, tuple[str, str]] = {
    "sm90_fwd": (f"{_CUTE}.flash_fwd_sm90", "FlashAttentionForwardSm90"),
    "fwd_base": (f"{_CUTE}.flash_fwd", "FlashAttentionForwardBase"),
}

# sha256 of the pinned files whose code the export compiles or whose rule the spec copies (the
# class, its base, the block-sparse helpers, and interface.py, whose config rule and call
# arguments the spec follows): any other bytes fail the build, so the export cache (keyed by
# repository files) stays correct without hashing the installed tree.
FILE_PINS: dict[str, str] = {
    "flash_fwd_sm90.py": "066d2cb58deaf65b00be93bfd29d0297a93283b208b1fdaf9f10392eb31f330c",
    "flash_fwd.py": "97edf14f4be14d83176efc816f867c0bf751ae65b380942da9147932ce959ea4",
    "block_sparse_utils.py": "54abc93843b731ec2d114148c75798718221565fb09b0bc6923d70526fed7e90",
    "block_sparsity.py": "9ca21cf8b9ae5f7c44023df646f70b793667cdce2bbb09ba15f5f7a3a19a4c26",
    "interface.py": "a05f987c6503f0431048b3f392838b2be00b4815959d5a9c02bebc670df2060b",
}

# method -> ((parameter, default repr or None when required), ...); names, order and defaults only.
# FlashAttentionForwardSm90.__init__ is (*args, <its own flags>, **kwargs) over the base's.
SIGNATURE_PINS: dict[str, dict[str, tuple[tuple[str, str | None], ...]]] = {
    "sm90_fwd": {
        "__init__": (
            ("self", None), ("args", None), ("intra_wg_overlap", "True"), ("mma_pv_is_rs", "True"),
            ("paged_kv_non_tma", "False"), ("has_bias", "False"), ("bias_block_size", "128"),
            ("rel_extent_padded", "128"), ("kwargs", None),
        ),
        "__call__": (
            ("self", None), ("mQ", None), ("mK", None), ("mV", None), ("mO", None), ("mLSE", None),
            ("softmax_scale", None), ("mCuSeqlensQ", "None"), ("mCuSeqlensK", "None"),
            ("mSeqUsedQ", "None"), ("mSeqUsedK", "None"), ("mPageTable", "None"),
            ("window_size_left", "None"), ("window_size_right", "None"), ("learnable_sink", "None"),
            ("blocksparse_tensors", "None"), ("aux_data", "AuxData(tensors=None, scalars=None)"),
            ("mBias", "None"), ("stream", "None"),
        ),
    },
    "fwd_base": {
        "__init__": (
            ("self", None), ("dtype", None), ("head_dim", None), ("head_dim_v", "None"),
            ("qhead_per_kvhead", "1"), ("is_causal", "False"), ("is_local", "False"),
            ("pack_gqa", "True"), ("tile_m", "128"), ("tile_n", "128"), ("num_stages", "1"),
            ("num_threads", "128"), ("Q_in_regs", "False"), ("score_mod", "None"),
            ("mask_mod", "None"), ("has_aux_tensors", "False"), ("q_subtile_factor", "None"),
            ("is_split_kv", "False"),
        ),
    },
}


def site() -> Path | None:
    """The folder of the pinned build-time packages (``SBS_SGLANG_BUILD_SITE``), or None."""
    return stubs.env_site(SITE_ENV)


def activate() -> Path:
    """Put the pinned packages' folder on ``sys.path`` (first), checking every pin."""
    return stubs.activate_site(SITE_ENV, PINS, REQUIREMENTS, "the SGLang contender of the test library")


def package_dir() -> Path:
    return activate() / "sglang"


def _refuse_imported(name: str, mod: types.ModuleType) -> None:
    raise UpstreamMismatch(
        f"{name} is already imported (from {getattr(mod, '__file__', '?')}); the SGLang "
        "contender imports its kernel modules under stub packages. Fix: export it in a "
        "process of its own (python -m aot.export unit does)"
    )


def _install_stub_packages(root: Path) -> None:
    stubs.install_stub_packages(root, _STUB_PACKAGES, UPSTREAM, refuse=_refuse_imported)


class _PlaceholderMeta(type):
    """Every attribute is another placeholder class: ``torch.device | None`` annotations,
    ``{torch.float16: ...}`` tables and ``torch._C._cuda_getCurrentRawStream`` all evaluate."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        kids = cls.__dict__["_kids"]
        if name not in kids:
            kids[name] = _PlaceholderMeta(f"{cls.__name__}.{name}", (), {"_kids": {}})
        return kids[name]


def _placeholder_torch() -> types.ModuleType:
    root = _PlaceholderMeta("torch", (), {"_kids": {}})
    mod = types.ModuleType("torch", "placeholder: torch is not installed in the build environment")
    setattr(mod, _STUB_MARK, True)
    mod.__getattr__ = lambda name: getattr(root, name)  # type: ignore[attr-defined]  # PEP 562
    return mod


def _torch_placeholder_if_missing():
    return stubs.torch_placeholder_if_missing(_placeholder_torch)


def file_sha256(name: str) -> str:
    return hashlib.sha256((package_dir() / Path(*_CUTE.split(".")[1:]) / name).read_bytes()).hexdigest()


def check_files() -> None:
    bad = {n: got for n, want in FILE_PINS.items() if (got := file_sha256(n)) != want}
    if bad:
        raise UpstreamMismatch(
            f"{UPSTREAM}: these files of {_CUTE} differ from the pinned bytes: "
            + ", ".join(f"{n} (sha256 {h})" for n, h in sorted(bad.items()))
            + ". Fix: reinstall from " + REQUIREMENTS + ", or review the new files and update "
            "FILE_PINS and the compile spec (aot/kernels/sglang_sm90.py)"
        )


def import_module(module: str) -> types.ModuleType:
    """Import ``module`` (inside the FlashAttention CuTe package or ``quack``) from the pinned
    install, torch-free when torch is absent."""
    where = activate()
    check_files()
    _install_stub_packages(where)
    import tvm_ffi  # noqa: F401  # before any torch placeholder: it probes torch at import

    with _torch_placeholder_if_missing():
        importlib.import_module("quack.dsl")  # what quack/__init__ does for the kernels
        return importlib.import_module(module)


def check_signatures(key: str, cls: type) -> None:
    stubs.check_signatures(SIGNATURE_PINS[key], cls, UPSTREAM,
                           "the compile spec (aot/kernels/sglang_sm90.py) no longer matches it")


def load_class(key: str) -> type:
    """The pinned class ``key`` (see :data:`CLASSES`), signature-checked."""
    module, name = CLASSES[key]
    cls = getattr(import_module(module), name, None)
    if cls is None:
        raise UpstreamMismatch(f"{UPSTREAM}: {module} no longer defines {name}")
    check_signatures(key, cls)
    return cls
