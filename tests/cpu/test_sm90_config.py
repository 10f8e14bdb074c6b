"""SM90 kernel package: config checks, the shipped variant table, experiments only on request."""

import pytest

pytestmark = pytest.mark.aot

# What ships for sm_90a: only the variants the runtime can select (aot/serving.py): the plan kernel
# always hands the attention kernels per-row counts, so every shipped variant is `_cnt`.
SHIPPED_SM90 = [
    "sbs_sm90a_sm90_bsa_bf16_k64_cnt", "sbs_sm90a_sm90_bsa_bf16_k128_cnt",
    "sbs_sm90a_sm90_bsa_bf16_k64_kvs_cnt", "sbs_sm90a_sm90_bsa_bf16_k128_kvs_cnt",
    "sbs_sm90a_sm90_bsa_sage_k64_cnt", "sbs_sm90a_sm90_bsa_sage_k128_cnt",
    "sbs_sm90a_sm90_bsa_sage_k64_qf_cnt", "sbs_sm90a_sm90_bsa_sage_k128_qf_cnt",
    "sbs_sm90a_sm90_bsa_sage_k64_c1_cnt", "sbs_sm90a_sm90_bsa_sage_k64_c1qf_cnt",
    "sbs_sm90a_sm90_bsa_sage_k128_c1_cnt", "sbs_sm90a_sm90_bsa_sage_k128_c1qf_cnt",
]
# and into the test library only: the variants only a benchmark or a GPU test selects
# (SelectionPolicy.sage_alt_shape, bf16_cluster=4, bf16_tail)
BENCH_SM90 = [
    "sbs_tsm90a_sm90_bsa_bf16_k64_c2kvs_cnt", "sbs_tsm90a_sm90_bsa_bf16_k64_tail_cnt",
    "sbs_tsm90a_sm90_bsa_bf16_k64_kvstail_cnt", "sbs_tsm90a_sm90_bsa_bf16_k128_c2kvs_cnt",
    "sbs_tsm90a_sm90_bsa_bf16_k128_tail_cnt", "sbs_tsm90a_sm90_bsa_bf16_k128_kvstail_cnt",
    "sbs_tsm90a_sm90_bsa_sage_k64_flat_cnt", "sbs_tsm90a_sm90_bsa_sage_k128_ws_cnt",
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
    (dict(mode="sage", block_k=128, k_stages=1, v_stages=1, wgs=0, kv_share=True), "kv_share"),
    (dict(mode="bf16", block_k=64, k_stages=3, v_stages=2, wgs=1, kv_share=True), "kv_share"),
    (dict(mode="bf16", block_k=64, k_stages=3, v_stages=2, wgs=2, cluster=2), "cluster=2 for bf16"),
    (dict(mode="bf16", block_k=128, k_stages=3, v_stages=2, wgs=1, cluster=2), "cluster=2 for bf16"),
])
def test_config_refuses_what_the_kernel_cannot_build(kwargs, why):
    from aot.kernels.sm90.config import Sm90Config

    with pytest.raises(ValueError, match=why):
        Sm90Config(**kwargs)


def test_shipped_configs_are_the_measured_defaults():
    from aot.kernels.sm90.config import Sm90Config
    from aot.kernels.sm90.variants import bench_variants, config_of, variants

    cfg = {(m, v.name): config_of(v.params) for m in ("bf16", "sage") for v in (*variants(m), *bench_variants(m))}
    flat = dict(wgs=0, pv_parts=1, ctas_per_sm=3)
    assert cfg[("sage", "k64_cnt")] == Sm90Config("sage", 128, 1, 1, pair=True, cluster=2, **flat)
    assert cfg[("sage", "k64_flat_cnt")] == Sm90Config("sage", 64, 1, 1, wgs=0, pv_parts=2, ctas_per_sm=4)
    assert cfg[("sage", "k128_ws_cnt")] == Sm90Config("sage", 128, 3, 2, wgs=1)
    assert cfg[("bf16", "k64")] == Sm90Config("bf16", 64, 3, 2, wgs=2)
    # the shared-ring bf16 variants are the default two-consumer kernels plus kv_share, nothing else
    assert cfg[("bf16", "k64_kvs_cnt")] == Sm90Config("bf16", 64, 3, 2, wgs=2, kv_share=True)
    assert cfg[("bf16", "k128_kvs_cnt")] == Sm90Config("bf16", 128, 1, 1, wgs=2, kv_share=True)
    for bk, st in ((64, (3, 2)), (128, (1, 1))):  # and those in two-CTA clusters
        assert cfg[("bf16", f"k{bk}_c2kvs_cnt")] == Sm90Config("bf16", bk, *st, wgs=2, kv_share=True, cluster=2)
        # the tail-split ones: the default and shared-ring kernels plus tail, nothing else
        assert cfg[("bf16", f"k{bk}_tail_cnt")] == Sm90Config("bf16", bk, *st, wgs=2, tail=True)
        assert cfg[("bf16", f"k{bk}_kvstail_cnt")] == Sm90Config("bf16", bk, *st, wgs=2, kv_share=True, tail=True)
    # the Q-fused variants are the default flat kernels plus q_fused, nothing else
    assert cfg[("sage", "k64_qf_cnt")] == Sm90Config("sage", 128, 1, 1, pair=True, q_fused=True, cluster=2, **flat)
    assert cfg[("sage", "k128_qf_cnt")] == Sm90Config("sage", 128, 1, 1, q_fused=True, cluster=2, **flat)
    # flat Sage on 128-key tiles (the 128-key kernel, the paired 64-key one): two-CTA clusters by
    # default (config.FLAT_CLUSTER), the one-CTA kernels as k{64,128}_c1[qf]_cnt; every other
    # shape one CTA
    assert cfg[("sage", "k128_cnt")].cluster == 2
    for bk, pair in ((128, {}), (64, {"pair": True})):
        assert cfg[("sage", f"k{bk}_c1_cnt")] == Sm90Config("sage", 128, 1, 1, **flat, **pair)
        assert cfg[("sage", f"k{bk}_c1qf_cnt")] == Sm90Config("sage", 128, 1, 1, q_fused=True, **flat, **pair)
    for bk, knobs in ((64, {"pair": True, "refill": "eager"}), (64, {"wgs": 0}), (128, {"wgs": 1}),
                      (128, {"wgs": 0, "stages": (2, 2)}), (128, {"refill": "eager"})):
        assert Sm90Config.resolve("sage", bk, **knobs).cluster == 1, knobs


