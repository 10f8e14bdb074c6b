"""Build-time checks of the router kernels (aot/kernels/router): every shipped library exports
``router_pool`` and one ``router_select`` (n_q, n_k runtime arguments), the sm_90a test library
the SIMT cross-check per (n_q, n_k), their arguments are what backends/router.py passes, the score
phases and kernel names are defined once (router_spec.py), and the compiled kernels use no local
memory."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.exports import export_without_local_memory

pytestmark = pytest.mark.aot
ROOT = Path(__file__).resolve().parents[2]


def test_every_library_exports_one_router():
    from aot import export
    from aot.kernels import router
    from aot.kernels.router.spec import ROUTER_N_VALUES

    libs = export.plan()
    shipped = [lib for lib in libs if not lib.startswith("test_")]
    assert len(shipped) == len(router.TARGETS)
    for lib in shipped:
        have = {(j.kernel.name, j.variant.name) for j in libs[lib] if j.kernel.name.startswith("router_")}
        assert have == {("router_pool", "bf16"), ("router_select", "mma")}, lib
    test = {(j.kernel.name, j.variant.name) for j in libs["test_sm90a"] if j.kernel.name.startswith("router_")}
    assert test == {("router_select_simt", f"q{a}k{b}") for a in ROUTER_N_VALUES for b in ROUTER_N_VALUES}
    # the bound: at most 70 exports per host CPU (the router's share: 2 per target)
    assert sum(len(libs[lib]) for lib in shipped) <= 70


def test_argument_names_match_the_runtime():
    from aot.kernels import router

    names = [a.name for a in router.pool_args()]
    assert names == ["q", "k", "pooled_q", "pooled_k", "sub_q", "sub_k", "q_scale", "stream"]
    common = ["pooled_q", "pooled_k", "scores", "q2k_block_index", "block_counts", "dense_rows"]
    tail = ["q_valid", "k_valid", "topk", "has_dense", "stream"]
    assert [a.name for a in router.select_args()] == common + ["n_q", "n_k"] + tail[:-1] + ["phase", "k_splits",
                                                                                          "stream"]
    assert [a.name for a in router.select_args(runtime_n=False)] == common + tail
    src = (ROOT / "python/subblock_sage/backends/router.py").read_text()
    for n in ("pooled_q", "pooled_k", "scores", "q2k_block_index", "block_counts", "dense_rows", "q_valid",
              "k_valid", "topk", "has_dense", "sub_q", "sub_k", "q_scale", "n_q", "n_k", "phase", "k_splits"):
        assert f'"{n}"' in src, n


def test_select_impls_and_kernel_names_defined_once():
    """router_spec.py names the score phases and the kernels; the registry registers exactly those
    (the shipped one on every target, the SIMT one in the test library only) and no other file
    assigns SELECT_IMPLS, SELECT_KERNELS or POOL_KERNEL."""
    from aot.kernels import router
    from aot.kernels.router import spec

    import aot.runtime.router_spec as runtime_spec

    # the build reads the runtime's file (aot/runtime: one module per runtime file)
    assert Path(runtime_spec.__file__).resolve() == ROOT / "python/subblock_sage/router_spec.py"
    assert spec.SELECT_KERNELS is runtime_spec.SELECT_KERNELS
    assert spec.SELECT_IMPLS == ("mma", "simt")  # the shipped (default) phase first
    assert spec.RUNTIME_N_IMPLS == ("mma",)
    # the runtime op imports them from that file (tests/cpu/test_route_args.py: the same objects)
    route_src = ast.parse((ROOT / "python/subblock_sage/backends/router.py").read_text())
    imported = {a.name for n in ast.walk(route_src) if isinstance(n, ast.ImportFrom) and n.module == "router_spec"
                for a in n.names}
    assert {"POOL_KERNEL", "SELECT_KERNELS", "SELECT_IMPLS"} <= imported, imported
    ks = {k.name: k for k in router.KERNELS}
    assert set(ks) == {spec.POOL_KERNEL, *spec.SELECT_KERNELS.values()}
    mma, simt = (ks[spec.SELECT_KERNELS[i]] for i in spec.SELECT_IMPLS)
    assert mma.targets == router.TARGETS and mma.test_targets == ()
    assert simt.targets == () and simt.test_targets == ("sm_90a",)
    names = {"SELECT_IMPLS", "SELECT_KERNELS", "POOL_KERNEL"}
    assigned = []
    for tree_root in ("python", "aot", "benchmark"):
        for path in sorted((ROOT / tree_root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    assigned += [(t.id, str(path.relative_to(ROOT))) for t in targets
                                 if isinstance(t, ast.Name) and t.id in names]
    assert sorted(assigned) == [(n, "python/subblock_sage/router_spec.py") for n in sorted(names)], assigned


@pytest.mark.parametrize("target", ["sm_90a", "sm_120a"])
def test_no_local_memory(target, tmp_path):
    """The shipped select kernel (every n_q x n_k: the most unrolled epilogue of them all), the
    SIMT kernels with the most accumulators (n_q x n_k = 32 and 64 per lane) and the pool kernel:
    no spill frames (sm_120a: the smallest shared memory, 99 KB per CTA, also fits)."""
    pytest.importorskip("cutlass")
    units = ["router_pool:bf16", "router_select:mma", "router_select_simt:q8k8", "router_select_simt:q4k8"]
    seen = export_without_local_memory("aot.kernels.router", target, units, tmp_path)
    for regs, meta in seen.values():
        assert regs <= 255
        assert meta["kernel"] in ("router_pool", "router_select", "router_select_simt")
    regs = next(r for r, meta in seen.values() if meta["kernel"] == "router_select")
    # 4 warps per CTA: sm_90a keeps 4 CTAs per SM (<= 128 registers per thread); sm_120a's
    # compiler takes 134 (3 CTAs per SM, 12 warps; not yet run on that hardware)
    assert regs <= (128 if target == "sm_90a" else 168), regs
