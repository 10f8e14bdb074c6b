"""The Sage quantizer's launch, recorded on CPU tensors (no GPU, no kernel library): exactly one
launch (``sage_quant_kv``) with exactly the argument names its kernel declares
(``aot/kernels/sage_quant/``), the variant chosen by the plan, the workspace the stream's own
quantizer buffer (``workspace.sync_buffer``) sized by the contract, and nothing allocated but
``torch.empty`` (a recorded call must replay as its launch). The numerics are checked on a GPU
(tests/gpu/test_quantize.py, tests/gpu/test_plan_kernel.py)."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from subblock_sage.contract import (  # noqa: E402
    SAGE_K_MEAN_SPLIT, SAGE_KV_UNIT_BLOCKS, SAGE_QUANT_KERNELS, SAGE_STATS_GROUP, SAGE_SYNC_KROW_WORDS, SAGE_SYNC_ROW0,
    SAGE_SYNC_VROW_WORDS, ceil_div)
from subblock_sage.backends import quantizer as quantize  # noqa: E402  (the launch; ops.quantize is the public op over it)


def _declared(plan: str = "none") -> set:
    from aot.kernels import sage_quant

    return {a.name for a in sage_quant.kv_args(plan) if a.name != "stream"}


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(quantize.abi, "launch", lambda k, p, v, **kw: calls.append((k, dict(p), v)))
    monkeypatch.setattr(quantize, "cuda_device_index", lambda dev: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    buffers = {}

    def sync_buffer(device, words):  # the stream's buffer: made once, handed out again
        buf = buffers.get(device)
        if buf is None or buf.numel() < words:
            buf = buffers[device] = torch.empty(words, dtype=torch.int32)
        return buf

    monkeypatch.setattr(quantize.workspace, "sync_buffer", sync_buffer)

    def refuse(*a, **kw):
        raise AssertionError("the quantizer may allocate with torch.empty only")

    for name in ("zeros", "zeros_like", "ones", "full", "full_like", "empty_like", "tensor"):
        monkeypatch.setattr(torch, name, refuse)
    return calls


def _qkv(B=2, Sq=300, Sk=15000, H=3):
    q = torch.empty(B, Sq, H, 128, dtype=torch.bfloat16)
    k = torch.empty(B, Sk, H, 128, dtype=torch.bfloat16)
    return q, k, torch.empty_strided(k.shape, k.stride(), dtype=torch.bfloat16)


def _plan(B=2, H=3, G=5, cap=4, counts=True):
    i32 = dict(dtype=torch.int32)
    values = {"q2k_block_index": torch.empty(B, H, G, cap, **i32), "out_index": torch.empty(B, H, G, 2 * cap, **i32),
              "out_counts": torch.empty(B, H, G, **i32), "summary": torch.empty(4, **i32),
              "num_key_blocks": 40, "split": 2, "num_out_blocks": 79}
    if counts:
        values["block_counts"] = torch.empty(B, H, G, **i32)
    else:
        values["topk"] = 3
    return values


def test_one_launch_without_plan(recorded):
    q, k, v = _qkv()
    out = quantize.quantize_canonical(q, k, v)
    assert [c[0] for c in recorded] == list(SAGE_QUANT_KERNELS) == ["sage_quant_kv"]
    ((_, params, values),) = recorded
    assert params == {"plan": "none"} and set(values) == _declared()
    nb = ceil_div(15000, 64)  # 235 blocks: 118 units of 2, 4 groups of 32 units (the last one short)
    assert SAGE_STATS_GROUP == 32 and SAGE_KV_UNIT_BLOCKS == 2
    assert "k_part" not in values and "v_part" not in values  # (the statistics rows live in sync)
    # the workspace: the 64-bit counter, then per (b, h) 4 rows of partial K sums (128 slots of 8
    # bytes), then per (b, h) 118 V unit rows + 4 group rows + the final row + 4 rows of V's
    # sampled amax + 1 row of the units' done slots (128 slots of 4 bytes; K has no statistics
    # rows: its mean comes from the K-mean tickets)
    assert SAGE_K_MEAN_SPLIT == 4 and (SAGE_SYNC_KROW_WORDS, SAGE_SYNC_VROW_WORDS) == (256, 128)
    sync = values["sync"]
    assert tuple(sync.shape) == (SAGE_SYNC_ROW0 + 2 * 3 * (4 * 256 + (118 + 4 + 1 + 4 + 1) * 128),) and sync.dtype == torch.int32
    assert nb == 235 and "lag" not in values  # (V is read once: no second read to time)
    assert values["k_mean"] is out["k_mean"] and values["v_fp8"] is out["v_fp8"]
    # a second call on the stream takes the same buffer (no filling, no allocation)
    quantize.quantize_canonical(q, k, v)
    assert recorded[1][2]["sync"] is sync


def test_kv_only_pass_has_no_q_tiles(recorded):
    """``with_q=False`` (an attention kernel that quantizes Q itself): the same launch, Q passed as
    a zero-row view of the caller's q (the launch then has no Q tiles: its grid counts
    ceil(Sq/128) tiles per head), no Q outputs returned, K/V arguments as with Q."""
    q, k, v = _qkv()
    full = quantize.quantize_canonical(q, k, v)
    kv = quantize.quantize_canonical(q, k, v, with_q=False)
    (_, _, a), (_, _, b) = recorded
    assert set(b) == set(a) == _declared()
    assert b["q"].shape == (2, 0, 3, 128) and b["q"].numel() == 0
    assert b["q_int8"].shape[1] == 0 and b["q_scale"].shape[2] == 0
    assert set(full) - set(kv) == {"q_int8", "q_scale"}
    assert b["k"] is k and b["v"] is v
    assert b["sync"] is a["sync"]


@pytest.mark.parametrize("counts", [True, False])
def test_plan_role_rides_on_the_quantizer_launch(recorded, counts):
    q, k, v = _qkv()
    plan = _plan(counts=counts)
    quantize.quantize_canonical(q, k, v, plan_values=plan)
    assert [c[0] for c in recorded] == ["sage_quant_kv"]  # no plan_prepare launch
    _, params, values = recorded[0]
    assert params == {"plan": "counts" if counts else "topk"}
    assert set(values) == _declared(params["plan"])
    assert all(values[name] is plan[name] for name in plan)


def test_plan_of_other_heads_is_refused(recorded):
    """The plan role's B and H must be q's (the kernel does not compare them, so the runtime checks
    it before any launch)."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"has \(B, H\) = \(2, 2\) but q has \(2, 3\)\. Fix: prepare the plan"):
        quantize.quantize_canonical(q, k, v, plan_values=_plan(H=2))
    assert not recorded


def test_plan_counts_must_agree_with_the_values(recorded):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"plan_counts=True but plan_values lacks block_counts"):
        quantize.quantize_canonical(q, k, v, plan_values=_plan(counts=False), plan_counts=True)
    assert not recorded


def test_workspace_past_32_bit_index_is_refused(recorded):
    """The quantizer's workspace is indexed with 32-bit words: a shape that needs 2**31 or more is
    refused before any launch, with the fix."""
    B, H, Sk = 1, 128, 1 << 24  # 262144 blocks: 128 V segments x ~135k rows x 128 words > 2**31
    q = torch.empty(1, 1, 1, 128, dtype=torch.bfloat16).expand(B, 128, H, 128)
    k = torch.empty(1, 1, 1, 128, dtype=torch.bfloat16).expand(B, Sk, H, 128)
    with pytest.raises(ValueError, match=r"quantizer workspace.*Fix: quantize fewer heads per call"):
        quantize.quantize_canonical(q, k, k)
    assert not recorded
