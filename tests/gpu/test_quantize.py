"""GPU tests of the compiled Sage quantizer (``subblock_sage.quantize_sage``) against the reference.

Contract (aot/kernels/sage_quant/): INT8 codes within one step of the reference, scales to 1e-6
relative, FP8 V within one E4M3 step, pad columns of V exactly zero, every layout / stride mix.
The K quantize step is checked against the reference run with the kernel's own ``k_mean`` (the
mean itself is checked separately), so a last-bit difference in the fp32 mean cannot turn into a
spurious scale mismatch.
"""

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

from subblock_sage.reference import (  # noqa: E402
    SAGE_PERM16,
    dequantize_sage,
    reference_k_mean,
    reference_quantize_sage,
    sage_quant_shapes,
)

from tests.helpers.gpu import poison_allocator  # noqa: E402

KEYS = ("q_int8", "q_scale", "k_int8", "k_scale", "k_mean", "v_fp8", "v_scale")


def _quantize(q, k, v, layout):
    import subblock_sage

    return subblock_sage.quantize_sage(q, k, v, layout=layout)


def _make(B, H, Sq, Sk, *, layout="BSHD", k_bias=3.0, seed=0, packed=False):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda")

    chan = 0.5 + torch.rand(1, 1, H, 128, generator=g, device="cuda")
    bias = k_bias * rnd(1, 1, H, 128)
    if packed:
        assert Sq == Sk and layout == "BSHD"
        qkv = rnd(B, Sk, 3, H, 128) * chan[:, :, None]
        qkv[:, :, 1] += bias
        qkv = qkv.to(torch.bfloat16)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q = (rnd(B, Sq, H, 128) * chan).to(torch.bfloat16)
    k = (rnd(B, Sk, H, 128) * chan + bias).to(torch.bfloat16)
    v = (rnd(B, Sk, H, 128) * chan).to(torch.bfloat16)
    if layout == "BHSD":
        q, k, v = (x.permute(0, 2, 1, 3).contiguous() for x in (q, k, v))
    return q, k, v


def _fp8_step(x: torch.Tensor) -> torch.Tensor:
    """One E4M3 step at |x| (3 mantissa bits; subnormal step 2^-9)."""
    a = x.abs().clamp_min(2.0**-6)
    return torch.exp2(torch.floor(torch.log2(a)) - 3)


