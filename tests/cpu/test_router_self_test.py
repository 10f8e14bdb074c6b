"""The router's startup self-test without a GPU: its verdict (``reference.router_verdict``) fed
real plans of its own problem (``ops/route.self_test_cases``), and its place in ``check`` /
``validate_startup`` and in the library listing.

A plan equal to the float64 reference passes; one that differs only among near-ties passes; a
block swapped far from the threshold, a wrong count, or a ragged tail scored as zeros (SGLang's
docstring names that bug) fails, with the difference named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]

from subblock_sage.backends.router import ROUTER_KERNELS  # noqa: E402
from subblock_sage.ops.route import SELF_TEST_CASES, self_test, self_test_cases  # noqa: E402
from subblock_sage.reference import (  # noqa: E402
    reference_route,
    reference_router_pool,
    reference_router_select,
    reference_scores_from_cells,
    router_verdict,
)
from subblock_sage.router_spec import LOG2E, num_cells  # noqa: E402


@pytest.fixture(scope="module")
def cases():
    out = []
    for q, k, dense, kw in self_test_cases():
        idx, cnt, scores, topk = reference_route(q, k, dense_rows=dense, **kw)
        out.append(dict(q=q, k=k, dense=dense, kw=kw, idx=idx, cnt=cnt, scores=scores, topk=topk))
    return out


def test_cases_are_ragged_and_cover_both_block_sizes(cases):
    assert len(cases) == len(SELF_TEST_CASES) == 2
    assert {c["kw"]["block_size_k"] for c in cases} == {64, 128}
    for c in cases:
        Sq, Sk, bk = c["q"].shape[1], c["k"].shape[1], c["kw"]["block_size_k"]
        assert Sq % 64 and Sk % bk and Sk % 16  # ragged query and key tails, a partial last cell
        assert 1 < c["topk"] < c["scores"].shape[-1]  # a real selection
    assert cases[0]["dense"] is not None and int(cases[0]["cnt"][0, 0, 1]) == cases[0]["scores"].shape[-1]


def test_the_reference_plan_passes(cases):
    for c in cases:
        line = router_verdict(c["idx"], c["cnt"], c["idx"], c["cnt"], c["scores"])
        assert line.startswith("same blocks as the float64 reference") and "0 differ" in line


def test_a_near_tie_swapped_passes(cases):
    """Two blocks whose scores are within the tolerance of the threshold may come either way."""
    c = cases[1]
    scores = c["scores"].clone()
    idx, cnt = c["idx"].clone(), c["cnt"]
    # row (0, 0, 0): make its best dropped block tie its threshold block, then keep that one instead
    row = scores[0, 0, 0]
    order = torch.sort(row, descending=True).indices
    t = int(cnt[0, 0, 0])
    kept_last, dropped_first = int(order[t - 1]), int(order[t])
    row[dropped_first] = row[kept_last] - 1e-4
    ids = [int(x) for x in idx[0, 0, 0, :t] if int(x) != kept_last] + [dropped_first]
    idx[0, 0, 0, :t] = torch.tensor(sorted(ids), dtype=torch.int32)
    line = router_verdict(idx, cnt, c["idx"], cnt, scores)
    assert "1 differ only among ties" in line


def test_a_block_far_from_the_threshold_fails(cases):
    c = cases[0]
    idx = c["idx"].clone()
    row = c["scores"][0, 1, 2]
    t = int(c["cnt"][0, 1, 2])
    worst = int(torch.argmin(row))  # the lowest-scoring block, surely far below the threshold
    ids = sorted([int(x) for x in idx[0, 1, 2, :t]][1:] + [worst])
    idx[0, 1, 2, :t] = torch.tensor(ids, dtype=torch.int32)
    with pytest.raises(AssertionError, match=r"not the float64 reference's: \d+ difference\(s\).*row \(0, 1, 2\)"):
        router_verdict(idx, c["cnt"], c["idx"], c["cnt"], c["scores"])


def test_a_wrong_count_fails(cases):
    c = cases[0]
    cnt = c["cnt"].clone()
    cnt[0, 0, 3] -= 1
    with pytest.raises(AssertionError, match=r"row \(0, 0, 3\): counts differ"):
        router_verdict(c["idx"], cnt, c["idx"], c["cnt"], c["scores"])


def test_a_tail_scored_as_zeros_fails(cases):
    """The bug the method rules out: cells past the last token scored as zero vectors (an
    exp(0) = 1 term in every block's sum) changes the plan of this ragged problem beyond ties."""
    failed = 0
    for c in cases:
        kw = c["kw"]
        sq, sk = 64 // kw["n_q"], kw["block_size_k"] // kw["n_k"]
        qp = reference_router_pool(c["q"], sq, block=64, scale=128 ** -0.5 * LOG2E)
        kp = reference_router_pool(c["k"], sk, block=kw["block_size_k"])
        wrong = reference_scores_from_cells(qp, kp, n_q=kw["n_q"], n_k=kw["n_k"],
                                            q_valid=num_cells(c["q"].shape[1], 64, kw["n_q"]),
                                            k_valid=num_cells(c["k"].shape[1], kw["block_size_k"], kw["n_k"]))
        idx, cnt = reference_router_select(wrong, c["topk"], c["dense"])
        try:
            router_verdict(idx, cnt, c["idx"], c["cnt"], c["scores"])
        except AssertionError:
            failed += 1
    assert failed >= 1


def test_the_self_test_is_registered_where_the_router_ships():
    from subblock_sage.diagnostics import probes

    assert probes.SELF_TESTS["router"] == ("ops.route", "self_test")
    assert "router" in probes.ALSO_AT_STARTUP and "router" not in probes.MODE_NEEDS
    assert self_test.supported(type("L", (), {"has_kernel": lambda self, k: True})())
    assert not self_test.supported(type("L", (), {"has_kernel": lambda self, k: k != ROUTER_KERNELS[1]})())


def test_router_status_in_the_listing():
    """`subblock-sage check` lists, for every library, its router's GPU run or that it has not yet
    run on a GPU of that target (or that the library has no router)."""
    from subblock_sage.diagnostics.format import format_report
    from subblock_sage.diagnostics.report import ROUTER_UNRUN, Report, TargetReport, router_status

    with_router = {"kernels": [{"kernel": k, "variant": "x"} for k in ROUTER_KERNELS + ("fi_sm120_bf16_fwd",)]}
    assert router_status(with_router) == ROUTER_UNRUN and "NOT YET RUN ON A GPU" in ROUTER_UNRUN
    assert router_status({"kernels": [{"kernel": "fi_sm120_bf16_fwd"}]}).startswith("not in this library")
    ran = dict(with_router, hardware={"run_on_hardware": True, "router": "run on an H100 (2026-12-07)"})
    assert router_status(ran) == "run on an H100 (2026-12-07)"
    r = Report()
    for name in ("sm_90a", "sm_120a"):
        r.targets[name] = TargetReport(gpus="x", capabilities=["9.0"], library=f"{name}/lib.so", present=True,
                                       sha256_ok=True, router=router_status(with_router))
    text = format_report(r)
    assert text.count("router (route, subblock_attention): compile-verified, NOT YET RUN ON A GPU") == 2


def test_check_lists_the_router_of_every_built_library(kdir, monkeypatch):
    """On the built wheel's manifest: every target's library ships the router and says what its
    run was: aot/hardware_runs.json's entry for the (target, host CPU), or not yet run on a GPU."""
    import json
    import platform

    from subblock_sage.diagnostics import probes
    from subblock_sage.diagnostics.format import format_report
    from subblock_sage.diagnostics.report import ROUTER_UNRUN, router_brief

    from tests.cpu.test_check import machine

    runs = json.loads((ROOT / "aot" / "hardware_runs.json").read_text())
    machine(monkeypatch, [(9, 0)])
    r = probes.check(run_kernels=False)
    want = {n: runs.get(n, {}).get(platform.machine(), {}).get("router", ROUTER_UNRUN) for n in r.targets}
    assert r.targets and {n: t.router for n, t in r.targets.items()} == want
    text = format_report(r, verbose=True)
    assert all(w in text for w in want.values())
    text = format_report(r)  # one line per library: a GPU run up to its first colon
    assert all(f"router (route, subblock_attention): {router_brief(w)}" in text for w in want.values())
    assert {n: t["router"] for n, t in r.to_dict()["targets"].items()} == want


def test_validate_startup_runs_the_router_self_test(kdir, monkeypatch):
    """Every mode's startup validation runs the router's self-test where the library ships it: a
    failing router fails startup (with the fix), one not shipped is no problem."""
    from subblock_sage.diagnostics import probes
    from subblock_sage.errors import StartupValidationError

    from tests.cpu import test_check as T

    T.machine(monkeypatch, [(9, 0)])
    T.CALLS.clear()
    use = lambda **m: monkeypatch.setattr(probes, "SELF_TESTS", {k: (T.HERE, f) for k, f in m.items()})  # noqa: E731
    use(bf16="hook_ok", router="hook_ok")
    r = probes.validate_startup(compute_mode="bf16", device=0)
    assert T.CALLS == [("ok", 0), ("ok", 0)] and r.gpus[0].self_tests["router"] == "ok: matches the reference"
    use(bf16="hook_ok", router="hook_fail")
    with pytest.raises(StartupValidationError, match="router self-test failed: output differs") as e:
        probes.validate_startup(compute_mode="bf16", device=0)
    assert "Fix: pip install" in str(e.value)
    use(bf16="hook_ok", sage_quant="hook_ok", sage_fp8="hook_ok", router="hook_unsupported")
    for mode in ("bf16", "sage_fp8"):
        r = probes.validate_startup(compute_mode=mode, device=0)
        assert r.gpus[0].self_tests["router"].startswith("not shipped for sm_90a")
