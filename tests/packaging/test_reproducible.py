"""Two clean builds of one commit give byte-identical artifacts: kernels wheels (both host CPUs),
runtime wheel and sdist.

Each build runs ./wheels/build.sh in its own fresh `git clone` of HEAD (so: committed files only,
no CMake cache, no stage, no dist carried over) at paths of different lengths (so nothing may
depend on where the checkout lives), with the DSL's file cache off (every kernel compiled cold).

By default the kernels are the tiny fixture kernel (tests.cpu.fixtures.scale_kernel) for all three
GPU targets and both CPUs: same export, shim, zig link, manifest and wheel code as a release,
~2 minutes a build; a third build takes every export from the first one's export cache and must
give the same bytes too. SBS_REPRO_FULL=1 builds the real registry instead (~15 minutes a build on
2 cores); the release workflow does that on every release (the `reproducible` job).
Uses the build environment of tests/run.sh (SBS_BUILD_ENV, default wheels/.buildenv)."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def build_env() -> Path:
    env = Path(os.environ.get("SBS_BUILD_ENV") or ROOT / "wheels" / ".buildenv")
    py = env / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no build environment at {env} (./wheels/build.sh creates it)")
    probe = subprocess.run([str(py), "-c", "import cutlass, ziglang, cmake"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"{env} lacks the build requirements")
    return env


def clean_build(where: Path, env: Path, arches: str, full: bool, cache: str = "off",
                log: list | None = None) -> dict[str, str]:
    src = where / "src"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(src)], check=True)
    dist = where / "dist"
    run_env = {
        k: v for k, v in os.environ.items()
        if k not in ("SOURCE_DATE_EPOCH", "SBS_BUILD_COMMIT", "SBS_DIST", "SBS_WORK", "SBS_TEST_LIBS")
    }
    run_env.update(
        SBS_BUILD_ENV=str(env), SBS_DIST=str(dist), SBS_SUMMARY="0", SBS_HOST_ARCHES=arches,
        CUTE_DSL_DISABLE_FILE_CACHING="1", SBS_EXPORT_CACHE=cache,
        # the pinned aarch64 static libraries (verified against their wheels' RECORD) are inputs,
        # not outputs: share one download instead of fetching ~90 MB per clone
        SBS_CROSS_CACHE=os.environ.get("SBS_CROSS_CACHE") or str(ROOT / "wheels" / ".cross"),
    )
    if full:
        run_env.pop("SUBBLOCK_SAGE_KERNEL_MODULES", None)
    else:
        run_env["SUBBLOCK_SAGE_KERNEL_MODULES"] = "tests.cpu.fixtures.scale_kernel"
    res = subprocess.run(["bash", str(src / "wheels" / "build.sh")], env=run_env, cwd=src,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    if log is not None:
        log.append(res.stdout)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dist.iterdir())}


def zip_member_diff(a: Path, b: Path) -> list[str]:
    out = []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        if list(ia) != list(ib):
            out.append(f"entry order/names differ: {sorted(set(ia) ^ set(ib))}")
        for n in sorted(set(ia) & set(ib)):
            if za.read(n) != zb.read(n):
                out.append(f"content of {n}")
            elif (ia[n].date_time, ia[n].external_attr) != (ib[n].date_time, ib[n].external_attr):
                out.append(f"metadata of {n}")
    return out


def test_two_clean_builds_are_byte_identical(tmp_path):
    env = build_env()
    full = os.environ.get("SBS_REPRO_FULL") == "1"
    arches = os.environ.get("SBS_HOST_ARCHES") or platform.machine()  # wheels/build.sh's default
    # a compiles everything into an empty export cache, b compiles everything without one, c takes
    # every export from a's cache (aot/export_cache.py): all three must give the same bytes
    cache, logs = str(tmp_path / "export-cache"), []
    a = clean_build(tmp_path / "a", env, arches, full, cache=cache)
    b = clean_build(tmp_path / "build-b-at-a-longer-path", env, arches, full)
    c = clean_build(tmp_path / "c", env, arches.split()[0], full, cache=cache, log=logs)  # one CPU: enough
    assert set(c) <= set(a) and all(c[n] == a[n] for n in c), \
        f"a cached build differs: {[n for n in c if a.get(n) != c[n]]}"
    assert " 0 compiled, " in logs[0] and "from the export cache" in logs[0], logs[0][-3000:]
    assert set(a) == set(b)
    kinds = {n.rsplit("-", 1)[-1] for n in a}
    assert "any.whl" in kinds and any(n.endswith(".tar.gz") for n in a)
    for arch in arches.split():
        assert any(n.endswith(f"manylinux_2_28_{arch}.whl") for n in a), (arch, sorted(a))
    differing = [n for n in a if a[n] != b[n]]
    details = {
        n: zip_member_diff(tmp_path / "a" / "dist" / n, tmp_path / "build-b-at-a-longer-path" / "dist" / n)
        for n in differing if n.endswith(".whl")
    }
    assert not differing, f"not reproducible: {differing} {details}"
