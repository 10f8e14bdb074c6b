"""The loader refuses every broken install or machine with a message naming the cause and the fix.

Uses a copy of the built kernels wheel (wheels/dist) unpacked under a temp dir and selected with
SUBBLOCK_SAGE_LIBRARY_DIR, so the real libraries are loaded (they need only glibc). On this
GPU-less machine the real library reports "no driver"; other machines (old driver, B300, …) are
simulated by replacing the library's status/capability queries.
"""

from __future__ import annotations

import json

import pytest

import importlib

from subblock_sage import __version__, loader
from subblock_sage.errors import (
    DriverTooOldError,
    KernelsNotInstalledError,
    LibraryIntegrityError,
    NoGPUError,
    StartupValidationError,
    UnsupportedGPUError,
    VersionMismatchError,
)

check_mod = importlib.import_module("subblock_sage.diagnostics.probes")
REINSTALL = f'pip install --force-reinstall --no-deps "subblock-sage-kernels-cu13=={__version__}"'
INSTALL = f'pip install "subblock-sage[cu130]=={__version__}"'


def _manifest(kdir):
    return json.loads((kdir / "manifest.json").read_text())


def _write_manifest(kdir, m):
    (kdir / "manifest.json").write_text(json.dumps(m))
    loader.reset_cache()


def _fake_machine(monkeypatch, *, driver=13000, rc=0, count=1, capability=(9, 0)):
    """Pretend the driver reports ``driver`` and every device has ``capability``."""
    monkeypatch.setattr(loader.Library, "status", lambda self: (rc, driver, 13000, count))
    monkeypatch.setattr(loader.Library, "capability", lambda self, d: capability)
    monkeypatch.setattr(loader.Library, "preload", lambda self, d: None)


def _driver_present() -> bool:
    lib = loader.any_library()
    return lib.status()[1] != 0


# ---------------------------------------------------------------------------------------------


def test_no_gpu_real_library(kdir):
    if _driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NoGPUError, match="no NVIDIA driver") as e:
        loader.library_for_device(0)
    msg = str(e.value)
    assert "no NVIDIA driver" in msg and "sm_90a" in msg and "sm_120a" in msg and "sm_100a" in msg
    r = check_mod.check()
    assert not r.ok and r.driver_cuda is None and not r.driver_ok
    assert any("no NVIDIA driver" in p for p in r.all_problems)
    assert r.versions_match and all(t.sha256_ok for t in r.targets.values())
    with pytest.raises(StartupValidationError, match="no NVIDIA driver") as e:
        check_mod.validate_startup()
    assert "no NVIDIA driver" in str(e.value)


