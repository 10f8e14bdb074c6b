"""Bad input to every public function gets a clear TypeError/ValueError before any launch.

Everything here runs without a GPU: dtype / rank / shape / stride / scale / layout / plan-shape
checks come before the device check, so they are exercised on ``meta`` tensors (no memory, any
size) and CPU tensors; device checks are exercised with CPU and mixed-device tensors; plan
*value* checks (which run on the plan's device) are exercised on CPU through the validation
function the GPU path uses. A launch or library load during any of these is a test failure.
"""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

import subblock_sage  # noqa: E402
from subblock_sage import validation  # noqa: E402
from tests.helpers.bad_input import (  # noqa: E402
    ATTN_CASES, BF16, I32, META, QUANT_CASES, SCALAR_CASES, plan, qkv, t,
)



@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Any library load or kernel launch is a bug here: bad input must be refused first."""
    from subblock_sage import abi, loader

    def boom(*a, **k):
        raise AssertionError("a kernel library was loaded or a kernel launched for bad input")

    monkeypatch.setattr(loader, "library_for_device", boom)
    monkeypatch.setattr(loader, "library_for_target", boom)
    monkeypatch.setattr(abi, "launch", boom)
    monkeypatch.setattr(abi, "prepare", boom)


def attn(q, k, v, idx, cnt=None, **kw):
    return subblock_sage.sparse_attention(q, k, v, idx, cnt, **kw)


@pytest.mark.parametrize("name", sorted(ATTN_CASES))
def test_sparse_attention_bad_input(name):
    build, exc, msg = ATTN_CASES[name]
    a = build()
    with pytest.raises(exc, match=msg):
        attn(a["q"], a["k"], a["v"], a["idx"], a["cnt"])


@pytest.mark.parametrize("name", sorted(ATTN_CASES))
def test_bad_input_reported_before_device(name):
    """The same mistakes on CPU tensors give the same error, not "must be on a CUDA device"."""
    build, exc, msg = ATTN_CASES[name]
    a = build()
    if any(isinstance(x, torch.Tensor) and x.numel() > 2**26 for x in a.values()):
        pytest.skip("too large to allocate on CPU")
    cpu = {n: _to_cpu(x) for n, x in a.items()}
    with pytest.raises(exc, match=msg):
        attn(cpu["q"], cpu["k"], cpu["v"], cpu["idx"], cpu["cnt"])


def _to_cpu(x):
    """A CPU tensor with x's shape, strides and dtype (meta -> cpu)."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.numel() == 0:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
    span = 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride()))
    return torch.zeros(span, dtype=x.dtype).as_strided(x.shape, x.stride())


@pytest.mark.parametrize("name", sorted(SCALAR_CASES))
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_sparse_attention_bad_scalars(name, device):
    kw, exc, msg = SCALAR_CASES[name]
    q, k, v = qkv(device=device)
    idx, cnt = plan(device=device)
    with pytest.raises(exc, match=msg):
        attn(q, k, v, idx, cnt, **kw)


@pytest.mark.parametrize("topk", [4, -1, 2.5, True, "2", 10**12])
def test_topk_out_of_range(topk):
    q, k, v = qkv()
    idx, _ = plan(cap=3)
    with pytest.raises(ValueError, match="topk must be an int in 0..capacity"):
        attn(q, k, v, idx, None, topk=topk)


def test_topk_ignored_when_counts_given():
    q, k, v = qkv(device="cpu")
    idx, cnt = plan(cap=3, device="cpu")
    # the plan is fine, so the only complaint is the device
    with pytest.raises(ValueError, match="CUDA device"):
        attn(q, k, v, idx, cnt, topk=99)


OUT_CASES = {
    "out_fp32": (lambda q: t(*q.shape, dtype=torch.float32), TypeError, "out must be torch.bfloat16"),
    "out_shape": (lambda q: t(1, 201, 2, 128), ValueError, "out must have q's shape"),
    "out_not_tensor": (lambda q: 3, TypeError, "out must be a torch.Tensor"),
    "out_overlapping": (lambda q: t(1, 1, 2, 128).expand(1, 200, 2, 128), ValueError, "must not overlap"),
    "out_head_strided": (lambda q: t(1, 200, 128, 2).transpose(2, 3), ValueError, "contiguous in its last"),
}


