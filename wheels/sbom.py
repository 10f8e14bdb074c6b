"""CycloneDX 1.6 JSON SBOM of the built distributions: every component that went into the kernel
libraries, with versions and SHA-256 digests of the bytes actually used (no network, stdlib only).

Why a script of our own rather than `cyclonedx-py requirements`: that tool only sees the names and
versions of a requirements file, so its SBOM had no hashes, no transitive dependencies, and no
idea which file of which wheel is linked into our libraries. This one reads
  * every kernels wheel in the dist folder and its ``manifest.json`` (host CPU, toolchain and
    upstream versions, sha256 of each library), and re-hashes each library inside the wheel;
  * the build environment the libraries were built in (``--site-packages``, read with
    importlib.metadata, so any Python can run this), checking each file it cites against the
    wheel's RECORD:
      - nvidia-cuda-runtime: ``nvidia/cu13/lib/libcudart_static.a`` -- statically linked;
        for a kernels wheel of another CPU (cross build) the archive of that CPU's PyPI wheel,
        read from aot/cross_libs.py's cache (its wheel digest must be one the lock allows);
      - ziglang: ``ziglang/zig`` -- the C compiler and linker of the libraries;
      - nvidia-cutlass-dsl(-libs-*): the MLIR compiler library that generated the kernel code;
      - flashinfer-python: the kernel classes compiled (digest of its RECORD, which pins the
        sha256 of every file of the distribution);
  * the upstream packages installed outside the build env, in a folder of their own
    (:data:`UPSTREAM_SITES`; nvidia-cudnn-frontend, whose SM100 Sage classes the sm_100a/sm_100f
    libraries compile), when a kernels wheel's manifest names them: digest of their RECORD;
  * ``wheels/build-requirements.lock``: every transitive build dependency, with the wheel
    digests the lock allows;
  * ``aot/toolchain/dsl_entry_points.c``: our own CUDA entry points, compiled into every library.
    (The DSL's ``libcuda_dialect_runtime_static.a`` is NOT linked: its license forbids
    redistributing it. The SBOM records that as a property and never lists it as a component.)

Anything inconsistent (a library whose bytes differ from its manifest digest, a manifest toolchain
version other than the installed one, a lock version other than the installed one, a missing file)
stops with an error naming the fix: an SBOM that lies is worse than none.

    python wheels/sbom.py --dist wheels/dist --site-packages <build env site-packages> \
        --lock wheels/build-requirements.lock -o release-extra/subblock-sage.cdx.json
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import json
import os
import re
import sys
import uuid
import zipfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The file digest of the manifest, stated once in the runtime's contract.py (stdlib only), read as
# the build reads it: aot.contract (aot/runtime/__init__.py). ROOT goes on the path for that import only.
sys.path.insert(0, str(ROOT))
try:
    from aot.contract import sha256_file
finally:
    sys.path.remove(str(ROOT))
KERNELS = "subblock-sage-kernels-cu13"
NOT_LINKED = "libcuda_dialect_runtime_static.a"

# (distribution, RECORD path glob of the file used, role). A glob must match exactly one file.
USED_FILES = [
    ("nvidia-cuda-runtime", "nvidia/cu13/lib/libcudart_static.a", "statically linked into every library"),
    ("ziglang", "ziglang/zig", "C compiler and linker of every library"),
    ("nvidia-cutlass-dsl-libs-cu13", "nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.*.so",
     "CuTe-DSL compiler that generated the kernel code"),
]
# Distributions whose whole content is an input (digest: their RECORD, which hashes every file).
USED_DISTS = {
    "nvidia-cutlass-dsl": "CuTe-DSL front end (kernel code generation)",
    "flashinfer-python": "upstream kernel classes compiled into the libraries",
}
OWN_SOURCES = ["aot/toolchain/dsl_entry_points.c"]
# Upstream distributions installed with --target into a folder of their own, never into the build
# env: name -> (environment variable of the folder, its default under the repository, role)
UPSTREAM_SITES = {
    "nvidia-cudnn-frontend": ("SBS_CUDNN_BUILD_SITE", ".carry/cudnn-build",
                              "upstream kernel classes compiled into the sm_100a/sm_100f libraries "
                              "(SM100 Sage FP8 forward and its quantizer)"),
}


def upstream_site(name: str) -> "Env":
    """The folder of ``name`` (:data:`UPSTREAM_SITES`) as an :class:`Env`."""
    var, default, _ = UPSTREAM_SITES[name]
    return Env(Path(os.environ.get(var) or ROOT / default))


class SbomError(SystemExit):
    """Stops the SBOM with a message that names the fix (exit status 1)."""

    def __init__(self, msg: str):
        super().__init__(f"wheels/sbom.py: {msg}")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _record_b64_to_hex(value: str) -> str:
    b64 = value.removeprefix("sha256=")
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


def parse_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, allowed sha256 digests) from a `--generate-hashes` requirements lock."""
    text = path.read_text().replace("\\\n", " ")
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if not m:
            continue
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
        if not hashes:
            raise SbomError(f"{path}: {m[1]}=={m[2]} has no --hash. Fix: regenerate the lock with wheels/lock.sh")
        out[_norm(m[1])] = (m[2], hashes)
    if not out:
        raise SbomError(f"{path} pins nothing. Fix: regenerate it with wheels/lock.sh")
    return out


