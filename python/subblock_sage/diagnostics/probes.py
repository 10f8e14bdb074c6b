"""What ``subblock_sage.check()`` inspects and runs, and the startup policy on top of it.

``check()`` returns a structured :class:`report.Report` (``subblock-sage check [--json]`` prints
it): runtime and kernels versions, driver and CUDA runtime versions, every library of the
install (present, sha256 against the manifest, run on its hardware or only compile-verified),
every visible GPU (compute capability, the target serving it, load result, a small launch of
every shipped compute mode compared with the reference). It never raises for a bad machine.

``validate_startup()`` raises one :class:`StartupValidationError` listing every problem that
stops a device from serving a compute mode, each with its fix, so a server fails at launch (a
B300, an old driver, a broken install) instead of after ten denoise steps. Which modes a target
ships comes from the manifest alone (``compute_modes``, written by the build from the contract).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # annotations only: this module must import without torch
    import torch

from .. import deadline, loader, torch_support, unvalidated
from .._version import __version__
from ..contract import MODES, SAGE_FP8, sha256_file
from ..errors import LibraryIntegrityError, SelfTestTimeoutError, StartupValidationError, SubblockSageError
from ..validation import cuda_device_index
from .report import GPUReport, Report, TargetReport, hardware_status, router_status

log = logging.getLogger("subblock_sage")
_PACKAGE = __package__.rpartition(".")[0]  # "subblock_sage": hook modules are relative to it

# Small launches compared with the reference, per compute mode (every mode of contract.MODES:
# ops/attention.py SELF_TESTS) and per extra kernel: (module, attribute[, key of that mapping]).
# Hook contract: ``fn(device_index) -> str`` (a one-line result; raises on a mismatch) with an
# attribute ``fn.supported(library) -> bool`` (whether that library ships the mode). A hook runs
# on the device's self-test stream and waits with ``deadline.wait_stream`` (never a plain
# synchronize), so a kernel that never finishes fails startup instead of hanging it.
SELF_TESTS: dict[str, tuple[str, ...]] = {
    "sage_quant": ("ops.quantize", "self_test"),
    **{mode: ("ops.attention", "SELF_TESTS", mode) for mode in MODES},
    "router": ("ops.route", "self_test"),
}
# Run after them by `check` on 12.x GPUs (and with --traffic): outputs bit-identical under
# concurrent memory traffic (the SM120 K/V stage-reuse race; diagnostics/traffic.py). Same contract.
TRAFFIC_TEST: tuple[str, str] = ("diagnostics.traffic", "self_test")
# What each public compute mode needs to pass: the quantizer's self-test where the mode quantizes,
# then its own.
MODE_NEEDS = {m.name: ("sage_quant",) * m.quantizes + (m.name,) for m in MODES.values()}
# Self-tests validate_startup also runs, whatever the mode, where the library ships them (the
# router: ``route`` / ``subblock_attention``); one that fails fails startup, one not shipped is
# not a problem (``sparse_attention`` with the caller's own plans does not need it).
ALSO_AT_STARTUP = ("router",)

NOT_SHIPPED = "not shipped for"


def reinstall_hint() -> str:
    return f'pip install --force-reinstall --no-deps "{loader.KERNELS_DIST}=={__version__}"'


def _check_targets(r: Report, m: dict, directory) -> None:
    """Every library of the install: present and matching the manifest's sha256."""
    for name, meta in sorted(m.get("targets", {}).items()):
        ran, status = hardware_status(meta)
        t = TargetReport(gpus=meta.get("gpus", "?"), capabilities=list(meta.get("capabilities", [])),
                         library=meta.get("library", "?"), run_on_hardware=ran, hardware_status=status,
                         kernels=sorted({f"{k['kernel']}/{k['variant']}" for k in meta.get("kernels", [])}),
                         compute_modes=list(meta.get("compute_modes", [])),
                         serves=list(meta.get("serves", [])),
                         unvalidated=[unvalidated.listing(mode, info)
                                      for mode, info in sorted(unvalidated.table(meta, name).items())],
                         router=router_status(meta))
        r.targets[name] = t
        path = directory / t.library
        if not path.is_file():
            t.problem = f"{name}: library {path} is missing. Fix: {reinstall_hint()}"
            continue
        t.present = True
        t.size = path.stat().st_size
        t.sha256_ok = sha256_file(path) == meta.get("sha256")
        if not t.sha256_ok:
            t.problem = (f"{name}: library {path} is corrupted (sha256 does not match the manifest). "
                         f"Fix: {reinstall_hint()}")


