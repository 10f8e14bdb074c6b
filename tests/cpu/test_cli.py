"""The command line never ends in a traceback: bad options, a bad log level, a missing torch, no
GPU and a broken install each give one line with the cause and the fix; no command prints the help."""

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


def _our_lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("args", [(), ("--log-level", "INFO")])
def test_no_command_prints_the_help(args):
    """No command is a request for help: the full help on stdout, exit status 0 (not argparse's
    `arguments are required: cmd` with 2)."""
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: subblock-sage"), r.stdout
    assert "check" in r.stdout and "bench" in r.stdout and "report whether this machine" in r.stdout
    assert "required" not in r.stderr and "Traceback" not in r.stderr


def test_bench_without_torch(kdir):
    r = _cli("bench", "--quick", block_torch=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    (line,) = _our_lines(r.stderr, "subblock-sage bench:")
    assert "needs PyTorch, which is not installed" in line and 'Fix: pip install "torch>=' in line


@pytest.mark.parametrize("cuda, match", [(None, "CPU-only build"), ("13.0", "no CUDA GPU is visible")])
def test_bench_without_gpu_is_one_line_with_a_fix(cuda, match):
    """bench on a machine where torch sees no GPU: one line naming why (a CPU-only torch, or a CUDA
    torch with no visible GPU) and the fix, exit status 1, before any bench code runs."""
    code = ("import sys, torch\n"
            f"torch.version.cuda = {cuda!r}\n"
            "torch.cuda.is_available = lambda: False\n"
            "from subblock_sage.cli import main\n"
            "raise SystemExit(main(['bench', '--quick']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    (line,) = _our_lines(r.stderr, "subblock-sage bench:")
    assert match in line and "Fix:" in line, line
    assert r.stdout == "", "nothing of bench ran"


def test_check_verbose_lists_what_each_library_serves(kdir):
    """`check` prints one line per library; `check -v` / `--verbose` adds what each serves, kernel
    by kernel (issue 59), and changes nothing else (exit status; --json: tests/cpu/test_check.py)."""
    from subblock_sage.cli import _parser

    short, verbose = _cli("check", "--no-launch"), _cli("check", "--no-launch", "-v")
    assert "Traceback" not in short.stderr + verbose.stderr and short.returncode == verbose.returncode
    assert "Libraries in this install:" in short.stdout and "serves " not in short.stdout
    assert "serves " in verbose.stdout and set(short.stdout.splitlines()) < set(verbose.stdout.splitlines())
    for args in (["check", "-v"], ["check", "--verbose"], ["check", "--json", "--verbose"]):
        assert _parser().parse_args(args).verbose
    assert not _parser().parse_args(["check"]).verbose


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
