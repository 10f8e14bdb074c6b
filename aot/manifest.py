"""Write manifest.json: every kernel and variant with its argument layout, the sha256 of every
library, toolchain and upstream versions, and the build commit. No timestamps (reproducible)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

from aot import registry, serving
from aot.contract import ABI_VERSION, KERNELS_DIST, MANIFEST_SCHEMA, UNVALIDATED, modes_served, sha256_file

ROOT = Path(__file__).resolve().parent.parent
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


def hardware_runs() -> dict:
    """Which (target, host CPU) libraries have run on their own hardware (edited by hand after a
    real run). Keyed by both: an x86_64 run says nothing about the aarch64 library (GH200). An
    entry's ``router``: the router kernels' run, where they have had one (``subblock-sage check``
    prints it; without it they are listed as not yet run on a GPU)."""
    runs = json.loads((ROOT / "aot" / "hardware_runs.json").read_text())
    runs.pop("_comment", None)
    return runs


def hardware_status(runs: dict, target: str, host_arch: str) -> dict:
    return runs.get(target, {}).get(host_arch) or {
        "run_on_hardware": False, "status": f"compile-verified, not yet run on that hardware ({host_arch} host)"}


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
    used_upstream: dict[str, str] = {}  # distribution -> the version its exports record
    for lib_path in sorted(libraries):
        folder = lib_path.name.removeprefix("libsubblock_sage_").removesuffix(".so")
        exports = json.loads((build_dir / "aot" / folder / "exports.json").read_text())
        target = registry.TARGETS[exports["target"]]
        for k in exports["kernels"]:
            if k.get("upstream"):
                name, _, version = k["upstream"].partition("==")
                used_upstream[name] = version
        targets[target.name] = {
            "folder": target.folder,
            "library": f"{target.folder}/{lib_path.name}",
            "sha256": sha256_file(lib_path),
            "size": lib_path.stat().st_size,
            "sm": target.sm,
            "capabilities": [f"{a}.{b}" for a, b in target.capabilities],
            "gpus": target.gpus,
            "hardware": hardware_status(runs, target.name, host_arch),
            # every export with its variant `params` (the runtime selects kernels by them) and
            # what the target serves, derived once here by the contract
            "kernels": exports["kernels"],
            "compute_modes": list(modes_served(k["kernel"] for k in exports["kernels"])),
            "serves": serves(exports["kernels"]),
        }
        if target.name in UNVALIDATED:
            targets[target.name]["unvalidated"] = UNVALIDATED[target.name]
    return {
        "schema": MANIFEST_SCHEMA,
        "package": KERNELS_DIST,
        "version": package_version(),
        "abi_version": ABI_VERSION,
        "host_arch": host_arch,
        "build_commit": build_commit(),
        "toolchain": _versions(TOOLCHAIN_DISTS),
        # the build env's version of its upstream packages; a package installed in a folder of its
        # own (nvidia-cudnn-frontend: aot/upstream/cudnn_import.py, which checks the pin) as pinned
        "upstream": dict(sorted({**{k: v for k, v in used_upstream.items() if k not in UPSTREAM_DISTS},
                                 **{k: v for k, v in _versions(UPSTREAM_DISTS).items() if k in used_upstream}}.items())),
        "targets": targets,
        "upstream_patches": upstream_patches(targets),
    }


def upstream_patches(targets: dict) -> list[dict]:
    """Upstream files compiled from a patched text (aot/upstream/patches.py, PATCHES.md), with the
    targets whose libraries contain the patched kernels; [] when none of them is built."""
    by_kernel: dict[str, list[str]] = {}
    for name, t in targets.items():
        for k in t["kernels"]:
            by_kernel.setdefault(k["kernel"], [])
            if name not in by_kernel[k["kernel"]]:
                by_kernel[k["kernel"]].append(name)
    from aot.upstream import patches

    if not any(k in by_kernel for p in patches.PATCHES for k in p.kernels):
        return []
    from aot.upstream import flashinfer_import

    records = patches.manifest_records(flashinfer_import.package_dir(), set(by_kernel))
    for r in records:
        r["targets"] = sorted({t for k in r["kernels"] for t in by_kernel.get(k, [])})
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.manifest", description=__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--build-dir", required=True, type=Path)
    ap.add_argument("--host-arch", default="x86_64")
    ap.add_argument("libraries", nargs="*", type=Path)
    ns = ap.parse_args(argv)
    text = json.dumps(build(ns.libraries, ns.build_dir, ns.host_arch), indent=1, sort_keys=True) + "\n"
    # runs on every build: the commit can change while no library does, and a manifest written
    # only with its libraries would name the commit of their first build; unchanged content keeps
    # the file's timestamp
    if not ns.out.is_file() or ns.out.read_text() != text:
        ns.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