def _check(out, q, k, v, layout):
    B = q.shape[0]
    if layout == "BSHD":
        Sq, H, Sk = q.shape[1], q.shape[2], k.shape[1]
    else:
        H, Sq, Sk = q.shape[1], q.shape[2], k.shape[2]
    shapes = sage_quant_shapes(B, H, Sq, Sk)
    for name in KEYS:
        assert name in out, name
        assert tuple(out[name].shape) == shapes[name], (name, tuple(out[name].shape))
        assert out[name].device == q.device
    assert out["q_int8"].dtype == torch.int8 and out["k_int8"].dtype == torch.int8
    assert out["v_fp8"].dtype == torch.float8_e4m3fn
    for name in ("q_scale", "k_scale", "k_mean", "v_scale"):
        assert out[name].dtype == torch.float32, name
    for name in ("q_int8", "k_int8", "v_fp8"):
        assert out[name].is_contiguous(), name

    # K mean: fp32 sum of the sampled keys (contract.sage_k_mean_rows) in a fixed order vs a
    # float64 reference of the same keys
    kf = (k.permute(0, 2, 1, 3) if layout == "BSHD" else k).double()
    mean64 = reference_k_mean(kf).double()
    assert torch.allclose(out["k_mean"].double(), mean64, rtol=1e-5, atol=1e-4)

    ref = reference_quantize_sage(q, k, v, layout=layout, k_mean=out["k_mean"])

    for name in ("q_scale", "k_scale", "v_scale"):
        torch.testing.assert_close(out[name], ref[name], rtol=1e-6, atol=0, msg=name)
    for name in ("q_int8", "k_int8"):
        d = (out[name].int() - ref[name].int()).abs()
        assert int(d.max()) <= 1, (name, int(d.max()))
        assert float((d > 0).float().mean()) < 1e-3, name  # ties only

    v8 = out["v_fp8"].view(torch.uint8)
    r8 = ref["v_fp8"].view(torch.uint8)
    a, b = out["v_fp8"].float(), ref["v_fp8"].float()
    assert not torch.isnan(a).any()
    assert torch.all((a - b).abs() <= _fp8_step(b)), "v_fp8 differs by more than one E4M3 step"
    assert float((v8 != r8).float().mean()) < 5e-3
    # pad columns (tokens >= Sk) are exact +0
    Sp = v8.shape[3]
    valid = torch.zeros(Sp, dtype=torch.bool, device=v8.device)
    t = torch.arange(Sk, device=v8.device)
    perm = torch.tensor(SAGE_PERM16, device=v8.device)
    valid[(t // 16) * 16 + perm[t % 16]] = True
    assert int(v8[..., ~valid].int().sum()) == 0

    # round trip sanity
    deq = dequantize_sage(out, seqlen_k=Sk)
    vf = (v.permute(0, 2, 1, 3) if layout == "BSHD" else v).float()
    rel = float((deq["v"] - vf).norm() / vf.norm())
    assert rel < 0.04, rel


CASES = [
    # B, H, Sq, Sk
    (1, 1, 128, 64),
    (2, 3, 200, 77),  # ragged: Sq % 128 != 0, Sk % 64 != 0
    (1, 2, 33, 1000),
    (2, 3, 1, 1),
    (1, 14, 4133, 3001),
    # sage_quant_kv: 32-block (2048-key) statistics groups, a short last group; 128-row Q CTAs
    # (the redo tickets: test_v_keys_above_the_bound_are_quantized_again)
    (2, 1, 257, 2049),  # H=1, B>1, one key past a group, one row past a Q CTA
    (2, 2, 129, 4097),
    (1, 3, 511, 20000),
    (3, 5, 300, 6143),
    # launch 2 interleaves Q tiles with K/V tickets: more Q tiles than the interleave takes (the
    # rest run after the K/V tickets; the bug this catches left them unwritten)
    (1, 14, 8192, 64),
    (2, 7, 4096, 100),
]


@pytest.mark.parametrize("B,H,Sq,Sk", CASES)
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_quantize_matches_reference(B, H, Sq, Sk, layout):
    q, k, v = _make(B, H, Sq, Sk, layout=layout, seed=B * 7 + Sq + Sk)
    poison_allocator()
    out = _quantize(q, k, v, layout)
    torch.cuda.synchronize()
    _check(out, q, k, v, layout)


@pytest.mark.parametrize("S", [77, 640, 1031])
def test_quantize_packed_qkv_views(S):
    q, k, v = _make(2, 3, S, S, packed=True, seed=S)
    assert not q.is_contiguous()
    poison_allocator()
    out = _quantize(q, k, v, "BSHD")
    torch.cuda.synchronize()
    _check(out, q, k, v, "BSHD")


def test_quantize_strided_bhsd_views():
    # BHSD views with padded strides: slices along H and S of bigger tensors
    g = torch.Generator(device="cuda").manual_seed(5)
    big = torch.randn(2, 5, 300, 128, generator=g, device="cuda").to(torch.bfloat16)
    q = big[:, 1:4, 10:210]
    k = big[:, 0:3, 7:150] + 2.0
    v = big[:, 2:5, 100:243]
    poison_allocator()
    out = _quantize(q, k, v, "BHSD")
    torch.cuda.synchronize()
    _check(out, q, k, v, "BHSD")


def test_quantize_deterministic_and_stream_ordered():
    q, k, v = _make(1, 4, 513, 1537, seed=3)
    a = _quantize(q, k, v, "BSHD")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        b = _quantize(q, k, v, "BSHD")
    s.synchronize()
    torch.cuda.synchronize()
    for name in KEYS:
        x, y = a[name], b[name]
        if x.dtype == torch.float8_e4m3fn:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert torch.equal(x, y), name


def test_quantize_large_bias_k_smoothing():
    # a large per-channel K bias: the smoothed codes must use the full INT8 range per block
    q, k, v = _make(1, 2, 256, 4096, k_bias=20.0, seed=9)
    out = _quantize(q, k, v, "BSHD")
    torch.cuda.synchronize()
    _check(out, q, k, v, "BSHD")
    assert torch.all(out["k_int8"].reshape(1, 2, -1, 64 * 128).abs().amax(-1) == 127)


@pytest.mark.parametrize("B,H,Sk", [(2, 3, 5000), (1, 2, 20000), (1, 3, 77)])
def test_v_keys_above_the_bound_are_quantized_again(B, H, Sk):
    """A V unit is quantized in its only read with ``v_scale_of(bound)`` (4x the amax of V's
    sample keys); where a key off the sample exceeds the bound the head's redo tickets quantize
    its units again with the exact amax (after each unit's done slot: the codes must end as the
    reference's, never the first pass's). Here: an outlier on key 1 of one head (off the sample
    at Sk > 512; at Sk = 77 every key is sampled and no redo happens), a channel zero on the
    sample but for one key in the last head; the other heads keep the bound. 20000 keys: 157
    units per head, two rows of done slots, 10 redo tickets per head. Outputs as the
    reference's, bit-identical on a second call (the redo is deterministic too)."""
    from subblock_sage.contract import sage_k_mean_rows

    q, k, v = _make(B, H, 200, Sk, seed=Sk)
    n, stride = sage_k_mean_rows(Sk)
    v[0, 1, 0, 3] = 300.0  # (BSHD: b, s, h, d)
    v[-1, :, -1, 7] = 0.0
    v[-1, stride + 1, -1, 7] = -0.75
    poison_allocator()
    out = _quantize(q, k, v, "BSHD")
    torch.cuda.synchronize()
    _check(out, q, k, v, "BSHD")
    assert float(out["v_scale"][0, 0, 3]) == pytest.approx(300.0 / 2.25 * (4.0 if Sk <= n else 1.0), rel=1e-6)
    if Sk > n:
        assert float(out["v_scale"][-1, -1, 7]) == pytest.approx(0.75 / 2.25, rel=1e-6)
    again = _quantize(q, k, v, "BSHD")
    torch.cuda.synchronize()
    from tests.helpers.gpu import quant_equal

    quant_equal(again, out)


def test_v_bound_clamped_below_the_largest_bf16():
    """4x a sampled amax near bf16's largest value would overflow fp32: the bound is clamped to
    2**126, so such a channel takes its exact amax (through the redo) and its scale stays
    finite."""
    q, k, v = _make(1, 2, 64, 600, seed=4)
    v[0, 5, 1, 2] = 3.0e38  # key 5: sampled (n = 512, stride 1)
    out = _quantize(q, k, v, "BSHD")
    torch.cuda.synchronize()
    ref = reference_quantize_sage(q, k, v, layout="BSHD", k_mean=out["k_mean"])
    assert torch.isfinite(out["v_scale"]).all()
    torch.testing.assert_close(out["v_scale"], ref["v_scale"], rtol=1e-6, atol=0)
    a, b = out["v_fp8"].float(), ref["v_fp8"].float()
    assert torch.all((a - b).abs() <= _fp8_step(b))


def _plan_values(B, H, Sq, Sk, *, counts, split, seed):
    from subblock_sage.contract import ceil_div
    from tests.helpers.plan_reference import random_plan

    bk = 64 * split
    G, nkb, cap = ceil_div(Sq, 64), ceil_div(Sk, bk), 9
    index, cnt = random_plan(B, H, G, cap, nkb, torch.Generator().manual_seed(seed))
    cnt[0, 0, -1] = -3  # negative count
    cnt[-1, -1, 0] = cap + 4  # count above capacity
    values = {"q2k_block_index": index.cuda(),
              "out_index": torch.full((B, H, G, cap * split), -77, dtype=torch.int32, device="cuda"),
              "out_counts": torch.full((B, H, G), -77, dtype=torch.int32, device="cuda"),
              "summary": torch.zeros(4, dtype=torch.int32, device="cuda"),
              "num_key_blocks": nkb, "split": split, "num_out_blocks": ceil_div(Sk, 64)}
    if counts:
        values["block_counts"] = cnt.cuda()
    else:
        values["topk"] = cap - 2
    return values, index, (cnt if counts else None)


@pytest.mark.parametrize("B,H,Sq,Sk", [(2, 3, 200, 2049), (1, 1, 700, 333), (2, 2, 1031, 5000)])
@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("counts", [True, False])
def test_quantize_with_plan_role(B, H, Sq, Sk, split, counts):
    """Launch 1 with the plan role (quantize_canonical(plan_values=...)): the quantizer outputs are
    bit-identical to a call without a plan (and match the reference), the plan outputs and the
    summary match the plan reference (bad ids, repeats, negative / too-large counts, 128 -> 64
    split with a partial last block)."""
    from subblock_sage.ops.quantize import quantize_canonical
    from tests.helpers.gpu import quant_equal
    from tests.helpers.plan_reference import check_prepared, prepare_reference

    q, k, v = _make(B, H, Sq, Sk, seed=Sq + Sk + split)
    want = _quantize(q, k, v, "BSHD")
    torch.cuda.synchronize()
    values, index, cnt = _plan_values(B, H, Sq, Sk, counts=counts, split=split, seed=Sk + split)
    poison_allocator()
    got = quantize_canonical(q, k, v, plan_values=values, plan_counts=counts)
    torch.cuda.synchronize()
    quant_equal(got, want)
    _check(got, q, k, v, "BSHD")
    rows, summary = prepare_reference(index, cnt, values.get("topk", 0), values["num_key_blocks"], split,
                                      values["num_out_blocks"])
    check_prepared(values["out_index"], values["out_counts"], rows)
    assert values["summary"].tolist() == summary
    assert summary[2] > 0 and summary[3] > 0  # the plan did have bad ids and repeats
    if counts:
        assert summary[0] == 3 and summary[1] == 13


@pytest.mark.parametrize("nkb", [32768, 32769])
def test_plan_role_at_the_bitmap_split(nkb):
    """The plan role takes 8 rows per CTA while 1/8 of its bitmap holds a row's key blocks
    (``sage_quant.schedule.plan_rows``: up to 32768), 4 above: ids up to the last key block, repeats and
    bad ids on both sides of the switch give the plan reference's outputs and summary. Twelve
    rows: a CTA with all 8 warps busy and one with 4 (run 86's try wrote past the bitmap when
    warps 4-7 zeroed their share, and was taken out until the index was fixed)."""
    from subblock_sage.ops.quantize import quantize_canonical
    from tests.helpers.plan_reference import check_prepared, prepare_reference

    B, H, Sq, Sk = 1, 1, 200, nkb * 64
    q, k, v = _make(B, H, Sq, Sk, seed=nkb)
    G, cap = 4, 6
    index = torch.tensor([[nkb - 1, 0, nkb - 1, nkb, 7, -1], [nkb // 2, nkb - 2, 3, 3, 1, 2],
                          [5, 4, 3, 2, 1, 0], [nkb - 1, nkb - 3, nkb + 5, 9, 9, 8]], dtype=torch.int32).view(1, 1, G, cap)
    cnt = torch.tensor([6, 5, 0, 4], dtype=torch.int32).view(1, 1, G)
    gen = torch.Generator().manual_seed(nkb)
    more = torch.randint(-2, nkb + 3, (1, 1, 8, cap), generator=gen, dtype=torch.int32)
    more[..., 0] = nkb - 1  # each row reaches the last key block
    index = torch.cat([index, more], dim=2)
    cnt = torch.cat([cnt, torch.tensor([6, 1, 3, 0, 6, 2, 5, 4], dtype=torch.int32).view(1, 1, 8)], dim=2)
    G = index.shape[2]
    values = {"q2k_block_index": index.cuda(), "block_counts": cnt.cuda(),
              "out_index": torch.full((B, H, G, cap), -77, dtype=torch.int32, device="cuda"),
              "out_counts": torch.full((B, H, G), -77, dtype=torch.int32, device="cuda"),
              "summary": torch.zeros(4, dtype=torch.int32, device="cuda"),
              "num_key_blocks": nkb, "split": 1, "num_out_blocks": nkb}
    quantize_canonical(q, k, v, plan_values=values, plan_counts=True)
    torch.cuda.synchronize()
    rows, summary = prepare_reference(index, cnt, 0, nkb, 1, nkb)
    check_prepared(values["out_index"], values["out_counts"], rows)
    assert values["summary"].tolist() == summary
    assert summary[2] >= 2 and summary[3] >= 2  # at least the first four rows' bad ids and repeats


def test_quantize_plan_with_other_batch_refused():
    """The plan's B and H are q's: a plan of another batch size is refused before the launch."""
    from subblock_sage.ops.quantize import quantize_canonical

    q, k, v = _make(2, 3, 200, 300, seed=1)
    values, _, _ = _plan_values(1, 3, 200, 300, counts=True, split=1, seed=1)
    with pytest.raises(ValueError, match=r"has \(B, H\) = \(1, 3\) but q has \(2, 3\)\. Fix: prepare the plan"):
        quantize_canonical(q, k, v, plan_values=values)


@pytest.mark.parametrize("Sq,Sk", [(300, 333), (8192, 1000)])
def test_quantize_without_q_gives_the_same_k_and_v(Sq, Sk):
    """``with_q=False`` (the Q-fused sm_90a kernel's quantizer pass: launch 2 without Q tiles)
    writes the same K/V outputs, bit for bit, and no Q outputs."""
    from subblock_sage.ops.quantize import quantize_canonical

    q, k, v = _make(2, 3, Sq, Sk, layout="BSHD", seed=Sq + Sk)
    full = quantize_canonical(q, k, v)
    poison_allocator()
    kv = quantize_canonical(q, k, v, with_q=False)
    torch.cuda.synchronize()
    assert set(full) - set(kv) == {"q_int8", "q_scale"}
    for name, t in kv.items():
        assert torch.equal(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t,
                           full[name].view(torch.uint8) if t.dtype == torch.float8_e4m3fn else full[name]), name


def _stream_buffer():
    """The current stream's quantizer buffer (``workspace.sync_buffer``'s) as the runtime holds it."""
    from subblock_sage import workspace

    dev = torch.cuda.current_device()
    return workspace.streams[(dev, torch.cuda.current_stream().cuda_stream)].sync


def _counter(buf):
    """(tickets of the running launch, epoch) from the buffer's 64-bit counter (words 0-1)."""
    lo, hi = (int(x) & 0xFFFFFFFF for x in buf[:2].tolist())
    return lo, hi


@pytest.mark.parametrize("plan", [False, True])
def test_stream_buffer_is_never_refilled(plan):
    """The quantizer's workspace is the stream's own buffer, zeroed once (eighteenth session:
    each launch tags the slots it writes with its epoch, and its last ticket resets the ticket
    count and advances the epoch). Calls of different shapes back to back on one buffer (a small
    one after a large one leaves stale slots of older epochs behind) give bit-identical outputs
    to calls each on a fresh buffer; after each launch the ticket count is 0 and the epoch one
    more, with or without the plan role (whose CTAs take no ticket); a second stream has its
    own buffer."""
    from subblock_sage import workspace
    from subblock_sage.ops.quantize import quantize_canonical
    from tests.helpers.gpu import quant_equal

    shapes = [(2, 3, 200, 5000), (1, 1, 70, 333), (1, 2, 1031, 64), (2, 3, 200, 5000)]
    inputs = [_make(*s, seed=i) for i, s in enumerate(shapes)]

    def call(x, i):
        if not plan:
            return _quantize(*x, "BSHD")
        values, _, _ = _plan_values(*shapes[i], counts=True, split=2, seed=i)
        return quantize_canonical(*x, plan_values=values, plan_counts=True)

    want = []
    for i, x in enumerate(inputs):
        workspace.release_workspaces()  # a fresh zeroed buffer per call
        want.append(call(x, i))
        torch.cuda.synchronize()
        _check(want[-1], *x, "BSHD")
        assert _counter(_stream_buffer()) == (0, 1)
    workspace.release_workspaces()
    poison_allocator()
    got = [call(x, i % len(inputs)) for i, x in enumerate(inputs * 3)]  # no sync between them
    torch.cuda.synchronize()
    for i, g in enumerate(got):
        quant_equal(g, want[i % len(inputs)])
    assert _counter(_stream_buffer()) == (0, len(got))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        again = call(inputs[0], 0)
        side_buf = _stream_buffer()
    torch.cuda.synchronize()
    quant_equal(again, want[0])
    assert side_buf.data_ptr() != _stream_buffer().data_ptr() and _counter(side_buf) == (0, 1)


def test_stream_buffer_across_the_epoch_wrap():
    """Epochs are 32-bit: the launches at 2**32 - 2, 2**32 - 1, 0 and 1 (the counter set by
    hand on a zeroed buffer) tag their slots 0xFFFFFFFD, 0xFFFFFFFF, 1 and 3, all different and
    never the 0 of a zeroed slot, and give the outputs of a fresh buffer. (A buffer is zeroed
    again every SAGE_SYNC_EPOCHS launches, so stale slots of 2**31 launches ago never meet a
    repeated tag: tests/cpu/test_replay.py.)"""
    from subblock_sage import workspace
    from tests.helpers.gpu import quant_equal

    x = _make(2, 3, 200, 5000, seed=5)
    workspace.release_workspaces()
    want = _quantize(*x, "BSHD")
    torch.cuda.synchronize()
    buf = _stream_buffer()
    buf.zero_()
    buf[1] = -2  # epoch 2**32 - 2
    for epoch in (0xFFFFFFFE, 0xFFFFFFFF, 0, 1):
        assert _counter(buf) == (0, epoch)
        quant_equal(_quantize(*x, "BSHD"), want)
        torch.cuda.synchronize()
    assert _counter(buf) == (0, 2)
