"""`subblock-sage bench`'s SGLang-like shapes and plans without a GPU, and the lab bench's
(benchmark/lab, never shipped) block-sparse contenders (FlexAttention's BlockMask from the plan and
its eager output against the float64 reference on CPU; cuDNN's block-sparse attention and SGLang's
AOT SM90 kernel up to the GPU: their one-line notes), the contender group's in-turn timing and its
ours_x column, and the options."""

from __future__ import annotations

import math
import sys
import types
import warnings

import pytest

from benchmark.lab import bench as lab
from benchmark.lab import contenders as ctd
from benchmark.lab import cudnn_fp8
from subblock_sage.tools import bench

torch = pytest.importorskip("torch")


# ---- shapes, plan sets, options ----------------------------------------------------------------------

def test_sglang_preset_and_plan_sets():
    assert bench.resolve_shapes("sglang") == ((2, 37760), (6, 37760), (14, 37760))
    assert bench.resolve_plans("sglang") == "sglang"
    assert bench.resolve_plans("host") == bench.resolve_plans() == "standard"
    assert bench.resolve_plans("host", "sglang") == "sglang" and bench.resolve_plans("sglang", "standard") == "standard"
    assert [p[0] for p in bench.PLAN_SETS["sglang"]] == ["sglang 0.75", "0.25 random", "1.0"]
    assert bench.PLAN_SETS["standard"] is bench.PLANS
    with pytest.raises(ValueError, match="unknown plan set 'x'; one of standard, sglang"):
        bench.resolve_plans(None, "x")


def test_parse_contender_options():
    own, ns = lab.parse_args(["--shapes", "sglang", "--plans", "standard", "--test-libs", "/x", "--no-contenders"])
    assert (ns.shapes, ns.plans, own.test_libs, own.no_contenders) == ("sglang", "standard", "/x", True)
    own, ns = lab.parse_args([])
    assert (ns.plans, own.test_libs, own.no_contenders) == (None, None, False)


def test_test_libs_option_then_env(monkeypatch):
    monkeypatch.delenv(ctd.TEST_LIBS_ENV, raising=False)
    assert ctd.test_libs_dir(None) is None
    monkeypatch.setenv(ctd.TEST_LIBS_ENV, "/env/libs")
    assert ctd.test_libs_dir(None) == "/env/libs"
    assert ctd.test_libs_dir("/opt/libs") == "/opt/libs"


# ---- SGLang-like plans ---------------------------------------------------------------------------------

@pytest.mark.parametrize("gk,sparsity,g,want", [(590, 0.75, 8, 152), (295, 0.75, 1, 74), (64, 0.75, 8, 16),
                                                (10, 0.75, 8, 8), (5, 0.0, 8, 5), (590, 0.9, 8, 64)])
def test_sglang_topk(gk, sparsity, g, want):
    # min(Gk, ceil(ceil((1 - sparsity) * Gk) / g) * g), written out for each case
    assert bench.sglang_topk(gk, sparsity, g) == want
    assert bench.sglang_granularity(64) == 8 and bench.sglang_granularity(128) == 1


@pytest.mark.parametrize("bk,topk", [(64, 152), (128, 74)])
def test_sglang_plan_is_what_sglangs_backend_hands_over(bk, topk):
    H, S = 2, 37760
    index, counts = bench.make_plan(1, H, S, S, 0.25, "sglang", block_size_k=bk, device="cpu")
    gq, gk = math.ceil(S / 64), math.ceil(S / bk)
    assert index.shape == (1, H, gq, gk) and index.dtype == counts.dtype == torch.int32  # capacity Gk
    n_dense = math.ceil(0.1 * gq)
    assert n_dense == 59
    assert (counts[..., :n_dense] == gk).all() and (counts[..., n_dense:] == topk).all()
    assert (index[..., :n_dense, :] == torch.arange(gk, dtype=torch.int32)).all()
    # every row a permutation of the key blocks (the kept ones first)
    assert (index.sort(dim=-1).values == torch.arange(gk, dtype=torch.int32)).all()
    prefix = index[..., n_dense:, :topk]
    ascending = bool((prefix[..., 1:] > prefix[..., :-1]).all())
    assert ascending is (bk == 64)  # SGLang's caller sorts 64-key (SM90 bf16) plans
    # routed rows differ between rows and heads (random scores stand in for the router's)
    assert not torch.equal(index[0, 0, n_dense], index[0, 0, n_dense + 1])
    assert not torch.equal(index[0, 0, n_dense:], index[0, 1, n_dense:])
    kept = bench.kept_flops(counts, bk, S, S, H) / (4 * 128)
    assert kept == H * 64 * bk * (n_dense * gk + (gq - n_dense) * topk)


