"""The trust chain of the loader, tried as an attacker and a careless operator would.

Every case tampers with a private copy of the built kernels package (the ``kdir`` fixture, selected
through SUBBLOCK_SAGE_LIBRARY_DIR), then asks the loader for libraries and runs ``check``. A
*foreign* library, built here with the system C compiler, writes a marker file from its ELF
constructor: if that marker appears, foreign code ran inside our process. Every case must end in one
of our typed errors with a "Fix:", never a traceback, and never with the marker written.

The load race: one process atomically swaps the library file between the genuine one and the
foreign one (rename, as an attacker with write access to the folder would) while many fresh
processes load it. Hashing a path and then loading the path again would let some of them load the
foreign bytes; the loader loads the bytes it hashed, so none may.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from subblock_sage import __version__, loader
from subblock_sage.errors import LibraryIntegrityError, VersionMismatchError

FOREIGN_C = textwrap.dedent("""
    #include <stdio.h>
    #include <stdlib.h>
    __attribute__((constructor)) static void foreign_ran(void) {
        const char *p = getenv("SBS_FOREIGN_MARKER");
        if (p) { FILE *f = fopen(p, "a"); if (f) { fputs("ran\\n", f); fclose(f); } }
    }
    int some_other_library_function(void) { return 42; }
""")


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


@pytest.fixture(scope="module")
def foreign_lib(tmp_path_factory) -> Path:
    """A valid ELF shared library without our C ABI whose constructor writes a marker file."""
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler on this machine to build the foreign library")
    d = tmp_path_factory.mktemp("foreign")
    (d / "foreign.c").write_text(FOREIGN_C)
    out = d / "libforeign.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(d / "foreign.c")], check=True)
    return out


@pytest.fixture
def marker(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "FOREIGN_CODE_RAN"
    monkeypatch.setenv("SBS_FOREIGN_MARKER", str(path))
    return path


def _manifest(kdir: Path) -> dict:
    return json.loads((kdir / "manifest.json").read_text())


def _write(kdir: Path, m: dict) -> None:
    (kdir / "manifest.json").write_text(json.dumps(m))
    loader.reset_cache()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _refused(call, match: str) -> str:
    """``call`` raises our integrity error whose message matches and carries a fix."""
    with pytest.raises(LibraryIntegrityError, match=match) as e:
        call()
    assert "Fix:" in str(e.value), str(e.value)
    return str(e.value)


def _check_reports_problem(target: str | None = None) -> None:
    """``check --no-launch`` neither crashes nor reports the install as fine."""
    from subblock_sage import check

    report = check(run_kernels=False)
    assert not report.ok
    if target is not None:
        assert report.targets[target].problem, report.targets[target]


# ---------------------------------------------------------------------------------------------
# Manifest entries: verification cannot be skipped, paths cannot leave the kernels folder

@pytest.mark.parametrize("sha", [None, "", "0" * 63, "A" * 64, "g" * 64, 12345, ["x"]],
                         ids=["null", "empty", "short", "upper", "nonhex", "int", "list"])
def test_invalid_sha256_is_refused(kdir, marker, sha):
    m = _manifest(kdir)
    m["targets"]["sm_90a"]["sha256"] = sha
    _write(kdir, m)
    _refused(loader.manifest, "no valid 'sha256'")
    _check_reports_problem()
    assert not marker.exists()


def test_missing_sha256_key_is_refused(kdir):
    m = _manifest(kdir)
    del m["targets"]["sm_100a"]["sha256"]
    _write(kdir, m)
    _refused(lambda: loader.library_for_target("sm_90a"), "sm_100a.*no valid 'sha256'")


@pytest.mark.parametrize("how", ["absolute", "dotdot", "dot", "backslash", "empty"])
def test_library_path_must_stay_inside(kdir, foreign_lib, marker, tmp_path, how):
    outside = tmp_path / "outside.so"
    shutil.copy(foreign_lib, outside)
    m = _manifest(kdir)
    t = m["targets"]["sm_90a"]
    t["sha256"] = _sha(outside)  # even a digest that matches the outside file does not help
    t["library"] = {"absolute": str(outside), "dotdot": "../../outside.so", "dot": "./sm90a/x.so",
                    "backslash": "sm90a\\..\\..\\outside.so", "empty": ""}[how]
    _write(kdir, m)
    _refused(lambda: loader.library_for_target("sm_90a"), "library path|no 'library'")
    assert not marker.exists()


def test_symlink_escaping_the_folder_is_refused(kdir, foreign_lib, marker, tmp_path):
    m = _manifest(kdir)
    t = m["targets"]["sm_90a"]
    lib = kdir / t["library"]
    outside = tmp_path / "outside.so"
    shutil.copy(foreign_lib, outside)
    lib.unlink()
    lib.symlink_to(outside)
    t["sha256"] = _sha(outside)
    _write(kdir, m)
    _refused(lambda: loader.library_for_target("sm_90a"), "outside the kernels folder")
    assert not marker.exists()


@pytest.mark.parametrize("mutate", [
    lambda m: m.__setitem__("targets", []),
    lambda m: m.__setitem__("targets", {"sm_90a": "lib.so"}),
    lambda m: m["targets"]["sm_90a"].__delitem__("library"),
    lambda m: m["targets"]["sm_90a"].__setitem__("capabilities", "9.0"),
    lambda m: m["targets"]["sm_90a"].__setitem__("capabilities", [9.0]),
    lambda m: m.__delitem__("targets"),
    lambda m: m.__setitem__("abi_version", "1"),
    lambda m: m.__setitem__("abi_version", True),
], ids=["targets-list", "target-str", "no-library", "caps-str", "caps-float", "no-targets",
        "abi-str", "abi-bool"])
def test_malformed_manifest_is_a_typed_error(kdir, mutate):
    m = _manifest(kdir)
    mutate(m)
    _write(kdir, m)
    _refused(loader.manifest, "malformed")
    _check_reports_problem()


def test_manifest_not_an_object(kdir):
    (kdir / "manifest.json").write_text("[1, 2]")
    loader.reset_cache()
    _refused(loader.manifest, "not an object")


# ---------------------------------------------------------------------------------------------
# Libraries: only our own, verified bytes are loaded

def test_foreign_library_with_wrong_digest_never_runs(kdir, foreign_lib, marker):
    lib = kdir / _manifest(kdir)["targets"]["sm_90a"]["library"]
    shutil.copy(foreign_lib, lib)
    _refused(lambda: loader.library_for_target("sm_90a"), "corrupted")
    _check_reports_problem("sm_90a")
    assert not marker.exists()


def test_valid_elf_without_our_abi_is_a_typed_error(kdir, foreign_lib):
    """An operator's override with a matching digest for a library that is not ours: it is refused
    with our error (it was AttributeError), also when it is the library ``check`` probes the driver
    with (the first target), where ``check`` used to die with a traceback."""
    from subblock_sage import check

    m = _manifest(kdir)
    probe = sorted(m["targets"])[0]
    lib = kdir / m["targets"][probe]["library"]
    shutil.copy(foreign_lib, lib)
    m["targets"][probe]["sha256"] = _sha(lib)
    _write(kdir, m)
    _refused(lambda: loader.library_for_target(probe), "not a subblock-sage kernel library")
    report = check(run_kernels=False)
    assert not report.ok
    assert any("not a subblock-sage kernel library" in p for p in report.all_problems), report.all_problems


def test_library_of_another_target_is_refused(kdir):
    m = _manifest(kdir)
    a, b = m["targets"]["sm_90a"], m["targets"]["sm_100a"]
    shutil.copy(kdir / b["library"], kdir / a["library"])
    _refused(lambda: loader.library_for_target("sm_90a"), "corrupted")
    a["sha256"] = b["sha256"]  # a manifest edited to match: the library still says what it is
    _write(kdir, m)
    _refused(lambda: loader.library_for_target("sm_90a"), "reports target sm_100a")


def test_truncated_library_is_refused(kdir):
    m = _manifest(kdir)
    lib = kdir / m["targets"]["sm_90a"]["library"]
    lib.write_bytes(lib.read_bytes()[:4096])
    _refused(lambda: loader.library_for_target("sm_90a"), "corrupted")
    m["targets"]["sm_90a"]["sha256"] = _sha(lib)
    _write(kdir, m)
    _refused(lambda: loader.library_for_target("sm_90a"), "truncated")


def test_library_of_another_cpu_is_refused(kdir):
    import platform

    m = _manifest(kdir)
    lib = kdir / m["targets"]["sm_90a"]["library"]
    data = bytearray(lib.read_bytes())
    data[18:20] = (183 if platform.machine() != "aarch64" else 62).to_bytes(2, "little")
    lib.write_bytes(bytes(data))
    m["targets"]["sm_90a"]["sha256"] = _sha(lib)
    _write(kdir, m)
    _refused(lambda: loader.library_for_target("sm_90a"), "this CPU is")


def test_library_replaced_by_a_directory(kdir):
    lib = kdir / _manifest(kdir)["targets"]["sm_90a"]["library"]
    lib.unlink()
    lib.mkdir()
    _refused(lambda: loader.library_for_target("sm_90a"), "missing")


def test_genuine_library_loads_from_verified_bytes(kdir):
    """The positive control: the genuine library loads, and what is mapped is not the path on disk
    but the sealed copy of the bytes that were hashed."""
    lib = loader.library_for_target("sm_90a")
    assert lib.target == "sm_90a"
    maps = Path("/proc/self/maps").read_text()
    path = str((kdir / _manifest(kdir)["targets"]["sm_90a"]["library"]).resolve())
    assert path not in maps


# ---------------------------------------------------------------------------------------------
# The override directory

def test_override_minimal_manifest_is_refused(kdir, foreign_lib, marker):
    """A folder with a foreign library and a minimal manifest (no digest, no version) is refused
    before dlopen; check never calls it served."""
    for p in list(kdir.iterdir()):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    (kdir / "sm90a").mkdir()
    shutil.copy(foreign_lib, kdir / "sm90a" / "lib.so")
    _write(kdir, {"targets": {"sm_90a": {"library": "sm90a/lib.so", "capabilities": ["9.0"]}}})
    _refused(loader.manifest, "malformed")
    _check_reports_problem()
    _write(kdir, {"version": __version__, "abi_version": loader.ABI_VERSION,
                  "targets": {"sm_90a": {"library": "sm90a/lib.so", "capabilities": ["9.0"], "gpus": "x"}}})
    _refused(loader.manifest, "no valid 'sha256'")
    assert not marker.exists()


def test_override_needs_matching_version(kdir):
    m = _manifest(kdir)
    m["version"] = "9.9.9"
    _write(kdir, m)
    with pytest.raises(VersionMismatchError, match="9.9.9"):
        loader.manifest()


def test_override_is_reported_as_override(kdir):
    """check never reports an override folder as the installed state."""
    from subblock_sage import check
    from subblock_sage.diagnostics.format import format_report

    source, directory = loader.library_source()
    assert source == "override" and directory == kdir
    report = check(run_kernels=False)
    assert report.library_source == "override"
    assert any(loader.ENV_LIBRARY_DIR in w and "not from the installed" in w for w in report.warnings)
    text = format_report(report)
    assert f"(OVERRIDE: {loader.ENV_LIBRARY_DIR}, not the installed wheel)" in text


# ---------------------------------------------------------------------------------------------
# The load race: swap the file while fresh processes load it

SWAPPER = textwrap.dedent("""
    import os, sys, time
    lib, genuine, foreign, stop = sys.argv[1:5]
    tmp = lib + ".swap"
    i = 0
    while not os.path.exists(stop):
        src = foreign if i % 2 else genuine
        with open(src, "rb") as f:
            data = f.read()
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, lib)
        i += 1