def _probe(r: Report, m: dict):
    """A loadable library (any target) for driver and device queries, or None."""
    errors = []
    for name, t in sorted(r.targets.items()):
        if not t.sha256_ok:
            continue
        try:
            return loader.library_for_target(name)
        except SubblockSageError as e:
            t.problem = t.problem or f"{name}: {e}"
            errors.append(str(e))
    r.problems.append("no kernel library of this install loads"
                      + (f" ({errors[0]})" if errors else "") + f". Fix: {reinstall_hint()}")
    return None


def check(*, run_kernels: bool = True, compute_modes: tuple[str, ...] | None = None,
          devices: Iterable[int] | None = None, traffic: bool | None = None) -> Report:
    """Inspect the install, the driver and the visible GPUs; never raises for a bad machine.

    Args:
        run_kernels: launch the self-tests (a small launch per compute mode vs the reference).
        compute_modes: restrict the self-tests to these (``SELF_TESTS`` keys); default all.
        devices: iterable of device indices to inspect; default every visible GPU.
        traffic: also run the traffic repeatability check (diagnostics/traffic.py); default (None):
            on compute capability 12.x only, where the SM120 K/V race was seen.
    """
    r = Report()
    try:
        import torch

        r.torch = torch.__version__
        r.torch_cuda = getattr(torch.version, "cuda", None)
    except ImportError:
        torch = None
    else:
        note = torch_support.version_warning(r.torch)
        if note:
            r.warnings.append(note)
    try:
        source, directory = loader.library_source()
        r.kernels_dir, r.library_source = str(directory), source
        if source == "override":
            r.warnings.append(
                f"the kernel libraries come from {loader.ENV_LIBRARY_DIR}={directory}, not from the installed "
                f"{loader.KERNELS_DIST} wheel: this report describes that folder. Fix (for the installed "
                f"state): unset {loader.ENV_LIBRARY_DIR}")
        m = loader.load_manifest(directory)
    except SubblockSageError as e:
        r.problems.append(str(e))
        return r
    r.kernels_version = m.get("version")
    r.build_commit = m.get("build_commit")
    r.toolchain = dict(m.get("toolchain", {}), **(m.get("upstream") or {}))
    try:
        loader.check_versions(m)
        r.versions_match = True
    except SubblockSageError as e:
        r.problems.append(str(e))
        return r
    _check_targets(r, m, directory)
    probe = _probe(r, m)
    if probe is None:
        return r
    rc, driver, runtime, count = probe.status()
    r.driver_cuda = loader.format_cuda_version(driver) if driver else None
    r.runtime_cuda = loader.format_cuda_version(runtime)
    try:
        probe.check_driver()
        r.driver_ok = True
    except SubblockSageError as e:
        r.problems.append(str(e))
        return r

    if torch is not None and torch.cuda.is_available():
        r.current_device = torch.cuda.current_device()
    elif count:
        r.current_device = 0
    if devices is not None:
        r.devices_requested = sorted({int(d) for d in devices})
    wanted = range(count) if devices is None else r.devices_requested
    for index in wanted:
        if not 0 <= index < count:
            r.problems.append(f"device {index} is not visible ({count} GPU(s); check CUDA_VISIBLE_DEVICES)")
            continue
        _check_gpu(r, m, probe, index, torch, run_kernels, compute_modes, traffic)
    if count == 0:
        r.problems.append("no NVIDIA GPU is visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)")
    return r