def test_sorted_prefix_keeps_ids_and_counts():
    index = torch.tensor([[[[5, 1, 3, 0, 2, 4], [4, 2, 0, 1, 3, 5], [1, 0, 2, 3, 4, 5]]]], dtype=torch.int32)
    counts = torch.tensor([[[3, 6, 0]]], dtype=torch.int32)
    got = lab.sorted_prefix(index, counts)
    assert got.tolist() == [[[[1, 3, 5, 0, 2, 4], [0, 1, 2, 3, 4, 5], [1, 0, 2, 3, 4, 5]]]]
    assert index.tolist()[0][0][0] == [5, 1, 3, 0, 2, 4]  # a copy


# ---- FlexAttention ---------------------------------------------------------------------------------------

def _plan_blocks(index, counts, gk):
    B, H, gq, cap = index.shape
    out = torch.zeros(B, H, gq, gk, dtype=torch.bool)
    for b in range(B):
        for h in range(H):
            for i in range(gq):
                for j in index[b, h, i, : int(counts[b, h, i])].tolist():
                    out[b, h, i, j] = True
    return out


@pytest.mark.parametrize("S,cap", [(256, 4), (256, 2), (200, 2), (200, 4)])
def test_flex_block_mask_is_the_plan(S, cap):
    """to_dense() of the BlockMask is the plan's block matrix (capacity below the number of key
    blocks, a ragged last block, an empty row); the ragged last block is partial (its mask_mod
    hides keys >= Sk), every other kept block full."""
    gk = math.ceil(S / 64)
    g = torch.Generator().manual_seed(S + cap)
    index = torch.stack([torch.randperm(gk, generator=g)[:cap] for _ in range(2 * gk)]).view(1, 2, gk, cap).int()
    counts = torch.randint(1, cap + 1, (1, 2, gk), generator=g, dtype=torch.int32)
    counts[0, 1, 0] = 0
    mask = ctd.flex_block_mask(index, counts, S, S)
    want = _plan_blocks(index, counts, gk)
    assert torch.equal(mask.to_dense().bool()[..., :gk, :gk], want)
    assert mask.BLOCK_SIZE == (64, 64)
    partial = torch.zeros_like(want)
    for b, h, i in ((0, h, i) for h in range(2) for i in range(gk)):
        for j in mask.kv_indices[b, h, i, : int(mask.kv_num_blocks[b, h, i])].tolist():
            partial[b, h, i, j] = True
    ragged = S % 64 != 0
    assert torch.equal(partial[..., : gk - 1], torch.zeros_like(partial[..., : gk - 1]))
    assert torch.equal(partial[..., gk - 1], want[..., gk - 1] if ragged else torch.zeros_like(want[..., gk - 1]))
    # the mask_mod states the plan: kept block and key < Sk
    t = torch.tensor
    for i in range(gk):
        for j in range(gk):
            assert mask.mask_mod(0, 1, t(64 * i + 5), t(64 * j)).item() is bool(want[0, 1, i, j])
        if ragged:
            assert mask.mask_mod(0, 0, t(64 * i), t(S)).item() is False  # past Sk, in the last block


