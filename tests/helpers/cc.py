"""A C compiler for tests that build small probes: `zig cc` from the build environment (the
compiler the kernel libraries are linked with; tests/run.sh creates it), else the running
Python's ziglang. Skips the test when neither exists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def zig_python() -> Path:
    for cand in (os.environ.get("SBS_BUILD_ENV"), ROOT / "wheels" / ".buildenv"):
        if cand and (Path(cand) / "bin" / "python").exists():
            py = Path(cand) / "bin" / "python"
            if subprocess.run([str(py), "-c", "import ziglang"], capture_output=True).returncode == 0:
                return py
    try:
        import ziglang  # noqa: F401

        return Path(sys.executable)
    except ImportError:
        pytest.skip("no ziglang (build environment: ./wheels/build.sh creates it) to compile the probe")


def zig_cc(*args: str, target: str | None = None) -> None:
    """Run ``zig cc [-target target] args...``; raise with the compiler's output on failure."""
    cmd = [str(zig_python()), "-m", "ziglang", "cc", *(["-target", target] if target else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
