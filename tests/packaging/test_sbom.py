"""wheels/sbom.py: the release SBOM lists every component linked into (or generating) the kernel
libraries, with versions and the sha256 of the bytes actually used, and refuses to write an SBOM
that would lie (wheels/RELEASING.md, "SBOM").

The unit tests build a small fake build environment, lock and kernels wheel in tmp_path (no build
env, no network); the last test runs the script against the real wheels/dist and build env."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "wheels"))
import sbom  # noqa: E402

sys.path.pop(0)

ARCH = "x86_64"
CROSS = "aarch64"
CUDART = b"!<arch>\nfake cudart static archive\n"
CUDART_CROSS = b"!<arch>\nfake aarch64 cudart static archive\n"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()


def _install(sp: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    di = sp / f"{name.replace('-', '_')}-{version}.dist-info"
    di.mkdir(parents=True)
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = []
    for rel, data in files.items():
        (sp / rel).parent.mkdir(parents=True, exist_ok=True)
        (sp / rel).write_bytes(data)
        rows.append(f"{rel},sha256={_b64(data)},{len(data)}")
    rows.append(f"{di.name}/RECORD,,")
    (di / "RECORD").write_text("\n".join(rows) + "\n")


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _kernels_wheel(dist: Path, arch: str, libs: dict[str, bytes], **manifest_over) -> Path:
    manifest = {
        "version": "0.1.0", "host_arch": arch, "build_commit": "0" * 40,
        "toolchain": {"nvidia-cuda-runtime": "13.0.96", "nvidia-cutlass-dsl": "4.8.1", "ziglang": "0.17.1"},
        "upstream": {"flashinfer-python": "0.7.2.post1"},
        "targets": {t: {"library": f"{t.replace('_', '')}/libsubblock_sage_{t.replace('_', '')}.so",
                        "sha256": _sha(b)} for t, b in libs.items()},
    }
    manifest.update(manifest_over)
    members = {"subblock_sage_kernels/manifest.json": json.dumps(manifest).encode()}
    for t, b in libs.items():
        members[f"subblock_sage_kernels/{manifest['targets'][t]['library']}"] = b
    return _wheel(dist / f"subblock_sage_kernels_cu13-0.1.0-py3-none-manylinux_2_28_{arch}.whl", members)


@pytest.fixture
def fake(tmp_path):
    """A build env (site-packages), its lock, aot.cross_libs' cache and a dist folder."""
    sp = tmp_path / "site-packages"
    _install(sp, "nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart_static.a": CUDART})
    _install(sp, "ziglang", "0.17.1", {"ziglang/zig": b"\x7fELF zig"})
    _install(sp, "nvidia-cutlass-dsl", "4.8.1", {"nvidia_cutlass_dsl/__init__.py": b""})
    _install(sp, "nvidia-cutlass-dsl-libs-cu13", "4.8.1", {
        "nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-311-x86_64-linux-gnu.so":
            b"\x7fELF mlir"})
    _install(sp, "flashinfer-python", "0.7.2.post1", {"flashinfer/__init__.py": b"# classes"})
    _install(sp, "packaging", "26.4", {"packaging/__init__.py": b""})

    cache = tmp_path / "cross"
    (cache / CROSS / "wheels").mkdir(parents=True)
    cross_whl = _wheel(cache / CROSS / "wheels" /
                       "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
                       {"nvidia/cu13/lib/libcudart_static.a": CUDART_CROSS})

    lock = tmp_path / "build-requirements.lock"
    entries = {"nvidia-cuda-runtime": ("13.0.96", [_sha(cross_whl.read_bytes()), "1" * 64]),
               "ziglang": ("0.17.1", ["2" * 64]), "nvidia-cutlass-dsl": ("4.8.1", ["3" * 64]),
               "nvidia-cutlass-dsl-libs-cu13": ("4.8.1", ["4" * 64]),
               "flashinfer-python": ("0.7.2.post1", ["5" * 64]), "packaging": ("26.4", ["6" * 64]),
               "colorama": ("0.4.6", ["7" * 64])}
    lock.write_text("".join(f"{n}=={v} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hs) + "\n"
                            for n, (v, hs) in entries.items()))

    dist = tmp_path / "dist"
    dist.mkdir()
    libs = {"sm_90a": b"\x7fELF lib sm90a", "sm_120a": b"\x7fELF lib sm120a"}
    _kernels_wheel(dist, ARCH, libs)
    _kernels_wheel(dist, CROSS, {t: b + b" arm" for t, b in libs.items()})
    _wheel(dist / "subblock_sage-0.1.0-py3-none-any.whl", {"subblock_sage/__init__.py": b""})
    return {"sp": sp, "cache": cache, "lock": lock, "dist": dist, "libs": libs}


def _bom(f) -> dict:
    return sbom.build_sbom(f["dist"], f["sp"], f["lock"], f["cache"], build_arch=ARCH)


def _walk(components):
    for c in components:
        yield c
        yield from _walk(c.get("components", []))


