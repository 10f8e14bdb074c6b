"""FlashInfer adapters: the torch-free import of the pinned classes, the signature pins, the
kernel specs, one compile+export per kernel (build env), and the runtime marshalling (CPU torch):
every produced argument is packed by the real runtime packer against the registry's specs, and a
pure-torch emulation that reads the inputs *through the kernel-layout views* (as the kernels do)
matches the float64 reference.

Build-env tests are marked ``aot`` and skip without CuTe-DSL; marshalling tests skip without torch.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_dsl = pytest.mark.skipif(not HAS_CUTLASS, reason="needs CuTe-DSL (the build env)")
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch (the test env)")


# ---------------------------------------------------------------------------------------------
# Import trick and pins (pure Python parts run anywhere)


def test_version_mismatch_names_the_fix(monkeypatch):
    from aot.upstream import flashinfer_import as fi

    monkeypatch.setattr(fi, "installed_version", lambda: "0.6.0")
    with pytest.raises(fi.UpstreamMismatch, match=r"pip install --no-deps flashinfer-python==0\.7\.2\.post1"):
        fi.check_version()
    monkeypatch.setattr(fi, "installed_version", lambda: None)
    with pytest.raises(fi.UpstreamMismatch, match="is not installed"):
        fi.check_version()


def test_signature_check_reports_changes():
    from aot.upstream import flashinfer_import as fi

    class Changed:
        def __init__(self, gqa_ratio=1, head_dim=128):  # lost parameters
            pass

        def __call__(self, mQ, mK):
            pass

    with pytest.raises(fi.UpstreamMismatch, match=r"signature of Changed changed") as e:
        fi.check_signatures("sm120_sage", Changed)
    assert "__init__" in str(e.value) and "__call__" in str(e.value)


def test_signature_pins_match_their_own_format():
    from aot.upstream import flashinfer_import as fi

    def f(self, a, b=3, c=None):
        pass

    assert fi.signature_of(f) == (("self", None), ("a", None), ("b", "3"), ("c", "None"))
    assert set(fi.SIGNATURE_PINS) == set(fi.CLASSES)


def test_placeholder_torch_is_scoped(monkeypatch):
    from aot.upstream import flashinfer_import as fi

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(fi.importlib.util, "find_spec", lambda name, *a: None)
    with fi._torch_placeholder_if_missing():
        import torch  # the placeholder

        assert getattr(torch, fi._STUB_MARK)
        assert torch.bfloat16 is torch.bfloat16 and hash(torch.float16) != hash(torch.float32)
        assert isinstance(torch.Tensor, type)
    assert "torch" not in sys.modules


_IMPORT_PROBE = r"""
import sys
import cutlass  # noqa: F401
from aot.upstream import flashinfer_import as fi
for key in fi.CLASSES:
    fi.load_class(key)
