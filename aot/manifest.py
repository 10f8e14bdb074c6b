"""Write manifest.json: every kernel and variant with its argument layout, the sha256 of every
library, toolchain and upstream versions, and the build commit. No timestamps (reproducible)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

from aot import registry, serving

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = 1
KERNELS_DIST = "subblock-sage-kernels-cu13"
TOOLCHAIN_DISTS = ("nvidia-cutlass-dsl", "nvidia-cuda-runtime", "ziglang")
UPSTREAM_DISTS = ("flashinfer-python",)


def package_version() -> str:
    text = (ROOT / "python" / "subblock_sage" / "_version.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text)[1]


def build_commit() -> str:
    if os.environ.get("SBS_BUILD_COMMIT"):
        return os.environ["SBS_BUILD_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _versions(names) -> dict[str, str]:
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hardware_runs() -> dict:
    """Which targets have been run on their own hardware (edited by hand after a real run)."""
    return json.loads((ROOT / "aot" / "hardware_runs.json").read_text())


def serves(kernels: list[dict]) -> list[str]:
    """What a library serves, one line per kernel: its shipped variants and the public calls that
    select them (aot/serving.py; ``subblock-sage check`` prints these lines as they are)."""
    variants: dict[str, list[str]] = {}
    for k in kernels:
        variants.setdefault(k["kernel"], []).append(k["variant"])
    return [f"{name} [{', '.join(sorted(v))}]: {serving.serves(name)}"
            for name, v in sorted(variants.items())]


def build(libraries: list[Path], build_dir: Path, host_arch: str) -> dict:
    runs = hardware_runs()
    targets = {}
    used_upstream = set()
    for lib_path in sorted(libraries):
        folder = lib_path.name.removeprefix("libsubblock_sage_").removesuffix(".so")
        exports = json.loads((build_dir / "aot" / folder / "exports.json").read_text())
        target = registry.TARGETS[exports["target"]]
        for k in exports["kernels"]:
            if k.get("upstream"):
                used_upstream.add(k["upstream"].split("==")[0])
        targets[target.name] = {
            "folder": target.folder,
            "library": f"{target.folder}/{lib_path.name}",
            "sha256": sha256(lib_path),
            "size": lib_path.stat().st_size,
            "sm": target.sm,
            "capabilities": [f"{a}.{b}" for a, b in target.capabilities],
            "gpus": target.gpus,
            "hardware": runs.get(target.name, {"run_on_hardware": False}),
            "kernels": exports["kernels"],
            "serves": serves(exports["kernels"]),
        }
    return {
        "schema": SCHEMA,
        "package": KERNELS_DIST,
        "version": package_version(),
        "abi_version": 1,
        "host_arch": host_arch,
        "build_commit": build_commit(),
        "toolchain": _versions(TOOLCHAIN_DISTS),
        "upstream": {k: v for k, v in _versions(UPSTREAM_DISTS).items() if k in used_upstream},
        "targets": targets,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.manifest", description=__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--build-dir", required=True, type=Path)
    ap.add_argument("--host-arch", default="x86_64")
    ap.add_argument("libraries", nargs="*", type=Path)
    ns = ap.parse_args(argv)
    manifest = build(ns.libraries, ns.build_dir, ns.host_arch)
    ns.out.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