def test_every_library_and_linked_component_is_listed_with_its_digest(fake):
    bom = _bom(fake)
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    comps = list(_walk(bom["components"]))
    libs = {(c["name"], dict((p["name"], p["value"]) for p in c["properties"])["sbs:host-arch"]): c
            for c in comps if c["name"].startswith("libsubblock_sage_")}
    assert len(libs) == 4
    for (name, arch), c in libs.items():
        data = fake["libs"]["sm_90a" if "sm90a" in name else "sm_120a"] + (b" arm" if arch == CROSS else b"")
        assert c["hashes"] == [{"alg": "SHA-256", "content": _sha(data)}]
    files = {(c["bom-ref"].split("#")[1].split("/")[0] if "#" in c["bom-ref"] else "", c["name"]): c
             for c in comps if c["type"] == "file"}
    # the static cudart of each CPU: the installed one natively, that CPU's PyPI wheel when crossed
    assert files[(ARCH, "nvidia/cu13/lib/libcudart_static.a")]["hashes"][0]["content"] == _sha(CUDART)
    assert files[(CROSS, "nvidia/cu13/lib/libcudart_static.a")]["hashes"][0]["content"] == _sha(CUDART_CROSS)
    assert files[(ARCH, "ziglang/zig")]["hashes"][0]["content"] == _sha(b"\x7fELF zig")
    own = (ROOT / "aot" / "toolchain" / "dsl_entry_points.c").read_bytes()
    assert files[("", "aot/toolchain/dsl_entry_points.c")]["hashes"][0]["content"] == _sha(own)
    # each library depends on its CPU's cudart, the compiler, the DSL and the compiled classes
    deps = {d["ref"]: d["dependsOn"] for d in bom["dependencies"]}
    for ref, on in deps.items():
        if ref.endswith(".so"):
            arch = CROSS if "aarch64" in ref else ARCH
            assert f"pkg:pypi/nvidia-cuda-runtime@13.0.96#{arch}" in on
            assert {f"pkg:pypi/ziglang@0.17.1#{ARCH}", f"pkg:pypi/flashinfer-python@0.7.2.post1#{ARCH}",
                    f"pkg:pypi/nvidia-cutlass-dsl-libs-cu13@4.8.1#{ARCH}"} <= set(on)
    # every locked build dependency, with the digests the lock allows
    locked = {c["name"]: c for c in bom["components"] if c["bom-ref"].startswith("pkg:pypi/")
              and c.get("properties") and c["properties"][0]["value"] == "build dependency (locked)"}
    assert {"packaging", "colorama", "nvidia-cuda-runtime", "flashinfer-python"} <= set(locked)
    assert locked["colorama"]["scope"] == "excluded"


def test_the_dsl_runtime_archive_is_not_listed_as_linked(fake):
    bom = _bom(fake)
    names = [c["name"] for c in _walk(bom["components"])]
    assert not any("cuda_dialect_runtime" in n for n in names)
    props = {p["name"]: p["value"] for p in bom["metadata"]["properties"]}
    assert props["sbs:not-linked"].startswith("libcuda_dialect_runtime_static.a")