def _check_gpu(r: Report, m: dict, probe, index: int, torch, run_kernels: bool, compute_modes,
               traffic: bool | None = None) -> None:
    name = "?"
    if torch is not None and torch.cuda.is_available():
        try:
            name = torch.cuda.get_device_name(index)
        except Exception:  # noqa: BLE001 - the name is informative only
            pass
    try:
        cap = probe.capability(index)
    except SubblockSageError as e:
        g = GPUReport(index=index, name=name, capability="?")
        r.gpus.append(g)
        g.problems.append(str(e))
        return
    g = GPUReport(index=index, name=name, capability=f"{cap[0]}.{cap[1]}")
    r.gpus.append(g)
    try:
        g.target = loader.target_for_capability(m, cap)
    except SubblockSageError as e:
        g.problems.append(str(e))
        return
    meta = m["targets"][g.target]
    g.run_on_hardware, g.target_status = hardware_status(meta)
    g.library = meta["library"]
    g.unvalidated = unvalidated.labels(meta, g.target, g.capability)
    for mode, why in g.unvalidated.items():
        r.warnings.append(f"GPU {index}: compute_mode={mode!r} on {g.target} is UNVALIDATED on compute "
                          f"capability {g.capability} ({why}); validate_startup refuses it without "
                          f"{unvalidated.ENV}=1")
    t = r.targets.get(g.target)
    if t is not None and t.problem:
        g.sha256_ok = t.sha256_ok
        g.problems.append(t.problem)
        return
    try:
        lib = loader.library_for_target(g.target)  # verifies sha256 again, loads
        g.sha256_ok = True
        lib.preload(index)
        g.loaded = True
    except SubblockSageError as e:
        if isinstance(e, LibraryIntegrityError):
            g.sha256_ok = False
        g.problems.append(str(e))
        return
    if not g.run_on_hardware:
        r.warnings.append(f"GPU {index}: {g.target} is {g.target_status}")
    served = True
    if run_kernels:
        too_old = None if torch is None else torch_support.version_problem(torch.__version__)
        if torch is None:
            g.problems.append(f"PyTorch is not installed, so the launch self-tests (and the ops) cannot "
                              f"run. Fix: {torch_support.INSTALL}")
            served = False
        elif too_old:
            g.problems.append(too_old)
            served = False
        elif not torch.cuda.is_available():
            g.problems.append(f"torch {torch.__version__} cannot use the GPU (a CPU-only build, or "
                              f"its CUDA does not match the driver). Fix: install a CUDA build of "
                              f"PyTorch")
            served = False
        else:
            for mode, hook in SELF_TESTS.items():
                if compute_modes and mode not in compute_modes:
                    continue
                if g.timed_out:  # the GPU may still run the stuck kernel: launch nothing more
                    g.self_tests[mode] = "skipped: an earlier self-test missed its deadline"
                    continue
                served &= _self_test(g, mode, hook, lib)
            if (cap[0] == 12 if traffic is None else traffic) and not g.timed_out and not compute_modes:
                served &= _self_test(g, "traffic", TRAFFIC_TEST, lib)
    g.served = served


def _self_test(g: GPUReport, mode: str, hook: tuple[str, ...], lib) -> bool:
    mod, fn, *key = hook
    try:
        try:
            module = importlib.import_module(f".{mod}", _PACKAGE)
        except ModuleNotFoundError as e:
            if not e.name or not f"{_PACKAGE}.{mod}".startswith(e.name):
                raise
            module = importlib.import_module(mod)  # an absolute module name (tests, plugins)
        test = getattr(module, fn)
        if key:
            test = test[key[0]]
    except (ImportError, AttributeError, KeyError) as e:
        g.self_tests[mode] = f"{NOT_SHIPPED} {g.target} (no self-test: {e})"
        return True
    try:
        supported = bool(test.supported(lib))
    except Exception as e:  # noqa: BLE001
        supported = False
        log.debug("self-test %s: supported() failed: %s", mode, e)
    if not supported:
        g.self_tests[mode] = f"{NOT_SHIPPED} {g.target}"
        return True
    try:
        with deadline.on_selftest_stream(g.index, f"GPU {g.index} ({g.target}), {mode} self-test"):
            g.self_tests[mode] = "ok: " + str(test(g.index))
        return True
    except SelfTestTimeoutError as e:
        g.timed_out = True
        g.self_tests[mode] = f"TIMED OUT: {e.problems[0]}"
        g.problems.append(f"{mode} self-test of the {g.target} kernels did not finish within the "
                          f"{deadline.timeout_s():g} s deadline ({deadline.ENV}); startup fails "
                          f"instead of hanging. {deadline.fix_hint(g.target)}")
        return False
    except Exception as e:  # noqa: BLE001 - report every failure; the caller decides
        g.self_tests[mode] = f"FAILED: {e}"
        g.problems.append(f"{mode} self-test failed: {e}. Fix: {reinstall_hint()}; if it "
                          f"persists, report it with the output of `subblock-sage check --json`")
        return False