@pytest.mark.parametrize("name", sorted(OUT_CASES))
def test_out_bad(name):
    build, exc, msg = OUT_CASES[name]
    q, k, v = qkv()
    idx, cnt = plan()
    with pytest.raises(exc, match=msg):
        attn(q, k, v, idx, cnt, out=build(q))


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_layout_mismatch_reported_as_shape(layout):
    """BHSD tensors passed as BSHD (a classic mistake) fail on shapes, with both shapes named."""
    q, k, v = qkv(layout="BHSD" if layout == "BSHD" else "BSHD", Sq=200, Sk=300, H=2)
    idx, cnt = plan()
    with pytest.raises(ValueError, match=r"q and k must have the same number of heads \(MHA\), got 200 and 300"):
        attn(q, k, v, idx, cnt, layout=layout)


# ---------------------------------------------------------------------------------------------
# Devices


def test_cpu_tensors_refused():
    q, k, v = qkv(device="cpu")
    idx, cnt = plan(device="cpu")
    with pytest.raises(ValueError, match=r"q must be on a CUDA device, got cpu \(move it with .cuda\(\)\)"):
        attn(q, k, v, idx, cnt)


def test_meta_tensors_refused():
    q, k, v = qkv()
    idx, cnt = plan()
    with pytest.raises(ValueError, match="must be on a CUDA device, got meta"):
        attn(q, k, v, idx, cnt)


@pytest.mark.parametrize("which", ["k", "v", "idx", "cnt", "out"])
def test_mixed_devices_refused(which):
    q, k, v = qkv(device="cpu")
    idx, cnt = plan(device="cpu")
    args = dict(q=q, k=k, v=v, idx=idx, cnt=cnt, out=torch.empty_like(q))
    args[which] = args[which].to(META)
    with pytest.raises(ValueError, match="all tensors must be on one CUDA device"):
        attn(args["q"], args["k"], args["v"], args["idx"], args["cnt"], out=args["out"])


# ---------------------------------------------------------------------------------------------
# quantize_sage


@pytest.mark.parametrize("name", sorted(QUANT_CASES))
def test_quantize_sage_bad_input(name):
    build, exc, msg = QUANT_CASES[name]
    a = build()
    with pytest.raises(exc, match=msg):
        subblock_sage.quantize_sage(a["q"], a["k"], a["v"])


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_quantize_sage_device_and_layout(device):
    q, k, v = qkv(device=device)
    with pytest.raises(ValueError, match="layout must be one of"):
        subblock_sage.quantize_sage(q, k, v, layout="NHD")
    with pytest.raises(ValueError, match="CUDA device"):
        subblock_sage.quantize_sage(q, k, v)
    with pytest.raises(ValueError, match="one CUDA device"):
        subblock_sage.quantize_sage(q, torch.empty_like(k, device="cpu" if device == "meta" else "meta"), v)


# ---------------------------------------------------------------------------------------------
# Plan values: checked by plan.prepare_plan on the plan's device (CPU tensors take its PyTorch
# path here; tests/gpu/test_bad_input_gpu.py covers the plan kernel's path).


def _check_plan(idx, cnt, *, topk=None, Sq=200, Sk=300, bk=64, check_values=False):
    from subblock_sage.plan import prepare_plan

    B, H = idx.shape[:2]
    p = validation.check_routing_plan(idx, cnt, topk, B=B, H=H, Sq=Sq, Sk=Sk, block_size_k=bk)
    prepared = prepare_plan(p, block_size_k_out=bk, check_index=check_values, capturing=False)
    prepared.verify()  # bad values raise here, before any attention launch
    return p


@pytest.mark.parametrize("bad", [-1, -(2**31), 5, 2**31 - 1])
def test_index_out_of_range(bad):
    idx, cnt = plan(cap=3, device="cpu")
    cnt.fill_(2)
    idx[0, 1, 2, 1] = bad  # live slot (count 2): ceil(300/64) = 5 key blocks
    _check_plan(idx, cnt)  # skipped by default (the kernels skip such entries)
    with pytest.raises(ValueError, match=r"q2k_block_index\[0, 1, 2, 1\] = .* is outside \[0, 5\)"):
        _check_plan(idx, cnt, check_values=True)


def test_index_out_of_range_in_dead_slot_is_fine():
    idx, cnt = plan(cap=3, device="cpu")
    cnt.fill_(2)
    idx[..., 2] = -7  # past every row's count: never read
    _check_plan(idx, cnt, check_values=True)