@pytest.mark.parametrize("S,cap", [(256, 2), (200, 4), (320, 5)])
def test_flex_contender_equals_the_reference_on_cpu(S, cap):
    """FlexAttention (eager on CPU: it evaluates the mask_mod, the plan, on every score) gives the
    float64 reference's output on a tiny plan: ragged Sk, capacity below Gk, an empty row."""
    from subblock_sage.reference import reference_sparse_attention

    gk = math.ceil(S / 64)
    g = torch.Generator().manual_seed(7 * S + cap)
    q, k, v = (torch.randn(1, S, 2, 128, generator=g) for _ in range(3))
    index = torch.stack([torch.randperm(gk, generator=g)[:cap] for _ in range(2 * gk)]).view(1, 2, gk, cap).int()
    counts = torch.randint(1, cap + 1, (1, 2, gk), generator=g, dtype=torch.int32)
    counts[0, 0, 1] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's "eager is slow, compile it" warning
        built = ctd.build_flex(q, k, v, index, counts, compiled=False)
        out = built.call()
    assert built.name == ctd.FLEX and built.note == "eager"
    ref = reference_sparse_attention(q, k, v, index, counts)
    got = out.transpose(1, 2).double()
    assert (got - ref).abs().max().item() < 1e-5
    assert got[0, 64:128, 0].abs().max().item() == 0.0  # the empty row: exact zeros
    scale = 0.05  # a softmax scale other than 1/sqrt(D) reaches it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ctd.build_flex(q, k, v, index, counts, scale, compiled=False).call()
    ref = reference_sparse_attention(q, k, v, index, counts, softmax_scale=scale)
    assert (out.transpose(1, 2).double() - ref).abs().max().item() < 1e-5


# ---- cuDNN block-sparse and SGLang's SM90 kernel: notes ----------------------------------------------

def test_cudnn_bsa_missing_frontend_is_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)
    with pytest.raises(ctd.Unavailable, match=r"^cudnn block-sparse bf16: skipped: nvidia-cudnn-frontend is not "
                                              r"importable .*pip install nvidia-cudnn-frontend to add it$"):
        ctd.load_cudnn_bsa()


def _fake_cudnn(monkeypatch, version, bsa):
    """A cudnn frontend package of ``version`` in ``sys.modules`` whose
    ``cudnn.block_sparse_attention`` is ``bsa`` (None: not importable)."""
    fake = types.ModuleType("cudnn")
    fake.__version__ = version
    fake.__path__ = []
    monkeypatch.setitem(sys.modules, "cudnn", fake)
    monkeypatch.setitem(sys.modules, "cudnn.block_sparse_attention", bsa)


def test_cudnn_bsa_frontend_without_the_api_is_a_note(monkeypatch):
    _fake_cudnn(monkeypatch, "1.9.0", None)  # a package without block_sparse_attention
    with pytest.raises(ctd.Unavailable, match=r"nvidia-cudnn-frontend 1.9.0 has no "
                                              r"cudnn.block_sparse_attention.block_sparse_attention_forward"):
        ctd.load_cudnn_bsa()


def test_cudnn_bsa_without_the_dsl_is_a_note(monkeypatch):
    bsa = types.ModuleType("cudnn.block_sparse_attention")
    bsa.block_sparse_attention_forward = lambda *a, **k: None
    _fake_cudnn(monkeypatch, "1.32.0", bsa)
    monkeypatch.setitem(sys.modules, "cutlass", None)
    with pytest.raises(ctd.Unavailable, match="compiles CuTe-DSL kernels at first call") as e:
        ctd.load_cudnn_bsa()
    note = str(e.value)
    assert "\n" not in note and "compiles CuTe-DSL kernels at first call" in note
    assert "nvidia-cutlass-dsl is not importable" in note and "1.32.0" in note


def test_cudnn_bsa_call_passes_the_plan():
    seen = {}

    def forward(q, k, v, index, **kw):
        seen.update(kw, index=index)
        return {"o_tensor": q}

    q = torch.zeros(1, 128, 2, 128)
    index, counts = torch.zeros(1, 2, 2, 2, dtype=torch.int32), torch.ones(1, 2, 2, dtype=torch.int32)
    built = ctd.build_cudnn_bsa(forward, q, q, q, index, counts, 0.1)
    assert built.call() is q and built.note.startswith("compiles at first use: ")
    assert seen["index"] is index and seen["q2k_block_nums"] is counts
    assert (seen["sparse_block_size"], seen["layout"], seen["softmax_scale"], seen["allow_empty_block_nums"]) == \
        (64, "bshd", 0.1, True)


def _fake_sglang_sm90(monkeypatch, load):
    mod = types.ModuleType("benchmark.lab.sglang_sm90")
    mod.load = load
    monkeypatch.setitem(sys.modules, "benchmark.lab.sglang_sm90", mod)
    import benchmark.lab as tools

    monkeypatch.setattr(tools, "sglang_sm90", mod, raising=False)
    return mod


