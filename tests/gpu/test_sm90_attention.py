"""GPU tests of the SM90a (Hopper) block-sparse attention kernels through the public API.

``subblock_sage.sparse_attention(..., compute_mode=...)`` against the float64/float32 reference
(:func:`subblock_sage.reference.reference_sparse_attention`) on ragged shapes (B=2, H=3, Sq and Sk
not multiples of 64/128), variable counts, empty and dense rows, out-of-range / negative /
repeated indices, BSHD and BHSD layouts, strided views, both key-block sizes, with and without
``block_counts``. Skipped without a GPU; only meaningful on compute capability 9.0.
"""

import math

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)
pytestmark = [
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
        reason="the sm_90a kernels run on H100/H200 only",
    ),
]

from subblock_sage.reference import reference_sparse_attention  # noqa: E402

from tests.helpers import accuracy  # noqa: E402
from tests.helpers.gpu import pair_plan  # noqa: E402

def _mk(B, S, H, layout, gen, bias=0.0):
    if layout == "BSHD":
        x = torch.randn(B, S, H, 128, generator=gen)
    else:
        x = torch.randn(B, H, S, 128, generator=gen)
    if bias:
        x = x + bias * torch.randn(128, generator=gen)
    return x.to(torch.bfloat16).cuda()


def _plan(B, H, gq, gk, cap, gen, *, junk=True, repeats=True):
    idx = torch.full((B, H, gq, cap), -1, dtype=torch.int32)
    for b in range(B):
        for h in range(H):
            for i in range(gq):
                p = torch.randperm(gk, generator=gen)[: min(cap, gk)]
                idx[b, h, i, : len(p)] = p.int()
    if junk:  # out-of-range and negative ids: skipped
        bad = torch.rand(B, H, gq, cap, generator=gen) < 0.15
        vals = torch.where(torch.rand(B, H, gq, cap, generator=gen) < 0.5, -3, gk + 5).int()
        idx = torch.where(bad, vals, idx)
    if repeats and cap >= 3:  # repeated ids count once
        idx[1, 2, 0, 1] = idx[1, 2, 0, 0]
        idx[0, 0, gq - 1, 2] = idx[0, 0, gq - 1, 0]
    counts = torch.randint(0, cap + 1, (B, H, gq), generator=gen, dtype=torch.int32)
    counts[0, 0, 0] = 0  # empty row -> exact zeros
    if gq > 1:  # dense row
        counts[0, 1, 1] = min(cap, gk)
        idx[0, 1, 1, : min(cap, gk)] = torch.randperm(gk, generator=gen)[: min(cap, gk)].int()
    counts[1, 2, 0] = max(int(counts[1, 2, 0]), 3)
    return idx.cuda(), counts.cuda()


def _check(got, ref, mode, layout="BSHD"):
    """Bounds on the whole tensor, every 64-row query block, every head and every channel
    (tests/helpers/accuracy.py; the old whole-tensor-only check let one wrong block through)."""
    assert got.dtype == torch.bfloat16
    accuracy.check_attention(got, ref, mode, layout, what=mode)


def _check_sage_dequantized(got, q, k, v, idx, counts, layout="BSHD", **kw):
    """Sage against exact attention on the quantizer's own (dequantized) outputs: a much tighter
    bound, so a layout or scale bug cannot hide in quantization noise."""
    import subblock_sage

    quant = subblock_sage.quantize_sage(q, k, v, layout=layout)
    ref = accuracy.dequantized_reference(quant, idx, counts, layout=layout, **kw)
    accuracy.check_attention(got, ref, accuracy.DEQUANT_BOUNDS, layout, what="sage_fp8 vs dequantized")


CASES = [
    # Sq, Sk, block_size_k, layout, with counts
    (300, 333, 64, "BSHD", True),
    (257, 1000, 64, "BHSD", True),
    (300, 333, 128, "BSHD", True),
    (130, 700, 128, "BHSD", False),
    (64, 64, 64, "BSHD", False),
    (1000, 2100, 128, "BSHD", True),
]


def _alt_backend():
    """The backend running the other Sage CTA shape of both key blocks from the test library (the
    bench-only ``k64_flat_cnt``, ``k128_ws_cnt``: benchmark/lab/test_library.py); skips without it."""
    from benchmark.lab.test_library import sm90_backend

    be, why = sm90_backend(sage_alt_shape={64, 128})
    if be is None:
        pytest.skip(why)
    return be


