"""Find, verify and load the kernel library that serves a GPU.

At first use: find the kernels distribution (or ``SUBBLOCK_SAGE_LIBRARY_DIR``), check that its
version equals the runtime's, pick the library for the device's compute capability, verify its
sha256 against the manifest, load it with ctypes, check the driver. Libraries load once per
process under a lock; kernels load per device lazily inside the library (its own mutex).
Nothing here needs torch, and importing this module never touches the GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import threading
from typing import Any
from dataclasses import dataclass
from pathlib import Path

from ._version import __version__
from .errors import (
    DriverTooOldError,
    KernelsNotInstalledError,
    LaunchError,
    LibraryIntegrityError,
    NoGPUError,
    UnsupportedGPUError,
    VersionMismatchError,
)

log = logging.getLogger("subblock_sage")

KERNELS_DIST = "subblock-sage-kernels-cu13"
KERNELS_PACKAGE = "subblock_sage_kernels"
ABI_VERSION = 1
MIN_DRIVER = 13000  # cudart 13 (static) needs an r580+ driver, which reports CUDA 13.0
ENV_LIBRARY_DIR = "SUBBLOCK_SAGE_LIBRARY_DIR"


def install_hint(version: str = __version__) -> str:
    return f'pip install "subblock-sage[cu130]=={version}"'


def format_cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "none"


# ---------------------------------------------------------------------------------------------
# The kernels distribution


def kernels_dir() -> Path:
    """Folder holding manifest.json and one sub-folder per GPU target."""
    override = os.environ.get(ENV_LIBRARY_DIR)
    if override:
        path = Path(override)
        if not (path / "manifest.json").is_file():
            raise KernelsNotInstalledError(
                f"{ENV_LIBRARY_DIR}={override} has no manifest.json. Point it at a folder laid "
                f"out like the installed '{KERNELS_PACKAGE}' package, or unset it."
            )
        return path
    import importlib.util

    spec = importlib.util.find_spec(KERNELS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise KernelsNotInstalledError(
            f"the kernels distribution '{KERNELS_DIST}' is not installed, so no GPU kernels are "
            f"available. Fix: {install_hint()}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def load_manifest(directory: Path | None = None) -> dict:
    directory = directory or kernels_dir()
    try:
        return json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise LibraryIntegrityError(
            f"cannot read {directory / 'manifest.json'} ({e}). Fix: pip install --force-reinstall "
            f'--no-deps "{KERNELS_DIST}=={__version__}"'
        ) from e


def check_versions(manifest: dict) -> None:
    kv = manifest.get("version")
    if kv != __version__:
        raise VersionMismatchError(
            f"subblock-sage {__version__} needs {KERNELS_DIST}=={__version__}, but {kv} is "
            f'installed. Fix: pip install "subblock-sage[cu130]=={__version__}" (or install the '
            f'runtime matching your kernels: pip install "subblock-sage=={kv}")'
        )
    if manifest.get("abi_version") != ABI_VERSION:
        raise VersionMismatchError(
            f"{KERNELS_DIST} uses C ABI {manifest.get('abi_version')}, this runtime speaks "
            f"{ABI_VERSION}. Fix: {install_hint()}"
        )


def supported_gpus(manifest: dict) -> str:
    rows = [
        f"{t} (compute capability {', '.join(m['capabilities'])}: {m['gpus']})"
        for t, m in sorted(manifest["targets"].items())
    ]
    return "; ".join(rows)


def target_for_capability(manifest: dict, capability: tuple[int, int]) -> str:
    cap = f"{capability[0]}.{capability[1]}"
    for name, t in sorted(manifest["targets"].items()):
        if cap in t["capabilities"]:
            return name
    raise UnsupportedGPUError(
        f"no kernels for compute capability {cap} in {KERNELS_DIST} {manifest.get('version')}. "
        f"Supported: {supported_gpus(manifest)}."
    )


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# One loaded library


@dataclass(frozen=True)
class KernelEntry:
    index: int
    name: str  # kernel name
    variant: str
    params: dict
    args: list


class Library:
    """A loaded kernel library (one GPU target) and its C ABI."""

    def __init__(self, path: Path, expected_sha256: str | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise LibraryIntegrityError(
                f"kernel library {self.path} is missing. Fix: pip install --force-reinstall "
                f'--no-deps "{KERNELS_DIST}=={__version__}"'
            )
        if expected_sha256 is not None:
            got = sha256_file(self.path)
            if got != expected_sha256:
                raise LibraryIntegrityError(
                    f"kernel library {self.path} is corrupted: sha256 {got[:16]}... does not "
                    f"match the manifest's {expected_sha256[:16]}... Fix: pip install "
                    f'--force-reinstall --no-deps "{KERNELS_DIST}=={__version__}"'
                )
        try:
            lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            raise LibraryIntegrityError(
                f"cannot load kernel library {self.path}: {e}. Fix: pip install "
                f'--force-reinstall --no-deps "{KERNELS_DIST}=={__version__}"'
            ) from e
        self._lib = lib
        i32, p = ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)
        for name, res, argt in (
            ("abi_version", i32, []),
            ("target", ctypes.c_char_p, []),
            ("exports_json", ctypes.c_char_p, []),
            ("num_kernels", i32, []),
            ("kernel_name", ctypes.c_char_p, [i32]),
            ("status", i32, [p, p, p]),
            ("device_capability", i32, [i32, p, p]),
            ("preload", i32, [i32]),
            ("launch", i32, [i32, i32, ctypes.POINTER(ctypes.c_void_p), i32]),
            ("last_error", ctypes.c_char_p, []),
        ):
            fn = getattr(lib, f"subblock_sage_v1_{name}")
            fn.restype, fn.argtypes = res, argt
            setattr(self, f"_{name}", fn)
        if self._abi_version() != ABI_VERSION:
            raise VersionMismatchError(
                f"{self.path} speaks C ABI {self._abi_version()}, runtime needs {ABI_VERSION}. "
                f"Fix: {install_hint()}"
            )
        self.target = self._target().decode()
        self.exports = json.loads(self._exports_json().decode())
        self.kernels: dict[tuple[str, str], KernelEntry] = {}
        for i, k in enumerate(self.exports["kernels"]):
            self.kernels[(k["kernel"], k["variant"])] = KernelEntry(
                i, k["kernel"], k["variant"], k.get("params", {}), k["args"]
            )

    def last_error(self) -> str:
        return (self._last_error() or b"").decode(errors="replace")

    def status(self) -> tuple[int, int, int, int]:
        """(error code, driver version, runtime version, device count)."""
        d, r, n = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
        rc = self._status(ctypes.byref(d), ctypes.byref(r), ctypes.byref(n))
        return rc, d.value, r.value, n.value

    def capability(self, device: int) -> tuple[int, int]:
        a, b = ctypes.c_int32(), ctypes.c_int32()
        rc = self._device_capability(device, ctypes.byref(a), ctypes.byref(b))
        if rc:
            raise NoGPUError(f"cannot query device {device}: {self.last_error()}")
        return a.value, b.value

    def check_driver(self) -> None:
        rc, driver, runtime, count = self.status()
        if driver == 0:
            raise NoGPUError(
                "no NVIDIA driver found (libcuda.so.1 could not be loaded): subblock-sage kernels "
                "need an NVIDIA GPU. Supported: H100/H200 (sm_90a), B200/GB200 (sm_100a), "
                "RTX PRO 5000/6000 and RTX 5090 (sm_120a)."
            )
        if driver < MIN_DRIVER or rc == 35:
            raise DriverTooOldError(
                f"the NVIDIA driver supports CUDA {format_cuda_version(driver)}, but these kernels "
                f"need CUDA {format_cuda_version(MIN_DRIVER)} (driver r580 or newer). Fix: update "
                f"the NVIDIA driver to r580+."
            )
        if rc or count == 0:
            raise NoGPUError(f"no usable NVIDIA GPU: {self.last_error() or 'no devices visible'}")

    def preload(self, device: int) -> None:
        """Load every kernel onto ``device`` (do this before CUDA-graph capture)."""
        rc = self._preload(device)
        if rc:
            raise LaunchError(f"{self.target}: {self.last_error()}")

    def entry(self, kernel: str, variant: str) -> KernelEntry:
        try:
            return self.kernels[(kernel, variant)]
        except KeyError:
            have = sorted(f"{k}/{v}" for k, v in self.kernels)
            raise LaunchError(
                f"{self.path.name} ({self.target}) has no kernel {kernel}/{variant}; it has {have}"
            ) from None

    def launch_raw(self, entry: KernelEntry, device: int, argv) -> None:
        rc = self._launch(entry.index, device, argv, len(argv))
        if rc:
            raise LaunchError(f"{entry.name}/{entry.variant} on cuda:{device}: {self.last_error()}")


# ---------------------------------------------------------------------------------------------
# Process-wide registry of loaded libraries

_lock = threading.Lock()
_by_target: dict[str, Library] = {}
_by_device: dict[int, Library] = {}
_manifest_cache: dict[str, dict] = {}


def manifest() -> dict[str, Any]:
    """The installed kernels' manifest.json (after checking its version matches the runtime)."""
    directory = kernels_dir()
    key = str(directory)
    m = _manifest_cache.get(key)
    if m is None:
        m = load_manifest(directory)
        _manifest_cache[key] = m
    check_versions(m)
    return m