class Env:
    """The build environment's installed distributions (read through importlib.metadata)."""

    def __init__(self, site_packages: Path):
        self.root = site_packages
        self.dists = {_norm(d.metadata["Name"]): d for d in metadata.distributions(path=[str(site_packages)])}
        if not self.dists:
            raise SbomError(f"no installed distribution in {site_packages}. Fix: pass the build "
                            "environment's site-packages (--site-packages)")

    def dist(self, name: str) -> metadata.Distribution:
        try:
            return self.dists[_norm(name)]
        except KeyError:
            raise SbomError(f"{name} is not installed in {self.root}. Fix: build with the locked "
                            "environment (pip install --require-hashes --no-deps -r wheels/build-requirements.lock)") from None

    def record_digest(self, name: str) -> str:
        text = self.dist(name).read_text("RECORD")
        if text is None:
            raise SbomError(f"{name} in {self.root} has no RECORD. Fix: reinstall it with pip")
        return _sha256(text.encode())

    def used_file(self, name: str, pattern: str) -> tuple[str, str]:
        """(path in the wheel, sha256 of the installed file), checked against the RECORD."""
        d = self.dist(name)
        rows = list(csv.reader(io.StringIO(d.read_text("RECORD") or "")))
        hits = [r for r in rows if r and fnmatch.fnmatch(r[0], pattern)]
        if len(hits) != 1:
            raise SbomError(f"{name}: {len(hits)} files match {pattern} in its RECORD (want 1). "
                            "Fix: update USED_FILES in wheels/sbom.py for this version")
        rel, rec_hash = hits[0][0], hits[0][1]
        path = Path(d.locate_file(rel))
        if not path.is_file():
            raise SbomError(f"{name}: {rel} is missing from {self.root}. Fix: reinstall the build env")
        digest = sha256_file(path)
        if not rec_hash.startswith("sha256=") or _record_b64_to_hex(rec_hash) != digest:
            raise SbomError(f"{name}: installed {rel} differs from its RECORD hash. Fix: recreate the "
                            "build environment from wheels/build-requirements.lock")
        return rel, digest


def _cross_file(cache: Path, arch: str, name: str, version: str, member: str,
                lock: dict[str, tuple[str, list[str]]]) -> tuple[str, str, str]:
    """(wheel file name, wheel sha256, member sha256) of another CPU's wheel in aot.cross_libs'
    cache; the wheel's digest must be one the lock allows for that very version."""
    norm = name.replace("-", "_")
    found = sorted((cache / arch / "wheels").glob(f"{norm}-{version}-*{arch}*.whl"))
    if not found:
        raise SbomError(f"no {norm}-{version} {arch} wheel in {cache / arch / 'wheels'} (the cross build's "
                        f"{member}). Fix: run `python -m aot.cross_libs --arch {arch}` in the build env "
                        "(or pass --cross-cache)")
    wheel = found[-1]
    wheel_sha = sha256_file(wheel)
    allowed = lock.get(_norm(name), ("", []))[1]
    if wheel_sha not in allowed:
        raise SbomError(f"{wheel.name} (sha256 {wheel_sha}) is not a wheel the lock allows for {name}. "
                        "Fix: delete the cross cache and rebuild, or regenerate the lock (wheels/lock.sh)")
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(member)
    return wheel.name, wheel_sha, _sha256(data)


def _native_arch() -> str:
    return os.uname().machine


def _hash(digest: str) -> list[dict]:
    return [{"alg": "SHA-256", "content": digest}]


def _props(**kv) -> list[dict]:
    return [{"name": f"sbs:{k.replace('_', '-')}", "value": str(v)} for k, v in kv.items()]


