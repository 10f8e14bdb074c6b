"""GPU tests of the bf16 SM90a kernels whose two consumers share one K/V ring (``k{64,128}_kvs_cnt``,
``SelectionPolicy(bf16_cluster=2)``; by the plan with ``bf16_cluster=None``) and of the same
kernels in two-CTA clusters (``k{64,128}_c2kvs_cnt``, ``bf16_cluster=4``).

A CTA of the two-consumer bf16 kernel holds query blocks 2c and 2c+1; when both rows are dense the
shared-ring kernel loads each K/V tile once for both consumers, and every other CTA runs as the
default kernel (one ring per row). In two-CTA clusters (rows 4c .. 4c+3), when all four rows are
dense each CTA loads half of every tile into both CTAs' rings by TMA multicast; a cluster with one
CTA's pair dense shares within that CTA. The consumers run the same MMAs in the same order as in
the default kernel, so the outputs must be bit-identical to it, on raw plans launched directly and
on plans prepared by the runtime; and within the bf16 bounds of the float64 reference, per
64-row block, head and channel (tests/helpers/accuracy.py). Skipped without a GPU; only
meaningful on compute capability 9.0.
"""

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
        reason="the sm_90a kernels run on H100/H200 only",
    ),
]

from subblock_sage.reference import reference_sparse_attention  # noqa: E402

from tests.gpu.test_sm90_attention import _mk  # noqa: E402
from tests.helpers import accuracy  # noqa: E402
from tests.helpers.gpu import pair_plan  # noqa: E402


SHARES = [2, 4]  # query blocks per K/V load (SelectionPolicy.bf16_cluster): in one CTA, in a cluster


def _backends(share=2):
    """(default bf16 kernel: one ring per row, the shared-ring kernel forced: ``share`` = 2 one
    CTA, 4 two-CTA clusters) as backends."""
    from subblock_sage.backends.sm90 import BACKEND

    if share == 4:
        be = _test_library_backend()
        if be is None:
            pytest.skip("bf16_cluster=4's kernels are in the test library only: set $SUBBLOCK_SAGE_TEST_LIBS")
        return be.with_policy(bf16_cluster=1), be
    return BACKEND.with_policy(bf16_cluster=1), BACKEND.with_policy(bf16_cluster=share)


def _test_library_backend():
    """The backend with bf16_cluster=4 whose ``k{64,128}_c2kvs_cnt`` come from the test library
    (benchmark/lab/test_library.py), or None without one."""
    from benchmark.lab.test_library import sm90_backend

    return sm90_backend(bf16_cluster=4)[0]


def _library_has_kv_share(lib, bk, share):
    return any(k == "sm90_bsa_bf16" and e.params.get("kv_share") and e.params.get("block_k") == bk
               and e.params.get("cluster") == (2 if share == 4 else 1) for (k, _), e in lib.kernels.items())


# Kinds of row pairs (2c, 2c+1) in ``_pair_plan``, by pair index (offset per head): consecutive
# pairs are a cluster's two CTAs, so the clusters see both pairs dense (four rows share), one
# dense pair beside another kind (shared within one CTA), and no dense pair.
PAIR_KINDS = ("dense", "dense", "dense+sparse", "dense", "same", "empty", "independent", "dense")


def _pair_plan(B, H, gq, gk, gen):
    """A raw plan (capacity gk + 3) whose row pairs (2c, 2c+1) are, per head in the order of
    ``PAIR_KINDS`` (tests/helpers/gpu.py ``pair_plan``), both dense (the CTA shares), dense and
    sparse, identical sparse rows, both empty, and independent random rows with junk ids
    (skipped), each below gk entries. Counts past capacity (clamped): the second row of the
    first shared pair, and the last row when it has no partner in its CTA (an odd count of query
    blocks)."""
    idx, counts, cap, shared = pair_plan(B, H, gq, gk, gen, PAIR_KINDS)
    if shared:
        counts[0, 0, 1] = cap + 5  # (b, h, pair 0) is of kind 0: both dense
    assert PAIR_KINDS[0] == "dense"
    if gq % 2:
        counts[1, 2, -1] = cap + 5
    return idx.int().cuda(), counts.int().cuda(), shared