def test_variant_names_and_params_are_derived_from_configs():
    """Every variant (shipped and experiments) records its full resolved config, and its name and
    params are those that ``variant_name`` / ``variant_params`` derive from that config: no
    variant is written by hand, and no two share a config (their identity)."""
    from aot import registry
    from aot.experiments import sm90 as experiments
    from aot.kernels.sm90.variants import config_of, variant_name, variant_params

    shipped = {k.name: k.variants for k in registry.all_kernels()}
    for k in experiments.KERNELS:
        names = [v.name for v in k.variants]
        assert len(set(names)) == len(names), names
        idents = {tuple(sorted(v.params.items())) for v in k.variants}
        assert len(idents) == len(names)
        for v in k.variants:
            p = v.params
            cfg = config_of(p)
            tag = f"abl{p['ablate']}" if "ablate" in p else ""
            assert v.name == variant_name(cfg, p["counts"], tag), (v.name, cfg)
            extra = {k: p[k] for k in ("label", "ablate") if k in p}
            assert dict(p) == {**variant_params(cfg, p["counts"]), **extra}, v.name
            assert ("label" in p) == (v.name not in {s.name for s in shipped[k.name]}), v.name


def test_experiments_are_not_part_of_the_shipped_kernels():
    """The experiments (the three-warpgroup subclass, the ablation) live outside aot/kernels: no
    module there or in the runtime imports aot.experiments, the shipped class neither derives from
    the subclass nor takes a flat_wgs=3 config."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in [*(root / "aot" / "kernels").rglob("*.py"), *(root / "python").rglob("*.py"),
                 root / "aot" / "registry.py", root / "aot" / "serving.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n.startswith("aot.experiments") for n in names), path
    pkg = root / "aot" / "kernels" / "sm90"
    tree = ast.parse((pkg / "kernel.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Sm90SparseAttention")
    assert not any("Flat3" in ast.unparse(b) for b in cls.bases)


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
    assert [j.prefix for j in export.plan("x86_64", ["sm_90a"])["test_sm90a"] if "_sm90_bsa_" in j.prefix] == BENCH_SM90
    assert not any("ablate" in v.params or "label" in v.params for k in registry.all_kernels() for v in k.variants)

    with_exp = {k.name: k for k in registry.all_kernels(experiments=True)}
    for k in registry.all_kernels():
        names = [v.name for v in with_exp[k.name].variants]
        assert names[:len(k.variants)] == [v.name for v in k.variants]
    sage = [v.name for v in with_exp["sm90_bsa_sage"].variants]
    assert {"k128_c1ablhalf_cnt", "k128_c1ablall_cnt", "k128_s22_cnt", "k64_eager_cnt", "k128_f3_cnt"} <= set(sage)
    # an experiments build exports them (aot/serving.py filters only what ships)
    exp = {j.prefix for j in export.plan("x86_64", ["sm_90a"], experiments=True)["sm90a"]}
    assert {"sbs_sm90a_sm90_bsa_sage_k128_c1ablhalf_cnt", "sbs_sm90a_sm90_bsa_bf16_k64_ablall_cnt"} <= exp
    assert set(SHIPPED_SM90) <= exp

