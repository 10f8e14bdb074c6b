"""What ./wheels/build.sh put in wheels/dist: manylinux compliance and structure of every kernels
wheel (both host CPUs), RECORD integrity, tags, metadata, and version agreement of all dists.

Needs only pyelftools; the `auditwheel show` check runs when PyPI's auditwheel is installed."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.helpers.elfcheck import dynamic_info, embedded_cubin_sms, glibc_tuple

MAX_WHEEL_BYTES = 20 * 2**20
GLIBC_FLOOR = (2, 28)
ALLOWED_NEEDED = {"libc.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libm.so.6"}
DYNAMIC_LOADER = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}
ELF_MACHINE = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
TARGET_RE = re.compile(r"^sm_(?P<sm>\d+)(?P<suffix>[af]?)$")  # sm_90a, sm_100f, ...
WHEEL_RE = re.compile(
    r"^subblock_sage_kernels_cu13-(?P<version>[^-]+)-py3-none-manylinux_2_28_(?P<arch>x86_64|aarch64)\.whl$"
)


def kernels_wheels(dist: Path) -> list[Path]:
    return sorted(dist.glob("subblock_sage_kernels_cu13-*.whl"))


def expected_arches() -> list[str]:
    # wheels/build.sh's default: this machine's CPU
    return (os.environ.get("SBS_HOST_ARCHES") or platform.machine()).split()


@pytest.fixture(scope="module", params=["x86_64", "aarch64"])
def kwheel(request, dist_dir) -> tuple[str, Path]:
    arch = request.param
    found = [w for w in kernels_wheels(dist_dir) if w.name.endswith(f"_{arch}.whl")]
    if not found:
        if arch in expected_arches():
            pytest.fail(f"no {arch} kernels wheel in {dist_dir} (SBS_HOST_ARCHES={' '.join(expected_arches())!r})")
        pytest.skip(f"{arch} not in SBS_HOST_ARCHES")
    (w,) = found
    return arch, w


def read_record(zf: zipfile.ZipFile) -> dict[str, tuple[str, str]]:
    (rec,) = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    rows = list(csv.reader(io.StringIO(zf.read(rec).decode())))
    return {r[0]: (r[1], r[2]) for r in rows if r}


def test_dist_has_every_artifact(dist_dir):
    names = {p.name for p in dist_dir.iterdir()}
    assert any(re.fullmatch(r"subblock_sage-[^-]+-py3-none-any\.whl", n) for n in names), names
    assert any(re.fullmatch(r"subblock_sage-[^-]+\.tar\.gz", n) for n in names), names
    for arch in expected_arches():
        assert any(n.endswith(f"manylinux_2_28_{arch}.whl") for n in names), (arch, names)
    stray = [n for n in names if not n.startswith(("subblock_sage-", "subblock_sage_kernels_cu13-"))]
    assert not stray, stray


def test_tags_and_wheel_file(kwheel):
    arch, w = kwheel
    m = WHEEL_RE.match(w.name)
    assert m and m["arch"] == arch, w.name
    with zipfile.ZipFile(w) as zf:
        wheel_file = zf.read(f"subblock_sage_kernels_cu13-{m['version']}.dist-info/WHEEL").decode()
    fields = Parser().parsestr(wheel_file)
    assert fields["Generator"].startswith("scikit-build-core "), fields["Generator"]
    assert fields["Wheel-Version"] == "1.0"
    assert fields["Root-Is-Purelib"] == "false"
    assert fields.get_all("Tag") == [f"py3-none-manylinux_2_28_{arch}"]


def test_size_limit(kwheel):
    _, w = kwheel
    assert w.stat().st_size <= MAX_WHEEL_BYTES, f"{w.name}: {w.stat().st_size / 2**20:.1f} MiB"


def test_record_is_complete_and_correct(kwheel):
    _, w = kwheel
    with zipfile.ZipFile(w) as zf:
        record = read_record(zf)
        names = zf.namelist()
        assert len(names) == len(set(names)), "duplicate entries"
        assert set(record) == set(names), set(record) ^ set(names)
        for name in names:
            digest, size = record[name]
            if name.endswith(".dist-info/RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = zf.read(name)
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == want, name
            assert int(size) == len(data), name


def test_archive_is_normalized(kwheel):
    """Sorted entries (dist-info last), one timestamp (SOURCE_DATE_EPOCH), normalized modes: the
    reproducible layout scikit-build-core writes with wheel.reproducible."""
    _, w = kwheel
    with zipfile.ZipFile(w) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    payload = [n for n in names if ".dist-info/" not in n]
    assert names[:len(payload)] == sorted(payload), "package files first, sorted"
    assert names[-1].endswith(".dist-info/RECORD"), names[-1]
    assert len({i.date_time for i in infos}) == 1
    for i in infos:
        mode = i.external_attr >> 16
        assert mode in (0o100644, 0o100755), (i.filename, oct(mode))


def test_one_folder_per_target_and_manifest(kwheel):
    arch, w = kwheel
    with zipfile.ZipFile(w) as zf:
        names = zf.namelist()
        manifest = json.loads(zf.read("subblock_sage_kernels/manifest.json"))
        tops = {n.split("/")[0] for n in names}
        version = WHEEL_RE.match(w.name)["version"]
        assert tops == {"subblock_sage_kernels", f"subblock_sage_kernels_cu13-{version}.dist-info"}
        assert manifest["version"] == version
        assert manifest["host_arch"] == arch
        assert manifest["package"] == "subblock-sage-kernels-cu13"
        assert manifest["targets"], "manifest lists no targets"
        folders = {n.split("/")[1] for n in names if n.count("/") >= 2 and n.startswith("subblock_sage_kernels/")}
        assert folders == {t["folder"] for t in manifest["targets"].values()}
        for name, t in manifest["targets"].items():
            assert TARGET_RE.match(name), name
            assert t["folder"] == name.replace("_", ""), (name, t["folder"])
            in_folder = [n for n in names if n.startswith(f"subblock_sage_kernels/{t['folder']}/")]
            assert in_folder == [f"subblock_sage_kernels/{t['library']}"], in_folder
            data = zf.read(f"subblock_sage_kernels/{t['library']}")
            assert hashlib.sha256(data).hexdigest() == t["sha256"]
            assert len(data) == t["size"]
            assert t["kernels"], name
            # what the target serves (aot/serving.py): one line per shipped kernel
            assert {x.split(" ", 1)[0] for x in t["serves"]} == {k["kernel"] for k in t["kernels"]}
        top_files = sorted(n for n in names if n.count("/") == 1 and n.startswith("subblock_sage_kernels/"))
        assert top_files == ["subblock_sage_kernels/__init__.py", "subblock_sage_kernels/manifest.json"]


def test_metadata_is_complete(kwheel):
    """Metadata 2.4 written by scikit-build-core from wheels/kernels/pyproject.toml: PEP 639
    license fields with both files inside the wheel, project URLs, classifiers, targets."""
    _, w = kwheel
    version = WHEEL_RE.match(w.name)["version"]
    info = f"subblock_sage_kernels_cu13-{version}.dist-info"
    with zipfile.ZipFile(w) as zf:
        meta = Parser().parsestr(zf.read(f"{info}/METADATA").decode())
        manifest = json.loads(zf.read("subblock_sage_kernels/manifest.json"))
        names = set(zf.namelist())
    assert meta["Metadata-Version"] == "2.4"
    assert meta["Name"] == "subblock-sage-kernels-cu13"
    assert meta["Version"] == version
    assert meta["License-Expression"] == "Apache-2.0"
    assert sorted(meta.get_all("License-File")) == ["LICENSE", "THIRD_PARTY_NOTICES.md"]
    assert {f"{info}/licenses/LICENSE", f"{info}/licenses/THIRD_PARTY_NOTICES.md"} <= names
    urls = meta.get_all("Project-URL") or []
    assert any(u.startswith("Homepage, https://github.com/subblock-sage/subblock-sage") for u in urls), urls
    classifiers = meta.get_all("Classifier") or []
    assert "Environment :: GPU :: NVIDIA CUDA :: 13" in classifiers
    assert "Operating System :: POSIX :: Linux" in classifiers
    for t in manifest["targets"]:
        assert t in meta["Summary"], (t, meta["Summary"])


def test_libraries_are_manylinux_2_28(kwheel, tmp_path):
    """Every library: right CPU, only glibc in NEEDED, no symbol newer than GLIBC_2.28, only the
    versioned C ABI exported, and the cubins of its own SM embedded."""
    arch, w = kwheel
    with zipfile.ZipFile(w) as zf:
        manifest = json.loads(zf.read("subblock_sage_kernels/manifest.json"))
        for name, t in manifest["targets"].items():
            lib = tmp_path / Path(t["library"]).name
            lib.write_bytes(zf.read(f"subblock_sage_kernels/{t['library']}"))
            info = dynamic_info(lib)
            assert info["machine"] == ELF_MACHINE[arch], (name, info["machine"])
            assert set(info["needed"]) <= ALLOWED_NEEDED | {DYNAMIC_LOADER[arch]}, (name, info["needed"])
            assert info["glibc"], name
            assert glibc_tuple(info["glibc"][-1]) <= GLIBC_FLOOR, (name, info["glibc"])
            assert info["exported"], name
            assert all(s.startswith("subblock_sage_v1_") for s in info["exported"]), info["exported"]
            assert set(embedded_cubin_sms(lib)) == {int(TARGET_RE.match(name)["sm"])}, name
            assert t["sm"] == int(TARGET_RE.match(name)["sm"]), (name, t["sm"])


def _auditwheel() -> list[str] | None:
    exe = shutil.which("auditwheel")
    if exe:
        return [exe]
    try:
        import auditwheel  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "auditwheel"]


def test_auditwheel_accepts(kwheel):
    arch, w = kwheel
    cmd = _auditwheel()
    if cmd is None:
        pytest.skip("auditwheel is not installed (pip install auditwheel)")
    out = subprocess.run(cmd + ["show", str(w)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    m = re.search(r'consistent with the following platform tag: "manylinux_(\d+)_(\d+)_(\w+)"', text)
    assert m, text
    assert m[3] == arch, text
    assert (int(m[1]), int(m[2])) <= GLIBC_FLOOR, text


def test_versions_agree(dist_dir):
    """Runtime wheel, sdist and kernels wheels carry one version; the extras pin exactly it."""
    (rt,) = dist_dir.glob("subblock_sage-*-py3-none-any.whl")
    version = rt.name.split("-")[1]
    with zipfile.ZipFile(rt) as zf:
        meta = Parser().parsestr(zf.read(f"subblock_sage-{version}.dist-info/METADATA").decode())
        wheel_file = zf.read(f"subblock_sage-{version}.dist-info/WHEEL").decode()
    assert "Tag: py3-none-any" in wheel_file
    reqs = meta.get_all("Requires-Dist") or []
    for extra in ("cu13", "cu130"):
        assert any(
            re.fullmatch(rf"subblock-sage-kernels-cu13\s*==\s*{re.escape(version)}\s*;\s*extra\s*==\s*['\"]{extra}['\"]", r)
            for r in reqs
        ), (extra, reqs)
    assert (dist_dir / f"subblock_sage-{version}.tar.gz").exists()
    for w in kernels_wheels(dist_dir):
        assert WHEEL_RE.match(w.name)["version"] == version, w.name


def test_sdist_is_clean(dist_dir):
    (sdist,) = dist_dir.glob("subblock_sage-*.tar.gz")
    with tarfile.open(sdist) as tf:
        members = tf.getmembers()
    names = [m.name.split("/", 1)[1] for m in members if "/" in m.name]
    assert "pyproject.toml" in names and "PKG-INFO" in names
    assert any(n.startswith("python/subblock_sage/") for n in names)
    assert not any(n.endswith((".pyc", ".so", ".whl")) or "__pycache__" in n for n in names), names
    assert len({m.mtime for m in members}) == 1, "sdist entries carry more than one mtime"
