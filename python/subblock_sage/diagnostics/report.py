"""The report model of ``subblock_sage.check()``: installed libraries, GPUs, problems, verdict."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field

from .. import loader
from .._version import __version__


def hardware_status(meta: dict) -> tuple[bool, str]:
    hw = meta.get("hardware") or {}
    if hw.get("run_on_hardware"):
        return True, f"run on hardware ({hw.get('gpu', '?')}, {hw.get('date', '?')})"
    return False, hw.get("status") or "compile-verified, not yet run on that hardware"


# The router's kernels (``route``, ``subblock_attention``) of a library whose hardware entry
# (aot/hardware_runs.json, copied into the manifest) names no router run: compiled and checked
# against the float64 reference on the CPU only.
ROUTER_UNRUN = "compile-verified, NOT YET RUN ON A GPU of this target"
# A library that does not ship them.
ROUTER_ABSENT = "not in this library (route / subblock_attention unavailable)"


def router_status(meta: dict) -> str:
    """What the library's router is: its GPU run (the manifest's ``hardware.router``), that it has
    not run on a GPU, or that this library has none."""
    from ..backends.router import ROUTER_KERNELS

    shipped = {k.get("kernel") for k in meta.get("kernels", [])}
    if not all(k in shipped for k in ROUTER_KERNELS):
        return ROUTER_ABSENT
    return (meta.get("hardware") or {}).get("router") or ROUTER_UNRUN


def router_brief(status: str) -> str:
    """A :func:`router_status` for the one-line listing of ``check``: a GPU run up to its first
    colon (aot/hardware_runs.json writes "run on an H100 (2026-12-07): what was checked"; the
    whole text is in ``check --verbose`` and the JSON), the other two as they are."""
    if status in (ROUTER_UNRUN, ROUTER_ABSENT):
        return status
    return status.partition(": ")[0]


@dataclass
class TargetReport:
    gpus: str
    capabilities: list
    library: str
    present: bool = False
    sha256_ok: bool | None = None  # None: not checked (missing)
    size: int | None = None
    run_on_hardware: bool = False
    hardware_status: str = ""
    kernels: list = field(default_factory=list)
    compute_modes: list = field(default_factory=list)  # manifest
    serves: list = field(default_factory=list)  # manifest lines (aot/serving.py), printed as-is
    unvalidated: list = field(default_factory=list)  # unvalidated.listing() lines, any GPU present or not
    router: str = ""  # router_status
    problem: str | None = None


@dataclass
class GPUReport:
    index: int
    name: str
    capability: str
    target: str | None = None
    target_status: str | None = None
    run_on_hardware: bool = False
    library: str | None = None
    sha256_ok: bool | None = None
    loaded: bool = False
    self_tests: dict[str, str] = field(default_factory=dict)
    served: bool = False
    problems: list[str] = field(default_factory=list)
    unvalidated: dict[str, str] = field(default_factory=dict)  # compute mode -> why (unvalidated.py)
    timed_out: bool = False  # a self-test missed its deadline (deadline.py)


@dataclass
class Report:
    runtime_version: str = __version__
    kernels_version: str | None = None
    versions_match: bool = False
    kernels_dir: str | None = None
    library_source: str | None = None  # "installed" (the kernels wheel) or "override" (SUBBLOCK_SAGE_LIBRARY_DIR)
    build_commit: str | None = None
    toolchain: dict = field(default_factory=dict)
    driver_cuda: str | None = None
    runtime_cuda: str | None = None
    min_driver_cuda: str = loader.format_cuda_version(loader.MIN_DRIVER)
    driver_ok: bool = False
    torch: str | None = None
    torch_cuda: str | None = None
    python: str = platform.python_version()
    machine: str = platform.machine()
    targets: dict[str, TargetReport] = field(default_factory=dict)
    gpus: list[GPUReport] = field(default_factory=list)
    current_device: int | None = None
    devices_requested: list | None = None  # check(devices=...): those decide `ok`
    problems: list[str] = field(default_factory=list)  # not tied to one GPU or library
    warnings: list[str] = field(default_factory=list)

    def gpu(self, index: int) -> GPUReport | None:
        return next((g for g in self.gpus if g.index == index), None)

    @property
    def all_problems(self) -> list[str]:
        out = list(self.problems)
        out += [t.problem for t in self.targets.values() if t.problem]
        for g in self.gpus:
            out += [f"GPU {g.index} ({g.name}, compute capability {g.capability}): {p}" for p in g.problems]
        return out

    @property
    def ok(self) -> bool:
        """True only when the install is sound and the current GPU (or every GPU asked for
        with ``check(devices=...)``) is fully served."""
        if self.problems or any(t.problem for t in self.targets.values()):
            return False
        if self.devices_requested is not None:
            return self.all_served
        g = self.gpu(self.current_device) if self.current_device is not None else None
        return g is not None and g.served

    @property
    def all_served(self) -> bool:
        return bool(self.gpus) and all(g.served for g in self.gpus)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["all_served"] = self.all_served
        d["all_problems"] = self.all_problems
        return d
