"""Startup validation: is this machine fully served, and if not, what exactly is the fix?

``check()`` returns a structured report (``subblock-sage check [--json]`` prints it);
``validate_startup()`` raises one :class:`StartupValidationError` listing every problem, so a
server fails at launch instead of after ten denoise steps.
"""

from __future__ import annotations

import importlib
import logging
import platform
from dataclasses import asdict, dataclass, field

from . import loader
from ._version import __version__
from .errors import StartupValidationError, SubblockSageError

log = logging.getLogger("subblock_sage")

# Small launches compared with the reference, per compute mode: (module, function). Each
# function takes a device index and returns a one-line result, raising on a mismatch.
SELF_TESTS: dict[str, tuple[str, str]] = {
    "sage_quant": ("ops.quantize", "self_test"),
    "sage_fp8": ("ops.attention", "self_test_sage_fp8"),
    "bf16": ("ops.attention", "self_test_bf16"),
}


@dataclass
class GPUReport:
    index: int
    name: str
    capability: str
    target: str | None = None
    target_status: str | None = None
    library: str | None = None
    sha256_ok: bool | None = None
    loaded: bool = False
    self_tests: dict[str, str] = field(default_factory=dict)
    served: bool = False


@dataclass
class Report:
    runtime_version: str = __version__
    kernels_version: str | None = None
    versions_match: bool = False
    kernels_dir: str | None = None
    build_commit: str | None = None
    toolchain: dict = field(default_factory=dict)
    driver_cuda: str | None = None
    runtime_cuda: str | None = None
    driver_ok: bool = False
    torch: str | None = None
    python: str = platform.python_version()
    targets: dict[str, str] = field(default_factory=dict)
    gpus: list[GPUReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True only when every visible GPU is fully served."""
        return not self.problems and bool(self.gpus) and all(g.served for g in self.gpus)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _target_status(meta: dict) -> str:
    hw = meta.get("hardware", {})
    if hw.get("run_on_hardware"):
        return f"run on hardware ({hw.get('gpu', '?')}, {hw.get('date', '?')})"
    return hw.get("status", "compile-verified, not yet run on that hardware")


def check(*, run_kernels: bool = True, compute_modes: tuple[str, ...] | None = None) -> Report:
    """Inspect the install, the driver and every visible GPU; never raises for a bad machine."""
    r = Report()
    try:
        import torch

        r.torch = torch.__version__
    except ImportError:
        r.torch = None
    try:
        directory = loader.kernels_dir()
        r.kernels_dir = str(directory)
        m = loader.load_manifest(directory)
    except SubblockSageError as e:
        r.problems.append(str(e))
        return r
    r.kernels_version = m.get("version")
    r.build_commit = m.get("build_commit")
    r.toolchain = dict(m.get("toolchain", {}), **m.get("upstream", {}))
    r.targets = {t: f"{meta['gpus']}: {_target_status(meta)}" for t, meta in m["targets"].items()}
    try:
        loader.check_versions(m)
        r.versions_match = True
    except SubblockSageError as e:
        r.problems.append(str(e))
        return r
    try:
        probe = loader.any_library()
        _, driver, runtime, count = probe.status()
        r.driver_cuda = loader.format_cuda_version(driver)
        r.runtime_cuda = loader.format_cuda_version(runtime)
        probe.check_driver()
        r.driver_ok = True
    except SubblockSageError as e:
        r.problems.append(str(e))
        return r

    for index in range(count):
        cap = probe.capability(index)
        name = "?"
        if r.torch is not None:
            import torch

            if torch.cuda.is_available():
                name = torch.cuda.get_device_name(index)
        g = GPUReport(index=index, name=name, capability=f"{cap[0]}.{cap[1]}")
        r.gpus.append(g)
        try:
            g.target = loader.target_for_capability(m, cap)
            meta = m["targets"][g.target]
            g.target_status = _target_status(meta)
            g.library = meta["library"]
            lib = loader.library_for_target(g.target)  # verifies sha256, loads
            g.sha256_ok = True
            lib.preload(index)
            g.loaded = True
        except SubblockSageError as e:
            if isinstance(e, loader.LibraryIntegrityError):
                g.sha256_ok = False
            r.problems.append(f"GPU {index} ({name}, {g.capability}): {e}")
            continue
        served = True
        if run_kernels:
            if r.torch is None:
                r.problems.append("torch is not installed: cannot run the launch self-tests. Fix: install PyTorch")
                served = False
            else:
                for mode, (mod, fn) in SELF_TESTS.items():
                    if compute_modes and mode not in compute_modes:
                        continue
                    served &= _self_test(r, g, mode, mod, fn, lib)
        g.served = served
    if count == 0:
        r.problems.append("no NVIDIA GPU is visible (check CUDA_VISIBLE_DEVICES)")
    return r


def _self_test(r: Report, g: GPUReport, mode: str, mod: str, fn: str, lib) -> bool:
    try:
        test = getattr(importlib.import_module(f".{mod}", __package__), fn)
    except (ImportError, AttributeError):
        g.self_tests[mode] = "not available in this version"
        return True
    if not test.supported(lib):
        g.self_tests[mode] = f"not shipped for {g.target}"
        return True
    try:
        g.self_tests[mode] = "ok: " + test(g.index)
        return True
    except Exception as e:  # report every failure; the caller decides
        g.self_tests[mode] = f"FAILED: {e}"
        r.problems.append(f"GPU {g.index}: {mode} self-test failed: {e}")
        return False


def validate_startup(compute_mode: str = "sage_fp8", device=None) -> Report:
    """Raise StartupValidationError (listing every problem with its fix) unless ``device``
    (default: every visible GPU) is fully served for ``compute_mode``."""
    r = check(compute_modes=(compute_mode, "sage_quant") if compute_mode == "sage_fp8" else (compute_mode,))
    problems = list(r.problems)
    gpus = r.gpus
    if device is not None:
        import torch

        idx = torch.device(device).index or 0
        gpus = [g for g in r.gpus if g.index == idx]
        if not gpus and not problems:
            problems.append(f"device {device} is not visible")
    for g in gpus:
        status = g.self_tests.get(compute_mode, "")
        if status.startswith("not shipped"):
            problems.append(
                f"GPU {g.index} ({g.name}, {g.target}): compute_mode={compute_mode!r} is not "
                f"shipped for this target; use compute_mode='bf16'"
            )
    if problems or not gpus:
        raise StartupValidationError(problems or ["no GPU is served"])
    return r


def format_report(r: Report) -> str:
    rows = [
        ("subblock-sage", r.runtime_version),
        ("subblock-sage-kernels-cu13", f"{r.kernels_version or 'not installed'}"
         + ("" if r.kernels_version is None else (" (matches)" if r.versions_match else " (MISMATCH)"))),
        ("kernels folder", r.kernels_dir or "-"),
        ("build commit", r.build_commit or "-"),
        ("toolchain", ", ".join(f"{k} {v}" for k, v in sorted(r.toolchain.items())) or "-"),
        ("NVIDIA driver (CUDA)", f"{r.driver_cuda or '-'}" + (" ok" if r.driver_ok else "")),
        ("CUDA runtime (static)", r.runtime_cuda or "-"),
        ("torch", r.torch or "not installed"),
        ("python", r.python),
    ]
    width = max(len(k) for k, _ in rows)
    out = ["subblock-sage check", ""]
    out += [f"{k:<{width}}  {v}" for k, v in rows]
    if r.targets:
        out += ["", "GPU targets in this install:"]
        out += [f"  {t:<8} {s}" for t, s in sorted(r.targets.items())]
    if r.gpus:
        out += ["", "GPUs:"]
        for g in r.gpus:
            out.append(
                f"  [{g.index}] {g.name} (compute capability {g.capability}) -> "
                f"{g.target or 'no target'}: {'SERVED' if g.served else 'NOT SERVED'}"
            )
            if g.library:
                out.append(f"      library {g.library}: sha256 {'ok' if g.sha256_ok else 'MISMATCH' if g.sha256_ok is False else '-'}, "
                           f"{'loaded' if g.loaded else 'not loaded'}; target status: {g.target_status}")
            for mode, res in g.self_tests.items():
                out.append(f"      {mode:<10} {res}")
    out.append("")
    if r.problems:
        out.append("Problems:")
        out += [f"  - {p}" for p in r.problems]
    out.append("Result: " + ("OK: every visible GPU is fully served" if r.ok else "NOT SERVED"))
    return "\n".join(out)
