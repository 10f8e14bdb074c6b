"""Build-time checks of the Sage quantizer kernel (aot/kernels/sage_quant/): every library that
serves Sage exports its one launch with every variant the runtime selects, the plan variants take
the quantizer's arguments followed by exactly the plan kernel's, the pooling variant the
quantizer's followed by ``router_pool``'s cells, and the compiled kernels use no local memory (a
spill would put the bandwidth-bound roles off their ~4 TB/s) and stay within the register budget
their CTA shape assumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.exports import export_without_local_memory

pytestmark = pytest.mark.aot
VARIANTS = ("noplan", "cnt", "topk", "pool")


def test_every_sage_library_exports_the_one_launch():
    from aot import export
    from aot.contract import modes_served
    from aot.kernels import sage_quant

    want = {("sage_quant_kv", v) for v in VARIANTS}
    libs = export.plan()
    sage_libs = [lib for lib, jobs in libs.items() if "sage_fp8" in modes_served({j.kernel.name for j in jobs})]
    assert {"sm90a", "sm120a"} <= set(sage_libs), sage_libs
    for lib, jobs in libs.items():
        have = {(j.kernel.name, j.variant.name) for j in jobs if j.kernel.name.startswith("sage_quant")}
        assert have in (want, set()), (lib, have)
        if not lib.startswith("test_"):
            assert have == want, lib  # every shipped target quantizes (sage_quant.TARGETS)
    # no other quantizer launch: Q, the K/V statistics and their reductions are roles of this one,
    # and the workspace tags its slots instead of being filled by a launch of its own
    gone = {"sage_quant_q", "sage_quant_kv_stats", "sage_quant_kv_finalize", "sage_quant_prep"}
    assert not gone & {j.kernel.name for jobs in libs.values() for j in jobs}
    assert set(sage_quant.TARGETS) == {j.target for jobs in libs.values() for j in jobs
                                       if j.kernel.name == "sage_quant_kv" and not j.test}


def test_plan_variants_take_the_plan_kernels_arguments():
    from aot.kernels import plan_prepare, sage_quant

    base = sage_quant.kv_args("none")
    assert [a.name for a in base[-3:]] == ["v_fp8", "sync", "stream"]
    assert [a.align for a in base if a.name == "sync"] == [8]  # 64-bit counter and slots
    for plan, counts in (("counts", True), ("topk", False)):
        args = sage_quant.kv_args(plan)
        # the quantizer's arguments as in the plan-less variant, then the plan kernel's, then the stream
        assert args[:len(base) - 1] == base[:-1]
        assert args[len(base) - 1:-1] == plan_prepare.plan_args(counts)
        assert [a.name for a in args[-1:]] == ["stream"]
    # (the plan's B and H must be q's: the runtime checks it, tests/cpu/test_quantize_launches.py)


def test_pool_variant_takes_the_router_pools_cells():
    """The pooling variant: the quantizer's arguments with q_int8's rows an extent of their own
    (Sq, or 0 when the Q tiles only pool), then router_pool's pooled_q / pooled_k (the same
    layout: router_select reads them) and Q's factor."""
    from aot.kernels import router, sage_quant

    base = sage_quant.kv_args("none")
    args = sage_quant.kv_args("none", pool=True)
    n = len(base) - 1
    assert [a.name for a in args[:n]] == [a.name for a in base[:n]]
    assert all(a == b for a, b in zip(args[:n], base[:n]) if a.name != "q_int8")
    (q8,) = [a for a in args if a.name == "q_int8"]
    assert q8.shape[1].key == "Sq8" and [a.shape[1].key for a in base if a.name == "q_int8"] == ["Sq"]
    pool = {a.name: a for a in router.pool_args()}
    assert [a.name for a in args[n:]] == ["pooled_q", "pooled_k", "q_pool_scale", "stream"]
    for name in ("pooled_q", "pooled_k"):
        assert args[[a.name for a in args].index(name)] == pool[name]
    assert args[-2].dtype == "float32"
    assert sage_quant.KERNELS[0].variants[-1].params == {"plan": "none", "pool": True}


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32`` (default mode): byte i of the result is byte ``sel`` nibble i of (a, b)."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    return sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def test_pool_unpack_selectors():
    """``ptx.add_bf16``'s ``prmt`` selectors put the low / high bf16 of a packed pair in the high
    half over zeros: what ``lo_f32`` (``w << 16``) and ``hi_f32`` (``w & 0xFFFF0000``) give."""
    import random

    from aot.kernels.sage_numerics import ptx

    src = Path(ptx.__file__).read_text()
    assert '"0x3244" if hi else "0x1044"' in src
    rng = random.Random(0)
    for w in [0, 0xFFFFFFFF, 0x80008000, 0x3F807F80] + [rng.getrandbits(32) for _ in range(1000)]:
        assert _prmt(w, 0, 0x1044) == (w << 16) & 0xFFFFFFFF
        assert _prmt(w, 0, 0x3244) == w & 0xFFFF0000


REGISTER_FILE = 65536  # 32-bit registers per SM on every target (sm_90a, sm_100, sm_120)


def _budget(threads: int, ctas_per_sm: int) -> int:
    """Registers per thread that let ctas_per_sm CTAs of `threads` threads share one SM
    (allocation granularity: 8 registers per thread)."""
    return REGISTER_FILE // (threads * ctas_per_sm) // 8 * 8


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "sm_120a", "sm_100f", "sm_120f"])
def test_compiled_kernels_have_no_local_memory(tmp_path, target):
    """The quantizer is a bandwidth kernel whose speed is the bytes it keeps in flight per SM:
    each variant compiles under a launch bound (sage_quant.KV_CTAS_PER_SM) and must fit it
    without local memory (a spill would cost more traffic than the occupancy gains)."""
    pytest.importorskip("cutlass")
    from aot.kernels import sage_quant

    assert target in sage_quant.TARGETS
    seen = {}
    for stem, (regs, meta) in export_without_local_memory(
            "aot.kernels.sage_quant", target, [f"sage_quant_kv:{v}" for v in VARIANTS], tmp_path).items():
        seen[stem] = regs
        names = [a["name"] for a in meta["args"]]
        assert names[:4] == ["q", "q_int8", "q_scale", "k"], names
    # 256 threads, 4 CTAs (32 warps) per SM -> <= 64 registers; sm_100 / sm_120: 3 CTAs, <= 80
    # registers (their ptxas spills the kernel at 64). Used: 64 on sm_90a, 80 on sm_100, 72-80 on
    # sm_120. The pooling variant: 3 CTAs on every target (<= 80; 78-80 used).
    from aot.kernels.sage_quant.spec import POOL_CTAS_PER_SM

    kv_ctas = sage_quant.KV_CTAS_PER_SM[target]
    assert sage_quant.KV_THREADS == 256 and kv_ctas == (4 if target == "sm_90a" else 3)
    assert POOL_CTAS_PER_SM[target] == 3
    for stem, regs in seen.items():
        ctas = POOL_CTAS_PER_SM[target] if stem.endswith("_pool") else kv_ctas
        assert regs <= _budget(sage_quant.KV_THREADS, ctas), (stem, regs)
