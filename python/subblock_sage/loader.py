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
import re
import threading
from typing import Any
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ._version import __version__
from .contract import ABI_VERSION, KERNELS_DIST, KERNELS_PACKAGE, SYMBOL_PREFIX, modes_served, select_variant
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


def library_source() -> tuple[str, Path]:
    """Where the libraries come from: ``("override", dir)`` when ``SUBBLOCK_SAGE_LIBRARY_DIR`` is
    set, else ``("installed", dir)`` (the kernels distribution). ``check`` reports this so an
    override directory is never mistaken for the installed state."""
    return ("override" if os.environ.get(ENV_LIBRARY_DIR) else "installed"), kernels_dir()


def reinstall_fix() -> str:
    return f'Fix: pip install --force-reinstall --no-deps "{KERNELS_DIST}=={__version__}"'


_SHA256 = re.compile(r"[0-9a-f]{64}")
_CAPABILITY = re.compile(r"[0-9]+\.[0-9]+")


def _bad_manifest(where: Path, what: str) -> LibraryIntegrityError:
    override = os.environ.get(ENV_LIBRARY_DIR)
    fix = (f"Fix: point {ENV_LIBRARY_DIR} at an unmodified kernels folder, or unset it."
           if override else reinstall_fix())
    return LibraryIntegrityError(f"{where} is malformed: {what}. {fix}")


def validate_manifest(m: object, where: Path = Path("manifest.json")) -> dict:
    """Refuse a manifest whose shape the loader relies on is wrong, before any key is used.

    Every target entry needs a ``library`` that is a plain relative path inside the kernels
    folder (no absolute path, no ``..``), a ``sha256`` of 64 lowercase hex digits (an entry
    without one would load unverified bytes), capabilities written ``"major.minor"`` and a
    ``gpus`` text. Anything else is a :class:`LibraryIntegrityError` naming the key, never a
    ``KeyError`` deep in the loader.
    """
    if not isinstance(m, dict):
        raise _bad_manifest(where, f"top level is {type(m).__name__}, not an object")
    for key, typ in (("version", str), ("abi_version", int), ("targets", dict)):
        if not isinstance(m.get(key), typ) or isinstance(m.get(key), bool):
            raise _bad_manifest(where, f"'{key}' is missing or not a {typ.__name__}")
    for name, t in m["targets"].items():
        if not isinstance(t, dict):
            raise _bad_manifest(where, f"target '{name}' is not an object")
        lib = t.get("library")
        if not isinstance(lib, str) or not lib:
            raise _bad_manifest(where, f"target '{name}' has no 'library' path")
        rel = PurePosixPath(lib)
        if rel.is_absolute() or "\\" in lib or any(part in ("", ".", "..") for part in lib.split("/")):
            raise _bad_manifest(where, f"target '{name}' library path {lib!r} is not a plain relative "
                                       "path inside the kernels folder")
        sha = t.get("sha256")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise _bad_manifest(where, f"target '{name}' has no valid 'sha256' ({sha!r}); an "
                                       "unverifiable library is never loaded")
        caps = t.get("capabilities")
        if not isinstance(caps, list) or not all(isinstance(c, str) and _CAPABILITY.fullmatch(c) for c in caps):
            raise _bad_manifest(where, f"target '{name}' 'capabilities' must be a list like [\"9.0\"]")
        if not isinstance(t.get("gpus", ""), str):
            raise _bad_manifest(where, f"target '{name}' 'gpus' must be a text")
    return m


def load_manifest(directory: Path | None = None) -> dict:
    directory = directory or kernels_dir()
    try:
        m = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise LibraryIntegrityError(f"cannot read {directory / 'manifest.json'} ({e}). {reinstall_fix()}") from e
    return validate_manifest(m, directory / "manifest.json")


def library_path(directory: Path, relative: str) -> Path:
    """The manifest's ``library`` resolved inside ``directory``; a symlink (or anything else)
    that leads outside the kernels folder is refused."""
    base = directory.resolve()
    path = (base / relative).resolve()
    if base not in path.parents:
        raise LibraryIntegrityError(
            f"kernel library {relative!r} resolves to {path}, outside the kernels folder {base}. "
            f"{reinstall_fix()}"
        )
    return path


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
    """The "Supported:" list of every message, from the manifest (family targets included)."""
    rows = [
        f"{t} (compute capability {', '.join(m['capabilities'])}: {m.get('gpus', '?')})"
        for t, m in sorted(manifest["targets"].items())
    ]
    return "; ".join(rows) or "none (this kernels build carries no libraries)"


def target_for_capability(manifest: dict, capability: tuple[int, int]) -> str:
    cap = f"{capability[0]}.{capability[1]}"
    for name, t in sorted(manifest["targets"].items()):
        if cap in t["capabilities"]:
            return name
    raise UnsupportedGPUError(
        f"no kernels for compute capability {cap} in {KERNELS_DIST} {manifest.get('version')}. "
        f"Supported: {supported_gpus(manifest)}."
    )