@pytest.fixture(params=["default", "alt", "int8q"])
def sage_shape(request):
    """Every shipped Sage kernel per key block: the default (flat: k64 the paired kernel, two
    plan entries per 128-key tile; k128 one entry per tile) quantizing its own Q tile
    (``k*_qf_cnt``), the same kernels on the quantizer's INT8 Q (``int8q``), and the other CTA
    shape (k64: the one-entry flat kernel; k128: warp-specialised). The replay cache is cleared
    around each: a recorded call of the same signature would otherwise replay the launches of
    the policy it was recorded under."""
    from subblock_sage import backends, replay
    from subblock_sage.backends.sm90 import BACKEND
    from subblock_sage.contract import SM90_SHAPES
    from subblock_sage.loader import library_for_device

    lib = library_for_device(torch.cuda.current_device())
    sage = [e.params for (k, _), e in lib.kernels.items() if k == "sm90_bsa_sage"]
    replay.clear()
    request.addfinalizer(replay.clear)
    if request.param == "default":
        # the test shapes are small: below the runtime's size bound for the Q-fused kernel
        be = BACKEND.with_policy(q_fused_min_ctas=0)
        have = {p["block_k"] for p in sage if p["q_fused"]}
        assert have == {64, 128}, f"Q-fused Sage kernels shipped for {sorted(have)}-key plans, not both"
    elif request.param == "int8q":
        be = BACKEND.with_policy(q_fused=False)
    else:
        be = _alt_backend()
        test_sage = [e.params for (k, _), e in be.library.kernels.items()
                     if k == "sm90_bsa_sage"]
        for bk in (64, 128):  # the one export per key block in the other CTA shape (test library)
            have = [p for p in test_sage
                    if p["block_k"] == bk and (p["wgs"], p["pair"]) == SM90_SHAPES[("sage", bk)]["alt"]]
            assert len(have) == 1, have
    with backends.using(be):
        yield request.param


