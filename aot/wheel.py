"""Assemble the kernels wheel ``subblock-sage-kernels-cu13`` from a CMake install tree.

The wheel is ``py3-none-manylinux_2_28_<arch>``: pure-Python wrapper package, one folder per GPU
target holding a self-contained shared library (no Python extension, so no CPython ABI tag), and
``manifest.json``. Written directly with zipfile so it is byte-reproducible: entries sorted, fixed
permissions, timestamps from SOURCE_DATE_EPOCH (the commit date), no build paths.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

from aot.contract import KERNELS_DIST as DIST
from aot.contract import KERNELS_PACKAGE as PACKAGE

DIST_UNDERSCORE = DIST.replace("-", "_")

_INIT = '''"""Ahead-of-time compiled SubBlock block-sparse attention kernels for subblock-sage.

Data only: the runtime `subblock_sage` loads these libraries. Targets: {targets}.
"""

__version__ = "{version}"
'''


def _zip_time() -> tuple[int, int, int, int, int, int]:
    import time

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # default: 1980-01-01
    epoch = max(epoch, 315532800)
    t = time.gmtime(epoch)
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec - t.tm_sec % 2)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def metadata(version: str, manifest: dict) -> str:
    targets = sorted(manifest["targets"])
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {DIST}",
        f"Version: {version}",
        "Summary: AOT-compiled SubBlock block-sparse attention kernels (CUDA 13) for subblock-sage; "
        f"GPU targets: {', '.join(targets)}",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        f"Keywords: cuda,attention,block-sparse,{','.join(targets)}",
        "Classifier: Environment :: GPU :: NVIDIA CUDA :: 13",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Programming Language :: Python :: 3",
    ]
    for t in targets:
        m = manifest["targets"][t]
        status = "run on hardware" if m["hardware"].get("run_on_hardware") else "compile-verified"
        lines.append(f"Project-URL: GPU target {t}, https://pypi.org/project/subblock-sage/#{t}")
        lines.append(f"Platform: {t} ({m['gpus']}; {status})")
    body = (
        f"Kernel libraries for subblock-sage {version}. Install through the runtime: "
        f'pip install "subblock-sage[cu130]=={version}".\n\nGPU targets: '
        + ", ".join(f"{t} ({manifest['targets'][t]['gpus']})" for t in targets)
        + "\n"
    )
    return "\n".join(lines) + "\nDescription-Content-Type: text/plain\n\n" + body


def build_wheel(stage: Path, out_dir: Path, plat: str) -> Path:
    pkg_dir = stage / PACKAGE
    manifest = json.loads((pkg_dir / "manifest.json").read_text())
    version = manifest["version"]
    files: dict[str, bytes] = {}
    for path in sorted(pkg_dir.rglob("*")):
        if path.is_file():
            files[f"{PACKAGE}/{path.relative_to(pkg_dir).as_posix()}"] = path.read_bytes()
    files[f"{PACKAGE}/__init__.py"] = _INIT.format(
        targets=", ".join(sorted(manifest["targets"])), version=version
    ).encode()
    dist_info = f"{DIST_UNDERSCORE}-{version}.dist-info"
    tag = f"py3-none-{plat}"
    files[f"{dist_info}/METADATA"] = metadata(version, manifest).encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: subblock-sage aot.wheel\nRoot-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    ).encode()
    files[f"{dist_info}/top_level.txt"] = f"{PACKAGE}\n".encode()
    record = [_record_line(n, d) for n, d in sorted(files.items())]
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{DIST_UNDERSCORE}-{version}-{tag}.whl"
    date_time = _zip_time()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        # dist-info last, as the wheel spec recommends; everything else sorted
        for name in sorted(files, key=lambda n: (n.startswith(dist_info), n)):
            info = zipfile.ZipInfo(name, date_time=date_time)
            executable = name.endswith(".so")
            info.external_attr = ((0o100755 if executable else 0o100644) & 0xFFFF) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[name], compresslevel=9)
    wheel.write_bytes(buf.getvalue())
    return wheel


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.wheel", description=__doc__)
    ap.add_argument("--stage", required=True, type=Path, help="CMake install prefix")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--plat", default="manylinux_2_28_x86_64")
    ns = ap.parse_args(argv)
    print(build_wheel(ns.stage, ns.out, ns.plat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
