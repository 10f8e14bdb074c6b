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

    # a library's exports and the test library's (the variants only benchmarks select) together:
    # what a backend with the test library (SM90Backend.with_library) selects among
    return {k.name: [(v.name, dict(v.params)) for v in (*k.variants, *k.test_variants)]
            for k in registry.all_kernels()}


def _runtime():
    sys.path.insert(0, str(ROOT / "python"))
    try:
        from subblock_sage.backends import sm90
        from subblock_sage.contract import select_variant
    finally:
        sys.path.pop(0)
    return sm90, select_variant


# (sage_cluster, bf16_cluster) pairs that reach every selection the policies can make
SHARING = ((None, None), (1, 1), (2, 2), (2, 4))


def _policy(**kw):
    sys.path.insert(0, str(ROOT / "python"))
    try:
        from subblock_sage.contract import SelectionPolicy
    finally:
        sys.path.pop(0)
    return SelectionPolicy(**kw)


def test_sm90_selections(variants):
    sm90, select = _runtime()
    be = sm90.SM90Backend()
    chosen = {}
    for mode, bk in itertools.product(("sage_fp8", "bf16"), (64, 128)):
        kernel = be.kernels[mode]
        chosen[(mode, bk)] = select(kernel, variants[kernel], be.params(mode, bk))
    assert chosen == {("sage_fp8", 64): "k64_cnt", ("sage_fp8", 128): "k128_cnt",
                      ("bf16", 64): "k64_kvs_cnt", ("bf16", 128): "k128_kvs_cnt"}  # params: dense rows by default
    for bk in (64, 128):  # the alternative Sage shape the bench and the GPU tests select
        alt = be.with_policy(sage_alt_shape={bk})
        assert select("sm90_bsa_sage", variants["sm90_bsa_sage"], alt.params("sage_fp8", bk)) == \
            f"k{bk}_{'ws' if bk == 128 else 'flat'}_cnt"
        assert select("sm90_bsa_sage", variants["sm90_bsa_sage"], alt.params("sage_fp8", 192 - bk)) == \
            chosen[("sage_fp8", 192 - bk)]  # the other key block keeps its default


@pytest.mark.parametrize("bk", [64, 128])
def test_sm90_cluster_selection(variants, bk):
    """Sage in the default shape (128-key plans; 64-key plans on the paired kernel): the two-CTA
    cluster kernel (k{bk}[_qf]_cnt) when the plan's capacity holds every key block
    (``dense_rows``, the default of ``params``), the one-CTA kernel (k{bk}_c1[qf]_cnt) otherwise;
    the policy's ``sage_cluster`` 1 / 2 forces either. bf16 and the other CTA shape ask for one
    CTA."""
    sm90, select = _runtime()
    sage = variants["sm90_bsa_sage"]
    for qf in (False, True):
        tag = "qf" if qf else ""
        be = sm90.SM90Backend()
        assert select("sm90_bsa_sage", sage, be.params("sage_fp8", bk, qf)) == f"k{bk}{'_' + tag if qf else ''}_cnt"
        assert select("sm90_bsa_sage", sage, be.params("sage_fp8", bk, qf, dense_rows=False)) == f"k{bk}_c1{tag}_cnt"
        two = be.with_policy(sage_cluster=2)
        assert select("sm90_bsa_sage", sage, two.params("sage_fp8", bk, qf, dense_rows=False)) == \
            f"k{bk}{'_' + tag if qf else ''}_cnt"
        one = be.with_policy(sage_cluster=1)
        assert select("sm90_bsa_sage", sage, one.params("sage_fp8", bk, qf)) == f"k{bk}_c1{tag}_cnt"
    be = sm90.SM90Backend()
    assert be.params("bf16", bk)["cluster"] == 1
    alt = be.with_policy(sage_alt_shape={bk})
    assert alt.params("sage_fp8", bk)["cluster"] == 1 and \
        select("sm90_bsa_sage", sage, alt.params("sage_fp8", bk)) == f"k{bk}_{'ws' if bk == 128 else 'flat'}_cnt"


