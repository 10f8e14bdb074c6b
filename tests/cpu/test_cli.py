"""The command line never ends in a traceback: bad options, a bad log level, a missing torch and a
broken install each give one line with the cause and the fix (issue 20)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from subblock_sage import __version__


def _cli(*args, env_extra=None, block_torch=False):
    import os

    env = dict(os.environ, **(env_extra or {}))
    pre = "import sys; sys.modules['torch'] = None; " if block_torch else ""
    code = "import sys; " + pre + "from subblock_sage.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)


def test_version():
    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"subblock-sage {__version__}"


def test_invalid_log_level_env_is_a_warning(kdir):
    r = _cli("check", "--no-launch", env_extra={"SUBBLOCK_SAGE_LOG_LEVEL": "verbose"})
    assert "Traceback" not in r.stderr
    assert "ignoring SUBBLOCK_SAGE_LOG_LEVEL='verbose'" in r.stderr
    assert "subblock-sage check" in r.stdout  # the report still printed


@pytest.mark.parametrize("shape, match", [("14", "not HEADS,SEQLEN"), ("a,b", "not HEADS,SEQLEN"),
                                          ("0,100", "must be positive")])
def test_bad_bench_shape_is_one_line(shape, match):
    r = _cli("bench", "--shape", shape)
    assert r.returncode == 2 and "Traceback" not in r.stderr and match in r.stderr


def test_bench_without_torch(kdir):
    r = _cli("bench", "--quick", block_torch=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "needs PyTorch" in r.stderr and "Fix: pip install torch" in r.stderr


def test_broken_install_is_one_line(kdir):
    (kdir / "manifest.json").write_text('{"version": "%s", "abi_version": 1, "targets": {"sm_90a": {}}}'
                                        % __version__)
    r = _cli("check", "--no-launch")
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout
    assert "malformed" in r.stdout + r.stderr and "Fix:" in r.stdout + r.stderr


def test_validate_startup_without_torch_is_a_typed_error(kdir):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from subblock_sage import validate_startup\n"
            "from subblock_sage.errors import StartupValidationError\n"
            "try:\n    validate_startup(compute_mode='bf16', device=0)\n"
            "except StartupValidationError as e:\n    print('TYPED', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stdout.startswith("TYPED") and "Fix:" in r.stdout