def test_no_gpu_cli_exit_status(kdir, capsys):
    if _driver_present():
        pytest.skip("this machine has an NVIDIA driver")
    from subblock_sage.cli import main

    assert main(["check"]) == 1
    out = capsys.readouterr().out
    assert "NOT SERVED" in out and "no NVIDIA driver" in out
    assert main(["check", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] is False and d["kernels_version"] == __version__ and d["versions_match"]


def _served(m, cap) -> bool:
    return any(f"{cap[0]}.{cap[1]}" in t["capabilities"] for t in m["targets"].values())


@pytest.mark.parametrize("cap", [(10, 3), (8, 0), (8, 9), (12, 1), (11, 0), (7, 5), (10, 1)])
def test_unsupported_capability(kdir, monkeypatch, cap):
    m = loader.manifest()
    if _served(m, cap):
        pytest.skip(f"this build serves {cap} (family target)")
    with pytest.raises(UnsupportedGPUError, match="Supported:") as e:
        loader.target_for_capability(m, cap)
    msg = str(e.value)
    assert f"{cap[0]}.{cap[1]}" in msg and "Supported:" in msg
    for t in ("sm_90a", "sm_100a", "sm_120a"):
        assert t in msg
    assert "B200" in msg and "H100" in msg
    # the same through the real device path (driver present, GPU of that capability)
    _fake_machine(monkeypatch, capability=cap)
    with pytest.raises(UnsupportedGPUError, match="Supported:"):
        loader.library_for_device(0)
    r = check_mod.check()
    assert not r.ok and r.gpus[0].target is None and not r.gpus[0].served
    with pytest.raises(StartupValidationError, match="Supported:") as e:
        check_mod.validate_startup(device=0)
    assert f"compute capability {cap[0]}.{cap[1]}" in str(e.value) and "Supported:" in str(e.value)


def test_b300_fails_at_launch_or_is_served_by_a_family_target(kdir, monkeypatch):
    """A B300 (10.3) has no sm_100a cubin: refused at launch, unless the build ships sm_100f."""
    m = loader.manifest()
    _fake_machine(monkeypatch, capability=(10, 3))
    if _served(m, (10, 3)):
        assert loader.library_for_device(0).target == "sm_100f"
        return
    for mode in ("sage_fp8", "bf16"):
        with pytest.raises(StartupValidationError, match="10.3"):
            check_mod.validate_startup(compute_mode=mode, device=0)


def test_driver_too_old(kdir, monkeypatch):
    _fake_machine(monkeypatch, driver=12080, rc=35)
    with pytest.raises(DriverTooOldError, match="r580") as e:
        loader.library_for_device(0)
    assert "12.8" in str(e.value) and "r580" in str(e.value)
    r = check_mod.check()
    assert r.driver_cuda == "12.8" and not r.driver_ok and not r.ok
    with pytest.raises(StartupValidationError, match="r580"):
        check_mod.validate_startup(device=0)


def test_checksum_mismatch(kdir, monkeypatch):
    m = _manifest(kdir)
    lib = kdir / m["targets"]["sm_90a"]["library"]
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    with pytest.raises(LibraryIntegrityError, match="corrupted") as e:
        loader.library_for_target("sm_90a")
    assert "corrupted" in str(e.value) and REINSTALL in str(e.value)
    r = check_mod.check()
    assert r.targets["sm_90a"].sha256_ok is False and REINSTALL in r.targets["sm_90a"].problem
    assert r.targets["sm_100a"].sha256_ok and r.targets["sm_120a"].sha256_ok
    assert not r.ok
    # an H200 is then refused at startup, naming the fix
    _fake_machine(monkeypatch, capability=(9, 0))
    with pytest.raises(StartupValidationError, match="sm_90a") as e:
        check_mod.validate_startup(device=0)
    assert REINSTALL in str(e.value) and "sm_90a" in str(e.value)


def test_missing_library(kdir, monkeypatch):
    m = _manifest(kdir)
    (kdir / m["targets"]["sm_120a"]["library"]).unlink()
    with pytest.raises(LibraryIntegrityError, match="missing") as e:
        loader.library_for_target("sm_120a")
    assert "missing" in str(e.value) and REINSTALL in str(e.value)
    r = check_mod.check()
    assert r.targets["sm_120a"].present is False and "missing" in r.targets["sm_120a"].problem
    _fake_machine(monkeypatch, capability=(12, 0))
    with pytest.raises(StartupValidationError, match="missing"):
        check_mod.validate_startup(compute_mode="bf16", device=0)


def test_version_mismatch(kdir):
    m = _manifest(kdir)
    m["version"] = "0.0.9"
    _write_manifest(kdir, m)
    with pytest.raises(VersionMismatchError, match=r"0\.0\.9") as e:
        loader.manifest()
    msg = str(e.value)
    assert "0.0.9" in msg and INSTALL in msg and 'pip install "subblock-sage==0.0.9"' in msg
    r = check_mod.check()
    assert r.kernels_version == "0.0.9" and not r.versions_match and not r.ok
    with pytest.raises(StartupValidationError, match="0.0.9"):
        check_mod.validate_startup()


def test_abi_mismatch(kdir):
    m = _manifest(kdir)
    m["abi_version"] = 99
    _write_manifest(kdir, m)
    with pytest.raises(VersionMismatchError, match="ABI 99") as e:
        loader.manifest()
    assert "ABI 99" in str(e.value) and INSTALL in str(e.value)


def test_manifest_unreadable(kdir):
    (kdir / "manifest.json").write_text("{not json")
    loader.reset_cache()
    with pytest.raises(LibraryIntegrityError, match="manifest.json") as e:
        loader.manifest()
    assert "manifest.json" in str(e.value) and REINSTALL in str(e.value)


def test_library_dir_without_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv(loader.ENV_LIBRARY_DIR, str(tmp_path))
    loader.reset_cache()
    with pytest.raises(KernelsNotInstalledError, match="unset it") as e:
        loader.manifest()
    assert loader.ENV_LIBRARY_DIR in str(e.value) and "unset it" in str(e.value)
    r = check_mod.check()
    assert not r.ok and loader.ENV_LIBRARY_DIR in r.problems[0]


def test_kernels_not_installed(monkeypatch):
    import importlib.util

    monkeypatch.delenv(loader.ENV_LIBRARY_DIR, raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == loader.KERNELS_PACKAGE else real(name, *a))
    loader.reset_cache()
    try:
        with pytest.raises(KernelsNotInstalledError, match="pip install") as e:
            loader.manifest()
        assert INSTALL in str(e.value)
        r = check_mod.check()
        assert not r.ok and INSTALL in r.problems[0]
        with pytest.raises(StartupValidationError, match="cu130"):
            check_mod.validate_startup()
    finally:
        loader.reset_cache()


def test_supported_machine_simulated(kdir, monkeypatch):
    """The other side: a served H200 passes (launch self-tests off: no GPU here)."""
    _fake_machine(monkeypatch, capability=(9, 0))
    lib = loader.library_for_device(0)
    assert lib.target == "sm_90a"
    r = check_mod.check(run_kernels=False)
    assert r.ok and r.gpus[0].target == "sm_90a" and r.gpus[0].loaded and r.gpus[0].sha256_ok
    assert r.driver_ok and r.driver_cuda == "13.0"