def test_the_sbom_is_deterministic(fake, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    a, b = _bom(fake), _bom(fake)
    assert a == b and a["metadata"]["timestamp"] == "2023-11-14T22:13:20Z"


def test_a_library_that_differs_from_its_manifest_is_refused(fake):
    whl = next(fake["dist"].glob(f"*{ARCH}.whl"))
    with zipfile.ZipFile(whl) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    lib = next(n for n in members if n.endswith(".so"))
    members[lib] = b"\x7fELF tampered"
    _wheel(whl, members)
    with pytest.raises(SystemExit, match=r"manifest says.*Fix: rebuild the wheel; do not publish it"):
        _bom(fake)


def test_a_manifest_built_with_another_toolchain_is_refused(fake):
    whl = next(fake["dist"].glob(f"*{ARCH}.whl"))
    whl.unlink()
    _kernels_wheel(fake["dist"], ARCH, fake["libs"],
                   toolchain={"nvidia-cuda-runtime": "13.0.48", "nvidia-cutlass-dsl": "4.8.1", "ziglang": "0.17.1"})
    with pytest.raises(SystemExit, match=r"built with nvidia-cuda-runtime==13.0.48 but the build env has 13.0.96.*Fix"):
        _bom(fake)


def test_an_installed_file_that_differs_from_its_record_is_refused(fake):
    (fake["sp"] / "ziglang" / "zig").write_bytes(b"\x7fELF another zig")
    with pytest.raises(SystemExit, match=r"ziglang: installed ziglang/zig differs from its RECORD hash.*Fix"):
        _bom(fake)


def test_an_env_that_differs_from_the_lock_is_refused(fake):
    fake["lock"].write_text(fake["lock"].read_text().replace("packaging==26.4", "packaging==25.0"))
    with pytest.raises(SystemExit, match=r"the lock pins packaging==25.0 but the build env has 26.4.*Fix"):
        _bom(fake)


def test_a_cross_wheel_the_lock_does_not_allow_is_refused(fake):
    (whl,) = (fake["cache"] / CROSS / "wheels").glob("*.whl")
    _wheel(whl, {"nvidia/cu13/lib/libcudart_static.a": b"!<arch>\nsomething else\n"})
    with pytest.raises(SystemExit, match=r"is not a wheel the lock allows for nvidia-cuda-runtime.*Fix"):
        _bom(fake)


def test_a_missing_cross_wheel_names_the_command(fake):
    shutil.rmtree(fake["cache"] / CROSS)
    with pytest.raises(SystemExit, match=r"Fix: run `python -m aot.cross_libs --arch aarch64`"):
        _bom(fake)


def _build_env_site_packages() -> Path | None:
    env = Path(os.environ.get("SBS_BUILD_ENV") or ROOT / "wheels" / ".buildenv")
    found = sorted(env.glob("lib/python3*/site-packages"))
    return found[-1] if found else None


def test_sbom_of_the_built_wheels(dist_dir, tmp_path):
    """The real thing: wheels/dist's kernels wheel(s) of this CPU (and the other CPU's when the
    cross cache is there) against the build env they were built in and the committed lock."""
    sp = _build_env_site_packages()
    if sp is None:
        pytest.skip("no build environment (SBS_BUILD_ENV or wheels/.buildenv): run ./wheels/build.sh first")
    arch = platform.machine()
    cache = Path(os.environ.get("SBS_CROSS_CACHE") or ROOT / "wheels" / ".cross")
    dist = tmp_path / "dist"
    dist.mkdir()
    for w in dist_dir.glob("*"):
        other = w.name.startswith("subblock_sage_kernels_cu13-") and not w.name.endswith(f"_{arch}.whl")
        if not other or any((cache / w.name.rsplit("_", 1)[-1][:-4] / "wheels").glob("nvidia_cuda_runtime-*")):
            shutil.copy(w, dist)
    out = tmp_path / "sbom.json"
    res = subprocess.run([sys.executable, str(ROOT / "wheels" / "sbom.py"), "--dist", str(dist),
                          "--site-packages", str(sp), "--cross-cache", str(cache), "-o", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    bom = json.loads(out.read_text())
    comps = list(_walk(bom["components"]))
    for whl in dist.glob("subblock_sage_kernels_cu13-*.whl"):
        with zipfile.ZipFile(whl) as zf:
            manifest = json.loads(zf.read("subblock_sage_kernels/manifest.json"))
            for target, entry in manifest["targets"].items():
                (c,) = [c for c in comps if c.get("bom-ref") == f"{whl.name}/subblock_sage_kernels/{entry['library']}"]
                assert c["hashes"][0]["content"] == entry["sha256"] == _sha(zf.read(f"subblock_sage_kernels/{entry['library']}"))
    cudart = sp / "nvidia" / "cu13" / "lib" / "libcudart_static.a"
    (f,) = [c for c in comps if c.get("bom-ref") == f"pkg:pypi/nvidia-cuda-runtime@{manifest['toolchain']['nvidia-cuda-runtime']}#{arch}/nvidia/cu13/lib/libcudart_static.a"]
    assert f["hashes"][0]["content"] == _sha(cudart.read_bytes())
    assert not any("cuda_dialect_runtime" in c["name"] for c in comps)


def test_an_upstream_installed_in_a_folder_of_its_own_is_listed(fake, tmp_path, monkeypatch):
    """nvidia-cudnn-frontend (its SM100 Sage classes compiled into the sm_100a/sm_100f libraries)
    is installed with --target outside the build env: listed from that folder (version, RECORD
    digest) when a manifest names it, a dependency of every library; a version other than the
    manifest's is refused."""
    site = tmp_path / "cudnn-build"
    _install(site, "nvidia-cudnn-frontend", "1.32.0", {"cudnn/__init__.py": b"# cudnn"})
    monkeypatch.setenv("SBS_CUDNN_BUILD_SITE", str(site))
    for p in fake["dist"].glob("subblock_sage_kernels_cu13-*.whl"):
        p.unlink()
    up = {"flashinfer-python": "0.7.2.post1", "nvidia-cudnn-frontend": "1.32.0"}
    _kernels_wheel(fake["dist"], ARCH, fake["libs"], upstream=up)
    bom = _bom(fake)
    (c,) = [c for c in bom["components"] if c["name"] == "nvidia-cudnn-frontend"]
    props = {p["name"]: p["value"] for p in c["properties"]}
    assert c["version"] == "1.32.0" and "sm_100a/sm_100f" in props["sbs:role"]
    assert props["sbs:record-sha256"] == _sha((site / "nvidia_cudnn_frontend-1.32.0.dist-info" / "RECORD").read_bytes())
    deps = {d["ref"]: d["dependsOn"] for d in bom["dependencies"]}
    assert all(f"pkg:pypi/nvidia-cudnn-frontend@1.32.0#{ARCH}" in on for ref, on in deps.items() if ref.endswith(".so"))
    for p in fake["dist"].glob("subblock_sage_kernels_cu13-*.whl"):
        p.unlink()
    _kernels_wheel(fake["dist"], ARCH, fake["libs"], upstream={**up, "nvidia-cudnn-frontend": "1.31.0"})
    with pytest.raises(sbom.SbomError, match="nvidia-cudnn-frontend==1.31.0.*Fix:"):
        _bom(fake)