@pytest.mark.parametrize("bk", [64, 128])
def test_sm90_bf16_kv_share_selection(variants, bk):
    """bf16 (two consumers per CTA): the default policy (``bf16_cluster`` None, measured:
    contract.SelectionPolicy) selects the shared-ring kernel (k{bk}_kvs_cnt) exactly when a row
    can be dense and one K/V ring per row (k{bk}_cnt) otherwise; 2 the shared-ring kernel always,
    4 the shared-ring kernel in two-CTA clusters (k{bk}_c2kvs_cnt) always, 1 never. No Sage
    request asks for a shared ring."""
    sm90, select = _runtime()
    bf16 = variants["sm90_bsa_bf16"]
    for dense in (False, True):
        for share, want in ((1, f"k{bk}_cnt"), (None, f"k{bk}_kvs_cnt" if dense else f"k{bk}_cnt"),
                            (2, f"k{bk}_kvs_cnt"), (4, f"k{bk}_c2kvs_cnt")):
            be = sm90.SM90Backend(_policy(bf16_cluster=share))
            params = be.params("bf16", bk, dense_rows=dense)
            assert params["cluster"] == (2 if share == 4 else 1)
            assert params["kv_share"] == want.endswith("kvs_cnt")
            assert select("sm90_bsa_bf16", bf16, params) == want, (share, dense)
            assert be.params("sage_fp8", bk, dense_rows=dense)["kv_share"] is False
        assert select("sm90_bsa_bf16", bf16, sm90.SM90Backend().params("bf16", bk, dense_rows=dense)) == \
            (f"k{bk}_kvs_cnt" if dense else f"k{bk}_cnt")
    assert sm90.BACKEND.policy.bf16_cluster is None


def test_sm90_requests_are_complete():
    """Every request names every selection axis with a value (no "a missing parameter means the
    default"), except the label, which only a policy with a label sets."""
    sm90, _ = _runtime()
    from aot.contract import SM90_SELECT_AXES

    be = sm90.SM90Backend()
    for mode, bk, qf, dense in itertools.product(("sage_fp8", "bf16"), (64, 128), (False, True), (False, True)):
        p = be.params(mode, bk, qf, dense)
        assert set(p) == set(SM90_SELECT_AXES), p
        assert all(v is not None for k, v in p.items() if k != "label"), p


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


def _fake_lib(variants):
    """The parts of ``loader.Library`` that ``quantizes_q`` uses, over the registry's variants."""
    from types import SimpleNamespace as NS

    sm90, select = _runtime()
    from subblock_sage.errors import LaunchError

    def kernel(name, **params):
        try:
            return NS(params=dict(variants[(name, select(name, [(v, p) for (k, v), p in variants.items()
                                                                  if k == name], params))]))
        except LookupError as e:
            raise LaunchError(str(e)) from None

    return NS(kernels={kv: NS(params=p) for kv, p in variants.items()}, kernel=kernel)


def test_sm90_q_fused_selection(variants):
    """The Q-fused Sage kernels: chosen for Sage calls of at least ``q_fused_min_ctas`` query
    blocks in the default shape when the library ships them (a library built from this registry),
    and then the quantizer skips Q; never for bf16, the other CTA shape, small calls, a library
    without them, or with the policy's ``q_fused`` off."""
    from types import SimpleNamespace as NS

    sm90, select = _runtime()
    shipped = {("sm90_bsa_sage", v): p for v, p in variants["sm90_bsa_sage"]}
    lib = _fake_lib(shipped)
    old = _fake_lib({kv: p for kv, p in shipped.items() if not p["q_fused"]})

    def call(mode="sage_fp8", bk=64, B=1, H=14, Sq=37760, dense=True):
        return NS(compute_mode=mode, spec=NS(block_size_k=bk, rows_can_be_dense=dense), q=NS(shape=(B, Sq, H, 128)))

    be = sm90.SM90Backend()
    for bk, dense in itertools.product((64, 128), (False, True)):
        assert be.quantizes_q(lib, call(bk=bk, dense=dense))
        params = be.params("sage_fp8", bk, True, dense)
        assert select("sm90_bsa_sage", variants["sm90_bsa_sage"], params) == f"k{bk}_{'qf' if dense else 'c1qf'}_cnt"
        assert not be.quantizes_q(old, call(bk=bk, dense=dense))
        assert not be.quantizes_q(lib, call(mode="bf16", bk=bk, dense=dense))
    n = be.policy.q_fused_min_ctas
    assert be.quantizes_q(lib, call(H=1, Sq=64 * n)) and not be.quantizes_q(lib, call(H=1, Sq=64 * n - 64))
    assert not be.quantizes_q(lib, call(H=4, Sq=8192))  # 512 query blocks: measured slower fused
    alt = be.with_policy(sage_alt_shape={128})
    assert not alt.quantizes_q(lib, call(bk=128)) and alt.quantizes_q(lib, call(bk=64))
    assert not be.with_policy(q_fused=False).quantizes_q(lib, call(bk=64))


