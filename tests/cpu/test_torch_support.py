"""The supported PyTorch range (python/subblock_sage/torch_support.py), on the CPU.

- No torch: ``import subblock_sage``, the loader and ``check`` work; using an op raises
  TorchNotInstalledError (an ImportError) with the install command, in a process where ``import
  torch`` fails (a sys.meta_path finder refuses it), not a raw ModuleNotFoundError.
- Too old: a torch older than TORCH_MIN (a stand-in package that only reports its version) gets
  TorchVersionError with the fix, not an AttributeError from inside torch.library.
- Newer than tested: used, with one logged warning and a ``check`` warning.
- Both ends for real: this suite runs on the tests' torch (tests/requirements.txt: TORCH_TESTED),
  and tests/run.sh --torch-min (.ci/run) runs the CPU suite again in a venv with TORCH_MIN's torch
  (tests/requirements-torch-min.txt); the pins and the README's claim are checked against the
  constants here.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from subblock_sage import torch_support
from subblock_sage.errors import SubblockSageError, TorchNotInstalledError, TorchVersionError
from subblock_sage.torch_support import TORCH_MIN, TORCH_TESTED

ROOT = Path(__file__).resolve().parents[2]

# A process in which `import torch` fails as it does where torch is not installed.
NO_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
for m in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
    del sys.modules[m]
"""


def _run(code: str, *, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_without_torch_import_works_and_each_op_raises_one_clear_error(kdir):
    code = NO_TORCH + """
try:
    import torch
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("the blocker let torch import")
import subblock_sage
from subblock_sage.errors import TorchNotInstalledError
print("version", subblock_sage.__version__)
print("manifest", subblock_sage.manifest()["version"])
for name in ("sparse_attention", "quantize_sage", "preload"):
    try:
        getattr(subblock_sage, name)
    except TorchNotInstalledError as e:
        assert isinstance(e, ImportError)
        print("ERR", name, e)
    else:
        raise SystemExit(f"{name}: no error")
try:
    from subblock_sage import sparse_attention
except ImportError as e:
    print("FROM", type(e).__name__)
print("torch imported:", "torch" in sys.modules)
"""
    r = _run(code)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    errs = [line for line in lines if line.startswith("ERR ")]
    assert len(errs) == 3, r.stdout
    for line in errs:
        name = line.split()[1]
        assert f"subblock_sage.{name} needs PyTorch, which is not installed. Fix: pip install \"torch>=" in line
        assert f">={TORCH_MIN[0]}.{TORCH_MIN[1]}" in line
    assert "FROM TorchNotInstalledError" in lines
    assert "torch imported: False" in lines


def test_check_without_torch_says_so_with_the_fix(kdir):
    code = NO_TORCH + """
from subblock_sage.cli import main
raise SystemExit(main(["check"]))
"""
    r = _run(code)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert re.search(r"^torch +not installed; supported: >= \d+\.\d+, tested up to \d+\.\d+$", r.stdout, re.M), r.stdout


def _fake_torch(where: Path, version: str) -> Path:
    """A package named torch that only reports ``version`` (a stand-in for an old install)."""
    pkg = where / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nclass version:\n    cuda = None\n")
    return where


def test_too_old_torch_is_one_typed_error(kdir, tmp_path):
    old = f"{TORCH_MIN[0]}.{TORCH_MIN[1] - 1}.0" if TORCH_MIN[1] else f"{TORCH_MIN[0] - 1}.9.0"
    site = _fake_torch(tmp_path, old)
    code = """
import subblock_sage
from subblock_sage.errors import TorchVersionError
try:
    subblock_sage.sparse_attention
except TorchVersionError as e:
    print("ERR", e)
"""
    r = _run(code, env_extra={"PYTHONPATH": str(site)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.startswith(f"ERR torch {old} is too old: subblock-sage needs torch >= "
                               f"{TORCH_MIN[0]}.{TORCH_MIN[1]}"), r.stdout
    assert "Fix: pip install" in r.stdout


@pytest.mark.parametrize("version, problem, warning", [
    (f"{TORCH_MIN[0]}.{TORCH_MIN[1]}.0", False, False),
    (f"{TORCH_MIN[0]}.{TORCH_MIN[1]}.1+cu130", False, False),
    (f"{TORCH_TESTED[0]}.{TORCH_TESTED[1]}.0+cpu", False, False),
    (f"{TORCH_TESTED[0]}.{TORCH_TESTED[1] + 1}.0", False, True),
    (f"{TORCH_TESTED[0]}.{TORCH_TESTED[1] + 1}.0a0+git1234567", False, True),
    (f"{TORCH_TESTED[0] + 1}.0.0", False, True),
    (f"{TORCH_MIN[0]}.{TORCH_MIN[1] - 1}.9", True, False),
    ("1.13.1", True, False),
    ("unknown", False, False),
])
def test_version_bounds(version, problem, warning):
    assert (torch_support.version_problem(version) is not None) == problem
    assert (torch_support.version_warning(version) is not None) == warning
    if problem:
        assert "Fix:" in torch_support.version_problem(version)


def test_newer_than_tested_warns_once(monkeypatch, caplog):
    newer = f"{TORCH_TESTED[0]}.{TORCH_TESTED[1] + 1}.0"
    fake = types.SimpleNamespace(__version__=newer)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(torch_support, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="subblock_sage"):
        assert torch_support.require_torch() is fake
        assert torch_support.require_torch() is fake
    notes = [r.getMessage() for r in caplog.records if "newer than the newest torch" in r.getMessage()]
    assert len(notes) == 1 and newer in notes[0]


def test_error_types():
    assert issubclass(TorchNotInstalledError, ImportError) and issubclass(TorchNotInstalledError, SubblockSageError)
    assert issubclass(TorchVersionError, SubblockSageError)


def _pinned_torch(path: Path) -> tuple[int, int]:
    (pin,) = re.findall(r"^torch==(\d+)\.(\d+)\.\d+\s*$", path.read_text(), re.M)
    return int(pin[0]), int(pin[1])


def test_the_tested_ends_are_the_stated_ones():
    """The tests' torch is TORCH_TESTED, tests/run.sh's low-end venv pins TORCH_MIN and CI runs it,
    and the README states that range: the range stated is the range tested."""
    assert _pinned_torch(ROOT / "tests" / "requirements.txt") == TORCH_TESTED
    assert _pinned_torch(ROOT / "tests" / "requirements-torch-min.txt") == TORCH_MIN
    run_sh = (ROOT / "tests" / "run.sh").read_text()
    assert "requirements-torch-min.txt" in run_sh and '"${1:-}" = "--torch-min"' in run_sh
    assert re.search(r"^exec \./tests/run\.sh --torch-min\b", (ROOT / ".ci" / "run").read_text(), re.M)
    claims = re.findall(r"torch (\d+)\.(\d+) or newer \(tested: \d+\.\d+ and (\d+)\.(\d+)",
                        (ROOT / "README.md").read_text())
    assert [((int(a), int(b)), (int(c), int(d))) for a, b, c, d in claims] == [(TORCH_MIN, TORCH_TESTED)], claims


def test_running_torch_is_in_range():
    """This suite's own torch (the tests' pin here, TORCH_MIN's in tests/run.sh's low-end venv)."""
    torch = pytest.importorskip("torch")
    have = torch_support.version_tuple(torch.__version__)
    assert TORCH_MIN <= have <= TORCH_TESTED, torch.__version__
    assert torch_support.version_problem(torch.__version__) is None
