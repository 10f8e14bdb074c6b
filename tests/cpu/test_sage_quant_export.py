"""Build-time checks of the Sage quantizer kernels (aot/kernels/sage_quant.py): every library that
serves Sage exports both launches with every variant the runtime selects, the plan role takes
exactly the plan kernel's arguments, and the compiled kernels use no local memory (a spill would
put the bandwidth-bound roles off their ~4 TB/s) and stay within the register budget their CTA
shape assumes."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.aot
ROOT = Path(__file__).resolve().parents[2]


def test_every_sage_library_exports_the_two_launches():
    from aot import export
    from aot.contract import modes_served
    from aot.kernels import sage_quant

    want = {("sage_quant_prep", v) for v in ("noplan", "cnt", "topk")} | {("sage_quant_kv", "default")}
    libs = export.plan()
    sage_libs = [lib for lib, jobs in libs.items() if "sage_fp8" in modes_served({j.kernel.name for j in jobs})]
    assert {"sm90a", "sm120a"} <= set(sage_libs), sage_libs
    for lib, jobs in libs.items():
        have = {(j.kernel.name, j.variant.name) for j in jobs if j.kernel.name.startswith("sage_quant")}
        assert have in (want, set()), (lib, have)
        if not lib.startswith("test_"):
            assert have == want, lib  # every shipped target quantizes (sage_quant.TARGETS)
    gone = {"sage_quant_q", "sage_quant_kv_stats", "sage_quant_kv_finalize"}
    assert not gone & {j.kernel.name for jobs in libs.values() for j in jobs}
    assert set(sage_quant.TARGETS) == {j.target for jobs in libs.values() for j in jobs
                                       if j.kernel.name == "sage_quant_prep" and not j.test}


def test_plan_role_takes_the_plan_kernels_arguments():
    from aot.kernels import plan_prepare, sage_quant

    for plan, counts in (("counts", True), ("topk", False)):
        args = sage_quant._args_prep(plan)
        # the K-mean role's k and the workspace, as in the plan-less variant
        assert args[:2] == sage_quant._args_prep("none")[:2] and [a.name for a in args[:2]] == ["k", "sync"]
        assert args[2:-1] == plan_prepare.plan_args(counts)
        assert [a.name for a in args[-1:]] == ["stream"]
    # (the plan's B and H are q's, which is in launch 2 since the twelfth session: the runtime
    # checks it, tests/cpu/test_quantize_launches.py)


def _regs_and_frames(obj: Path) -> tuple[int, list[int]]:
    """(registers, frame sizes) from the .nv.info sections of the cubin embedded in one export."""
    from aot.tools.cubin_identity import _sections, cuda_images

    regs, frames = [], []
    for _, img in cuda_images(obj.read_bytes()):
        for s in _sections(img):
            if not s["sname"].startswith(".nv.info"):
                continue
            d, i = s["data"], 0
            while i + 4 <= len(d):
                fmt, attr = d[i], d[i + 1]
                if fmt != 4:  # EIFMT_SVAL carries a 16-bit size and a payload; others are 4 bytes
                    i += 4
                    continue
                size = struct.unpack_from("<H", d, i + 2)[0]
                if attr in (0x2F, 0x11) and size >= 8:  # EIATTR_REGCOUNT, EIATTR_FRAME_SIZE
                    (regs if attr == 0x2F else frames).append(struct.unpack_from("<I", d, i + 8)[0])
                i += 4 + size
    assert len(regs) == 1, regs
    return regs[0], frames


REGISTER_FILE = 65536  # 32-bit registers per SM on every target (sm_90a, sm_100, sm_120)


def _budget(threads: int, ctas_per_sm: int) -> int:
    """Registers per thread that let ctas_per_sm CTAs of `threads` threads share one SM
    (allocation granularity: 8 registers per thread)."""
    return REGISTER_FILE // (threads * ctas_per_sm) // 8 * 8


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "sm_120a", "sm_100f", "sm_120f"])
def test_compiled_kernels_have_no_local_memory(tmp_path, target):
    """Both launches are bandwidth kernels whose speed is the bytes they keep in flight per SM:
    each compiles under a launch bound (sage_quant.KV_CTAS_PER_SM, PREP_CTAS_PER_SM) and must
    fit it without local memory (a spill would cost more traffic than the occupancy gains)."""
    pytest.importorskip("cutlass")
    from aot.kernels import sage_quant

    assert target in sage_quant.TARGETS
    units = ["sage_quant_prep:cnt", "sage_quant_prep:topk", "sage_quant_prep:noplan", "sage_quant_kv:default"]
    cmd = [sys.executable, "-m", "aot.export", "unit", "--module", "aot.kernels.sage_quant",
           "--target", target, "--out", str(tmp_path)]
    for u in units:
        cmd += ["--unit", u]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    seen = {}
    for meta in sorted(tmp_path.glob("*.json")):
        if meta.name.endswith(".time.json"):
            continue
        regs, frames = _regs_and_frames(meta.with_suffix(".o"))
        assert frames and not any(frames), (meta.name, frames)
        seen[meta.stem] = regs
        names = [a["name"] for a in json.loads(meta.read_text())["args"]]
        assert names[:2] == ["k", "sync"] if "prep" in meta.stem else names[:4] == ["q", "q_int8", "q_scale", "k"], names
    assert len(seen) == 4, seen
    # sage_quant_kv: 256 threads, 4 CTAs (32 warps) per SM -> <= 64 registers (was 185 at 128
    # threads: 8 warps per SM)
    # (sm_100 / sm_120: 3 CTAs, <= 80 registers: their ptxas spills the single-pass kernel at 64)
    kv_ctas = sage_quant.KV_CTAS_PER_SM[target]
    assert sage_quant.KV_THREADS == 256 and kv_ctas == (4 if target == "sm_90a" else 3)
    kv = [r for name, r in seen.items() if "quant_kv" in name]
    assert kv and all(r <= _budget(sage_quant.KV_THREADS, kv_ctas) for r in kv), seen
    # sage_quant_prep: 256 threads, 4 CTAs per SM (sm_120: 3) -> <= 64 (80) registers (was 108:
    # 2 CTAs, 16 warps per SM)
    ctas = sage_quant.PREP_CTAS_PER_SM[target]
    assert ctas == (3 if target.startswith("sm_120") else 4)
    prep = [r for name, r in seen.items() if "quant_prep" in name]
    assert len(prep) == 3 and all(r <= _budget(sage_quant.PREP_THREADS, ctas) for r in prep), (ctas, seen)