def test_experiments_registry_selects_what_the_shipped_one_does(variants):
    """Every selection the sm90 backend makes under the policies a release build serves (per mode,
    key block, Q choice, row kind, shape and cluster choice) resolves in the experiments registry
    (``-DSBS_EXPERIMENTS=ON``) to the variant it resolves to in the shipped one: an experiment
    export can never make a default selection ambiguous. ``label="f3"`` selects the
    three-warpgroup exports, and only in the experiments registry; a label selects in either mode."""
    from aot.experiments import sm90 as experiments

    sm90, select = _runtime()
    exp = {k.name: [(v.name, dict(v.params)) for v in (*k.variants, *k.test_variants)] for k in experiments.KERNELS}
    for alt, (cluster, share) in itertools.product(((), (64,), (128,)), SHARING):
        be = sm90.SM90Backend(_policy(sage_alt_shape=alt, sage_cluster=cluster, bf16_cluster=share))
        for mode, bk, qf, dense in itertools.product(("sage_fp8", "bf16"), (64, 128), (False, True), (False, True)):
            if mode == "bf16" and qf:
                continue
            kernel = be.kernels[mode]
            params = be.params(mode, bk, qf, dense)
            if bk in alt and qf:
                continue  # no Q-fused kernel in the other shape (quantizes_q never asks)
            assert select(kernel, exp[kernel], params) == select(kernel, variants[kernel], params), params
    f3 = sm90.SM90Backend(_policy(label="f3"))
    for qf in (False, True):
        params = f3.params("sage_fp8", 128, qf)
        assert select("sm90_bsa_sage", exp["sm90_bsa_sage"], params) == f"k128_f3{'qf' if qf else ''}_cnt"
        with pytest.raises(LookupError, match="no variant"):
            select("sm90_bsa_sage", variants["sm90_bsa_sage"], params)
    abl = sm90.SM90Backend(_policy(label="ablhalf"))
    for bk in (64, 128):
        assert select("sm90_bsa_bf16", exp["sm90_bsa_bf16"], abl.params("bf16", bk)) == f"k{bk}_ablhalf_cnt"


def test_selection_policy_is_frozen_and_checked():
    import dataclasses

    from aot.contract import SelectionPolicy

    p = SelectionPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign"):
        p.sage_cluster = 1
    assert hash(p) == hash(SelectionPolicy()) and p == SelectionPolicy()
    assert SelectionPolicy(sage_alt_shape=[64]).sage_alt_shape == frozenset({64})
    for bad in ({"sage_alt_shape": {96}}, {"sage_cluster": 3}, {"bf16_cluster": 3}, {"bf16_cluster": 8}, {"q_fused_min_ctas": -1}):
        with pytest.raises(ValueError, match="Fix:"):
            SelectionPolicy(**bad)


def test_sm90_backend_has_no_mutable_selection_knobs():
    """The backend's selection is its frozen policy: the former class knobs are gone, setting any
    attribute fails with a fix, and ``with_policy`` returns a new backend."""
    sm90, _ = _runtime()
    for knob in ("sage_share3", "sage_cluster", "sage_wgs", "q_fused", "q_fused_min_ctas"):
        assert not hasattr(sm90.SM90Backend, knob) and not hasattr(sm90.BACKEND, knob), knob
    with pytest.raises(AttributeError, match="with_policy"):
        sm90.BACKEND.sage_cluster = 1
    other = sm90.BACKEND.with_policy(sage_cluster=1)
    assert other is not sm90.BACKEND and other.policy.sage_cluster == 1
    assert sm90.BACKEND.policy == _policy()
    with pytest.raises(TypeError, match="Fix:"):
        sm90.SM90Backend({"sage_cluster": 1})


def test_every_served_config_is_one_built_variant(variants):
    """Under every policy a release build serves, every request of the sm90 backend matches exactly
    one shipped export, that export is served (aot/serving.py exports it), and every served
    export is what some request selects."""
    from aot import serving
    from aot.contract import SM90_SELECT_AXES

    sm90, select = _runtime()
    reached = set()
    for alt, (cluster, share), tail in itertools.product(((), (64,), (128,), (64, 128)), SHARING, (None, "rule")):
        be = sm90.SM90Backend(_policy(sage_alt_shape=alt, sage_cluster=cluster, bf16_cluster=share, bf16_tail=tail))
        for mode, bk, qf, dense in itertools.product(("sage_fp8", "bf16"), (64, 128), (False, True), (False, True)):
            kernel = be.kernels[mode]
            want = be.params(mode, bk, qf, dense)
            hits = [(v, p) for v, p in variants[kernel] if all(p.get(a) == want[a] for a in SM90_SELECT_AXES)]
            if qf and (mode == "bf16" or bk in alt):
                assert hits == [], want  # no Q-fused export there: quantizes_q never asks
                continue
            if want.get("tail") and want["cluster"] == 2:
                assert hits == [], want  # no tail-split kernel in two-CTA clusters
                continue
            assert len(hits) == 1, (want, hits)
            assert serving.is_served(kernel, *hits[0]), hits[0]
            assert select(kernel, variants[kernel], want) == hits[0][0]
            reached.add((kernel, hits[0][0]))
    served = {(k, v) for k in ("sm90_bsa_sage", "sm90_bsa_bf16") for v, p in variants[k] if serving.is_served(k, v, p)}
    assert served == reached