def test_sglang_sm90_module_missing_is_a_note(monkeypatch):
    import benchmark.lab as tools

    monkeypatch.setitem(sys.modules, "benchmark.lab.sglang_sm90", None)  # a checkout without it
    monkeypatch.delattr(tools, "sglang_sm90", raising=False)
    with pytest.raises(ctd.Unavailable, match=r"^sglang sm90 bf16 \(AOT\): skipped: benchmark.lab.sglang_sm90 "
                                              r"is not importable"):
        ctd.load_sglang_sm90("/libs")


def test_sglang_sm90_not_found_is_a_note_with_its_reason(monkeypatch):
    mod = _fake_sglang_sm90(monkeypatch, lambda test_libs_dir=None: None)
    mod.load_failure = ("SGLang's SM90 kernel: skipped: no libsubblock_sage_test_sm90a.so in /libs; build it "
                        "with SBS_TEST_LIBS=ON ./wheels/build.sh\nand set SUBBLOCK_SAGE_TEST_LIBS")
    with pytest.raises(ctd.Unavailable, match="no libsubblock_sage_test_sm90a.so in /libs") as e:
        ctd.load_sglang_sm90("/libs")
    assert str(e.value) == (ctd.SGLANG_SM90 + ": skipped: no libsubblock_sage_test_sm90a.so in /libs; build it "
                            "with SBS_TEST_LIBS=ON ./wheels/build.sh and set SUBBLOCK_SAGE_TEST_LIBS")


def test_sglang_sm90_real_module_without_a_library_is_a_note(tmp_path, monkeypatch):
    monkeypatch.delenv("SUBBLOCK_SAGE_TEST_LIBS", raising=False)
    monkeypatch.delenv("SUBBLOCK_SAGE_TEST_LIB_DIR", raising=False)
    with pytest.raises(ctd.Unavailable, match="skipped: no ") as e:
        ctd.load_sglang_sm90(str(tmp_path))
    note = str(e.value)
    assert note.startswith(ctd.SGLANG_SM90 + ": skipped: no ") and str(tmp_path) in note and "\n" not in note


def test_sglang_sm90_runs_with_sglangs_arguments(monkeypatch):
    calls = []

    class Kernel:
        def run(self, q, k, v, index, counts, scale, out=None):
            calls.append((index, counts, scale, out))
            return out

    seen_dir = []
    _fake_sglang_sm90(monkeypatch, lambda d=None: seen_dir.append(d) or Kernel())
    kernel = ctd.load_sglang_sm90("/libs")
    assert seen_dir == ["/libs"]
    q = torch.zeros(1, 128, 2, 128, dtype=torch.bfloat16)
    index, counts = torch.zeros(1, 2, 2, 2, dtype=torch.int32), torch.ones(1, 2, 2, dtype=torch.int32)
    built = ctd.build_sglang_sm90(kernel, q, q, q, index, counts)
    out = built.call()
    assert len(calls) == 2  # the first call (setup) and this one, into one buffer
    assert calls[0][3] is calls[1][3] is out and out.shape == q.shape
    assert calls[1][0] is index and calls[1][1] is counts and calls[1][2] == pytest.approx(128 ** -0.5)


def test_load_contenders_collects_notes(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)
    monkeypatch.setitem(sys.modules, "benchmark.lab.sglang_sm90", None)
    monkeypatch.setitem(sys.modules, "benchmark.lab.cudnn_sm90", None)
    notes = []
    loaded = lab.load_contenders(notes, "/libs")
    assert list(loaded) == [ctd.FLEX]
    assert [n.split(":")[0] for n in notes] == [ctd.CUDNN_BSA, ctd.SGLANG_SM90, ctd.CUDNN_BSA_BF16]


