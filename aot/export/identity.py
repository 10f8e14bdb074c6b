"""What identifies an export unit before anything is imported (the export cache's unit key) and
what it read: the repository files it opened or imported, the pinned distributions' metadata, the
depfile Ninja reads to re-run it.

An export's cache entry is valid while both halves are unchanged: the unit key
(:func:`unit_identity`: what is compiled, for what, by which toolchain) and the dependency set
recorded when it was compiled (:func:`repo_inputs`: every repository file the export process
imported or read, with its sha256). Never fewer inputs than can change the code: a stale hit
ships a wrong library, a needless miss costs seconds. So the dependency set is what the process
actually read, not a declared list that could drift, and it is per file: a module that an export
imports is an input even when none of its code is traced, since its import-time code (constants,
a registry entry, a patch) can change what is. An edit therefore recompiles exactly the exports
whose processes import the edited file, and keeping an edit local means importing less: the sm_90a
attention kernels take the quantizer's Q numerics from ``aot/kernels/sage_numerics``, not from the
quantizer package, so a quantizer edit recompiles its 20 exports and not the 12 sm_90a ones too
(tests/cpu/test_export_inputs.py computes which exports an edit invalidates)."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from aot.contract import ABI_VERSION

ROOT = Path(__file__).resolve().parents[2]
# Distributions whose version is an input of every export (the DSL compiles; FlashInfer supplies
# the SM100/SM120 classes; cuda-bindings supplies the stream type).
INPUT_DISTS = ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core",
               "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13", "cuda-bindings",
               "flashinfer-python")
# Imported by a unit but not an input of what it produces: the cache itself (how results are
# found, not what they hold) and the serving filter (which units are planned, not their code).
NOT_INPUTS = frozenset({"aot/export_cache.py", "aot/serving.py"})


@functools.cache
def _input_dists() -> dict:
    from importlib import metadata

    out = {}
    for name in INPUT_DISTS:
        try:
            out[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _dist_versions() -> dict[str, str | None]:
    return {n: d.version if d is not None else None for n, d in _input_dists().items()}


def dist_metadata_files() -> list[Path]:
    """METADATA of each installed input distribution: in the depfile, so that Ninja re-runs the
    exports after a DSL / FlashInfer upgrade (the cache key has the versions themselves)."""
    out = []
    for dist in _input_dists().values():
        if dist is None:
            continue
        # the dist-info folder of a PathDistribution; `dist.files` would find METADATA too but
        # parses the whole RECORD (14k entries for the DSL: ~0.5 s, most of a cache hit's time)
        base = getattr(dist, "_path", None)
        if base is not None and (Path(base) / "METADATA").is_file():
            out.append((Path(base) / "METADATA").resolve())
            continue
        meta = next((f for f in dist.files or () if f.name == "METADATA"), None)
        if meta is not None:
            out.append(Path(dist.locate_file(meta)).resolve())
    return out


def _compile_env() -> dict[str, str]:
    """Environment variables that can change what the DSL or a kernel module compiles."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(("CUTE_DSL_", "CUTLASS_", "SBS_SM90_"))
            and not any(w in k for w in ("CACH", "LOG", "PRINT", "DUMP", "KEEP"))}


def unit_identity(module: str, kernel: str, variant: str, target: str, test: bool,
                  host_arch: str) -> dict:
    """Everything that identifies an export before importing anything (the cache's unit key);
    the repository files it reads are added by the cache (recorded dependency sets). Each entry
    can change the result by itself: ``module``/``kernel``/``variant`` pick the code,
    ``target`` the GPU architecture (``--gpu-arch``), ``test`` the symbol prefix (``sbs_t...``),
    ``host_arch`` the host code of the object, ``abi`` the entry and argument layout the object
    is written for, ``python`` the interpreter that runs the tracer (the DSL's wheels are per
    Python version), ``dists`` the compiler itself (the DSL), FlashInfer's classes and the stream
    type (cuda-bindings), ``env`` the DSL's and the kernels' compile switches; ``schema`` the
    key's own format."""
    return {"schema": 1, "abi": ABI_VERSION, "module": module, "kernel": kernel,
            "variant": variant, "target": target, "test": test, "host_arch": host_arch,
            "python": list(sys.version_info[:2]), "dists": _dist_versions(), "env": _compile_env()}


class OpenRecorder:
    """Records every file opened (audit event ``open``: ``open()``, ``Path.read_text``, the
    import system's ``io.open_code``), so that data files a module reads at import time (e.g.
    FlashInfer patch rules) count as inputs, like the modules themselves."""

    def __init__(self):
        self.paths: set[str] = set()
        self.active = True
        sys.addaudithook(self._hook)

    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def _hook(self, event, args):
        # ("open", (path, mode, flags)): only reads are inputs; what the export writes (its own
        # outputs, possibly inside the repository when the build dir is) must not become one
        if not (self.active and event == "open" and args and isinstance(args[0], (str, bytes))):
            return
        mode, flags = (list(args) + [None, None])[1:3]
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            return
        if isinstance(flags, int) and flags & self._WRITE_FLAGS:
            return
        self.paths.add(os.path.abspath(os.fsdecode(args[0])))


def repo_inputs(opened: set[str], exclude: frozenset[str] = NOT_INPUTS) -> dict[str, str]:
    """{repo-relative path: sha256} of the repository files this process imported or opened."""
    from aot.export_cache import file_sha256

    files = set(opened)
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f:
            files.add(os.path.abspath(f))
    out = {}
    for f in sorted(files):
        p = Path(f)
        try:
            rel = p.relative_to(ROOT).as_posix()
        except ValueError:
            continue
        if "__pycache__" in p.parts or rel in exclude or not p.is_file():
            continue
        out[rel] = file_sha256(p)
    return out


def write_depfile(path: Path, output: Path, deps: list[Path]) -> None:
    def esc(p: Path) -> str:
        return str(p).replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")

    lines = [f"{esc(output)}:"] + [f" {esc(d)}" for d in deps]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(" \\\n".join(lines) + "\n")
    os.replace(tmp, path)
