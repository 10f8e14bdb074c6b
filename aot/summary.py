"""Print what ./wheels/build.sh produced: kernels x targets x sizes, and every wheel."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aot.contract import KERNELS_PACKAGE


def main(dist: str) -> int:
    console = Console()
    wheels = sorted(Path(dist).glob("*"))
    kernels = Table(title="Kernel libraries (kernels x targets)")
    for col in ("host", "target", "GPUs", "kernel", "variants", "library", "status"):
        kernels.add_column(col)
    for w in wheels:
        if not w.name.startswith(KERNELS_PACKAGE) or w.suffix != ".whl":
            continue
        with zipfile.ZipFile(w) as zf:
            m = json.loads(zf.read(f"{KERNELS_PACKAGE}/manifest.json"))
        for tname, t in sorted(m["targets"].items()):
            by_kernel: dict[str, list[str]] = {}
            for k in t["kernels"]:
                by_kernel.setdefault(k["kernel"], []).append(k["variant"])
            status = "run on hardware" if t["hardware"].get("run_on_hardware") else "compile-verified"
            for i, (kname, variants) in enumerate(sorted(by_kernel.items())):
                kernels.add_row(
                    m["host_arch"] if i == 0 else "", tname if i == 0 else "",
                    t["gpus"] if i == 0 else "", kname, str(len(variants)),
                    f"{t['size'] / 2**20:.2f} MiB" if i == 0 else "", status if i == 0 else "",
                )
    console.print(kernels)
    files = Table(title=f"Wheels in {dist}")
    files.add_column("file")
    files.add_column("size", justify="right")
    for w in wheels:
        files.add_row(w.name, f"{w.stat().st_size / 2**20:.2f} MiB")
    console.print(files)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "wheels/dist"))