def _launch_raw(lib, be, q, k, v, idx, counts, bk):
    from subblock_sage import abi

    B, Sq, H, _ = q.shape
    out = torch.full((B, Sq + 64, H, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    values = be.values(q, k, v, {"q2k_block_index": idx, "block_counts": counts}, 128 ** -0.5, "bf16",
                       out[:, :Sq], None)
    abi.launch("sm90_bsa_bf16", be.params("bf16", bk), values, library=lib)
    return out


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("Sq,Sk", [(270, 1000), (576, 4000), (64, 300), (1000, 37760 // 8 + 7)])
def test_kv_share_kernel_equals_default_kernel(bk, Sq, Sk, share):
    """The shared-ring kernel (``share`` 4: in two-CTA clusters) against the default bf16 kernel,
    launched raw on the same plan (``_pair_plan``): bit-identical outputs, within the bf16 bounds
    of the float64 reference, the empty rows exact zeros. Sq=270 has 5 query blocks (the last
    CTA's second row is past Sq; with clusters, the last cluster's second CTA is wholly past Sq),
    Sq=576 9, Sq=64 one; Sk ragged (a partial last key block, masked); Sk=4000 at 64 keys: 63 entries, the
    shared ring (six K, four V buffers) wraps ten times. Poisoned outputs: every row < Sq is
    written, no row past it."""
    from subblock_sage.loader import library_for_device

    one, shared_ring = _backends(share)
    lib = library_for_device(torch.cuda.current_device())
    ring_lib = shared_ring.library_for(lib, "sm90_bsa_bf16", shared_ring.params("bf16", bk))
    assert _library_has_kv_share(ring_lib, bk, share), f"the shared-ring bf16 kernel for {share} rows is built"
    assert one.params("bf16", bk)["kv_share"] is False and shared_ring.params("bf16", bk)["kv_share"] is True
    gen = torch.Generator().manual_seed(3 * Sq + Sk + bk + share)
    B, H = 2, 3
    q, k, v = _mk(B, Sq, H, "BSHD", gen), _mk(B, Sk, H, "BSHD", gen, bias=3.0), _mk(B, Sk, H, "BSHD", gen)
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / bk)
    idx, counts, shared = _pair_plan(B, H, gq, gk, gen)
    assert shared or gq == 1
    base = _launch_raw(lib, one, q, k, v, idx, counts, bk)
    got = _launch_raw(ring_lib, shared_ring, q, k, v, idx, counts, bk)
    torch.cuda.synchronize()
    assert torch.isfinite(got[:, :Sq]).all() and torch.isnan(got[:, Sq:]).all()
    assert torch.equal(got[:, :Sq], base[:, :Sq]), (
        f"kv_share vs the default kernel: max |diff| {float((got[:, :Sq].float() - base[:, :Sq].float()).abs().max())}")
    clamped = counts.clamp(0, idx.shape[-1])
    ref = reference_sparse_attention(q, k, v, idx, clamped, block_size_k=bk).to(got.device)
    accuracy.check_attention(got[:, :Sq], ref, "bf16", what="kv_share vs float64")
    for b, h, r in (clamped == 0).nonzero().tolist():
        assert (got[b, r * 64:min((r + 1) * 64, Sq), h] == 0).all(), (b, h, r)  # empty rows: exact zeros


def _sglang_like(B, H, Sq, Sk, bk, gen, dense_frac=0.10, density=0.25):
    """SGLang's heterogeneous plan: full capacity (every key block), the first ``dense_frac`` of
    the query blocks dense, the rest ``density`` of the key blocks at random (ascending)."""
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / bk)
    keep = max(1, round(density * gk))
    idx = torch.full((B, H, gq, gk), -1, dtype=torch.int32)
    counts = torch.full((B, H, gq), keep, dtype=torch.int32)
    for b in range(B):
        for h in range(H):
            for i in range(gq):
                idx[b, h, i, :keep] = torch.randperm(gk, generator=gen)[:keep].sort().values.int()
    n_dense = max(1, round(dense_frac * gq))
    idx[:, :, :n_dense] = torch.arange(gk, dtype=torch.int32)
    counts[:, :, :n_dense] = gk
    return idx.cuda(), counts.cuda()


def _hostile(B, H, gq, gk, gen):
    """A plan the runtime must prepare: per head, rows listing every key block shuffled with
    repeats and out-of-range ids (prepared into dense rows, so that pairs of them share), rows with
    ids out of range and repeated, counts past capacity and negative counts (clamped), empty rows."""
    cap = 2 * gk + 4
    idx = torch.randint(-3, gk + 4, (B, H, gq, cap), generator=gen, dtype=torch.int32)
    counts = torch.randint(0, cap + 1, (B, H, gq), generator=gen, dtype=torch.int32)
    for b in range(B):
        for h in range(H):
            for i in range(gq):
                if (b + h + i // 2) % 3 == 0:  # every block, shuffled, then repeats and junk ids
                    row = torch.cat([torch.randperm(gk, generator=gen), torch.randint(0, gk, (gk,), generator=gen),
                                     torch.tensor([-1, gk, gk + 100, -(2**31)])]).int()
                    idx[b, h, i] = row[:cap]
                    counts[b, h, i] = cap
    counts[0, 0, 0] = 0
    counts[1, 1, -1] = cap + 9
    counts[0, 2, 1] = -4
    return idx.cuda(), counts.cuda()


@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("plan", ["dense", "random", "sglang", "hostile"])
def test_kv_share_through_the_runtime(bk, plan):
    """``sparse_attention`` with ``bf16_cluster`` 2 (the shared-ring kernel forced), 4 (in two-CTA
    clusters), None (by the plan) and 1 (the default kernel) on plans the runtime prepares: dense, 0.25 random, SGLang-like
    (full capacity, the first 10 % of the query blocks dense, the rest 0.25) and hostile plans (ids
    out of range, repeated ids, counts out of range, empty rows), ragged Sq and Sk with an odd count
    of query blocks: the four outputs bit-identical, within the bf16 bounds of the float64
    reference."""
    import subblock_sage
    from subblock_sage import replay

    from subblock_sage.backends.sm90 import BACKEND

    gen = torch.Generator().manual_seed(bk + ("dense", "random", "sglang", "hostile").index(plan))
    B, H, Sq, Sk = 2, 3, 1030 if plan != "sglang" else 2450, 2090 if plan != "sglang" else 2450
    q, k, v = _mk(B, Sq, H, "BSHD", gen), _mk(B, Sk, H, "BSHD", gen, bias=3.0), _mk(B, Sk, H, "BSHD", gen)
    gq, gk = math.ceil(Sq / 64), math.ceil(Sk / bk)
    assert gq % 2 == 1
    if plan == "dense":
        idx = torch.arange(gk, dtype=torch.int32).expand(B, H, gq, gk).contiguous().cuda()
        counts = torch.full((B, H, gq), gk, dtype=torch.int32, device="cuda")
    elif plan == "random":
        keep = max(1, gk // 4)
        idx = torch.rand(B, H, gq, gk, generator=gen).topk(keep, dim=-1).indices.int().cuda()
        counts = torch.full((B, H, gq), keep, dtype=torch.int32, device="cuda")
    elif plan == "sglang":
        idx, counts = _sglang_like(B, H, Sq, Sk, bk, gen)
    else:
        idx, counts = _hostile(B, H, gq, gk, gen)
    outs = {}
    replay.clear()
    try:
        for cl in (2, 4, None, 1):
            be = BACKEND.with_policy(bf16_cluster=cl) if cl != 4 else _test_library_backend()
            if be is None:  # no test library: bf16_cluster=4 is not compared
                continue
            outs[cl] = subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=bk, compute_mode="bf16",
                                                      backend=be)
            replay.clear()  # (a replayed call would keep the kernel it recorded)
    finally:
        replay.clear()
    torch.cuda.synchronize()
    for cl in (None, 2, 4):
        if cl not in outs:
            continue
        assert torch.equal(outs[cl], outs[1]), (
            f"bf16_cluster={cl} vs 1 on {plan}: max |diff| {float((outs[cl].float() - outs[1].float()).abs().max())}")
    ref = reference_sparse_attention(q, k, v, idx, counts.clamp(0, idx.shape[-1]), block_size_k=bk)
    accuracy.check_attention(outs[2], ref.to(outs[2].device), "bf16", what=f"kv_share on {plan} vs float64")


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("H", [2, 6])
def test_kv_share_sglang_shape_equals_default_kernel(H, share):
    """At SGLang's size (S=37760: 590 query and 590 64-key blocks, the first 10 % of the query
    blocks dense, the rest top-k 152 of 590), the shared-ring kernel's output is bit-identical to
    the default kernel's (the float64 reference is checked on the smaller plans above)."""
    import subblock_sage
    from subblock_sage import replay

    one, shared_ring = _backends(share)
    gen = torch.Generator().manual_seed(H)
    S = 37760
    q, k, v = (_mk(1, S, H, "BSHD", gen) for _ in range(3))
    idx, counts = _sglang_like(1, H, S, S, 64, gen, density=152 / 590)
    assert int(counts[0, 0, -1]) == 152 and idx.shape[-1] == 590
    replay.clear()
    try:
        a = subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=64, compute_mode="bf16", backend=one)
        replay.clear()
        b = subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=64, compute_mode="bf16",
                                           backend=shared_ring)
    finally:
        replay.clear()
    torch.cuda.synchronize()
    assert torch.isfinite(b).all()
    assert torch.equal(a, b), f"max |diff| {float((a.float() - b.float()).abs().max())}"


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("bk", [64, 128])
def test_kv_share_captures_into_a_graph(bk, share):
    """Calls on the shared-ring kernel capture into a CUDA graph: a replay with new inputs (the
    same plan: dense and sparse rows, odd count of query blocks) equals an eager call."""
    import subblock_sage
    from subblock_sage import backends, replay

    _, shared_ring = _backends(share)
    gen = torch.Generator().manual_seed(bk + share)
    B, H, Sq, Sk = 1, 2, 1030, 1500
    idx, counts = _sglang_like(B, H, Sq, Sk, bk, gen, dense_frac=0.5)
    assert math.ceil(Sq / 64) % 2 == 1 and int(counts[0, 0, 0]) == math.ceil(Sk / bk)  # dense pairs share
    q, k, v = (_mk(B, s, H, "BSHD", gen) for s in (Sq, Sk, Sk))
    replay.clear()
    try:
        with backends.using(shared_ring):
            subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=bk, compute_mode="bf16")  # recorded
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static = subblock_sage.sparse_attention(q, k, v, idx, counts, block_size_k=bk, compute_mode="bf16")
            q2, k2, v2 = (_mk(B, s, H, "BSHD", gen) for s in (Sq, Sk, Sk))
            for dst, src in ((q, q2), (k, k2), (v, v2)):
                dst.copy_(src)
            g.replay()
            want = subblock_sage.sparse_attention(q2, k2, v2, idx, counts, block_size_k=bk, compute_mode="bf16")
        torch.cuda.synchronize()
    finally:
        replay.clear()
    assert torch.equal(static, want)
    ref = reference_sparse_attention(q2, k2, v2, idx, counts, block_size_k=bk).to(want.device)
    accuracy.check_attention(want, ref, "bf16", what="kv_share in a graph vs float64")