def test_lab_hooks_add_the_rows_where_the_bench_had_them(monkeypatch):
    """The lab's ``Extra`` (``bench.run(..., extra=Lab(...))``): at start one note per contender
    that cannot run (cuDNN's FP8 SDPA first, as before the move), no contender group without a
    bf16 mode, and the dense Sage kernel alternated with cuDNN's FP8 SDPA only after a sage_fp8
    kernel-only row on a dense plan, while the shape's FP8 call lives (end_shape drops it)."""
    monkeypatch.setitem(sys.modules, "cudnn", None)
    monkeypatch.setitem(sys.modules, "benchmark.lab.sglang_sm90", None)
    monkeypatch.setitem(sys.modules, "benchmark.lab.cudnn_sm90", None)
    ctx = bench.Context(lib=None, backend=None, modes=["bf16", "sage_fp8"], sampler=_FakeSampler(), reps=3,
                        warm_s=0.0, notes=[])
    extra = lab.Lab(test_libs="/libs")
    extra.start(ctx)
    assert [n.split(":")[0] for n in ctx.notes] == [cudnn_fp8.ROW, ctd.CUDNN_BSA, ctd.SGLANG_SM90, ctd.CUDNN_BSA_BF16]
    assert extra.cudnn_mod is None and list(extra.loaded) == [ctd.FLEX]
    assert extra.shape_rows(ctx) == []  # no FP8 row without the frontend
    quiet = bench.Context(lib=None, backend=None, modes=["sage_fp8"], sampler=None, reps=3, warm_s=0.0, notes=[])
    off = lab.Lab(cudnn=False)
    off.start(quiet)
    assert quiet.notes == [] and off.loaded is None and off.plan_rows(quiet, None, None, 64, "p") == []
    seen = []
    monkeypatch.setattr(lab, "alternated", lambda calls, *a, **k: seen.append(list(calls)) or ["alternated row"])
    extra.fp8_call = lambda: "fp8"
    kern = lambda: "ours"  # noqa: E731
    assert extra.kernel_rows(ctx, "bf16", "1.0 bk64", 1.0, kern) == []
    assert extra.kernel_rows(ctx, "sage_fp8", "0.25 random bk64", 0.25, kern) == []
    assert extra.kernel_rows(ctx, "sage_fp8", "1.0 bk128", 1.0, kern) == ["alternated row"]
    assert seen == [["sage_fp8 (kernel only)", cudnn_fp8.ROW]]
    extra.end_shape(ctx)
    assert extra.fp8_call is None and extra.kernel_rows(ctx, "sage_fp8", "1.0 bk128", 1.0, kern) == []
    assert isinstance(extra, bench.Extra) and extra.columns == lab.COLUMNS and set(bench.COLUMNS) < set(lab.COLUMNS)


# ---- the group: in turn, one power state, ours_x ---------------------------------------------------------

class _FakeSampler:
    def __init__(self):
        self.samples = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.samples = [(1750, 690.0, 0)]


def test_alternated_against_ours(monkeypatch):
    """Timed in turn (A B C A B C), ours_x = our kept-block rate / the row's: its ms / ours on the
    plan's rows, the throughput ratio against the dense row (its FLOPs are the dense ones)."""
    order = []
    ms = {"ours": 2.0, "flex": 3.0, "dense": 4.0}

    def fake_time_ms(fn, reps, warm_s):
        order.append(fn())
        return ms[order[-1]]

    monkeypatch.setattr(lab, "time_ms", fake_time_ms)
    calls = {lab.OURS_BF16: lambda: "ours", ctd.FLEX: lambda: "flex", lab.SDPA_CUDNN: lambda: "dense"}
    dense_flops, kept = 4e12, 1e12
    rows = lab.alternated(calls, (2, 37760), "sglang 0.75 bk64", _FakeSampler(), 20, 1.0, dense_flops, None,
                          rounds=2, kept={lab.OURS_BF16: kept, ctd.FLEX: kept, "sdpa cudnn dense bf16": dense_flops},
                          dense_names=("sdpa cudnn dense bf16",), versus=lab.OURS_BF16)
    assert order == ["ours", "flex", "dense"] * 2
    ours, flex, dense = rows
    assert "ours_x" not in ours and "vs_fp8" not in ours
    assert flex["ours_x"] == 1.5 and flex["plan"] == "sglang 0.75 bk64"
    assert dense["plan"] == "dense" and dense["ours_x"] == round((kept / 2.0) / (dense_flops / 4.0), 3)
    assert flex["kept_tflops"] == round(kept / 3.0 / 1e9, 1) and dense["kept_tflops"] == dense["dense_tflops"]
    assert "ours_x" in lab.format_table(rows).splitlines()[0]
    lines = lab.header("GPU", 20, 1.0, 0, rows)
    assert any(line.startswith("contender groups") and "ours_x" in line for line in lines)


def test_first_use_column_after_the_rest():
    row = {"contender": "flex_attention bf16, alternated x3", "ms": 1.0, "first_use": "compiles at first use: 40.1 s, "
           "excluded"}
    head = lab.format_table([row]).splitlines()[0].split()
    assert head[-1] == "first_use"