def build_sbom(dist: Path, site_packages: Path, lock_path: Path, cross_cache: Path,
               build_arch: str | None = None) -> dict:
    build_arch = build_arch or _native_arch()
    lock = parse_lock(lock_path)
    env = Env(site_packages)
    for name, (version, _) in sorted(lock.items()):
        if name in env.dists and env.dists[name].version != version:
            raise SbomError(f"the lock pins {name}=={version} but the build env has "
                            f"{env.dists[name].version}. Fix: build in the env installed from the lock")

    files = sorted(p for p in dist.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz"))
    kernels = [p for p in files if p.name.startswith("subblock_sage_kernels_cu13-") and p.suffix == ".whl"]
    if not kernels:
        raise SbomError(f"no kernels wheel in {dist}. Fix: run ./wheels/build.sh first")

    components: list[dict] = []
    deps: dict[str, set[str]] = {}
    sites: dict[str, Env] = {}
    for whl in kernels:
        with zipfile.ZipFile(whl) as zf:
            try:
                named = json.loads(zf.read("subblock_sage_kernels/manifest.json")).get("upstream", {})
            except KeyError:
                named = {}
        sites.update({n: upstream_site(n) for n in named if n in UPSTREAM_SITES and n not in sites})

    # Build inputs that every library of every CPU shares.
    shared_refs = []
    for name, pattern, role in USED_FILES[1:]:
        d = env.dist(name)
        rel, digest = env.used_file(name, pattern)
        ref = f"pkg:pypi/{_norm(name)}@{d.version}#{build_arch}"
        shared_refs.append(ref)
        components.append({
            "type": "application" if name == "ziglang" else "library", "bom-ref": ref,
            "name": _norm(name), "version": d.version, "purl": f"pkg:pypi/{_norm(name)}@{d.version}",
            "scope": "required",
            "properties": _props(role=role, build_arch=build_arch, record_sha256=env.record_digest(name)),
            "components": [{"type": "file", "bom-ref": f"{ref}/{rel}", "name": rel, "hashes": _hash(digest)}],
        })
    def used(name, where, role, **props):  # a distribution the build imports (no file of it ships)
        d = where.dist(name)
        ref = f"pkg:pypi/{_norm(name)}@{d.version}#{build_arch}"
        shared_refs.append(ref)
        components.append({
            "type": "library", "bom-ref": ref, "name": _norm(name), "version": d.version,
            "purl": f"pkg:pypi/{_norm(name)}@{d.version}", "scope": "required",
            "properties": _props(role=role, build_arch=build_arch, record_sha256=where.record_digest(name), **props),
        })

    for name, role in USED_DISTS.items():
        used(name, env, role)
    for name, site in sorted(sites.items()):
        used(name, site, UPSTREAM_SITES[name][2], installed="a folder of its own (--target)")
    for rel in OWN_SOURCES:
        ref = f"file:{rel}"
        shared_refs.append(ref)
        components.append({"type": "file", "bom-ref": ref, "name": rel,
                           "hashes": _hash(sha256_file(ROOT / rel)),
                           "properties": _props(role="compiled into every library")})

    cudart_name, cudart_member, cudart_role = USED_FILES[0]
    cudart_version = env.dist(cudart_name).version
    cudart_refs: dict[str, str] = {}

    for whl in kernels:
        with zipfile.ZipFile(whl) as zf:
            man_name = "subblock_sage_kernels/manifest.json"
            try:
                manifest = json.loads(zf.read(man_name))
            except KeyError:
                raise SbomError(f"{whl.name} has no {man_name}. Fix: rebuild it with ./wheels/build.sh") from None
            arch = manifest["host_arch"]
            for key, want in manifest.get("toolchain", {}).items():
                if env.dist(key).version != want:
                    raise SbomError(f"{whl.name} was built with {key}=={want} but the build env has "
                                    f"{env.dist(key).version}. Fix: generate the SBOM in the env the wheel was built in")
            for key, want in manifest.get("upstream", {}).items():
                if (sites[key] if key in sites else env).dist(key).version != want:
                    raise SbomError(f"{whl.name} compiled {key}=={want} but the build env has "
                                    f"{(sites[key] if key in sites else env).dist(key).version}. Fix: generate "
                                    "the SBOM in the env the wheel was built in")
            if arch not in cudart_refs:
                ref = f"pkg:pypi/{_norm(cudart_name)}@{cudart_version}#{arch}"
                if arch == build_arch:
                    rel, digest = env.used_file(cudart_name, cudart_member)
                    extra = _props(role=cudart_role, host_arch=arch, source="build environment",
                                   record_sha256=env.record_digest(cudart_name))
                else:
                    wname, wsha, digest = _cross_file(cross_cache, arch, cudart_name, cudart_version,
                                                      cudart_member, lock)
                    rel = cudart_member
                    extra = _props(role=cudart_role, host_arch=arch, source=f"PyPI wheel {wname}",
                                   wheel_sha256=wsha)
                components.append({
                    "type": "library", "bom-ref": ref, "name": _norm(cudart_name), "version": cudart_version,
                    "purl": f"pkg:pypi/{_norm(cudart_name)}@{cudart_version}", "scope": "required",
                    "properties": extra,
                    "components": [{"type": "file", "bom-ref": f"{ref}/{rel}", "name": rel, "hashes": _hash(digest)}],
                })
                cudart_refs[arch] = ref
            libs = []
            for target, entry in sorted(manifest["targets"].items()):
                member = f"subblock_sage_kernels/{entry['library']}"
                try:
                    data = zf.read(member)
                except KeyError:
                    raise SbomError(f"{whl.name}: {member} is missing. Fix: rebuild the wheel") from None
                digest = _sha256(data)
                if digest != entry.get("sha256"):
                    raise SbomError(f"{whl.name}: {member} has sha256 {digest}, its manifest says "
                                    f"{entry.get('sha256')}. Fix: rebuild the wheel; do not publish it")
                ref = f"{whl.name}/{member}"
                libs.append({"type": "library", "bom-ref": ref, "name": Path(member).name,
                             "version": manifest["version"], "hashes": _hash(digest),
                             "properties": _props(gpu_target=target, host_arch=arch)})
                deps[ref] = {cudart_refs[arch], *shared_refs}
        components.append({
            "type": "library", "bom-ref": whl.name, "name": KERNELS, "version": manifest["version"],
            "purl": f"pkg:pypi/{KERNELS}@{manifest['version']}?file_name={whl.name}",
            "hashes": _hash(sha256_file(whl)), "properties": _props(host_arch=arch, build_commit=manifest.get("build_commit", "")),
            "components": libs,
        })
        deps[whl.name] = {lib["bom-ref"] for lib in libs}

    for p in files:
        if p in kernels:
            continue
        m = re.match(r"^([A-Za-z0-9_.]+?)-(\d[^-]*?)(?:-|\.tar\.gz$)", p.name)
        name, version = (_norm(m[1]), m[2]) if m else (p.name, "")
        components.append({"type": "library", "bom-ref": p.name, "name": name, "version": version,
                           "purl": f"pkg:pypi/{name}@{version}?file_name={p.name}",
                           "hashes": _hash(sha256_file(p))})

    # Every transitive build dependency of the locked environment.
    listed = {c["name"] for c in components}
    for name, (version, hashes) in sorted(lock.items()):
        ref = f"pkg:pypi/{name}@{version}"
        props = _props(role="build dependency (locked)", lock_sha256=",".join(hashes))
        if name in env.dists:
            props += _props(record_sha256=env.record_digest(name))
        else:
            props += _props(installed="no (platform marker excluded it)")
        if name in listed:
            ref += "#lock"
        components.append({"type": "library", "bom-ref": ref, "name": name, "version": version,
                           "purl": f"pkg:pypi/{name}@{version}", "scope": "required" if name in env.dists else "excluded",
                           "properties": props})

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    body = {"components": components,
            "dependencies": [{"ref": k, "dependsOn": sorted(v)} for k, v in sorted(deps.items())]}
    version = next(c["version"] for c in components if c["name"] == KERNELS)
    bom = {
        "bomFormat": "CycloneDX", "specVersion": "1.6",
        # deterministic: the same inputs give the same SBOM, byte for byte
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, _sha256(json.dumps(body, sort_keys=True).encode()))}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "wheels/sbom.py"}]},
            "component": {"type": "library", "bom-ref": "subblock-sage", "name": "subblock-sage",
                          "version": version, "purl": f"pkg:pypi/subblock-sage@{version}"},
            "properties": _props(not_linked=f"{NOT_LINKED} (its license forbids redistributing it; aot/toolchain/dsl_entry_points.c provides what the libraries need)"),
        },
        **body,
    }
    return bom