@pytest.mark.parametrize("mode", ["bf16", "sage_fp8"])
@pytest.mark.parametrize("Sq,Sk,bk,layout,with_counts", CASES)
def test_sparse_attention_matches_reference(mode, Sq, Sk, bk, layout, with_counts, sage_shape):
    import subblock_sage

    if mode == "bf16" and sage_shape != "default":
        pytest.skip("one kernel per key block for bf16")

    gen = torch.Generator().manual_seed(Sq * 7 + Sk + bk)
    B, H = 2, 3
    q, k, v = _mk(B, Sq, H, layout, gen), _mk(B, Sk, H, layout, gen, bias=3.0), _mk(B, Sk, H, layout, gen)
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / bk)
    cap = gk + 3
    idx, counts = _plan(B, H, gq, gk, cap, gen)
    kw = dict(block_size_k=bk, compute_mode=mode, layout=layout)
    if with_counts:
        got = subblock_sage.sparse_attention(q, k, v, idx, counts, **kw)
        ref = reference_sparse_attention(q, k, v, idx, counts, block_size_k=bk, layout=layout)
    else:
        topk = max(1, gk // 2)
        got = subblock_sage.sparse_attention(q, k, v, idx, None, topk=topk, **kw)
        ref = reference_sparse_attention(q, k, v, idx, None, topk=topk, block_size_k=bk, layout=layout)
    torch.cuda.synchronize()
    _check(got, ref.to(got.device), mode, layout)
    if mode == "sage_fp8":
        _check_sage_dequantized(got, q, k, v, idx, counts if with_counts else None, layout, block_size_k=bk,
                                topk=None if with_counts else topk)
    if with_counts:  # the empty row is exactly zero
        rows = got[0, :64, 0] if layout == "BSHD" else got[0, 0, :64]
        assert (rows == 0).all()


@pytest.mark.parametrize("share", [None, 1])
@pytest.mark.parametrize("tail", [0, 1, 3, 1000])
@pytest.mark.parametrize("Sq,Sk,bk,layout,with_counts", CASES)
def test_bf16_tail_split_matches_reference(tail, share, Sq, Sk, bk, layout, with_counts):
    """The test library's ``tail`` bf16 kernels with their last ``tail`` pairs of query blocks split
    (``kernel.ws_split``: two CTAs of one query block each, the plan row's entries halved between
    the consumers and merged in shared memory; 0: the 1-D grid, nothing split; 1000: every pair) on
    the plans of the test above (out-of-range, negative and repeated ids; empty, dense and
    0..cap-entry rows, so halves of 0 and 1 entries; ragged Sq, so a split pair's second block past
    Sq), with and without the shared ring (``share`` None: kv_share where rows can be dense; 1: one
    ring per row), against the float64 reference and the shipped kernel."""
    import subblock_sage
    from subblock_sage.backends.sm90 import BACKEND

    from benchmark.lab.test_library import sm90_backend

    be, why = sm90_backend(bf16_tail=tail, bf16_cluster=share)
    if be is None:
        pytest.skip(why)

    gen = torch.Generator().manual_seed(Sq * 5 + Sk + bk + tail)
    B, H = 2, 3
    q, k, v = _mk(B, Sq, H, layout, gen), _mk(B, Sk, H, layout, gen, bias=3.0), _mk(B, Sk, H, layout, gen)
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / bk)
    idx, counts = _plan(B, H, gq, gk, gk + 3, gen)
    topk = None if with_counts else max(1, gk // 2)
    kw = dict(block_size_k=bk, compute_mode="bf16", layout=layout, topk=topk)
    cnt = counts if with_counts else None
    got = subblock_sage.sparse_attention(q, k, v, idx, cnt, backend=be, **kw)
    whole = subblock_sage.sparse_attention(q, k, v, idx, cnt, backend=BACKEND.with_policy(bf16_cluster=share), **kw)
    ref = reference_sparse_attention(q, k, v, idx, cnt, topk=topk, block_size_k=bk, layout=layout)
    torch.cuda.synchronize()
    _check(got, ref.to(got.device), "bf16", layout)
    torch.testing.assert_close(got, whole, atol=2e-2, rtol=2e-2)
    if with_counts:  # the empty row is exactly zero
        rows = got[0, :64, 0] if layout == "BSHD" else got[0, 0, :64]
        assert (rows == 0).all()


@pytest.mark.parametrize("mode", ["bf16", "sage_fp8"])
def test_strided_views_and_scales(mode):
    """q/k/v as slices of one packed QKV tensor; custom softmax scales."""
    import subblock_sage

    gen = torch.Generator().manual_seed(3)
    B, S, H = 2, 200, 3
    qkv = torch.randn(B, S, 3, H, 128, generator=gen).to(torch.bfloat16).cuda()
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    gq = gk = math.ceil(S / 64)
    idx, counts = _plan(B, H, gq, gk, gk, gen, junk=False, repeats=False)
    for scale in (0.05, 0.3):
        got = subblock_sage.sparse_attention(q, k, v, idx, counts, softmax_scale=scale, compute_mode=mode)
        ref = reference_sparse_attention(q, k, v, idx, counts, softmax_scale=scale)
        torch.cuda.synchronize()
        _check(got, ref.to(got.device), mode)
        if mode == "sage_fp8":
            _check_sage_dequantized(got, q, k, v, idx, counts, softmax_scale=scale)


@pytest.mark.parametrize("mode", ["bf16", "sage_fp8"])
def test_out_argument_and_all_empty(mode):
    import subblock_sage

    gen = torch.Generator().manual_seed(5)
    B, S, H = 2, 100, 3
    q, k, v = (_mk(B, S, H, "BSHD", gen) for _ in range(3))
    gq = math.ceil(S / 64)
    idx = torch.zeros(B, H, gq, 2, dtype=torch.int32, device="cuda")
    counts = torch.zeros(B, H, gq, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    got = subblock_sage.sparse_attention(q, k, v, idx, counts, compute_mode=mode, out=out)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    assert (out == 0).all()


@pytest.mark.parametrize("bk", [64, 128])
def test_sage_long_dense_row_two_level_accumulation(bk, sage_shape):
    """A 32768-key dense row with a non-zero-mean V: FP8 P.V accumulated in the MMA alone (about
    13 mantissa bits kept) loses the small late tiles; the two-level FP32 accumulation must not
    (docs/design/kernels-sm90.md: single-level gave output gain 0.797 here)."""
    import subblock_sage

    gen = torch.Generator().manual_seed(11)
    B, H, Sq, Sk = 1, 2, 128, 32768
    q, k = _mk(B, Sq, H, "BSHD", gen), _mk(B, Sk, H, "BSHD", gen, bias=2.0)
    v = (torch.randn(B, Sk, H, 128, generator=gen) + 0.5).to(torch.bfloat16).cuda()
    gq, gk = Sq // 64, Sk // bk
    idx = torch.stack([torch.randperm(gk, generator=gen) for _ in range(B * H * gq)]).view(B, H, gq, gk)
    idx = idx.int().cuda()
    got = subblock_sage.sparse_attention(q, k, v, idx, None, block_size_k=bk, compute_mode="sage_fp8")
    ref = reference_sparse_attention(q, k, v, idx, None, block_size_k=bk).to(got.device)
    torch.cuda.synchronize()
    gain = float(got.double().mean() / ref.double().mean())
    assert abs(gain - 1) < 0.01, f"output gain {gain:.4f}"
    _check(got, ref, "sage_fp8")
    _check_sage_dequantized(got, q, k, v, idx, None, block_size_k=bk)


def _paired_vs_flat(lib, q, k, v, idx, counts, z, q_fused=False):
    """The paired 64-key kernel (one CTA, ``k64_c1[qf]_cnt``: raw plans; the default two-CTA
    cluster kernels take prepared ones, test_cluster2_kernel_equals_flat_kernel checks them bit
    for bit against these) and the one-entry flat one (``k64_flat_cnt``, INT8 Q), selected by
    their parameters and launched raw on the same plan with the backend's own packing into
    poisoned outputs: finite, and within 1 % relative L1 of each other. Returns (outputs, the
    paired one in float64)."""
    from subblock_sage import abi
    from subblock_sage.backends.sm90 import BACKEND
    from subblock_sage.contract import SelectionPolicy, sm90_request

    outs = []
    # complete requests (every export records its whole config): the paired kernel in one CTA,
    # then the alternative 64-key shape (one entry per tile, flat, INT8 Q)
    flat_lib = _alt_backend().library  # k64_flat_cnt: the test library's
    for params, where in ((sm90_request(SelectionPolicy(sage_cluster=1), "sage_fp8", 64, q_fused=q_fused,
                                        dense_rows=False), lib),
                          (sm90_request(SelectionPolicy(sage_alt_shape={64}), "sage_fp8", 64, q_fused=False,
                                        dense_rows=False), flat_lib)):
        out = torch.full_like(q, float("nan"))
        ops = {kk: vv for kk, vv in z.items() if not (params.get("q_fused") and kk.startswith("q_"))}
        values = BACKEND.values(q, k, v, {"q2k_block_index": idx, "block_counts": counts},
                                128 ** -0.5, "sage_fp8", out, ops)
        abi.launch("sm90_bsa_sage", params, values, library=where)
        outs.append(out)
    torch.cuda.synchronize()
    pair, one = (o.double() for o in outs)
    assert torch.isfinite(pair).all()
    rel = float((pair - one).abs().sum() / one.abs().sum())
    assert rel < 0.01, f"paired vs one-entry flat kernel: relative L1 {rel:.4f}"
    return outs, pair


def test_paired_kernel_matches_flat_on_raw_plans():
    """The paired Sage kernel (k64_cnt: two 64-key plan entries per 128-key tile) against the one-entry
    flat kernel, both launched raw on an unsanitised plan: ids -1 / >= Gk (skipped, including one
    half of a pair), odd counts (a missing second half), counts beyond capacity (clamped), the
    partial last key block in either half, an empty row."""
    import subblock_sage
    from subblock_sage.loader import library_for_device

    lib = library_for_device(torch.cuda.current_device())
    gen = torch.Generator().manual_seed(5)
    B, H, Sq, Sk = 2, 3, 300, 1000
    q, k, v = _mk(B, Sq, H, "BSHD", gen), _mk(B, Sk, H, "BSHD", gen, bias=3.0), _mk(B, Sk, H, "BSHD", gen)
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / 64)
    idx, counts = _plan(B, H, gq, gk, gk + 3, gen, repeats=False)
    idx[0, 0, 1, :4] = torch.tensor([gk - 1, -1, 3, gk + 7], dtype=torch.int32)  # partial block + junk
    counts[0, 0, 1] = 4
    counts[1, 1, 1] = 5  # odd
    counts[1, 0, 2] = 10**6  # clamped to capacity
    idx, counts = idx.cuda(), counts.cuda()
    z = subblock_sage.quantize_sage(q, k, v)
    outs, pair = _paired_vs_flat(lib, q, k, v, idx, counts, z)
    assert (pair[0, :64, 0] == 0).all()  # counts[0, 0, 0] = 0: exact zeros
    # not only against each other: both against the references of the plan the kernels promise
    # to run on raw input (counts clamped to capacity, ids outside [0, Gk) skipped)
    clamped = counts.clamp(0, idx.shape[-1])
    ref = reference_sparse_attention(q, k, v, idx, clamped).to(pair.device)
    dref = accuracy.dequantized_reference(z, idx, clamped)
    for name, o in (("paired", outs[0]), ("flat", outs[1])):
        accuracy.check_attention(o, ref, "sage_fp8", what=f"{name} vs float64")
        accuracy.check_attention(o, dref, accuracy.DEQUANT_BOUNDS, what=f"{name} vs dequantized")


@pytest.mark.parametrize("q_fused", [False, True])
def test_paired_kernel_whole_and_split_pairs(q_fused):
    """The paired kernel loads V of a tile whose two ids are 2j and 2j+1 as one 128-key box and
    reads it in the 128-key layout when the row lists as many entries as there are key blocks (a
    dense row), any other pair as two 64-key tiles. Raw plans that hit
    the edges of the rule: a dense ascending row (all whole); rows of Gk entries with junk, whose
    pairs are whole, reversed (split), only look aligned by their load ids (-1 or an id >= Gk
    with 1: block 0 is loaded for the invalid one and masked), end in the partial last key
    block; sparse rows with aligned pairs (never whole), an odd count, an empty row. Against the
    one-entry flat kernel and the float64 and dequantized references; the output is poisoned."""
    import subblock_sage
    from subblock_sage.loader import library_for_device

    lib = library_for_device(torch.cuda.current_device())
    gen = torch.Generator().manual_seed(11)
    B, H, Sq, Sk = 1, 2, 640, 1000  # Gk = 16 64-key blocks, the last one 40 keys
    q, k, v = _mk(B, Sq, H, "BSHD", gen), _mk(B, Sk, H, "BSHD", gen, bias=3.0), _mk(B, Sk, H, "BSHD", gen)
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / 64)
    rows = [
        list(range(gk)),                      # dense ascending: every pair whole
        [-1, 1, 2, 3, 5, 4, 6, 7, gk + 7, 9, 10, 11, 12, 13, 14, 15],  # Gk entries: whole, split, junk
        [gk + 7, 1, 3, 2, 4, 5, 7, 6, 8, 9, 11, 10, 12, 13, 15, 14],   # load ids (0, 1), reversed pairs
        [0, 1, 3, 4, 6, 7, 9, 10, 12, 13],    # sparse: aligned pairs stay split
        [14, 15, 2, 3],                       # the partial last block in a sparse row
        [4, 5, 8, 9, 11],                     # odd count: a missing second half
        [1, 2, 5, 4, 7, 8],                   # (odd, even) and reversed pairs
        [8, 9, 0, 1, 10, 11],                 # pairs out of order
        [15, 14, 12, 13],
        [],                                   # empty row
    ]
    cap = gk
    idx = torch.full((B, H, gq, cap), -1, dtype=torch.int32)
    counts = torch.zeros((B, H, gq), dtype=torch.int32)
    for h in range(H):
        for i in range(gq):
            r = rows[(i + 3 * h) % len(rows)]
            idx[0, h, i, :len(r)] = torch.tensor(r, dtype=torch.int32) if r else idx[0, h, i, :0]
            counts[0, h, i] = len(r)
    idx, counts = idx.cuda(), counts.cuda()
    z = subblock_sage.quantize_sage(q, k, v)
    outs, pair = _paired_vs_flat(lib, q, k, v, idx, counts, z, q_fused)
    empty = [i for i in range(gq) if not rows[i % len(rows)]]
    for i in empty:
        assert (pair[0, i * 64:(i + 1) * 64, 0] == 0).all()  # head 0's empty row: exact zeros
    ref = reference_sparse_attention(q, k, v, idx, counts).to(pair.device)
    dref = accuracy.dequantized_reference(z, idx, counts)
    accuracy.check_attention(outs[0], ref, "sage_fp8", what="paired vs float64")
    accuracy.check_attention(outs[0], dref, accuracy.DEQUANT_BOUNDS, what="paired vs dequantized")