def test_index_range_follows_block_size_k():
    idx, cnt = plan(cap=3, device="cpu")
    idx[0, 0, 0, 0] = 2  # ceil(300/128) = 3 key blocks of 128: ok; with 64: ok
    _check_plan(idx, cnt, bk=128, check_values=True)
    idx[0, 0, 0, 0] = 3
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        _check_plan(idx, cnt, bk=128, check_values=True)


@pytest.mark.parametrize("bad", [4, -1, 2**31 - 1, -(2**31)])
def test_counts_above_capacity_or_negative(bad):
    idx, cnt = plan(cap=3, device="cpu")
    cnt[0, 0, 3] = bad
    _check_plan(idx, cnt)  # default: no raise; clamped on the device, never read back (issue 19)
    with pytest.raises(ValueError, match=r"block_counts values must be in 0..capacity \(3\)"):
        _check_plan(idx, cnt, check_values=True)  # check_plan=True refuses them


def test_topk_fills_counts():
    idx, _ = plan(cap=3, device="cpu")
    p = _check_plan(idx, None, topk=2)
    assert p.counts is None and p.topk == 2 and p.capacity == 3
    p = _check_plan(idx, None)
    assert p.topk == 3
    assert p.num_key_blocks == 5 and p.index.is_contiguous()


def test_noncontiguous_plan_made_contiguous():
    idx = torch.zeros(1, 2, 4, 6, dtype=I32)[..., ::2]
    cnt = torch.ones(1, 2, 8, dtype=I32)[..., ::2]
    p = _check_plan(idx, cnt, check_values=True)
    assert p.index.is_contiguous() and p.counts.is_contiguous()


def test_plan_on_other_device():
    idx, cnt = plan(device="cpu")
    q, k, v = qkv()
    with pytest.raises(ValueError, match="all tensors must be on one CUDA device, got .*q2k_block_index on cpu"):
        attn(q, k, v, idx, cnt)


# ---------------------------------------------------------------------------------------------
# Other public functions


def test_validate_startup_bad_args():
    with pytest.raises(ValueError, match="compute_mode must be one of"):
        subblock_sage.validate_startup(compute_mode="int4")
    with pytest.raises(ValueError, match="CUDA device"):
        subblock_sage.validate_startup(device="cpu")


def test_preload_bad_device():
    with pytest.raises(ValueError, match="CUDA device"):
        subblock_sage.preload("cpu")


def test_sglang_runner_bad_input():
    from subblock_sage.integrations.sglang import make_runner

    with pytest.raises(ValueError, match="compute_mode must be one of"):
        make_runner(compute_mode="int8")
    with pytest.raises(ValueError, match="block_size_k must be one of"):
        make_runner(compute_mode="bf16", block_size_k=96)
    run = make_runner(compute_mode="bf16")
    q, k, v = qkv()
    idx, cnt = plan()
    with pytest.raises(TypeError, match="bfloat16"):
        run(q.float(), k, v, idx, 3, 0.1, cnt)
    with pytest.raises(ValueError, match="finite"):
        run(q, k, v, idx, 3, float("nan"), cnt)
    with pytest.raises(ValueError, match="topk"):
        run(q, k, v, idx, 4, 0.1)
    with pytest.raises(ValueError, match="CUDA device"):
        run(q, k, v, idx, 3, 0.1, cnt)


# ---------------------------------------------------------------------------------------------
# The checks are traceable: torch.compile(fullgraph=True) sees one custom op per public call.


class _Traced(Exception):
    pass


def _trace(fn, *args, dynamic=False, aot=False):
    """Compile ``fn`` with fullgraph=True and return the FX graph code (nothing is executed)."""
    graphs = []

    def backend(gm, example_inputs):
        if aot:
            from torch._functorch.aot_autograd import aot_module_simplified

            def fw(gm2, ex2):
                graphs.append(gm2)
                return lambda *a: (_ for _ in ()).throw(_Traced("traced"))

            return aot_module_simplified(gm, example_inputs, fw_compiler=fw)
        graphs.append(gm)
        return lambda *a: (_ for _ in ()).throw(_Traced("traced"))

    torch._dynamo.reset()
    with pytest.raises(_Traced, match="traced"):
        torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    torch._dynamo.reset()
    return graphs[0].code


@pytest.fixture
def cuda_check_off(monkeypatch):
    """Tracing on CPU tensors: the only check that cannot pass here is 'is it CUDA'."""
    monkeypatch.setattr(validation, "check_same_cuda_device", lambda tensors: None)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("aot", [False, True])
