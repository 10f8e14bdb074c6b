"""SM90 kernel package: config checks, the shipped variant table, experiments only on request."""

import pytest

pytestmark = pytest.mark.aot

# What ships for sm_90a: only the variants the runtime can select (issue 22, aot/serving.py): the
# plan kernel always hands the attention kernels per-row counts, so every shipped variant is `_cnt`.
SHIPPED_SM90 = [
    "sbs_sm90a_sm90_bsa_bf16_k64_cnt", "sbs_sm90a_sm90_bsa_bf16_k128_cnt",
    "sbs_sm90a_sm90_bsa_sage_k64_cnt", "sbs_sm90a_sm90_bsa_sage_k128_cnt",
    "sbs_sm90a_sm90_bsa_sage_k64_flat_cnt", "sbs_sm90a_sm90_bsa_sage_k128_ws_cnt",
    "sbs_sm90a_sm90_bsa_sage_k64_qf_cnt", "sbs_sm90a_sm90_bsa_sage_k128_qf_cnt",
    "sbs_sm90a_sm90_bsa_sage_k64_c1_cnt", "sbs_sm90a_sm90_bsa_sage_k64_c1qf_cnt",
    "sbs_sm90a_sm90_bsa_sage_k128_c1_cnt", "sbs_sm90a_sm90_bsa_sage_k128_c1qf_cnt",
]


@pytest.mark.parametrize("kwargs, why", [
    (dict(mode="bf16", block_k=128, k_stages=1, v_stages=1, wgs=0), "flat shape"),
    (dict(mode="sage", block_k=96, k_stages=1, v_stages=1, wgs=0), "block_k=96"),
    (dict(mode="bf16", block_k=128, k_stages=1, v_stages=1, wgs=2, pair=True), "pair needs"),
    (dict(mode="sage", block_k=128, k_stages=1, v_stages=2, wgs=0), "never deeper"),
    (dict(mode="sage", block_k=128, k_stages=1, v_stages=1, wgs=0, refill="late"), "refill"),
    (dict(mode="sage", block_k=128, k_stages=3, v_stages=2, wgs=1, q_fused=True), "flat Sage kernel only"),
    (dict(mode="bf16", block_k=64, k_stages=3, v_stages=2, wgs=2, q_fused=True), "flat Sage kernel only"),
    (dict(mode="sage", block_k=128, k_stages=1, v_stages=1, wgs=0, flat_wgs=2, ctas_per_sm=1), "one or three"),
    (dict(mode="sage", block_k=64, k_stages=1, v_stages=1, wgs=0, flat_wgs=3, ctas_per_sm=1), "128-key tiles"),
    (dict(mode="sage", block_k=128, k_stages=3, v_stages=2, wgs=1, flat_wgs=3, ctas_per_sm=1), "128-key tiles"),
    (dict(mode="sage", block_k=128, k_stages=1, v_stages=1, wgs=0, flat_wgs=3), "one CTA per SM"),
    (dict(mode="sage", block_k=128, k_stages=1, v_stages=1, wgs=0, cluster=4), "one or two CTAs"),
    (dict(mode="sage", block_k=128, k_stages=1, v_stages=1, wgs=0, pair=True, refill="eager", cluster=2),
     "cluster=2 is built"),
    (dict(mode="sage", block_k=64, k_stages=1, v_stages=1, wgs=0, cluster=2), "cluster=2 is built"),
    (dict(mode="sage", block_k=128, k_stages=2, v_stages=2, wgs=0, cluster=2), "cluster=2 is built"),
    (dict(mode="sage", block_k=128, k_stages=3, v_stages=2, wgs=1, cluster=2), "cluster=2 is built"),
    (dict(mode="sage", block_k=128, k_stages=1, v_stages=1, wgs=0, flat_wgs=3, ctas_per_sm=1, cluster=2),
     "cluster=2 is built"),
])
def test_config_refuses_what_the_kernel_cannot_build(kwargs, why):
    from aot.kernels.sm90.config import Sm90Config

    with pytest.raises(ValueError, match=why):
        Sm90Config(**kwargs)