def validate_startup(compute_mode: str = SAGE_FP8.name, device: int | str | torch.device | None = None, *,
                     allow_unvalidated: bool | None = None) -> Report:
    """Raise StartupValidationError (every problem, each with its fix) unless ``device`` is fully
    served for ``compute_mode``; return the report otherwise.

    Args:
        compute_mode: ``"sage_fp8"`` or ``"bf16"``.
        device: a CUDA device (index, ``"cuda:N"``, ``torch.device``); ``None``: the current
            CUDA device; ``"all"``: every visible GPU.
        allow_unvalidated: serve a compute mode labelled unvalidated on the GPU (Sage on 12.1);
            default: ``SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1`` (see unvalidated.py).

    Self-test launches wait with a deadline (``SUBBLOCK_SAGE_SELFTEST_TIMEOUT_S``, default 60 s):
    one that does not finish raises SelfTestTimeoutError (a StartupValidationError).
    """
    if compute_mode not in MODE_NEEDS:
        raise ValueError(f"compute_mode must be one of {tuple(MODE_NEEDS)}, got {compute_mode!r}")
    devices = None
    if device is None:
        try:
            import torch

            if torch.cuda.is_available():
                devices = [torch.cuda.current_device()]
        except ImportError:
            pass
    elif device != "all":
        devices = [cuda_device_index(device, "validate_startup")]
    r = check(compute_modes=MODE_NEEDS[compute_mode] + ALSO_AT_STARTUP, devices=devices)
    problems = list(r.problems)
    gpus = r.gpus
    used_targets = {g.target for g in gpus if g.target}
    # a broken library of a target no checked GPU uses does not stop this device
    problems += [t.problem for n, t in r.targets.items() if t.problem and n in used_targets and
                 not any(t.problem in g.problems for g in gpus)]
    for g in gpus:
        where = f"GPU {g.index} ({g.name}, compute capability {g.capability}"
        where += f", {g.target})" if g.target else ")"
        problems += [f"{where}: {p}" for p in g.problems]
        if g.problems:
            continue
        if compute_mode in g.unvalidated and not unvalidated.allowed(allow_unvalidated):
            problems.append(unvalidated.refusal(where, compute_mode, g.unvalidated[compute_mode], g.target))
            continue
        for need in MODE_NEEDS[compute_mode]:
            if g.self_tests.get(need, "").startswith(NOT_SHIPPED):
                other = [m for m in MODE_NEEDS if m != compute_mode]
                problems.append(
                    f"{where}: compute_mode={compute_mode!r} is not shipped for {g.target} "
                    f"(missing: {need}). Fix: use compute_mode={other[0]!r} on this GPU, or a GPU "
                    f"whose target ships it ({_targets_shipping(r, compute_mode)})"
                )
                break
    if not gpus and not problems:
        problems.append("no GPU to validate (no CUDA device visible to torch). Fix: check "
                        "CUDA_VISIBLE_DEVICES and that PyTorch is a CUDA build")
    if problems:
        # keep order, drop duplicates
        cls = SelfTestTimeoutError if any(g.timed_out for g in gpus) else StartupValidationError
        raise cls(list(dict.fromkeys(problems)))
    return r


def _targets_shipping(r: Report, compute_mode: str) -> str:
    rows = [f"{n}: {t.gpus}" for n, t in sorted(r.targets.items())
            if compute_mode in t.compute_modes]  # from the manifest alone
    return "; ".join(rows) or "none in this install"
