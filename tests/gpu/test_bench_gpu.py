"""`subblock-sage bench` on a real GPU: every contender of the quick shape produces a consistent
row (no errors where the target serves the mode), the FLOP columns follow from the time, and the
NVML columns appear exactly when NVML is readable through nvidia-ml-py."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

from subblock_sage.tools import bench, power  # noqa: E402
from tests.helpers.gpu import attention_modes  # noqa: E402


def _served_modes():
    return set(attention_modes())


def test_quick_bench_rows_are_consistent():
    H, S = 2, 4096
    rows = bench.run(((H, S),), reps=3, warm_s=0.2)
    modes = _served_modes()
    names = {r["contender"] for r in rows}
    assert "sdpa cudnn dense bf16" in names or "sdpa flash dense bf16" in names
    for mode in modes:
        assert f"{mode} (whole call)" in names, names
    has_nvml = power.Sampler(torch.cuda.current_device()).available
    dense_flops = 4 * S * S * bench.D * H
    for r in rows:
        if r["contender"].split()[0] in modes:
            assert "error" not in r, r
        if "error" in r:
            continue
        assert r["ms"] > 0 and math.isfinite(r["ms"])
        if "dense_tflops" in r:
            # ms is rounded to 4 decimals (0.025 ms rows: 0.2%), TFLOPS to 1
            tol = 0.6e-4 / r["ms"] + 1e-3
            assert r["dense_tflops"] == pytest.approx(dense_flops / r["ms"] / 1e9, rel=tol, abs=0.1)
            assert r["kept_tflops"] <= r["dense_tflops"] + 0.1
        if has_nvml:
            assert 100 <= r["MHz"] <= 5000 and 0 < r["W"] < 5000, r
            assert "%" in r["slowed"], r
        else:
            assert "MHz" not in r
    for r in rows:
        if "whole/kernel" in r:
            assert r["whole/kernel"] > 0.5, r  # the whole call cannot be much faster than its kernel


def test_bench_command_line_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "subblock_sage", "bench", "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "kept-block TFLOPS" in p.stdout
    data = json.loads(out.read_text())
    assert data["gpu"] == torch.cuda.get_device_name() and data["rows"]
