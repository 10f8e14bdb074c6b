"""Build-time checks of the router kernels (aot/kernels/router): every shipped library exports
both launches with every n_q x n_k (with and without dense rows), their arguments are what
ops/route.py passes, and the compiled kernels use no local memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.exports import export_without_local_memory

pytestmark = pytest.mark.aot
ROOT = Path(__file__).resolve().parents[2]


def test_every_library_exports_the_router():
    from aot import export
    from aot.kernels import router
    from aot.kernels.router.spec import ROUTER_N_VALUES

    want = {("router_pool", "bf16")} | {("router_select", f"{impl}_q{a}k{b}") for impl in ("mma", "simt")
                                         for a in ROUTER_N_VALUES for b in ROUTER_N_VALUES}
    libs = export.plan()
    shipped = [lib for lib in libs if not lib.startswith("test_")]
    assert len(shipped) == len(router.TARGETS)
    for lib in shipped:
        have = {(j.kernel.name, j.variant.name) for j in libs[lib] if j.kernel.name.startswith("router_")}
        assert have == want, lib


def test_argument_names_match_the_runtime():
    from aot.kernels import router

    names = [a.name for a in router.pool_args()]
    assert names == ["q", "k", "pooled_q", "pooled_k", "sub_q", "sub_k", "q_scale", "stream"]
    names = [a.name for a in router.select_args()]
    assert names == ["pooled_q", "pooled_k", "scores", "q2k_block_index", "block_counts", "dense_rows", "q_valid",
                     "k_valid", "topk", "has_dense", "stream"]
    assert router.SELECT_IMPLS == ("mma", "simt")
    src = (ROOT / "python/subblock_sage/ops/route.py").read_text()
    for n in ("pooled_q", "pooled_k", "scores", "q2k_block_index", "block_counts", "dense_rows", "q_valid",
              "k_valid", "topk", "has_dense", "sub_q", "sub_k", "q_scale"):
        assert f'"{n}"' in src, n


@pytest.mark.parametrize("target", ["sm_90a", "sm_120a"])
def test_no_local_memory(target, tmp_path):
    """The largest register footprints (SIMT: n_q x n_k = 32 and 64 accumulators per lane; mma: the
    most unrolled epilogues) and the pool
    kernel: no spill frames (sm_120a: the smallest shared memory, 99 KB per CTA, also fits)."""
    pytest.importorskip("cutlass")
    units = ["router_pool:bf16", "router_select:mma_q4k4", "router_select:mma_q8k8", "router_select:mma_q1k1",
             "router_select:simt_q8k8", "router_select:simt_q4k8"]
    for regs, meta in export_without_local_memory("aot.kernels.router", target, units, tmp_path).values():
        assert regs <= 255
        assert meta["kernel"] in ("router_pool", "router_select")