def test_shipped_configs_are_the_measured_defaults():
    from aot.kernels.sm90.config import Sm90Config
    from aot.kernels.sm90.variants import config_of

    assert config_of("sage", {"block_k": 64, "counts": True, "pair": True}) == Sm90Config(
        "sage", 128, 1, 1, wgs=0, pv_parts=1, ctas_per_sm=3, pair=True, cluster=2)
    assert config_of("sage", {"block_k": 64, "counts": True, "wgs": 0}) == Sm90Config(
        "sage", 64, 1, 1, wgs=0, pv_parts=2, ctas_per_sm=4)
    assert config_of("sage", {"block_k": 128, "counts": True, "wgs": 1}) == Sm90Config("sage", 128, 3, 2, wgs=1)
    assert config_of("bf16", {"block_k": 64, "counts": False, "pair": False}) == Sm90Config("bf16", 64, 3, 2, wgs=2)
    # the Q-fused variants are the default flat kernels plus q_fused, nothing else
    assert config_of("sage", {"block_k": 64, "counts": True, "pair": True, "q_fused": True}) == Sm90Config(
        "sage", 128, 1, 1, wgs=0, pv_parts=1, ctas_per_sm=3, pair=True, q_fused=True, cluster=2)
    assert config_of("sage", {"block_k": 128, "counts": True, "pair": False, "q_fused": True}) == Sm90Config(
        "sage", 128, 1, 1, wgs=0, pv_parts=1, ctas_per_sm=3, q_fused=True, cluster=2)
    # flat Sage on 128-key tiles (the 128-key kernel, the paired 64-key one): two-CTA clusters by
    # default (config.FLAT_CLUSTER), the one-CTA kernels as k{64,128}_c1[qf]_cnt; every other
    # shape one CTA
    assert config_of("sage", {"block_k": 128, "counts": True, "pair": False}).cluster == 2
    for bk, pair in ((128, {}), (64, {"pair": True})):
        assert config_of("sage", {"block_k": bk, "counts": True, **pair, "cluster": 1}) == Sm90Config(
            "sage", 128, 1, 1, wgs=0, pv_parts=1, ctas_per_sm=3, **pair)
        assert config_of("sage", {"block_k": bk, "counts": True, **pair, "cluster": 1, "q_fused": True}) == \
            Sm90Config("sage", 128, 1, 1, wgs=0, pv_parts=1, ctas_per_sm=3, q_fused=True, **pair)
    for params in ({"block_k": 64, "counts": True, "pair": True, "refill": "eager"},
                   {"block_k": 64, "counts": True, "wgs": 0},
                   {"block_k": 128, "counts": True, "wgs": 1}, {"block_k": 128, "counts": True, "wgs": 0,
                                                                "stages": (2, 2)},
                   {"block_k": 128, "counts": True, "refill": "eager"}):
        assert config_of("sage", params).cluster == 1, params


def test_q_fused_entry_takes_bf16_q_and_no_q_scale():
    """The Q-fused kernel's C ABI: bf16 q (16-byte-aligned strided views, like the quantizer's
    input), no q_scale; everything else as the INT8-Q kernel's, in the same order."""
    from aot.kernels.sm90.variants import args_for

    int8q = args_for("sage", True)
    fused = args_for("sage", True, q_fused=True)
    assert [a.name for a in fused] == [a.name for a in int8q if a.name != "q_scale"]
    assert fused[0].dtype == "bfloat16" and int8q[0].dtype == "int8"
    assert [st.div for st in fused[0].stride[:3]] == [8, 8, 8]


def test_q_smem_offset_is_the_dsl_layout():
    """``layout.q_smem_offset`` (where the Q-fused kernel stores its codes) against the DSL's own
    shared-memory layout of the INT8 Q tile (make_smem_layout_a, as kernel.py builds it), for every
    row and 8-byte chunk and every byte in it: a DSL that changed its swizzle would fail here, not
    as wrong attention on a GPU."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.utils import LayoutEnum

    from aot.kernels.sm90.layout import q_smem_offset

    got = {}

    @cute.jit
    def probe():
        lay = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (64, 128, 128), cutlass.Int8, 1)
        for r in cutlass.range_constexpr(64):
            for c in cutlass.range_constexpr(128):
                got[r, c] = cute.crd2idx((r, c, 0), lay)

    cute.compile(probe)
    for (r, c), idx in got.items():
        assert int(idx) == q_smem_offset(r, c // 8) + c % 8, (r, c, idx)
    assert sorted(int(i) for i in got.values()) == list(range(64 * 128))


def test_experiments_only_on_request():
    from aot import export, registry

    shipped = [j.prefix for j in export.plan("x86_64", ["sm_90a"])["sm90a"] if "_bsa_" in j.prefix]
    assert shipped == SHIPPED_SM90
    assert not any("ablate" in v.params for k in registry.all_kernels() for v in k.variants)

    with_exp = {k.name: k for k in registry.all_kernels(experiments=True)}
    for k in registry.all_kernels():
        names = [v.name for v in with_exp[k.name].variants]
        assert names[:len(k.variants)] == [v.name for v in k.variants]
    sage = [v.name for v in with_exp["sm90_bsa_sage"].variants]
    assert {"k128_ablhalf_cnt", "k128_ablall_cnt", "k128_flats2_cnt", "k64_eager_cnt"} <= set(sage)
    # an experiments build exports them (aot/serving.py filters only what ships)
    exp = {j.prefix for j in export.plan("x86_64", ["sm_90a"], experiments=True)["sm90a"]}
    assert {"sbs_sm90a_sm90_bsa_sage_k128_ablhalf_cnt", "sbs_sm90a_sm90_bsa_bf16_k64_ablall_cnt"} <= exp
    assert set(SHIPPED_SM90) <= exp

