"""Fetch the static library a cross-built kernel library links against (docs/design/build.md, facts, 8).

A kernel library for another host CPU (aarch64 for GH200/GB200, built on x86_64) links
``libcudart_static.a`` *of that CPU*. It comes from the aarch64 wheel of the very same PyPI
package, at exactly the version installed in this (x86_64) build environment, read with
importlib.metadata:

    nvidia-cuda-runtime==<installed>            ->  nvidia/cu13/lib/libcudart_static.a

(nvidia-cutlass-dsl's libcuda_dialect_runtime_static.a is neither linked nor fetched: its license
forbids redistributing it, and aot/toolchain/dsl_entry_points.c provides what the libraries need.)

``pip download --only-binary :all: --no-deps --platform ...`` fetches it into a cache
(``wheels/.cross/<arch>/``, ignored by git; ``SBS_CROSS_CACHE`` overrides), the archive is
checked against its wheel's RECORD hash, extracted, and the directories are printed
``;``-separated (the form CMake's ``SBS_STATIC_LIB_DIRS`` takes):

    python -m aot.cross_libs --arch aarch64
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# SBS_CROSS_CACHE lets clean rebuilds (tests/packaging/test_reproducible.py) share one download.
DEFAULT_CACHE = Path(os.environ.get("SBS_CROSS_CACHE") or ROOT / "wheels" / ".cross")

# dist -> the static archive inside its wheel
LIBS = {
    "nvidia-cuda-runtime": "nvidia/cu13/lib/libcudart_static.a",
}


def platforms(arch: str) -> list[str]:
    # Oldest first is irrelevant to pip; list every manylinux alias these wheels are published as.
    return [f"manylinux_2_28_{arch}", f"manylinux_2_17_{arch}", f"manylinux2014_{arch}"]


def _record_hash(zf: zipfile.ZipFile, member: str) -> str | None:
    for name in zf.namelist():
        if name.endswith(".dist-info/RECORD"):
            for row in csv.reader(io.StringIO(zf.read(name).decode())):
                if row and row[0] == member and row[1].startswith("sha256="):
                    return row[1].removeprefix("sha256=")
    return None


def _download(dist: str, version: str, arch: str, dest: Path) -> Path:
    norm = dist.replace("-", "_")
    found = sorted(dest.glob(f"{norm}-{version}-*{arch}*.whl"))
    if found:
        return found[-1]
    py = f"{sys.version_info.major}{sys.version_info.minor}"
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--no-deps", "--only-binary=:all:", "--dest", str(dest),
           "--python-version", py, "--implementation", "cp",
           "--abi", f"cp{py}", "--abi", "abi3", "--abi", "none"]
    for p in platforms(arch):
        cmd += ["--platform", p]
    cmd.append(f"{dist}=={version}")
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise SystemExit(
            f"aot.cross_libs: could not download {dist}=={version} for {arch} "
            f"(platforms {', '.join(platforms(arch))}):\n{res.stderr.strip()}"
        )
    found = sorted(dest.glob(f"{norm}-{version}-*{arch}*.whl"))
    if not found:
        raise SystemExit(f"aot.cross_libs: pip reported success but no {norm}-{version} {arch} wheel in {dest}")
    return found[-1]


def _extract(wheel: Path, member: str, out_root: Path) -> Path:
    target = out_root / member
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(member)
        want = _record_hash(zf, member)
    got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    if want is not None and want != got:
        raise SystemExit(f"aot.cross_libs: {member} in {wheel.name} does not match its RECORD hash")
    if not target.exists() or target.read_bytes() != data:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    return target.parent


def static_lib_dirs(arch: str, cache: Path = DEFAULT_CACHE) -> list[str]:
    cache = cache / arch
    downloads = cache / "wheels"
    downloads.mkdir(parents=True, exist_ok=True)
    # keep the cache out of git without touching the repository's .gitignore
    ignore = cache.parent / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    dirs = []
    for dist, member in LIBS.items():
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"aot.cross_libs: {dist} is not installed in {sys.prefix}; "
                             "the cross build takes the version from the native one")
        wheel = _download(dist, version, arch, downloads)
        dirs.append(str(_extract(wheel, member, cache / f"{dist}-{version}")))
    return dirs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.cross_libs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True, choices=("aarch64", "x86_64"))
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ns = ap.parse_args(argv)
    print(";".join(static_lib_dirs(ns.arch, ns.cache)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
