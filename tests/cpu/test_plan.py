"""Plan preparation (subblock_sage/plan.py) on its PyTorch path against the Python reference; the kernel
path is compared with the same reference on the GPU (tests/gpu/test_plan_kernel.py)."""

import pytest

torch = pytest.importorskip("torch")

from tests.helpers.plan_reference import check_prepared, prepare_reference, random_plan  # noqa: E402
from subblock_sage.plan import Plan, prepare_plan  # noqa: E402


@pytest.mark.parametrize("bk_in,bk_out", [(64, 64), (128, 128), (128, 64)])
@pytest.mark.parametrize("use_counts", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_torch_path_matches_reference(bk_in, bk_out, use_counts, seed):
    g = torch.Generator().manual_seed(seed)
    B, H, Sq, Sk = 2, 3, 300, 333 + 64 * seed  # partial last block; odd Gk64 with seed 0
    gq, nkb = -(-Sq // 64), -(-Sk // bk_in)
    index, counts = random_plan(B, H, gq, 7, nkb, g)
    topk = 5
    vplan = Plan(index, counts if use_counts else None, 7 if use_counts else topk, bk_in, Sk)
    p = prepare_plan(vplan, block_size_k_out=bk_out, check_index=False, capturing=False)
    split, nout = bk_in // bk_out, -(-Sk // bk_out)
    rows, _ = prepare_reference(index, counts if use_counts else None, topk, nkb, split, nout)
    assert p.block_size_k == bk_out and p.num_key_blocks == nout and p.capacity == 7 * split
    check_prepared(p.index, p.counts, rows)


def test_torch_path_value_checks():
    idx = torch.zeros(1, 1, 2, 3, dtype=torch.int32)
    cnt = torch.tensor([[[1, 4]]], dtype=torch.int32)
    vplan = Plan(idx, cnt, 3, 64, 100)
    p = prepare_plan(vplan, block_size_k_out=64, check_index=False, capturing=False)
    p.verify()  # default: bad counts are clamped, nothing is read back (no host wait)
    assert p.counts.tolist() == [[[1, 1]]]  # row 2: count 4 -> 3, ids 0, 0, 0 -> one distinct
    p = prepare_plan(vplan, block_size_k_out=64, check_index=True, capturing=False)
    with pytest.raises(ValueError, match=r"block_counts values must be in 0..capacity \(3\), got min 1 max 4"):
        p.verify()
    cnt[0, 0, 1] = 2
    idx[0, 0, 1, 1] = 2  # 2 key blocks of 64 in Sk=100
    p = prepare_plan(vplan, block_size_k_out=64, check_index=True, capturing=False)
    with pytest.raises(ValueError, match=r"q2k_block_index\[0, 0, 1, 1\] = 2 is outside \[0, 2\)"):
        p.verify()



@pytest.mark.parametrize("bk", [64, 128])
def test_rows_can_be_dense_and_the_sm90_cluster_choice(bk):
    """A row can list every key block only when the rows' counts can reach them: block_counts
    with a capacity of at least the key blocks, or such a ``topk`` (a topk plan of full capacity
    whose topk is smaller has no dense row). The sm_90a backend asks for its two-CTA cluster
    kernels (``cluster=2``) only then, the one-CTA kernels (``cluster=1``) otherwise."""
    from types import SimpleNamespace

    from subblock_sage.backends.sm90 import SM90Backend

    Sk = 1000
    nkb = -(-Sk // bk)
    idx = torch.zeros(1, 1, 2, nkb, dtype=torch.int32)
    cnt = torch.zeros(1, 1, 2, dtype=torch.int32)
    cases = [(Plan(idx, cnt, 0, bk, Sk), True), (Plan(idx[..., :-1], cnt, 0, bk, Sk), False),
             (Plan(idx, None, nkb, bk, Sk), True), (Plan(idx, None, nkb - 1, bk, Sk), False),
             (Plan(idx[..., :-1], None, nkb - 1, bk, Sk), False)]
    be = SM90Backend()
    for plan, dense in cases:
        assert plan.rows_can_be_dense is dense, plan
        z = {"k_int8": torch.zeros(1, Sk, 1, 128, dtype=torch.int8), "v_fp8": None, "k_scale": None,
             "v_scale": None}
        args = SimpleNamespace(compute_mode="sage_fp8", plan=plan, spec=plan.spec, q=None, k=None, v=None, scale=1.0)
        launch = be.launch(args, Plan(idx, cnt, 0, bk, Sk), z, None)  # prepared: full capacity
        assert launch.params["cluster"] == (2 if dense else 1), (plan, launch.params)
