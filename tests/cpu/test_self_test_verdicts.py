"""The thresholds of the launch self-tests that `subblock-sage check` runs, with real numbers on CPU.

tests/cpu/test_check.py replaces the self-tests with hooks (it tests the report, not the verdict),
so here the verdict functions the self-tests call (``reference.attention_verdict`` /
``quantizer_verdict``) are fed real outputs: the float64 reference rounded to bf16, a faithful
CPU stand-in of the Sage kernel (tests/helpers/accuracy.emulate_sage: ~0.037 relative L1), and
faulty outputs. Each limit is shown to pass what it must and to reject what it must, cosine
included.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from subblock_sage.reference import (  # noqa: E402
    SELF_TEST_LIMITS,
    attention_verdict,
    quantizer_verdict,
    reference_quantize_sage,
    reference_sparse_attention,
)

from tests.helpers.accuracy import emulate_sage  # noqa: E402


@pytest.fixture(scope="module")
def case():
    """The self-test's own problem (ops/attention._self_test): B=1 H=2 Sq=150 Sk=200, one empty
    row, one dense row, random counts."""
    g = torch.Generator().manual_seed(7)
    B, H, Sq, Sk, bk = 1, 2, 150, 200, 64
    q, k, v = (torch.randn(B, S, H, 128, generator=g).to(torch.bfloat16) for S in (Sq, Sk, Sk))
    gq, gk = -(-Sq // 64), -(-Sk // bk)
    index = torch.stack([torch.randperm(gk, generator=g) for _ in range(B * H * gq)]).view(B, H, gq, gk).int()
    counts = torch.randint(0, gk + 1, (B, H, gq), generator=g).int()
    counts[0, 0, 0], counts[0, 1, 1] = 0, gk
    ref = reference_sparse_attention(q, k, v, index, counts, block_size_k=bk)
    quant = reference_quantize_sage(q, k, v)
    return {"q": q, "k": k, "v": v, "ref": ref, "quant": quant,
            "sage": emulate_sage(quant, index, counts, block_size_k=bk)}


def _numbers(line):
    # "cosine 0.99934, relative L1 0.0371 vs float64 reference"
    parts = line.replace(",", "").split()
    return float(parts[1]), float(parts[4])


def test_bf16_output_passes_both_modes(case):
    got = case["ref"].to(torch.bfloat16)
    cos, rel = _numbers(attention_verdict(got, case["ref"], "bf16"))
    assert cos > 0.99999 and rel < 0.005
    attention_verdict(got, case["ref"], "sage_fp8")


def test_sage_level_error_passes_sage_and_fails_bf16(case):
    cos, rel = _numbers(attention_verdict(case["sage"], case["ref"], "sage_fp8"))
    assert 0.02 < rel < SELF_TEST_LIMITS["sage_fp8"][0] and SELF_TEST_LIMITS["sage_fp8"][1] < cos < 0.9999
    with pytest.raises(RuntimeError, match=r"relative L1 0\.0[2-4]\d+ vs float64 reference \(limits: relative L1 <= 0\.01"):
        attention_verdict(case["sage"], case["ref"], "bf16")


@pytest.mark.parametrize("mode", ["bf16", "sage_fp8"])
def test_scale_error_rejected_by_relative_l1(case, mode):
    factor = 1.0 + 1.3 * SELF_TEST_LIMITS[mode][0]
    with pytest.raises(RuntimeError, match="output differs from the reference"):
        attention_verdict(case["ref"] * factor, case["ref"], mode)
    attention_verdict(case["ref"] * (1.0 + 0.7 * SELF_TEST_LIMITS[mode][0]), case["ref"], mode)


@pytest.mark.parametrize("mode", ["bf16", "sage_fp8"])
def test_concentrated_error_rejected_by_cosine_alone(case, mode):
    """A few huge wrong values: relative L1 stays tiny, only the cosine limit catches it."""
    ref = case["ref"]
    got = ref.clone()
    got[0, 100, 1, 7] += 0.1 * float(ref.norm())  # cosine ~0.995: below both limits
    with pytest.raises(RuntimeError, match=r"cosine 0\.[0-9]+, relative L1 0\.00[0-9]+ vs float64"):
        attention_verdict(got, ref, mode)
    rel = float((got - ref).abs().sum() / ref.abs().sum())
    assert rel < 0.002  # so relative L1 alone would have passed


@pytest.mark.parametrize("mode", ["bf16", "sage_fp8"])
def test_non_finite_rejected(case, mode):
    got = case["ref"].clone()
    got[0, 3, 0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite values"):
        attention_verdict(got, case["ref"], mode)


def test_quantizer_verdict(case):
    ref = case["quant"]
    assert "within 0 step" in quantizer_verdict({k: t.clone() for k, t in ref.items()}, ref)
    one = {k: t.clone() for k, t in ref.items()}
    one["q_int8"][0, 0, 0, 0] += 1 if int(one["q_int8"][0, 0, 0, 0]) < 127 else -1
    assert "within 1 step" in quantizer_verdict(one, ref)
    two = {k: t.clone() for k, t in ref.items()}
    two["k_int8"][0, 1, 5, 9] += 2 if int(two["k_int8"][0, 1, 5, 9]) < 126 else -2
    with pytest.raises(RuntimeError, match="INT8 codes differ from the reference by 2 steps"):
        quantizer_verdict(two, ref)
    sc = {k: t.clone() for k, t in ref.items()}
    sc["v_scale"][0, 0, 3] *= 1 + 1e-4
    with pytest.raises(RuntimeError, match=r"v_scale differs from the reference by 1\.0\de-04 relative"):
        quantizer_verdict(sc, ref)
    sc = {k: t.clone() for k, t in ref.items()}
    sc["q_scale"][0, 1, 0] *= 1 + 2e-6
    quantizer_verdict(sc, ref)  # float rounding of the scale is tolerated
    vv = {k: t.clone() for k, t in ref.items()}
    col = vv["v_fp8"][0, 0, 5].float()
    vv["v_fp8"][0, 0, 5] = col.roll(1).to(torch.float8_e4m3fn)  # a wrong token order in one channel
    with pytest.raises(RuntimeError, match="v_fp8 differs from the reference by more than one E4M3 step"):
        quantizer_verdict(vv, ref)