@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("Sq,layout", [(270, "BSHD"), (64, "BHSD"), (1000, "BSHD")])
def test_q_fused_kernel_equals_int8_q_kernel(bk, Sq, layout):
    """The Q-fused Sage kernel (``k*_qf_cnt``: bf16 Q in, quantized into shared memory with the
    quantizer's functions) against the same kernel on the quantizer's INT8 Q, launched raw on an
    unsanitised plan: the outputs must be bit-identical (same codes, same scales), on a strided
    Q (a packed-QKV view), a partial last query block and, at Sq=270, a scale group wholly past
    Sq (rows 288-319). Poisoned outputs: every row < Sq is written, no row past it. 128-key
    plans: the one-CTA kernels (``k128_c1[qf]_cnt``). The two-CTA cluster kernels take prepared
    plans only (a raw row of capacity entries holding junk counts as dense and would be shared);
    test_cluster2_kernel_equals_flat_kernel checks them, Q-fused and INT8-Q, bit for bit against
    these."""
    import subblock_sage
    from subblock_sage import abi
    from subblock_sage.backends.sm90 import BACKEND as DEFAULT
    from subblock_sage.loader import library_for_device

    BACKEND = DEFAULT.with_policy(sage_cluster=1)

    lib = library_for_device(torch.cuda.current_device())
    gen = torch.Generator().manual_seed(Sq + bk)
    B, H, Sk = 2, 3, 700
    if layout == "BSHD":  # q of a packed (B, S, 3, H, D) projection: strides (S*3*H*D, 3*H*D, D, 1)
        x = (torch.randn(B, Sq, 3, H, 128, generator=gen) * 2).to(torch.bfloat16).cuda()
        q = x[:, :, 0]
    else:
        q = _mk(B, Sq, H, layout, gen)
    k, v = _mk(B, Sk, H, layout, gen, bias=3.0), _mk(B, Sk, H, layout, gen)
    if layout == "BHSD":
        q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))  # the kernels take canonical (B,S,H,D) views
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / bk)
    idx, counts = _plan(B, H, gq, gk, gk + 3, gen, repeats=False)
    counts[1, 0, gq - 1] = 10**6  # clamped to capacity
    idx, counts = idx.cuda(), counts.cuda()
    z = subblock_sage.quantize_sage(q, k, v)  # canonical views in, like the backend's
    kv_only = {n: t for n, t in z.items() if n not in ("q_int8", "q_scale")}
    outs = []
    for operands, fused in ((z, False), (kv_only, True)):
        out = torch.full((B, Sq + 64, H, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        values = BACKEND.values(q, k, v, {"q2k_block_index": idx, "block_counts": counts}, 128 ** -0.5,
                                "sage_fp8", out[:, :Sq], operands)
        assert ("q_scale" in values) != fused
        abi.launch("sm90_bsa_sage", BACKEND.params("sage_fp8", bk, fused), values, library=lib)
        outs.append(out)
    torch.cuda.synchronize()
    int8q, fused = outs
    assert torch.isfinite(fused[:, :Sq]).all() and torch.isnan(fused[:, Sq:]).all()
    assert torch.equal(fused[:, :Sq], int8q[:, :Sq]), (  # (rows past Sq are NaN in both: checked above)
        f"Q-fused vs INT8-Q kernel: max |diff| {float((fused[:, :Sq].float() - int8q[:, :Sq].float()).abs().max())}")
    ref = reference_sparse_attention(q, k, v, idx, counts.clamp(0, idx.shape[-1]), block_size_k=bk).to(fused.device)
    accuracy.check_attention(fused[:, :Sq], ref, "sage_fp8", what="Q-fused vs float64")


def _share3_plan(B, H, gq, gk, cap, gen):
    """A raw plan whose rows come in groups of three (one CTA of the flat_wgs=3 kernel): per head,
    group g is identical rows (dense, random, with junk ids, empty, count past capacity), two
    equal rows and a third that differs in one id or in its count, or three random rows."""
    idx, counts = _plan(B, H, gq, gk, cap, gen, repeats=False)
    for b in range(B):
        for h in range(H):
            for g in range(0, gq, 3):
                kind = (b * H + h + g // 3) % 6
                rows = list(range(g, min(g + 3, gq)))
                if kind == 5:
                    continue  # three random rows
                if kind == 0:  # dense, in order
                    idx[b, h, g, :gk] = torch.arange(gk, dtype=torch.int32)
                    counts[b, h, g] = gk
                elif kind == 1:  # count past capacity (clamped)
                    counts[b, h, g] = 10**6
                elif kind == 2:  # empty
                    counts[b, h, g] = 0
                for r in rows[1:]:
                    idx[b, h, r] = idx[b, h, g]
                    counts[b, h, r] = counts[b, h, g]
                if kind == 3 and len(rows) == 3:  # the third row differs in one id
                    n = int(counts[b, h, g].clamp(0, cap))
                    if n:
                        idx[b, h, rows[2], n - 1] = -7  # skipped: no id repeats within the row
                if kind == 4 and len(rows) == 3:  # the third row one entry shorter
                    counts[b, h, rows[2]] = max(int(counts[b, h, g].clamp(0, cap)) - 1, 0)
    return idx.cuda(), counts.cuda()


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("Sq,Sk", [(270, 1000), (576, 4000), (64, 300)])
def test_share3_kernel_equals_flat_kernel(fused, Sq, Sk):
    """(Experiment builds.) The flat kernel with three warpgroups per CTA (``k128_f3[qf]_cnt``: K/V loads shared when
    the CTA's three plan rows are identical, each warpgroup on its own buffer otherwise) against
    the one-CTA flat kernel (``k128_c1[qf]_cnt``), launched raw on the same plan: bit-identical
    outputs (the same arithmetic per row). The plan mixes identical groups (dense rows, junk ids,
    empty rows, counts past capacity; Sk=4000: 32 entries, the shared ring wraps eight times) with
    groups that differ in one id or one count (must not share), a last CTA whose third row is past
    Sq (Sq=270: 5 query blocks), and a single query block (Sq=64). Poisoned outputs: every row < Sq
    is written, no row past it."""
    import subblock_sage
    from subblock_sage.backends.sm90 import SM90Backend
    from subblock_sage.contract import SelectionPolicy
    from subblock_sage.loader import library_for_device

    lib = library_for_device(torch.cuda.current_device())
    if not any(k == "sm90_bsa_sage" and e.params["flat_wgs"] == 3 for (k, _), e in lib.kernels.items()):
        pytest.skip("the flat_wgs=3 kernels are timing experiments: built with -DSBS_EXPERIMENTS=ON only")
    gen = torch.Generator().manual_seed(Sq + Sk + fused)
    B, H = 2, 3
    q, k, v = _mk(B, Sq, H, "BSHD", gen), _mk(B, Sk, H, "BSHD", gen, bias=3.0), _mk(B, Sk, H, "BSHD", gen)
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / 128)
    idx, counts = _share3_plan(B, H, gq, gk, gk + 3, gen)
    z = subblock_sage.quantize_sage(q, k, v)
    if fused:
        z = {n: t for n, t in z.items() if n not in ("q_int8", "q_scale")}
    # the one-CTA flat kernel (raw plans: the cluster kernels take prepared ones) and the experiment
    flat, share = SM90Backend(SelectionPolicy(sage_cluster=1)), SM90Backend(SelectionPolicy(label="f3"))
    assert lib.kernel("sm90_bsa_sage", **share.params("sage_fp8", 128, fused)).params["flat_wgs"] == 3
    _equals_flat_kernel(lib, flat, share, q, k, v, idx, counts, z, fused, "flat_wgs=3")


def _equals_flat_kernel(lib, flat, other, q, k, v, idx, counts, z, fused, what, bk=128):
    """Launch the Sage kernels for ``bk``-key plans that backends ``flat`` and ``other`` select on
    the same raw plan into poisoned outputs: every row < Sq written, none past it, ``other``'s
    output bit for bit ``flat``'s, and within the Sage bounds of the float64 reference."""
    from subblock_sage import abi

    B, Sq, H, _ = q.shape
    outs = []
    for be in (flat, other):
        out = torch.full((B, Sq + 64, H, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        values = be.values(q, k, v, {"q2k_block_index": idx, "block_counts": counts}, 128 ** -0.5, "sage_fp8",
                           out[:, :Sq], z)
        abi.launch("sm90_bsa_sage", be.params("sage_fp8", bk, fused), values, library=lib)
        outs.append(out)
    torch.cuda.synchronize()
    one, two = outs
    assert torch.isfinite(two[:, :Sq]).all() and torch.isnan(two[:, Sq:]).all()
    assert torch.equal(two[:, :Sq], one[:, :Sq]), (
        f"{what} vs the flat kernel: max |diff| {float((two[:, :Sq].float() - one[:, :Sq].float()).abs().max())}")
    clamped = counts.clamp(0, idx.shape[-1])
    ref = reference_sparse_attention(q, k, v, idx, clamped, block_size_k=bk).to(two.device)
    accuracy.check_attention(two[:, :Sq], ref, "sage_fp8", what=f"{what} vs float64")


@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("Sq,Sk", [(270, 1000), (576, 4000), (64, 300)])
def test_cluster2_kernel_equals_flat_kernel(fused, Sq, Sk, bk):
    """The default flat kernel of each key block in two-CTA clusters (``k{64,128}[_qf]_cnt``; 64:
    the paired kernel: a cluster whose rows 2c and 2c+1 are both dense loads each K/V tile once
    for both, half of every TMA box by each CTA, multicast into both; any other cluster runs as
    two flat CTAs) against the one-CTA kernel (``k{64,128}_c1[qf]_cnt``), launched raw on the same
    plan: bit-identical outputs. Per head, the row pairs are both dense (ascending, as the plan
    preparation writes them: shared), dense and sparse, identical sparse rows, and independent
    random rows with junk ids (skipped), empty rows and counts past capacity (all CTA-local);
    Sq=270 has 5 query blocks (the last cluster's second CTA is past Sq), Sq=64 one. 64-key plans:
    a dense row's tiles are aligned pairs (V as one 128-key box) but for the last of an odd count
    of key blocks (Sk=4000: 63, Sk=300: 5; two 64-key V boxes, the second block 0, masked).
    Poisoned outputs: every row < Sq is written, no row past it."""
    import subblock_sage
    from subblock_sage.backends.sm90 import SM90Backend
    from subblock_sage.contract import SelectionPolicy
    from subblock_sage.loader import library_for_device

    lib = library_for_device(torch.cuda.current_device())
    assert any(k == "sm90_bsa_sage" and e.params.get("cluster") == 1 and e.params.get("block_k") == bk
               for (k, _), e in lib.kernels.items()), \
        f"the one-CTA flat kernels k{bk}_c1[qf]_cnt are shipped beside the cluster kernels"
    gen = torch.Generator().manual_seed(2 * Sq + Sk + fused + bk)
    B, H = 2, 3
    q, k, v = _mk(B, Sq, H, "BSHD", gen), _mk(B, Sk, H, "BSHD", gen, bias=3.0), _mk(B, Sk, H, "BSHD", gen)
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / bk)
    # per head: both dense (the cluster shares), dense and sparse, identical sparse rows (both
    # CTA-local), independent rows
    idx, counts, cap, shared = pair_plan(B, H, gq, gk, gen, ("dense", "dense+sparse", "same", "independent+raw"))
    counts[1, 0, 0] = 0  # an empty row (in a pair of independent rows)
    counts[1, 2, -1] = cap + 5  # past capacity: clamped
    assert shared or gq == 1
    assert gq % 2 == 1  # the row past capacity (last row) has no partner in the grid
    idx, counts = idx.int().cuda(), counts.int().cuda()
    z = subblock_sage.quantize_sage(q, k, v)
    if fused:
        z = {n: t for n, t in z.items() if n not in ("q_int8", "q_scale")}
    flat, cluster = SM90Backend(SelectionPolicy(sage_cluster=1)), SM90Backend(SelectionPolicy(sage_cluster=2))
    assert flat.params("sage_fp8", bk, fused)["cluster"] == 1
    assert cluster.params("sage_fp8", bk, fused)["cluster"] == 2
    _equals_flat_kernel(lib, flat, cluster, q, k, v, idx, counts, z, fused, "cluster=2", bk)
