"""A user's install, from wheels/dist only (no index): fresh venvs run the README's install line
(`README_INSTALL`, for `[cu130]` and `[cu13]`) from the repository root, import, and
`subblock-sage check` fails cleanly on a machine without an NVIDIA driver/GPU; an index offering a
higher version of both dists is never asked; a kernels wheel of another version gives the
VersionMismatchError naming the fix; and the aarch64 kernel library loads and answers under
qemu-user (skipped where Debian's qemu-user and the arm64 glibc cannot be installed)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.cc import zig_python

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# The README's local install line, word for word (README.md must use exactly this): from the
# repository root, the extras resolve from wheels/dist alone. --no-index: with --find-links only,
# pip still asks the index, and a same-named higher version there would win.
README_INSTALL = 'pip install --no-index --find-links wheels/dist "subblock-sage[cu130]"'


def _has_nvidia_driver() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def make_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin" / "python"


def pip(py: Path, *args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-index", *args], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def runtime_version(dist: Path) -> str:
    (rt,) = dist.glob("subblock_sage-*-py3-none-any.whl")
    return rt.name.split("-")[1]


def _fake_wheel(out: Path, dist: str, version: str, tag: str, requires: list[str]) -> Path:
    """A wheel of ``dist`` at ``version`` holding one module, packed by PyPA's `wheel pack`."""
    name = dist.replace("-", "_")
    tree = out / f"{name}-{version}"
    info = tree / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (tree / f"{name}_decoy.py").write_text("DECOY = True\n")
    extras = sorted({r.split("extra == ")[1].strip("'\"") for r in requires if "extra == " in r})
    (info / "METADATA").write_text("\n".join(
        ["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}"]
        + [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]) + "\n")
    (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
    subprocess.run([sys.executable, "-m", "wheel", "pack", str(tree), "--dest-dir", str(out)],
                   check=True, capture_output=True)
    (whl,) = out.glob(f"{name}-{version}-*.whl")
    return whl


def decoy_index(where: Path, version: str = "99.0.0") -> str:
    """A local PEP 503 index offering both dists at ``version`` (higher than ours): the file://
    URL of its root."""
    import platform

    kernels = "subblock-sage-kernels-cu13"
    wheels = {
        "subblock-sage": _fake_wheel(where / "files", "subblock-sage", version, "py3-none-any",
                                     [f'{kernels}=={version}; extra == "cu130"',
                                      f'{kernels}=={version}; extra == "cu13"']),
        kernels: _fake_wheel(where / "files", kernels, version, f"py3-none-manylinux_2_28_{platform.machine()}", []),
    }
    for project, whl in wheels.items():
        (where / "simple" / project).mkdir(parents=True)
        (where / "simple" / project / "index.html").write_text(
            f'<html><body><a href="../../files/{whl.name}">{whl.name}</a></body></html>\n')
    return (where / "simple").as_uri()


@pytest.mark.parametrize("extra", ["cu130", "cu13"])
def test_user_install_and_check_without_gpu(dist_dir, tmp_path, extra):
    assert dist_dir == ROOT / "wheels" / "dist"  # README_INSTALL names it relative to the root
    index = decoy_index(tmp_path / "index")
    # the decoy works: an install that may ask the index takes its higher version
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                          "--no-deps", "--index-url", index, "--dest", str(tmp_path / "dl"), "subblock-sage"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and [p.name for p in (tmp_path / "dl").iterdir()] == [
        "subblock_sage-99.0.0-py3-none-any.whl"], res.stdout + res.stderr
    py = make_venv(tmp_path / "venv")
    words = shlex.split(README_INSTALL.replace("[cu130]", f"[{extra}]"))
    assert words[:2] == ["pip", "install"]
    env = dict(os.environ, PIP_INDEX_URL=index, PIP_EXTRA_INDEX_URL=index, PIP_DISABLE_PIP_VERSION_CHECK="1")
    res = subprocess.run([str(py), "-m", *words], capture_output=True, text=True, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    version = runtime_version(dist_dir)
    out = subprocess.run(
        [str(py), "-c",
         "import json, subblock_sage, subblock_sage_kernels, importlib.metadata as md;"
         "print(json.dumps([subblock_sage.__version__, subblock_sage_kernels.__version__,"
         " md.version('subblock-sage-kernels-cu13'), subblock_sage.manifest()['version']]))"],
        capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [version] * 4
    check = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout

    if _has_nvidia_driver():
        pytest.skip("this machine has an NVIDIA driver: the no-GPU report cannot be checked here")
    exe = tmp_path / "venv" / "bin" / "subblock-sage"
    res = subprocess.run([str(exe), "check"], capture_output=True, text=True, cwd=tmp_path)
    text = res.stdout + res.stderr
    assert res.returncode != 0, text
    assert "Traceback" not in text, text
    assert "no NVIDIA driver" in text or "no NVIDIA GPU" in text, text
    res = subprocess.run([str(exe), "check", "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    report = json.loads(res.stdout)
    assert report["problems"], report


def mismatched_kernels_wheel(dist: Path, out: Path, version: str) -> Path:
    """The installed-platform kernels wheel under another version: unpacked, manifest and METADATA
    edited, repacked by PyPA's `wheel pack` (which writes RECORD)."""
    import platform

    arch = platform.machine()
    (src,) = dist.glob(f"subblock_sage_kernels_cu13-*-manylinux_2_28_{arch}.whl")
    old = src.name.split("-")[1]
    tree = out / "unpacked"
    with zipfile.ZipFile(src) as zf:
        zf.extractall(tree)
    mpath = tree / "subblock_sage_kernels" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["version"] = version
    mpath.write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    info = tree / f"subblock_sage_kernels_cu13-{old}.dist-info"
    meta = info / "METADATA"
    meta.write_text(meta.read_text().replace(f"\nVersion: {old}\n", f"\nVersion: {version}\n", 1))
    (info / "RECORD").unlink()
    info.rename(tree / f"subblock_sage_kernels_cu13-{version}.dist-info")
    (out / "dist").mkdir()
    subprocess.run([sys.executable, "-m", "wheel", "pack", str(tree), "--dest-dir", str(out / "dist")],
                   check=True, capture_output=True)
    (wheel,) = (out / "dist").glob(f"subblock_sage_kernels_cu13-{version}-*.whl")
    return wheel


def test_version_mismatch_names_the_fix(dist_dir, tmp_path):
    version = runtime_version(dist_dir)
    other = "0.0.1" if version != "0.0.1" else "0.0.2"
    kw = mismatched_kernels_wheel(dist_dir, tmp_path, other)
    py = make_venv(tmp_path / "venv")
    pip(py, "--find-links", str(dist_dir), "subblock-sage")
    pip(py, "--no-deps", str(kw))
    res = subprocess.run(
        [str(py), "-c",
         "import subblock_sage\n"
         "from subblock_sage.errors import VersionMismatchError\n"
         "try:\n    subblock_sage.manifest()\n"
         "except VersionMismatchError as e:\n    print(e)\n"
         "else:\n    raise SystemExit('no VersionMismatchError')\n"],
        capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    msg = res.stdout
    assert version in msg and other in msg, msg
    assert f'pip install "subblock-sage[cu130]=={version}"' in msg, msg

    exe = tmp_path / "venv" / "bin" / "subblock-sage"
    res = subprocess.run([str(exe), "check"], capture_output=True, text=True, cwd=tmp_path)
    text = res.stdout + res.stderr
    assert res.returncode != 0 and "Traceback" not in text, text
    assert f'pip install "subblock-sage[cu130]=={version}"' in text, text


# ---------------------------------------------------------------------------------------------
# aarch64 under qemu-user

AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")
PROBE_C = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
typedef int32_t (*i32_fn)(void);
typedef const char *(*str_fn)(void);
typedef int32_t (*status_fn)(int32_t *, int32_t *, int32_t *);
int main(int argc, char **argv) {
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("{\"dlopen_error\": \"%s\"}\n", dlerror()); return 2; }
  i32_fn abi = (i32_fn)dlsym(h, "subblock_sage_v1_abi_version");
  str_fn target = (str_fn)dlsym(h, "subblock_sage_v1_target");
  i32_fn nk = (i32_fn)dlsym(h, "subblock_sage_v1_num_kernels");
  status_fn status = (status_fn)dlsym(h, "subblock_sage_v1_status");
  str_fn last = (str_fn)dlsym(h, "subblock_sage_v1_last_error");
  if (!abi || !target || !nk || !status || !last) { printf("{\"dlsym_error\": 1}\n"); return 3; }
  int32_t drv = -1, rt = -1, cnt = -1;
  int32_t rc = status(&drv, &rt, &cnt);
  printf("{\"abi\": %d, \"target\": \"%s\", \"kernels\": %d, \"status\": %d, \"runtime\": %d}\n",
         abi(), target(), nk(), rc, rt);
  return 0;
}
"""


def _ensure_qemu() -> str:
    qemu = shutil.which("qemu-aarch64")
    if qemu and (AARCH64_SYSROOT / "lib" / "libc.so.6").exists():
        return qemu
    apt = shutil.which("apt-get")
    if os.environ.get("SBS_NO_APT") or not apt or os.geteuid() != 0:
        pytest.skip("qemu-user / libc6-arm64-cross not installed (apt-get install qemu-user libc6-arm64-cross)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        r = subprocess.run([apt, "install", "-y", "-qq", "qemu-user", "libc6-arm64-cross"],
                           capture_output=True, env=env, timeout=600)
        if r.returncode != 0:
            subprocess.run([apt, "update", "-qq"], capture_output=True, env=env, timeout=300)
            subprocess.run([apt, "install", "-y", "-qq", "qemu-user", "libc6-arm64-cross"],
                           capture_output=True, env=env, timeout=600)
    except subprocess.TimeoutExpired:
        pass
    qemu = shutil.which("qemu-aarch64")
    if not qemu or not (AARCH64_SYSROOT / "lib" / "libc.so.6").exists():
        pytest.skip("could not install Debian's qemu-user and libc6-arm64-cross")
    return qemu


def test_aarch64_library_loads_under_qemu(dist_dir, tmp_path):
    wheels = list(dist_dir.glob("subblock_sage_kernels_cu13-*-manylinux_2_28_aarch64.whl"))
    if not wheels:
        pytest.skip("no aarch64 kernels wheel in wheels/dist")
    import platform

    native = platform.machine() == "aarch64"
    runner = [] if native else [_ensure_qemu(), "-L", str(AARCH64_SYSROOT)]
    zpy = zig_python()
    (tmp_path / "probe.c").write_text(PROBE_C)
    probe = tmp_path / "probe"
    subprocess.run([str(zpy), "-m", "ziglang", "cc", "-target", "aarch64-linux-gnu.2.28", "-O1",
                    "-o", str(probe), str(tmp_path / "probe.c")], check=True, cwd=tmp_path)
    with zipfile.ZipFile(wheels[0]) as zf:
        manifest = json.loads(zf.read("subblock_sage_kernels/manifest.json"))
        assert manifest["host_arch"] == "aarch64"
        for name, t in sorted(manifest["targets"].items()):
            lib = tmp_path / t["folder"] / Path(t["library"]).name
            lib.parent.mkdir(exist_ok=True)
            lib.write_bytes(zf.read(f"subblock_sage_kernels/{t['library']}"))
            res = subprocess.run([*runner, str(probe), str(lib)],
                                 capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, (name, res.stdout, res.stderr)
            got = json.loads(res.stdout)
            assert got["abi"] == manifest["abi_version"] == 1
            assert got["target"] == name
            assert got["kernels"] == len(t["kernels"])
            assert got["runtime"] >= 13000, got
            if not _has_nvidia_driver():  # no driver: the library reports it instead of crashing
                assert got["status"] != 0, got
