"""Kernel registry: every kernel x GPU target x compile-time variant that the build exports.

A kernel module (``aot/kernels/*.py``) describes itself with one :class:`Kernel`. Its
``compile_spec(target, variant)`` returns the CuTe-DSL callable plus an ordered list of
argument specs; :mod:`aot.export` turns the specs into fake tensors with symbolic sizes and
strides, compiles, exports, and records each argument's layout for the runtime marshaller.

Nothing here imports CuTe-DSL, so the registry can be listed (and tested) cheaply.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from aot.contract import TARGET_NAMES, TARGETS, Target  # noqa: F401  (the registry's targets)

# ---------------------------------------------------------------------------------------------
# GPU targets: declared once, in the contract (python/subblock_sage/contract.py TARGETS: name,
# wheel folder, ELF SM number, compute capabilities, GPUs, attention-kernel family), which the
# runtime reads too; the build takes them from there (docs/design/extending.md).

# ---------------------------------------------------------------------------------------------
# Argument specs. Sizes and strides are ints (static: baked into the binary, checked at run
# time for equality) or `Sym` (dynamic: passed at run time; `div` is a divisibility the kernel
# was compiled to assume, which the runtime checks before every launch).


@dataclass(frozen=True)
class Sym:
    """A symbolic (run-time) extent or stride. ``key`` ties equal extents across arguments."""

    key: str
    div: int = 1
    width: int = 32  # 32 or 64 bits; strides default to 64 (see TensorArg)


@dataclass(frozen=True)
class TensorArg:
    name: str
    dtype: str  # "bfloat16", "int8", "float8_e4m3fn", "float32", "int32"
    shape: tuple[int | Sym, ...]
    stride: tuple[int | Sym, ...]
    align: int = 16  # bytes the data pointer must be aligned to


@dataclass(frozen=True)
class ScalarArg:
    name: str
    dtype: str  # "float32" or "int32"
    example: float | int = 1


@dataclass(frozen=True)
class StreamArg:
    name: str = "stream"


ArgSpec = TensorArg | ScalarArg | StreamArg


@dataclass(frozen=True)
class CompileSpec:
    """What one (kernel, variant, target) compiles: ``fn(*fake_args)`` under ``cute.compile``.

    ``extra_kwargs`` are passed to ``fn`` after the spec'd arguments (compile-time Python values
    such as ``None`` for an absent optional tensor); they never appear in the C ABI. ``by_name``:
    the spec'd arguments are passed by their names, so that ``extra_kwargs`` may fill parameters
    between them (one entry serving variants whose C ABIs leave out different tensors).
    """

    fn: Callable[..., Any]
    args: Sequence[ArgSpec]
    extra_kwargs: Mapping[str, Any] = field(default_factory=dict)
    by_name: bool = False

    def bind(self, values: Sequence[Any]) -> tuple[tuple, dict]:
        """``fn``'s (positional, keyword) arguments for ``values``, one per spec'd argument."""
        if self.by_name:
            return (), {**{a.name: x for a, x in zip(self.args, values, strict=True)}, **self.extra_kwargs}
        return tuple(values), dict(self.extra_kwargs)


@dataclass(frozen=True)
class Variant:
    name: str  # short and unique within its kernel: part of the exported symbol
    # what the export records (exports.json, manifest.json) and the runtime selects it by
    # (contract.select_variant); a kernel module may derive both from one config (sm90/variants.py)
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Kernel:
    name: str  # unique; the runtime launches by (name, variant)
    doc: str
    targets: tuple[str, ...]  # shipped targets
    variants: tuple[Variant, ...]
    compile_spec: Callable[[str, Variant], CompileSpec]
    # Targets built only into the test library (never shipped), e.g. sm_120a classes built for
    # sm_90a so that the H200 can check their marshalling numerically.
    test_targets: tuple[str, ...] = ()
    # Variants built only into the test library of each shipped target (never shipped): those only
    # a benchmark or a GPU test selects (e.g. the sm90 kernels' alternative CTA shapes).
    test_variants: tuple[Variant, ...] = ()
    upstream: str | None = None  # e.g. "flashinfer-python==0.7.2.post1"


# Kernel modules register themselves by exposing `KERNELS: list[Kernel]`.
KERNEL_MODULES: tuple[str, ...] = (
    "aot.kernels.sage_quant", "aot.kernels.plan_prepare",
    "aot.kernels.flashinfer_sm120", "aot.kernels.flashinfer_sm100",
    "aot.kernels.sm90", "aot.kernels.sglang_sm90", "aot.kernels.router",
    "aot.kernels.cudnn_sm90", "aot.kernels.cudnn_sm100",
)


# Built only on request (CMake -DSBS_EXPERIMENTS=ON, `python -m aot.export ... --experiments`),
# never in a release: every module of this package (aot/experiments/__init__.py). Their KERNELS
# replace the registered kernels of the same name (the same kernels with more variants).
EXPERIMENTS_PACKAGE = "aot.experiments"


def experiment_modules() -> tuple[str, ...]:
    """The modules of ``EXPERIMENTS_PACKAGE``, found in its folder (nothing imported): an
    experiment is added by adding its module there, and no shipped file names it."""
    folder = Path(__file__).resolve().parent / EXPERIMENTS_PACKAGE.split(".", 1)[1]
    return tuple(f"{EXPERIMENTS_PACKAGE}.{m.name}" for m in sorted(pkgutil.iter_modules([str(folder)]),
                                                                   key=lambda m: m.name))


def kernel_modules() -> tuple[str, ...]:
    """KERNEL_MODULES, or the comma-separated override SUBBLOCK_SAGE_KERNEL_MODULES (tests)."""
    env = os.environ.get("SUBBLOCK_SAGE_KERNEL_MODULES", "")
    return tuple(m for m in env.split(",") if m) or KERNEL_MODULES


def all_kernels(experiments: bool = False) -> list[Kernel]:
    kernels: list[Kernel] = []
    for mod_name in kernel_modules():
        mod = importlib.import_module(mod_name)
        kernels.extend(mod.KERNELS)
    if experiments:
        extra = {k.name: k for m in experiment_modules() for k in importlib.import_module(m).KERNELS}
        kernels = [extra.pop(k.name, k) for k in kernels] + list(extra.values())
    names = [k.name for k in kernels]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"duplicate kernel names in registry: {sorted(dupes)}")
    for k in kernels:
        for t in (*k.targets, *k.test_targets):
            if t not in TARGETS:
                raise ValueError(f"kernel {k.name}: unknown target {t!r}; known: {sorted(TARGETS)}")
    return kernels


def symbol_prefix(kernel: str, variant: str, target: str, test: bool = False) -> str:
    """Unique C symbol prefix of one export (and its files' stem, ``<prefix>.o/.h/.json``):
    distinct prefixes never collide when linked. Of names, not registry objects, so that an export
    process derives every unit's prefix before it imports the kernel module (a cache hit never
    imports it)."""
    return f"sbs_{'t' if test else ''}{TARGETS[target].folder}_{kernel}_{variant}"
