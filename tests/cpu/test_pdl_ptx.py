"""Programmatic dependent launch in the generated sm_90a code (``aot/kernels/sm90/config.py: PDL``).

Build env (``-m aot``): the kernels are compiled for sm_90a with the DSL keeping their PTX
(``CUTE_DSL_KEEP_PTX=1``, one process per kernel: the DSL caches compiled functions by name) and
the PTX is read in program order:
  * every attention kernel executes ``griddepcontrol.wait`` once, and before it reads nothing from
    global memory (no ``ld.global``, no TMA load, no atomic): what an earlier kernel wrote may only
    be read after the previous grid has ended and flushed;
  * except the Q-fused kernel, whose only reads before the wait are its thread's eight 16-byte
    loads of the bf16 Q tile (a call input: the quantizer before it reads q, never writes it);
  * the quantizer and the plan kernel execute ``griddepcontrol.launch_dependents`` before any
    global access and never wait.
The launch attribute itself (``use_pdl``) is host code; its effect was measured on the H200 (the
attention kernel starting ~8 us before the quantizer ends, MEASUREMENTS.md runs 88 and 90), and
the hazard of a read before the wait has its GPU test (tests/gpu/test_replay_gpu.py,
``test_back_to_back_calls_wait_for_the_kernel_before``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.aot,
              pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs CuTe-DSL (the build env)")]
ROOT = Path(__file__).resolve().parents[2]

_COMPILE = r"""
import sys
sys.path.insert(0, {root!r})
from aot import export, registry
kname, vname = sys.argv[1], sys.argv[2]
k = next(k for k in registry.all_kernels() if k.name == kname)
v = next(v for v in k.variants if v.name == vname)
_, cute = export.dsl()
spec = k.compile_spec("sm_90a", v)
args, kwargs = spec.bind(export.make_fakes(spec.args))
cute.compile(spec.fn, *args, **kwargs, options="--gpu-arch sm_90a")
print("COMPILED")
"""

# global-memory reads and read-modify-writes in PTX (the generic-address forms are not emitted by
# these kernels for global data; a plain ld without a state space would be caught by GENERIC)
GLOBAL_READ = re.compile(r"^\s*(@!?%p\d+\s+)?(ld\.global|ld\.relaxed\.gpu|ld\.acquire|ld\.volatile\.global|"
                         r"atom\.global|atom\.add|red\.global|cp\.async\.bulk\.tensor|cp\.async\.ca|cp\.async\.cg)")
GENERIC = re.compile(r"^\s*(@!?%p\d+\s+)?ld(\.[a-z0-9]+)*\s")  # any ld: checked for a state space below
Q_LOAD = re.compile(r"^\s*(@!?%p\d+\s+)?ld\.global(\.L2::cache_hint)?\.v4\.b32\b")


def compile_ptx(tmp_path: Path, kernel: str, variant: str) -> list[str]:
    out = tmp_path / f"{kernel}-{variant}"
    out.mkdir()
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_DUMP_DIR=str(out))
    r = subprocess.run([sys.executable, "-c", _COMPILE.format(root=str(ROOT)), kernel, variant],
                       cwd=out, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "COMPILED" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    ptx = sorted(out.glob("*.sm_90a.ptx"))
    assert len(ptx) == 1, sorted(p.name for p in out.iterdir())
    return [ln for ln in ptx[0].read_text().splitlines() if ln.strip()]


def reads_before(lines: list[str], marker: str) -> tuple[int, list[str]]:
    """(index of the one line holding ``marker``, the global reads before it)."""
    at = [i for i, ln in enumerate(lines) if marker in ln]
    assert len(at) == 1, (marker, len(at))
    before = []
    for ln in lines[:at[0]]:
        if GLOBAL_READ.match(ln):
            before.append(ln.strip())
        elif GENERIC.match(ln):
            assert re.match(r"^\s*(@!?%p\d+\s+)?ld\.(shared|param|const|local)", ln), ln  # a state space
    return at[0], before


def test_reads_before_counter():
    ptx = """
    ld.param.u64 %rd1, [p];
    ld.shared.u32 %r1, [%r2];
    @%p1 ld.global.L2::cache_hint.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1], %rd2;
    griddepcontrol.wait;
    ld.global.b32 %r5, [%rd3];
    """.splitlines()
    lines = [ln for ln in ptx if ln.strip()]
    at, before = reads_before(lines, "griddepcontrol.wait")
    assert at == 3 and len(before) == 1 and Q_LOAD.match(before[0])
    with pytest.raises(AssertionError, match=r"griddepcontrol\.wait', 2"):
        reads_before(lines + ["griddepcontrol.wait;"], "griddepcontrol.wait")  # twice
    with pytest.raises(AssertionError, match=r"ld\.b32 %r1"):
        reads_before(["ld.b32 %r1, [%rd1];", "griddepcontrol.wait;"], "griddepcontrol.wait")  # no state space


@pytest.mark.parametrize("kernel,variant", [("sm90_bsa_sage", "k128_cnt"), ("sm90_bsa_sage", "k64_cnt"),
                                            ("sm90_bsa_bf16", "k64_cnt")])
def test_attention_kernel_waits_before_its_first_global_read(tmp_path, kernel, variant):
    """INT8-Q flat, paired 64-key and warp-specialised bf16 kernels: nothing read before the wait."""
    lines = compile_ptx(tmp_path, kernel, variant)
    _, before = reads_before(lines, "griddepcontrol.wait")
    assert before == [], before[:4]
    assert not any("griddepcontrol.launch_dependents" in ln for ln in lines)


def test_q_fused_kernel_reads_only_its_q_tile_before_the_wait(tmp_path):
    lines = compile_ptx(tmp_path, "sm90_bsa_sage", "k128_qf_cnt")
    at, before = reads_before(lines, "griddepcontrol.wait")
    assert len(before) == 8 and all(Q_LOAD.match(ln) for ln in before), before
    assert any(GLOBAL_READ.match(ln) for ln in lines[at:])  # the plan, scales and K/V after it


@pytest.mark.parametrize("kernel,variant", [("sage_quant_kv", "cnt"), ("plan_prepare", "cnt")])
def test_quantizer_and_plan_kernel_trigger_their_dependents_first(tmp_path, kernel, variant):
    lines = compile_ptx(tmp_path, kernel, variant)
    _, before = reads_before(lines, "griddepcontrol.launch_dependents")
    assert before == [], before[:4]
    assert not any("griddepcontrol.wait" in ln for ln in lines)