def _read_verified(path: Path, expected_sha256: str | None) -> bytes:
    """Read the library once, through one descriptor, and check the digest of those bytes.

    Whatever is loaded afterwards is made from these bytes (:func:`_open_sealed`), never from the
    path again: hashing a path and then opening it again lets a swap in between load other bytes
    (with the file swapped by atomic rename while 60 fresh processes loaded it, hash-then-open ran
    the foreign library's constructor in 11 of them, this loader in none: MEASUREMENTS.md,
    tests/cpu/test_trust_chain.py)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise LibraryIntegrityError(f"kernel library {path} is missing. {reinstall_fix()}") from None
    except OSError as e:
        raise LibraryIntegrityError(f"cannot open kernel library {path}: {e}. {reinstall_fix()}") from e
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 22)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if expected_sha256 is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != expected_sha256:
            raise LibraryIntegrityError(
                f"kernel library {path} is corrupted: sha256 {got[:16]}... does not match the "
                f"manifest's {expected_sha256[:16]}... {reinstall_fix()}"
            )
    return data


_ELF_MACHINES = {"x86_64": 62, "aarch64": 183}


def check_elf(data: bytes, path: Path) -> None:
    """Refuse bytes that dlopen would map but not survive: not a 64-bit little-endian shared
    object of this CPU, or program headers / loadable segments that reach past the end of the
    file (a truncated library with a matching digest in an override manifest would otherwise
    crash the process with SIGBUS inside dlopen instead of raising)."""
    import platform
    import struct

    def bad(what: str) -> LibraryIntegrityError:
        return LibraryIntegrityError(f"kernel library {path} is not a loadable shared library ({what}). {reinstall_fix()}")

    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise bad("no ELF header")
    if data[4] != 2 or data[5] != 1:
        raise bad("not a 64-bit little-endian ELF")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    want = _ELF_MACHINES.get(platform.machine())
    if e_type != 3:
        raise bad(f"ELF type {e_type}, not a shared object")
    if want is not None and e_machine != want:
        raise bad(f"built for ELF machine {e_machine}, this CPU is {platform.machine()}")
    e_phoff, = struct.unpack_from("<Q", data, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    if e_phentsize < 56 or e_phoff + e_phentsize * e_phnum > len(data):
        raise bad("program headers past the end of the file (truncated?)")
    for i in range(e_phnum):
        p_type, _, p_offset = struct.unpack_from("<IIQ", data, e_phoff + i * e_phentsize)
        p_filesz, = struct.unpack_from("<Q", data, e_phoff + i * e_phentsize + 32)
        if p_type == 1 and p_offset + p_filesz > len(data):  # PT_LOAD
            raise bad(f"segment {i} ends at byte {p_offset + p_filesz}, the file has {len(data)} (truncated?)")


def _open_sealed(data: bytes, name: str) -> int:
    """A sealed in-memory file holding ``data`` (memfd, no further writes possible), to dlopen
    through ``/proc/self/fd/N``. Returns -1 where memfd or sealing is unavailable."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return -1
    try:
        fd = create(f"subblock_sage:{name}", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 2))
    except OSError:
        return -1
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        import fcntl

        seals = (getattr(fcntl, "F_SEAL_SEAL", 1) | getattr(fcntl, "F_SEAL_SHRINK", 2)
                 | getattr(fcntl, "F_SEAL_GROW", 4) | getattr(fcntl, "F_SEAL_WRITE", 8))
        fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", 1033), seals)
    except OSError:
        os.close(fd)
        return -1
    return fd


_sealed_fds: list[int] = []  # memfds of loaded libraries, kept open (see _dlopen_verified)