def library_for_target(target: str) -> Library:
    with _lock:
        lib = _by_target.get(target)
        if lib is None:
            m = manifest()
            t = m["targets"].get(target)
            if t is None:
                raise UnsupportedGPUError(
                    f"{KERNELS_DIST} {m['version']} carries no {target} library. Supported: "
                    f"{supported_gpus(m)}."
                )
            path = kernels_dir() / t["library"]
            lib = Library(path, expected_sha256=t["sha256"])
            if lib.target != target:
                raise LibraryIntegrityError(
                    f"{path} reports target {lib.target}, manifest says {target}. Fix: pip install "
                    f'--force-reinstall --no-deps "{KERNELS_DIST}=={__version__}"'
                )
            log.info("loaded %s (%s)", path, target)
            _by_target[target] = lib
        return lib


def any_library() -> Library:
    """Some library of this install, for driver/GPU queries before a device is picked."""
    m = manifest()
    if not m["targets"]:
        raise KernelsNotInstalledError(f"{KERNELS_DIST} carries no libraries. Fix: {install_hint()}")
    return library_for_target(sorted(m["targets"])[0])


def library_for_device(device: int) -> Library:
    lib = _by_device.get(device)
    if lib is not None:
        return lib
    probe = any_library()
    probe.check_driver()
    cap = probe.capability(device)
    lib = library_for_target(target_for_capability(manifest(), cap))
    with _lock:
        _by_device[device] = lib
    return lib


def reset_cache() -> None:
    """Forget loaded libraries and manifests (tests; a library stays mapped once loaded)."""
    with _lock:
        _by_target.clear()
        _by_device.clear()
        _manifest_cache.clear()

