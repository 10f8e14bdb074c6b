"""Kernel exports made by a build-time test: one ``python -m aot.export unit`` process for a few
units, then each export's registers and stack frames from its cubin (tests/cpu/test_*_export.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.elfcheck import regs_and_frames

ROOT = Path(__file__).resolve().parents[2]


def export_without_local_memory(module: str, target: str, units: list[str], out: Path) -> dict[str, tuple[int, dict]]:
    """Export ``units`` (``kernel:variant``) of kernel module ``module`` for ``target`` into ``out``;
    per export (its file stem) the registers and the metadata (``<stem>.json``), once every export
    is checked to have stack frames, all of size 0 (no local memory: no spills)."""
    cmd = [sys.executable, "-m", "aot.export", "unit", "--module", module, "--target", target, "--out", str(out)]
    for u in units:
        cmd += ["--unit", u]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    seen = {}
    for meta in sorted(out.glob("*.json")):
        if meta.name.endswith(".time.json"):
            continue
        regs, frames = regs_and_frames(meta.with_suffix(".o"))
        assert frames and not any(frames), (meta.name, frames)
        seen[meta.stem] = (regs, json.loads(meta.read_text()))
    assert len(seen) == len(units), seen
    return seen