def test_tail_pairs_rule_and_which_exports_take_them(variants):
    """``contract.sm90_tail_pairs``: at S=37760 on 132 SMs (H=2/6/14: 590, 1770, 4130 pairs) the
    part-full last wave's pairs split where their halves fit one wave; a policy forces a count
    (clamped). ``contract.sm90_takes_tail``: the ``tail`` exports (test library: the default bf16
    kernel and its shared-ring form, both key blocks) have ``tail_pairs`` right before the stream,
    no other export has it, and only a policy with ``bf16_tail`` selects them."""
    sys.path.insert(0, str(ROOT / "python"))
    try:
        from subblock_sage.contract import sm90_tail_pairs, sm90_takes_tail
    finally:
        sys.path.pop(0)
    from aot import registry

    rule = _policy()
    assert [sm90_tail_pairs(rule, p, 132) for p in (590, 1770, 4130)] == [62, 54, 38]
    assert sm90_tail_pairs(rule, 264, 132) == 0 and sm90_tail_pairs(rule, 100, 132) == 0  # full; 200 > 132
    assert sm90_tail_pairs(rule, 62, 132) == 62  # one part-full wave: every pair splits
    assert sm90_tail_pairs(_policy(bf16_tail=5), 590, 132) == 5
    assert sm90_tail_pairs(_policy(bf16_tail=900), 590, 132) == 590
    assert sm90_tail_pairs(_policy(bf16_tail="rule"), 590, 132) == 62
    for bad in (-1, True, 1.5, "all"):
        with pytest.raises(ValueError, match="bf16_tail"):
            _policy(bf16_tail=bad)
    import ast
    import types

    from aot.kernels.sm90 import variants as sm90_variants

    # the C ABI takes run()'s parameters in their order (the CuTe-DSL export): the spec must list
    # them so, the absent ones left out (read from the source: no CuTe-DSL import here)
    tree = ast.parse((ROOT / "aot/kernels/sm90/kernel.py").read_text())
    run = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Sm90SparseAttention"
               for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "run")
    run_params = [a.arg for a in run.args.args[1:]]

    seen = 0
    for k in registry.all_kernels():
        if not k.name.startswith("sm90_bsa_"):
            continue
        # the registry's compile spec with a stand-in kernel object (no CuTe-DSL import)
        spec = sm90_variants.spec(k.variants[0].params["mode"], lambda cfg, params: types.SimpleNamespace(run=None))
        for v in (*k.variants, *k.test_variants):
            cs = spec("sm_90a", v)
            names = [a.name for a in cs.args]
            assert names == [p for p in run_params if p not in cs.extra_kwargs], (k.name, v.name)
            assert ("tail_pairs" in cs.extra_kwargs) != ("tail_pairs" in names), (k.name, v.name)
            takes = sm90_takes_tail(v.params)
            assert ("tail_pairs" in names) == takes, (k.name, v.name)
            if takes:
                seen += 1
                assert names[-2:] == ["tail_pairs", "stream"] and v.params["mode"] == "bf16"
            assert takes == (v in k.test_variants and v.name.endswith("tail_cnt")), (k.name, v.name)
    assert seen == 4  # k64_tail_cnt, k128_tail_cnt, k64_kvstail_cnt, k128_kvstail_cnt (test library)
    sm90, select = _runtime()
    for tail in (None, "rule", 3):
        be = sm90.SM90Backend(_policy(bf16_tail=tail))
        for bk, dense in itertools.product((64, 128), (False, True)):
            name = select("sm90_bsa_bf16", variants["sm90_bsa_bf16"], be.params("bf16", bk, dense_rows=dense))
            params = dict(variants["sm90_bsa_bf16"])[name]
            assert params["tail"] == (tail is not None) and params["kv_share"] == dense, (tail, bk, dense, name)