def test_compile_fullgraph_traces_custom_ops(cuda_check_off, dynamic, aot):
    def f(q, k, v, idx, cnt):
        o = subblock_sage.sparse_attention(q, k, v, idx, cnt, compute_mode="bf16", softmax_scale=0.1)
        r = subblock_sage.quantize_sage(q, k, v)
        return o * 2, r["q_int8"], r["v_fp8"]

    q, k, v = qkv(device="cpu")
    idx, cnt = plan(device="cpu")
    code = _trace(f, q, k, v, idx, cnt, dynamic=dynamic, aot=aot)
    assert "subblock_sage.sparse_attention" in code and "subblock_sage.quantize_sage" in code


def test_compile_fullgraph_out_variant(cuda_check_off):
    def g(q, k, v, idx, out):
        subblock_sage.sparse_attention(q, k, v, idx, None, topk=2, out=out, layout="BHSD")
        return out

    q, k, v = qkv(device="cpu", layout="BHSD")
    idx, _ = plan(device="cpu")
    code = _trace(g, q, k, v, idx, torch.empty_like(q), dynamic=True)
    assert "subblock_sage.sparse_attention_out" in code


def test_compile_still_validates(cuda_check_off):
    """A bad call fails at trace time with the same clear error."""
    def f(q, k, v, idx):
        return subblock_sage.sparse_attention(q, k, v, idx, softmax_scale=-1.0)

    q, k, v = qkv(device="cpu")
    idx, _ = plan(device="cpu")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="softmax_scale must be finite and > 0"):
        torch.compile(f, backend="eager", fullgraph=True)(q, k, v, idx)
    torch._dynamo.reset()


def test_fake_impls_match_the_contract():
    """Meta-device calls (the fake impls) give the documented shapes, dtypes and strides."""
    for layout in ("BSHD", "BHSD"):
        q, k, v = qkv(B=2, Sq=200, Sk=300, H=3, layout=layout)
        idx, cnt = plan(B=2, H=3, Sq=200)
        o = torch.ops.subblock_sage.sparse_attention(q, k, v, idx, cnt, None, 64, 0.1, "bf16", layout, False)
        assert o.shape == q.shape and o.dtype == BF16 and o.is_contiguous()
        res = torch.ops.subblock_sage.quantize_sage(q, k, v, layout)
        shapes = [tuple(x.shape) for x in res]
        assert shapes == [(2, 3, 200, 128), (2, 3, 8), (2, 3, 300, 128), (2, 3, 5), (2, 3, 128, 320),
                          (2, 3, 128), (2, 3, 128)]
        assert [x.dtype for x in res] == [torch.int8, torch.float32, torch.int8, torch.float32,
                                          torch.float8_e4m3fn, torch.float32, torch.float32]


def test_opcheck_schema_and_fake():
    q, k, v = qkv(device="meta")
    idx, cnt = plan(device="meta")
    for op, args in (
        (torch.ops.subblock_sage.sparse_attention.default,
         (q, k, v, idx, cnt, None, 64, 0.1, "sage_fp8", "BSHD", False)),
        (torch.ops.subblock_sage.quantize_sage.default, (q, k, v, "BSHD")),
    ):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_eager_shortcut_leaves_modes_and_subclasses_to_the_operator(cuda_check_off):
    """Plain eager calls skip the dispatcher; under a dispatch mode (here FakeTensorMode) or with
    a tensor subclass the wrappers must still go through torch.ops (fake impl, mode handlers)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from subblock_sage.validation import eager

    q, k, v = qkv(device="cpu")
    idx, cnt = plan(device="cpu")
    assert eager(q, k, v, idx, cnt, None)

    class Sub(torch.Tensor):
        pass

    assert not eager(q.as_subclass(Sub), k, v)
    for i in range(6):  # a subclass in any position, the optional ones included
        args = [q, k, v, idx, cnt, q.clone()]
        args[i] = args[i].as_subclass(Sub)
        assert not eager(*args), i
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fq, fk, fv, fi, fc = (mode.from_tensor(x) for x in (q, k, v, idx, cnt))
        assert not eager(fq, fk, fv)
        o = subblock_sage.sparse_attention(fq, fk, fv, fi, fc, compute_mode="bf16")
        r = subblock_sage.quantize_sage(fq, fk, fv)
    assert isinstance(o, FakeTensor) and o.shape == q.shape and o.dtype == BF16
    assert isinstance(r["q_int8"], FakeTensor) and r["q_int8"].dtype == torch.int8
