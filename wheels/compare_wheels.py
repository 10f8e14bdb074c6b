"""Compare two builds of one wheel (release workflow: cibuildwheel's vs ./wheels/build.sh's).

Exit 1 when the files inside differ (names or bytes: libraries, manifest, metadata); only a note
when just the zip container differs (compression or entry metadata of another zlib/Python).
`--warn`: report a content difference as a warning and exit 0 (the aarch64 wheel: cibuildwheel
builds it natively, ./wheels/build.sh cross-compiles it; that the DSL emits the same host code
both ways has not been established yet).
    python wheels/compare_wheels.py [--warn] A.whl B.whl
"""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path


def members(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as zf:
        return {n: hashlib.sha256(zf.read(n)).hexdigest() for n in zf.namelist()}


def main(a: str, b: str, warn: bool = False) -> int:
    pa, pb = Path(a), Path(b)
    if not pb.exists():
        print(f"::error::{pb} missing: the two builds made different wheels")
        return 1
    ma, mb = members(pa), members(pb)
    differ = sorted(n for n in set(ma) | set(mb) if ma.get(n) != mb.get(n))
    if differ:
        print(f"::{'warning' if warn else 'error'}::{pa.name}: contents differ: {differ}")
        return 0 if warn else 1
    if pa.read_bytes() != pb.read_bytes():
        print(f"::notice::{pa.name}: same files, different zip bytes (compression or entry metadata)")
    else:
        print(f"{pa.name}: byte-identical")
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--warn"]
    raise SystemExit(main(args[0], args[1], warn="--warn" in sys.argv[1:]))