""")

LOADER = textwrap.dedent("""
    import sys
    from subblock_sage import loader
    from subblock_sage.errors import SubblockSageError
    try:
        loader.library_for_target("sm_90a")
        print("loaded")
    except SubblockSageError as e:
        print("refused", str(e)[:60])
""")


def test_swap_during_load_never_loads_foreign_bytes(kdir, foreign_lib, marker, tmp_path):
    n = int(os.environ.get("SBS_RACE_PROCESSES", "60"))
    m = _manifest(kdir)
    lib = kdir / m["targets"]["sm_90a"]["library"]
    genuine = tmp_path / "genuine.so"
    shutil.copy(lib, genuine)
    stop = tmp_path / "stop"
    env = dict(os.environ, SBS_FOREIGN_MARKER=str(marker), SUBBLOCK_SAGE_LIBRARY_DIR=str(kdir))
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(lib), str(genuine), str(foreign_lib), str(stop)])
    outcomes: dict[str, int] = {}
    try:
        batch = 6
        for start in range(0, n, batch):
            procs = [subprocess.Popen([sys.executable, "-c", LOADER], env=env, stdout=subprocess.PIPE, text=True)
                     for _ in range(min(batch, n - start))]
            for p in procs:
                out = p.communicate(timeout=120)[0].strip() or f"exit {p.returncode}"
                outcomes[out.split()[0]] = outcomes.get(out.split()[0], 0) + 1
    finally:
        stop.touch()
        swapper.wait(timeout=30)
    assert sum(outcomes.values()) == n
    assert set(outcomes) <= {"loaded", "refused"}, outcomes
    assert outcomes.get("loaded", 0) > 0 and outcomes.get("refused", 0) > 0, (
        f"the swap did not interleave with the loads ({outcomes}): the test proved nothing")
    assert not marker.exists(), f"foreign code ran in {marker.read_text().count('ran')} of {n} processes"