def _dlopen_verified(path: Path, expected_sha256: str | None) -> ctypes.CDLL:
    """dlopen exactly the bytes whose digest was checked.

    First choice: a sealed memfd copy. Where the kernel refuses to map a memfd executable
    (``vm.memfd_noexec=2``) or has no memfd, the fallback is a private copy in a fresh
    ``0700`` temporary folder, checked again after it is written and removed once loaded."""
    data = _read_verified(path, expected_sha256)
    check_elf(data, path)
    fd = _open_sealed(data, path.name)
    errors = []
    if fd >= 0:
        # The descriptor stays open for the life of the process (a library is never unloaded):
        # dlopen knows loaded objects by the name it was given, so a closed and reused number
        # would make a later dlopen("/proc/self/fd/N") return the library loaded earlier under it.
        try:
            lib = ctypes.CDLL(f"/proc/self/fd/{fd}", mode=ctypes.RTLD_LOCAL)
            _sealed_fds.append(fd)
            return lib
        except OSError as e:
            errors.append(str(e))
            os.close(fd)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="subblock_sage-") as tmp:
        copy = Path(tmp) / path.name
        fdw = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o500)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fdw, view):]
        finally:
            os.close(fdw)
        try:
            return ctypes.CDLL(str(copy), mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            errors.append(str(e))
    raise LibraryIntegrityError(f"cannot load kernel library {path}: {'; '.join(errors)}. {reinstall_fix()}")


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
        """Load ``path``; with ``expected_sha256`` (every shipped library), the loaded bytes are
        the very bytes whose digest matched (:func:`_dlopen_verified`)."""
        self.path = Path(path)
        if not self.path.is_file():
            raise LibraryIntegrityError(f"kernel library {self.path} is missing. {reinstall_fix()}")
        lib = _dlopen_verified(self.path, expected_sha256)
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
            ("run_steps", i32, [ctypes.c_void_p, i32, i32, ctypes.c_char_p, i32]),  # replay.py
            ("last_error", ctypes.c_char_p, []),
        ):
            try:
                fn = getattr(lib, SYMBOL_PREFIX + name)
            except AttributeError:
                raise LibraryIntegrityError(
                    f"{self.path} is not a subblock-sage kernel library (it lacks the C ABI "
                    f"symbol {SYMBOL_PREFIX}{name}). {reinstall_fix()}"
                ) from None
            fn.restype, fn.argtypes = res, argt
            setattr(self, f"_{name}", fn)
        if self._abi_version() != ABI_VERSION:
            raise VersionMismatchError(
                f"{self.path} speaks C ABI {self._abi_version()}, runtime needs {ABI_VERSION}. "
                f"Fix: {install_hint()}"
            )
        self.target = self._target().decode()
        try:
            self.exports = json.loads(self._exports_json().decode())
        except ValueError as e:
            raise LibraryIntegrityError(f"{self.path} carries an unreadable kernel table ({e}). {reinstall_fix()}") from e
        self.kernels: dict[tuple[str, str], KernelEntry] = {}
        self._selected: dict[tuple, KernelEntry] = {}
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
            try:
                supported = supported_gpus(manifest())
            except Exception:  # the no-driver message must not fail on a bad manifest
                supported = "see the manifest (subblock-sage check --no-launch)"
            raise NoGPUError(
                "no NVIDIA driver found (libcuda.so.1 could not be loaded): subblock-sage kernels "
                "need an NVIDIA GPU with its driver. Fix: run on a machine with a supported NVIDIA "
                "GPU and driver r580+ (in a container: expose the GPU, e.g. docker run --gpus all, "
                f"so libcuda.so.1 is visible). Supported: {supported}."
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

    @property
    def compute_modes(self) -> tuple[str, ...]:
        """The compute modes this library serves, from its kernels (contract.modes_served)."""
        return modes_served(k for k, _ in self.kernels)

    def has_kernel(self, kernel: str) -> bool:
        return any(k == kernel for k, _ in self.kernels)

    def kernel(self, kernel: str, **params) -> KernelEntry:
        """The export of ``kernel`` whose recorded variant parameters match ``params``
        (``contract.select_variant``: ``None`` = parameter not set). Cached per selection."""
        key = (kernel, *sorted(params.items()))
        try:
            return self._selected[key]
        except KeyError:
            pass
        variants = [(v, e.params) for (k, v), e in self.kernels.items() if k == kernel]
        if not variants:
            have = sorted({k for k, _ in self.kernels})
            raise LaunchError(f"{self.path.name} ({self.target}) has no kernel {kernel}; it has {have}")
        try:
            entry = self.kernels[(kernel, select_variant(kernel, variants, params))]
        except LookupError as e:
            raise LaunchError(f"{self.path.name} ({self.target}): {e}") from None
        self._selected[key] = entry
        return entry

    def run_steps(self, steps_address: int, n_steps: int, device: int, roots) -> int:
        """Launch a recorded step sequence (``replay.py``); returns the C return code (0, or
        ``SBS_MISALIGNED`` = -2 when a patched pointer breaks its alignment: nothing launched);
        raises LaunchError on any other failure."""
        roots = bytes(roots)  # packed int64 roots (replay._pack_roots), or a ctypes array
        rc = self._run_steps(steps_address, n_steps, device, roots, len(roots) // 8)
        if rc and rc != -2:
            raise LaunchError(f"{self.target} on cuda:{device}: {self.last_error()}")
        return rc

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
            path = library_path(kernels_dir(), t["library"])
            lib = Library(path, expected_sha256=t["sha256"])
            if lib.target != target:
                raise LibraryIntegrityError(f"{path} reports target {lib.target}, manifest says {target}. {reinstall_fix()}")
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

