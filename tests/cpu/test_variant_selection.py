"""Every kernel selection the runtime makes resolves to exactly one variant the build registers.

The runtime selects kernels by variant parameters (``Library.kernel`` -> ``contract.
select_variant``); the registry (``aot/kernels/*.py``) decides which variants exist. This checks
the two against each other without compiling anything (build env: the kernel modules import
CuTe-DSL lazily)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.aot

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def variants():
    from aot import registry

    return {k.name: [(v.name, dict(v.params)) for v in k.variants] for k in registry.all_kernels()}


def _runtime():
    sys.path.insert(0, str(ROOT / "python"))
    try:
        from subblock_sage.backends import sm90
        from subblock_sage.contract import select_variant
    finally:
        sys.path.pop(0)
    return sm90, select_variant


def test_sm90_selections(variants):
    sm90, select = _runtime()
    be = sm90.SM90Backend()
    chosen = {}
    for mode, bk in itertools.product(("sage_fp8", "bf16"), (64, 128)):
        kernel = be.kernels[mode]
        chosen[(mode, bk)] = select(kernel, variants[kernel], be.params(mode, bk))
    assert chosen == {("sage_fp8", 64): "k64_cnt", ("sage_fp8", 128): "k128_cnt",
                      ("bf16", 64): "k64_cnt", ("bf16", 128): "k128_cnt"}
    for bk in (64, 128):  # the alternative Sage shape the bench and the GPU tests select
        alts = [p["wgs"] for _, p in variants["sm90_bsa_sage"] if p.get("block_k") == bk and "wgs" in p]
        assert len(alts) == 1, alts
        be.sage_wgs = {bk: alts[0]}
        assert select("sm90_bsa_sage", variants["sm90_bsa_sage"], be.params("sage_fp8", bk)) != chosen[("sage_fp8", bk)]


@pytest.mark.parametrize("bk", [64, 128])
def test_sm90_cluster_selection(variants, bk):
    """Sage in the default shape (128-key plans; 64-key plans on the paired kernel): the two-CTA
    cluster kernel (k{bk}[_qf]_cnt) when the plan's capacity holds every key block
    (``dense_rows``, the default of ``params``), the one-CTA kernel (k{bk}_c1[qf]_cnt) otherwise;
    ``sage_cluster`` 1 / 2 forces either. bf16 and the other CTA shape never ask for a cluster
    kernel."""
    sm90, select = _runtime()
    sage = variants["sm90_bsa_sage"]
    for qf in (False, True):
        tag = "qf" if qf else ""
        be = sm90.SM90Backend()
        assert select("sm90_bsa_sage", sage, be.params("sage_fp8", bk, qf)) == f"k{bk}{'_' + tag if qf else ''}_cnt"
        assert select("sm90_bsa_sage", sage, be.params("sage_fp8", bk, qf, dense_rows=False)) == f"k{bk}_c1{tag}_cnt"
        be.sage_cluster = 2
        assert select("sm90_bsa_sage", sage, be.params("sage_fp8", bk, qf, dense_rows=False)) == \
            f"k{bk}{'_' + tag if qf else ''}_cnt"
        be.sage_cluster = 1
        assert select("sm90_bsa_sage", sage, be.params("sage_fp8", bk, qf)) == f"k{bk}_c1{tag}_cnt"
    be = sm90.SM90Backend()
    assert "cluster" not in be.params("bf16", bk)
    be.sage_wgs = {bk: 1 if bk == 128 else 0}
    assert "cluster" not in be.params("sage_fp8", bk) and \
        select("sm90_bsa_sage", sage, be.params("sage_fp8", bk)) == f"k{bk}_{'ws' if bk == 128 else 'flat'}_cnt"


def test_flashinfer_and_helper_selections(variants):
    _, select = _runtime()
    # what backends/sm120.py and sm100.py ask for with a prepared plan (per-row counts)
    assert select("fi_sm120_sage_fwd", variants["fi_sm120_sage_fwd"],
                  {"has_block_nums": True, "block_sizes_mode": 0}) == "rows_bs0"
    assert select("fi_sm120_bf16_fwd", variants["fi_sm120_bf16_fwd"],
                  {"has_block_nums": True, "block_sizes_mode": 0}) == "rows_bs0"
    for i64 in (False, True):
        assert select("fi_sm100_bf16_fwd", variants["fi_sm100_bf16_fwd"],
                      {"use_clc_scheduler": True, "has_block_nums": True, "allow_empty_block_nums": True,
                       "has_block_sizes": True, "use_int64_kv_strides": i64}).startswith("clc_rows_bs_")
    assert select("plan_prepare", variants["plan_prepare"], {"counts": True}) == "cnt"
    assert select("plan_prepare", variants["plan_prepare"], {"counts": False}) == "topk"
    # what ops/quantize.py asks for: no plan, or the plan role by whether counts were given
    from subblock_sage.ops import quantize

    assert select("sage_quant_kv", variants["sage_quant_kv"], {"plan": "none"}) == "noplan"
    for counts, name in ((True, "cnt"), (False, "topk")):
        assert select("sage_quant_kv", variants["sage_quant_kv"],
                      {"plan": quantize.PLAN_PARAMS[counts]}) == name


def test_sm90_q_fused_selection(variants):
    """The Q-fused Sage kernels: chosen for Sage calls of at least ``q_fused_min_ctas`` query
    blocks in the default shape when the library ships them (a library built from this registry),
    and then the quantizer skips Q; never for bf16, the other CTA shape, small calls, a library
    without them, or with ``q_fused`` off."""
    from types import SimpleNamespace as NS

    sm90, select = _runtime()
    lib = NS(kernels={("sm90_bsa_sage", v): NS(params=p) for v, p in variants["sm90_bsa_sage"]})
    old = NS(kernels={k: e for k, e in lib.kernels.items() if not e.params.get("q_fused")})

    def call(mode="sage_fp8", bk=64, B=1, H=14, Sq=37760):
        return NS(compute_mode=mode, plan=NS(block_size_k=bk), q=NS(shape=(B, Sq, H, 128)))

    be = sm90.SM90Backend()
    for bk in (64, 128):
        assert be.quantizes_q(lib, call(bk=bk))
        params = be.params("sage_fp8", bk, True)
        assert select("sm90_bsa_sage", variants["sm90_bsa_sage"], params) == f"k{bk}_qf_cnt"
        assert not be.quantizes_q(old, call(bk=bk))
        assert not be.quantizes_q(lib, call(mode="bf16", bk=bk))
    n = be.q_fused_min_ctas
    assert be.quantizes_q(lib, call(H=1, Sq=64 * n)) and not be.quantizes_q(lib, call(H=1, Sq=64 * n - 64))
    assert not be.quantizes_q(lib, call(H=4, Sq=8192))  # 512 query blocks: measured slower fused
    be.sage_wgs = {128: 1}
    assert not be.quantizes_q(lib, call(bk=128)) and be.quantizes_q(lib, call(bk=64))
    be.q_fused = False
    assert not be.quantizes_q(lib, call(bk=64))


def test_experiments_registry_selects_what_the_shipped_one_does(variants):
    """Every selection the sm90 backend makes (per mode, key block and Q choice, also with
    ``sage_share3``) resolves in the experiments registry (``-DSBS_EXPERIMENTS=ON``) to the
    variant it resolves to in the shipped one, and the experiment-only knob to a flat_wgs=3
    variant: an experiment variant can never make a default selection ambiguous (run 66: the
    ablation variants, which lacked ``pair``, tied with k128_cnt)."""
    from aot.kernels.sm90 import experiments

    sm90, select = _runtime()
    exp = {k.name: [(v.name, dict(v.params)) for v in k.variants] for k in experiments.KERNELS}
    for share in (False, True):
        be = sm90.SM90Backend()
        be.sage_share3 = share
        for mode, bk, qf in itertools.product(("sage_fp8", "bf16"), (64, 128), (False, True)):
            if mode == "bf16" and qf:
                continue
            kernel = be.kernels[mode]
            params = be.params(mode, bk, qf)
            got = select(kernel, exp[kernel], params)
            if params.get("flat_wgs") == 3:
                assert got == f"k128_f3{'qf' if qf else ''}_cnt", (params, got)
            else:
                assert got == select(kernel, variants[kernel], params), (params, got)