def _default_site_packages() -> Path:
    env = Path(os.environ.get("SBS_BUILD_ENV") or ROOT / "wheels" / ".buildenv")
    found = sorted(env.glob("lib/python3*/site-packages"))
    if not found:
        raise SbomError(f"no site-packages under {env}. Fix: pass --site-packages or set SBS_BUILD_ENV")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dist", type=Path, default=ROOT / "wheels" / "dist")
    ap.add_argument("--site-packages", type=Path, default=None,
                    help="the build env's site-packages (default: $SBS_BUILD_ENV or wheels/.buildenv)")
    ap.add_argument("--lock", type=Path, default=ROOT / "wheels" / "build-requirements.lock")
    ap.add_argument("--cross-cache", type=Path,
                    default=Path(os.environ.get("SBS_CROSS_CACHE") or ROOT / "wheels" / ".cross"))
    ap.add_argument("--build-arch", default=None, help="CPU of the build env (default: this machine's)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)
    bom = build_sbom(a.dist, a.site_packages or _default_site_packages(), a.lock, a.cross_cache, a.build_arch)
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(bom, indent=2, sort_keys=True) + "\n")
    n = sum(len(c.get("components", [])) for c in bom["components"] if c["name"] == KERNELS)
    print(f"wheels/sbom.py: {a.output}: {len(bom['components'])} components, {n} libraries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