fl = sys.modules["flashinfer"]
assert getattr(fl, fi._STUB_MARK, False), "flashinfer/__init__.py was executed"
assert "flashinfer.jit" not in sys.modules and "flashinfer.api_logging" not in sys.modules
had_torch = importlib_util.find_spec("torch") is not None
assert had_torch or "torch" not in sys.modules, "placeholder torch leaked"
print("OK", sorted(k for k in sys.modules if k.startswith("flashinfer"))[:3])
"""


@pytest.mark.aot
@needs_dsl
def test_import_pinned_classes_without_flashinfer_init():
    code = "import importlib.util as importlib_util\n" + _IMPORT_PROBE
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.aot
@needs_dsl
def test_installed_signatures_match_pins():
    from aot.upstream import flashinfer_import as fi

    for key in fi.CLASSES:
        cls = fi.load_class(key)  # raises UpstreamMismatch on any change
        assert fi.source_sha256(key)
        assert cls.__module__ == fi.CLASSES[key][0]


# ---------------------------------------------------------------------------------------------
# Registry entries


def _kernels():
    from aot.kernels import flashinfer_sm100, flashinfer_sm120

    return {k.name: k for k in (*flashinfer_sm120.KERNELS, *flashinfer_sm100.KERNELS)}


def test_registry_entries():
    from aot import registry
    from aot.upstream import flashinfer_import as fi

    ks = _kernels()
    assert set(ks) == {"fi_sm120_sage_fwd", "fi_sm120_bf16_fwd", "fi_sm100_bf16_fwd"}
    assert "aot.kernels.flashinfer_sm120" in registry.KERNEL_MODULES
    assert "aot.kernels.flashinfer_sm100" in registry.KERNEL_MODULES
    for k in ks.values():
        assert k.upstream == fi.UPSTREAM == "flashinfer-python==0.7.2.post1"
    for name in ("fi_sm120_sage_fwd", "fi_sm120_bf16_fwd"):
        assert ks[name].targets == ("sm_120a", "sm_120f") and ks[name].test_targets == ("sm_90a",)
        assert {v.name for v in ks[name].variants} == {
            f"{c}_bs{m}" for c in ("topk", "rows") for m in range(4)
        }
    assert ks["fi_sm100_bf16_fwd"].targets == ("sm_100a", "sm_100f")
    assert not ks["fi_sm100_bf16_fwd"].test_targets
    assert len(ks["fi_sm100_bf16_fwd"].variants) == 10


def test_build_ships_only_the_variants_the_runtime_selects():
    """The kernel modules describe every variant; the build plans the ones a public call reaches
    (aot/serving.py; the backends' selection is driven in the tests below)."""
    from aot import export

    planned: dict[tuple[str, str], set[str]] = {}
    for jobs in export.plan().values():
        for j in jobs:
            if j.kernel.name.startswith("fi_"):
                planned.setdefault((j.kernel.name, j.lib), set()).add(j.variant.name)
    assert planned == {
        ("fi_sm120_sage_fwd", "sm120a"): {"rows_bs0"}, ("fi_sm120_sage_fwd", "sm120f"): {"rows_bs0"},
        ("fi_sm120_sage_fwd", "test_sm90a"): {"rows_bs0"},
        ("fi_sm120_bf16_fwd", "sm120a"): {"rows_bs0"}, ("fi_sm120_bf16_fwd", "sm120f"): {"rows_bs0"},
        ("fi_sm120_bf16_fwd", "test_sm90a"): {"rows_bs0"},
        ("fi_sm100_bf16_fwd", "sm100a"): {"clc_rows_bs_i32", "clc_rows_bs_i64"},
        ("fi_sm100_bf16_fwd", "sm100f"): {"clc_rows_bs_i32", "clc_rows_bs_i64"},
    }


def _shipped(kernel: str) -> set[str]:
    from aot import serving

    return {v.name for v in _kernels()[kernel].variants if serving.is_served(kernel, v.name)}


def _specs(kernel: str, variant) -> list:
    from aot.kernels import flashinfer_sm100, flashinfer_sm120

    p = variant.params
    if kernel == "fi_sm100_bf16_fwd":
        pairs, fixed = flashinfer_sm100.sm100_args(p["has_block_nums"], p["has_block_sizes"])
    else:
        pairs, fixed = flashinfer_sm120._sm120_args(kernel == "fi_sm120_sage_fwd",
                                                    p["has_block_nums"], p["block_sizes_mode"])
    return pairs, fixed


@pytest.mark.parametrize("kernel", ["fi_sm120_sage_fwd", "fi_sm120_bf16_fwd", "fi_sm100_bf16_fwd"])
def test_specs_are_symbolic_and_stream_last(kernel):
    from aot.registry import Sym, StreamArg, TensorArg

    for v in _kernels()[kernel].variants:
        pairs, fixed = _specs(kernel, v)
        specs = [s for s, _ in pairs]
        assert isinstance(specs[-1], StreamArg)
        assert len({s.name for s in specs}) == len(specs)
        # every upstream __call__ parameter is given exactly once: spec'd or fixed
        upstream = {kw for _, kw in pairs} | set(fixed)
        assert len(upstream) == len(pairs) + len(fixed)
        for s in specs:
            if isinstance(s, TensorArg):
                assert len(s.shape) == len(s.stride)
                assert sum(1 for x in s.stride if x == 1) == 1, s  # exactly one unit-stride mode
                for x in s.stride:
                    assert x == 1 or (isinstance(x, Sym) and x.width == 64), s
                for x in s.shape:
                    assert isinstance(x, Sym) or x == 128, s  # only the head dim is static


# ---------------------------------------------------------------------------------------------
# Compile + export (build env): one variant per kernel and target; the build does them all.


@pytest.mark.aot
@needs_dsl
@pytest.mark.parametrize(
    "kernel,variant,target",
    [
        ("fi_sm120_sage_fwd", "rows_bs0", "sm_120a"),
        ("fi_sm120_bf16_fwd", "rows_bs0", "sm_90a"),
        ("fi_sm100_bf16_fwd", "clc_rows_bs_i32", "sm_100a"),
    ],
)
def test_compile_and_export(tmp_path, kernel, variant, target):
    from aot import export

    k = _kernels()[kernel]
    v = next(x for x in k.variants if x.name == variant)
    job = export.Job(target, target, k, v, f"sbs_test_{kernel}_{variant}")
    entry = export.export_job(job, tmp_path, "x86_64")  # cross-checks the header against the spec
    names = [a["name"] for a in entry["args"]]
    assert names == [s.name for s, _ in _specs(kernel, v)[0]]
    assert (tmp_path / f"{job.prefix}.o").stat().st_size > 10_000


# ---------------------------------------------------------------------------------------------
# Runtime marshalling (CPU torch)


def _layouts(kernel: str, variant):
    """Manifest-style argument layouts (what aot.export.arg_layouts records) from the specs."""
    from aot.registry import ScalarArg, Sym, TensorArg

    def enc(x):
        return {"sym": x.key, "div": x.div} if isinstance(x, Sym) else x

    out = []
    for s, _ in _specs(kernel, variant)[0]:
        if isinstance(s, TensorArg):
            out.append({"name": s.name, "kind": "tensor", "dtype": s.dtype, "align": s.align,
                        "shape": [enc(x) for x in s.shape], "stride": [enc(x) for x in s.stride],
                        "shape_ctype": "int32_t", "stride_ctype": "int64_t"})
        elif isinstance(s, ScalarArg):
            out.append({"name": s.name, "kind": "scalar", "dtype": s.dtype, "ctype": "int32_t"})
        else:
            out.append({"name": s.name, "kind": "stream"})
    return out


def _variant(launch) -> str:
    """The registered variant the runtime's parameter selection picks for ``launch``."""
    from subblock_sage.contract import select_variant

    k = _kernels()[launch.kernel]
    return select_variant(launch.kernel, [(x.name, x.params) for x in k.variants], launch.params)


def _pack(launch, shipped: bool = True):
    """Pack with the runtime's own packer (checks dtype, rank, static modes, divisibility, shared
    extents, alignment) against the registry spec of the variant the launch's parameters select,
    which must be one the build ships unless ``shipped=False``."""
    from subblock_sage import abi

    name = _variant(launch)
    if shipped:
        assert name in _shipped(launch.kernel), (launch.kernel, name)
    v = next(x for x in _kernels()[launch.kernel].variants if x.name == name)
    entry = types.SimpleNamespace(name=launch.kernel, variant=name, args=_layouts(launch.kernel, v))
    argv, keep = abi.pack(entry, launch.values, 0)
    return entry, keep


def _fplan(index, counts, topk, Sk, sanitize=False):
    """A 64-key-block Plan from a valid test plan (the public API prepares it with the plan
    kernel); ``sanitize``: repaired by sanitize_plan, which always yields per-row counts."""
    from subblock_sage.plan import Plan, sanitize_plan

    gk = -(-Sk // 64)
    if sanitize:
        index, counts = sanitize_plan(index.contiguous(), counts, topk or 0, gk)
        return Plan(index, counts, 0, 64, Sk)
    return Plan(index.contiguous(), counts, 0 if counts is not None else topk, 64, Sk)


def _out(q, layout):
    """(user-facing out, its BHSD view) like sparse_attention allocates it."""
    import torch

    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    return out, (out.transpose(1, 2) if layout == "BSHD" else out)


def _inputs(B, H, Sq, Sk, layout, seed=0, cap=None, k_bias=0.0):
    import torch

    g = torch.Generator().manual_seed(seed)

    def t(S, bias=0.0):
        x = (torch.randn(B, S, H, 128, generator=g) + bias).to(torch.bfloat16)
        return x if layout == "BSHD" else x.transpose(1, 2).contiguous()

    q, k, v = t(Sq), t(Sk, k_bias), t(Sk)
    gq, gk = -(-Sq // 64), -(-Sk // 64)
    cap = cap or gk + 2
    index = torch.randint(-2, gk + 2, (B, H, gq, cap), generator=g, dtype=torch.int32)
    counts = torch.randint(0, cap + 1, (B, H, gq), generator=g, dtype=torch.int32)
    counts[0, 0, 0] = 0  # an empty row
    index[0, -1, -1, :gk] = torch.randperm(gk, generator=g).int()
    counts[0, -1, -1] = gk  # a dense row
    return q, k, v, index, counts


def _emulate(kernel, values, B, H, Sq, Sk, scale):
    """Attention computed by reading the argument *views* the kernel receives, in the kernel's
    mode order: catches any permutation/stride mistake in the marshalling."""
    import torch

    if kernel == "fi_sm100_bf16_fwd":  # (B, H, S, D) views, index (B, H, Gq, cap)
        Q = lambda b, h: values["q"][b, h]  # noqa: E731
        K = lambda b, h: values["k"][b, h]  # noqa: E731
        V = lambda b, h: values["v"][b, h]  # noqa: E731
        idx = lambda b, h, i: values["q2k_block_index"][b, h, i]  # noqa: E731
        cnt = lambda b, h, i: values["block_counts"][b, h, i] if "block_counts" in values \
            else values["block_sparse_num"]  # noqa: E731
        bs = values.get("block_sizes")
        size = (lambda b, h, j: int(bs[j])) if bs is not None else (lambda b, h, j: 64)
    else:  # (S, D, H, B); V (D, S, H, B); index (cap, Gq, H, B)
        Q = lambda b, h: values["q"][:, :, h, b]  # noqa: E731
        K = lambda b, h: values["k"][:, :, h, b]  # noqa: E731
        V = lambda b, h: values["v"][:, :, h, b].t()  # noqa: E731
        idx = lambda b, h, i: values["q2k_block_index"][:, i, h, b]  # noqa: E731
        cnt = lambda b, h, i: values["block_counts"][i, h, b] if "block_counts" in values \
            else values["block_sparse_num"]  # noqa: E731
        sk = values["k"].shape[0]
        size = lambda b, h, j: min(64, sk - 64 * j)  # noqa: E731  (mode 0: masked by Sk)
    out = torch.zeros(B, H, Sq, 128, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            q, k, v = Q(b, h).double(), K(b, h).double(), V(b, h).double()
            for i in range(-(-Sq // 64)):
                n = int(cnt(b, h, i))
                blocks = [int(x) for x in idx(b, h, i)[:n]]
                assert all(0 <= j < -(-Sk // 64) for j in blocks), blocks  # never out of range
                assert len(set(blocks)) == len(blocks)
                keys = [r for j in blocks for r in range(64 * j, 64 * j + size(b, h, j))]
                if not keys:
                    continue
                rows = slice(64 * i, min(Sq, 64 * i + 64))
                s = q[rows] @ k[keys].t() * scale
                out[b, h, rows] = torch.softmax(s, -1) @ v[keys]
    return out


@needs_torch
@pytest.mark.parametrize("kernel", ["fi_sm120_bf16_fwd", "fi_sm100_bf16_fwd"])
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("block_size_k", [64, 128])
@pytest.mark.parametrize("with_counts", [True, False])
def test_backend_marshalling_matches_reference(monkeypatch, kernel, layout, block_size_k, with_counts):
    """The backends end to end on CPU (up to the launch): validation, plan preparation, views;
    packed against the spec of a *shipped* variant (with or without the caller's counts: prepared
    plans always carry per-row counts), emulated through the views, vs float64."""
    import torch

    from subblock_sage import validation
    from subblock_sage.backends import sm100, sm120
    from subblock_sage.plan import prepare_plan
    from subblock_sage.reference import reference_sparse_attention

    B, H, Sq, Sk = 2, 3, 150, 200
    q, k, v, index, counts = _inputs(B, H, Sq, Sk, layout, seed=block_size_k)
    if block_size_k == 128:
        gk128 = -(-Sk // 128)
        index = index.clamp(max=gk128 + 1)
    monkeypatch.setattr(validation, "check_same_cuda_device", lambda tensors: None)  # CPU tensors
    be = sm100.BACKEND if kernel == "fi_sm100_bf16_fwd" else sm120.BACKEND
    topk = None
    if not with_counts:
        topk, counts = int(counts.max()), None
        index = index.clamp(min=0)  # a topk plan: every row reads topk ids (repeats are dropped)
    args = validation.check_attention_args(q, k, v, index, counts, topk=topk, block_size_k=block_size_k,
                                           softmax_scale=0.1, compute_mode="bf16", layout=layout)
    plan = prepare_plan(args.plan, block_size_k_out=be.plan_block_size_k(block_size_k),
                        check_index=False, capturing=False)  # CPU: the PyTorch path
    plan.verify()
    out = torch.zeros_like(q)
    L = be.launch(args, plan, None, args.canonical(out))
    assert L.kernel == kernel
    _pack(L)
    got = _emulate(kernel, L.values, B, H, Sq, Sk, 0.1)
    ref = reference_sparse_attention(q, k, v, index, counts, topk=topk, block_size_k=block_size_k,
                                     softmax_scale=0.1, layout=layout)
    ref_bhsd = ref.transpose(1, 2) if layout == "BSHD" else ref
    assert torch.allclose(got, ref_bhsd.double(), atol=1e-9, rtol=1e-7)
    # the kernel writes through values["out"]: it must alias the user's out in its layout
    L.values["out"].fill_(1)
    assert bool((out == 1).all())


@needs_torch
@pytest.mark.parametrize("variant_in", ["topk", "rows", "topk_bs1", "rows_bs2", "rows_bs3"])
def test_sm120_sage_marshalling_packs(variant_in):
    import torch

    from subblock_sage.backends import sm120

    B, H, Sq, Sk = 2, 3, 130, 190
    gk = -(-Sk // 64)
    f32 = torch.float32
    q8 = torch.zeros(B, Sq, H, 128, dtype=torch.int8).transpose(1, 2)  # a BSHD-memory view
    k8 = torch.zeros(B, H, Sk, 128, dtype=torch.int8)
    v8 = torch.zeros(B, H, 128, gk * 64, dtype=torch.float8_e4m3fn)
    qs, ks, vs = (torch.ones(B, H, n, dtype=f32) for n in (-(-Sq // 128) * 4, gk, 128))
    _, _, _, index, counts = _inputs(B, H, Sq, Sk, "BHSD")
    rows = variant_in.startswith("rows")
    plan = _fplan(index, counts if rows else None, None if rows else 2, Sk, sanitize=True)
    mode = int(variant_in[-1]) if "_bs" in variant_in else 0
    bsz = {0: None, 1: torch.full((gk,), 64), 2: torch.full((B, gk), 64),
           3: torch.full((B, H, gk), 64)}[mode]
    out, ob = _out(torch.empty(B, Sq, H, 128), "BSHD")
    L = sm120.sm120_sage_launch(q8, k8, v8, qs, ks, vs, plan, ob, out, softmax_scale=0.2,
                             block_sizes=None if bsz is None else bsz.int())
    # sanitize always yields per-row counts (the plan may have lost entries)
    assert L.params == {"has_block_nums": True, "block_sizes_mode": mode} and L.kernel == "fi_sm120_sage_fwd"
    # Only rows_bs0 ships: the public API takes no FlashInfer block_sizes (aot/serving.py). The
    # block-size views stay checked against the kernel module's spec, for a build that adds them.
    assert _variant(L) == f"rows_bs{mode}"
    assert (_variant(L) in _shipped(L.kernel)) == (mode == 0)
    _pack(L, shipped=mode == 0)
    assert L.values["v"].shape == (128, gk * 64, H, B) and L.values["v"].stride(1) == 1
    assert L.values["q"].data_ptr() == q8.data_ptr()  # views, not copies


@needs_torch
def test_sanitize_plan_matches_python_reference():
    import torch

    from subblock_sage.plan import sanitize_plan

    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        B, H, gq, cap, gk = 2, 2, 3, int(torch.randint(1, 9, (1,), generator=g)), 5
        index = torch.randint(-3, gk + 3, (B, H, gq, cap), generator=g, dtype=torch.int32)
        counts = torch.randint(-2, cap + 3, (B, H, gq), generator=g, dtype=torch.int32)
        use_counts = trial % 2 == 0
        topk = int(torch.randint(0, cap + 1, (1,), generator=g))
        new_idx, new_cnt = sanitize_plan(index, counts if use_counts else None, topk, gk)
        assert new_idx.is_contiguous() and new_idx.dtype == new_cnt.dtype == torch.int32
        for b in range(B):
            for h in range(H):
                for i in range(gq):
                    n = max(0, min(cap, int(counts[b, h, i]))) if use_counts else topk
                    want = sorted({x for x in index[b, h, i, :n].tolist() if 0 <= x < gk})  # ascending
                    assert int(new_cnt[b, h, i]) == len(want)
                    assert new_idx[b, h, i, : len(want)].tolist() == want
                    assert not new_idx[b, h, i, len(want):].any()


@needs_torch
def test_sm100_variant_selection_and_key_padding():
    import torch

    from subblock_sage.backends import sm100 as fm

    B, H, Sq = 1, 2, 64
    for Sk in (256, 200):
        q = torch.zeros(B, H, Sq, 128, dtype=torch.bfloat16)
        k = torch.zeros(B, H, Sk, 128, dtype=torch.bfloat16)
        gk = -(-Sk // 64)
        index = torch.arange(gk, dtype=torch.int32).expand(B, H, 1, gk).contiguous()
        # what the backends hand in: a prepared plan, per-row counts -> CLC + block sizes (shipped)
        plan = _fplan(index, torch.full((B, H, 1), 2, dtype=torch.int32), None, Sk, sanitize=True)
        out, ob = _out(q, "BHSD")
        L = fm.sm100_bf16_launch(q, k, k, plan, ob, out)
        assert _variant(L) == "clc_rows_bs_i32"
        _pack(L)
        assert L.values["block_sizes"].tolist()[-1] == (Sk % 64 or 64)
        if Sk % 64:
            assert L.values["k"].shape[2] == gk * 64
            L2 = fm.sm100_bf16_launch(q, k, k, plan, ob, out, unaligned_keys="int64")
            assert _variant(L2) == "clc_rows_bs_i64" and L2.values["k"] is k
            _pack(L2)
        # a scalar-topk plan (only reachable by calling the marshaller directly) selects a topk
        # variant, which the build does not ship
        Lt = fm.sm100_bf16_launch(q, k, k, _fplan(index, None, 2, Sk), ob, out)
        assert _variant(Lt).startswith(("static_topk_", "clc_topk_"))
        assert _variant(Lt) not in _shipped("fi_sm100_bf16_fwd")
        _pack(Lt, shipped=False)
        # empty rows of a prepared plan are launched (the rows variant writes exact zeros) ...
        rows0 = _fplan(index, torch.zeros((B, H, 1), dtype=torch.int32), None, Sk, sanitize=True)
        L0 = fm.sm100_bf16_launch(q, k, k, rows0, ob, out)
        assert _variant(L0) == "clc_rows_bs_i32" and not L0.zero_output
        # ... a direct topk-0 plan is not launched at all (topk variants forbid empty rows)
        plan0 = _fplan(index, None, 0, Sk)
        out.fill_(3)
        assert fm.sm100_bf16_launch(q, k, k, plan0, ob, out).zero_output and not out.any()
    # upstream's Int64 rule: a batch stride of 2**27 elements or more
    big = torch.empty(0, dtype=torch.bfloat16, device="meta").as_strided((2, 1, 64, 128), (1 << 27, 128, 128, 1))
    assert fm.sm100_requires_int64_kv_strides(big, big)
    assert not fm.sm100_requires_int64_kv_strides(big[:1], big[:1])
    assert fm.sm100_use_clc(1, 4, 64, 8, True) and not fm.sm100_use_clc(1, 1, 64, 8, False)
