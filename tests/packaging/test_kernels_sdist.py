"""The kernels sdist (scikit-build-core, wheels/kernels/pyproject.toml) is self-contained: built
from the repository, unpacked elsewhere, it builds a kernels wheel with no repository around it.

Runs in the build environment (`-m aot`): the wheel is built without isolation from the pinned
toolchain, for the fixture kernel and sm_90a only (the sdist carries every real kernel too; what is
tested here is that the symlinked tree, CMake, the version provider and the license files survive
the trip). The fixture module lives in tests/, outside the sdist, so only it comes via PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = [pytest.mark.aot, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _build(args: list[str], cwd: Path, env: dict) -> None:
    res = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check", *args],
                         cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def test_kernels_sdist_builds_a_wheel(tmp_path):
    pytest.importorskip("cutlass")
    pytest.importorskip("scikit_build_core")
    env = dict(os.environ, SOURCE_DATE_EPOCH="1700000000")
    _build(["--sdist", "--outdir", str(tmp_path / "sdist"), "wheels/kernels"], ROOT, env)
    (sdist,) = (tmp_path / "sdist").glob("subblock_sage_kernels_cu13-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
        assert not any(m.issym() or m.islnk() for m in tf.getmembers()), "symlinks must be resolved"
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tf.extractall(tmp_path / "src", **kw)
    for need in ("CMakeLists.txt", "pyproject.toml", "PKG-INFO", "LICENSE", "THIRD_PARTY_NOTICES.md",
                 "python/subblock_sage/_version.py", "aot/export/__main__.py", "aot/toolchain/dsl_entry_points.c"):
        assert need in names, need
    assert not any("__pycache__" in n or n.endswith((".so", ".o", ".whl")) for n in names)
    (src,) = (tmp_path / "src").iterdir()

    env.update(SBS_HOST_ARCH="x86_64" if os.uname().machine == "x86_64" else "aarch64", SBS_TARGETS="sm_90a",
               SUBBLOCK_SAGE_KERNEL_MODULES="tests.cpu.fixtures.scale_kernel", PYTHONPATH=str(ROOT))
    _build(["--wheel", "--outdir", str(tmp_path / "dist"), "-Cbuild-dir=" + str(tmp_path / "build"), "."],
           src, env)
    (wheel,) = (tmp_path / "dist").glob("subblock_sage_kernels_cu13-*-py3-none-manylinux_2_28_*.whl")
    with zipfile.ZipFile(wheel) as zf:
        manifest = json.loads(zf.read("subblock_sage_kernels/manifest.json"))
        version = manifest["version"]
        meta = Parser().parsestr(zf.read(f"subblock_sage_kernels_cu13-{version}.dist-info/METADATA").decode())
        files = set(zf.namelist())
    assert sorted(manifest["targets"]) == ["sm_90a"]
    assert "subblock_sage_kernels/sm90a/libsubblock_sage_sm90a.so" in files
    assert meta["Version"] == version and meta["License-Expression"] == "Apache-2.0"
