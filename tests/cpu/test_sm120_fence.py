"""The SM120 K/V stage-reuse fix is in the generated code of every shipped SM120 build.

Build env (``-m aot``): each SM120 class (Sage and bf16) is compiled for sm_120a and sm_120f with
the DSL keeping its PTX (``CUTE_DSL_KEEP_PTX=1``), and every consumer release of a K or V stage
(an ``mbarrier.arrive.shared.b64`` on the stage's empty barrier) must come right after a
``fence.proxy.async.shared::cta``. The same class compiled from the *unpatched* installed file has
two fenced releases fewer, so this test fails if the patch stops reaching the compiler (e.g. the
DSL read the kernel source from disk instead of the patched text). Each compile runs in its own
process (the DSL caches compiled functions by name within a process).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
needs_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                               reason="needs CuTe-DSL (the build env)")

# One variant per kernel: the consumer loop (where the fences go) is the same in every variant.
VARIANT = {"fi_sm120_sage_fwd": "rows_bs0", "fi_sm120_bf16_fwd": "topk_bs0"}

_COMPILE = r"""
import sys
sys.path.insert(0, {root!r})
from aot import export, registry
from aot.upstream import flashinfer_import
target, kname, vname, unpatched = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
if unpatched:
    flashinfer_import.load_class = flashinfer_import.load_unpatched_class
k = next(k for k in registry.all_kernels() if k.name == kname)
v = next(v for v in k.variants if v.name == vname)
_, cute = export.dsl()
spec = k.compile_spec(target, v)
args, kwargs = spec.bind(export.make_fakes(spec.args))
cute.compile(spec.fn, *args, **kwargs,
             options=f"--gpu-arch {{target}}")
print("COMPILED")
"""

RELEASE = re.compile(r"^\s*mbarrier\.arrive\.shared\.b64\b")  # not expect_tx: a consumer release
FENCE = "fence.proxy.async.shared::cta"


def fenced_releases(ptx: str) -> tuple[int, int]:
    """(releases, releases with the fence among the 3 lines before them: the fence, the
    predicated branch of the elected thread, the arrive count)."""
    lines = [ln for ln in ptx.splitlines() if ln.strip()]
    total = fenced = 0
    for i, ln in enumerate(lines):
        if RELEASE.match(ln):
            total += 1
            fenced += any(FENCE in p for p in lines[max(0, i - 3):i])
    return total, fenced


def compile_ptx(tmp_path: Path, target: str, kernel: str, unpatched: bool = False) -> str:
    out = tmp_path / f"{target}-{kernel}-{int(unpatched)}"
    out.mkdir()
    env = dict(os.environ, CUTE_DSL_KEEP_PTX="1", CUTE_DSL_DUMP_DIR=str(out))
    r = subprocess.run([sys.executable, "-c", _COMPILE.format(root=str(ROOT)), target, kernel,
                        VARIANT[kernel], "1" if unpatched else "0"],
                       cwd=out, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "COMPILED" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    ptx = sorted(out.glob(f"*.{target}.ptx"))
    assert len(ptx) == 1, sorted(p.name for p in out.iterdir())
    return ptx[0].read_text()


def test_fenced_release_counter():
    ptx = """
    ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1}, [%r2];
    @%p1 bra $L1;
    mov.b32 %r3, 1;
    mbarrier.arrive.shared.b64 %rd1, [%r4], %r3;
    fence.proxy.async.shared::cta;
    @%p2 bra $L2;
    mov.b32 %r5, 1;
    mbarrier.arrive.shared.b64 %rd2, [%r6], %r5;
    mbarrier.arrive.expect_tx.shared.b64 %rd3, [%r7], %r8;
    """
    assert fenced_releases(ptx) == (2, 1)


@pytest.mark.aot
@needs_dsl
@pytest.mark.parametrize("target", ["sm_120a", "sm_120f"])
@pytest.mark.parametrize("kernel", sorted(VARIANT))
def test_patched_kernels_fence_each_kv_release(tmp_path, target, kernel):
    total, fenced = fenced_releases(compile_ptx(tmp_path, target, kernel))
    # Q release (once per tile, no fence: its reuse is ordered by the next tile's load) + K + V
    assert total >= 3, total
    assert fenced >= 2, f"{kernel} for {target}: only {fenced} of {total} releases are fenced"


@pytest.mark.aot
@needs_dsl
@pytest.mark.parametrize("kernel", sorted(VARIANT))
def test_unpatched_source_lacks_the_two_fences(tmp_path, kernel):
    patched = fenced_releases(compile_ptx(tmp_path, "sm_120a", kernel))
    unpatched = fenced_releases(compile_ptx(tmp_path, "sm_120a", kernel, unpatched=True))
    assert unpatched[0] == patched[0], (patched, unpatched)  # same releases
    assert unpatched[1] == patched[1] - 2, (patched, unpatched)  # the two K/V fences are the patch's
