"""Startup guards, on CPU: the self-test deadline (a launch that never finishes must
fail startup within the deadline, not hang it) and the "unvalidated" gate of Sage on compute
capability 12.1 (refused by validate_startup unless the caller opts in)."""

from __future__ import annotations

import importlib
import time

import pytest

from subblock_sage import deadline, unvalidated
from subblock_sage.errors import SelfTestTimeoutError, StartupValidationError


class NeverEvent:
    """A CUDA event of a kernel that never finishes."""

    def __init__(self):
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return False


class LaterEvent:
    def __init__(self, after: int):
        self.after, self.queries = after, 0

    def query(self) -> bool:
        self.queries += 1
        return self.queries > self.after


def test_never_finishing_event_times_out_within_the_deadline():
    ev = NeverEvent()
    t0 = time.monotonic()
    with pytest.raises(SelfTestTimeoutError, match=r"GPU 3 \(sm_120a\).*did not finish within 0\.3 s.*"
                                                   r"SUBBLOCK_SAGE_SELFTEST_TIMEOUT_S"):
        deadline.wait_event(ev, "GPU 3 (sm_120a), bf16 self-test", timeout=0.3)
    took = time.monotonic() - t0
    assert 0.3 <= took < 1.5, took
    assert ev.queries > 3  # it polled, it did not block in one call


def test_fake_clock_deadline_and_success():
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    with pytest.raises(SelfTestTimeoutError, match="x: the self-test launch did not finish within"):
        deadline.wait_event(NeverEvent(), "x", timeout=5.0, clock=lambda: now[0], sleep=sleep)
    assert 5.0 <= now[0] <= 5.0 + 1e-9 and max(slept) <= 0.01
    ev = LaterEvent(after=4)
    deadline.wait_event(ev, "x", timeout=5.0, clock=lambda: 0.0, sleep=lambda s: None)
    assert ev.queries == 5


def test_timeout_env(monkeypatch):
    monkeypatch.delenv(deadline.ENV, raising=False)
    assert deadline.timeout_s() == 60.0
    monkeypatch.setenv(deadline.ENV, "2.5")
    assert deadline.timeout_s() == 2.5
    for bad in ("0", "-1", "abc", "inf", "nan"):
        monkeypatch.setenv(deadline.ENV, bad)
        with pytest.raises(ValueError, match=r"SUBBLOCK_SAGE_SELFTEST_TIMEOUT_S=.*Fix: unset it"):
            deadline.timeout_s()


def test_timeout_error_is_a_startup_validation_error():
    assert issubclass(SelfTestTimeoutError, StartupValidationError)


# ---------------------------------------------------------------------------------------------
# The 12.1 Sage label


def test_labels_from_manifest_and_builtin():
    assert unvalidated.labels({}, "sm_120f", "12.1").keys() == {"sage_fp8"}
    assert unvalidated.labels({}, "sm_120a", "12.0") == {}
    assert unvalidated.labels({}, "sm_90a", "9.0") == {}
    meta = {"unvalidated": {"bf16": {"capabilities": ["12.1"], "why": "because"}}}
    assert unvalidated.labels(meta, "sm_120f", "12.1") == {"bf16": "because"}  # the manifest wins


def test_opt_in(monkeypatch):
    monkeypatch.delenv(unvalidated.ENV, raising=False)
    assert not unvalidated.allowed()
    assert unvalidated.allowed(True) and not unvalidated.allowed(False)
    monkeypatch.setenv(unvalidated.ENV, "1")
    assert unvalidated.allowed() and not unvalidated.allowed(False)
    monkeypatch.setenv(unvalidated.ENV, "0")
    assert not unvalidated.allowed()


def _fake_check(monkeypatch, capability, target, *, timed_out=False):
    check_mod = importlib.import_module("subblock_sage.diagnostics.probes")

    def fake(**kw):
        r = check_mod.Report()
        g = check_mod.GPUReport(index=0, name="Fake GB10", capability=capability, target=target,
                                served=not timed_out, timed_out=timed_out)
        g.unvalidated = unvalidated.labels({}, target, capability)
        g.self_tests = {m: "ok: fine" for m in kw["compute_modes"]}
        if timed_out:
            g.problems.append("bf16 self-test of the sm_120f kernels did not finish within the 60 s "
                              "deadline. Fix: ...")
        r.gpus.append(g)
        r.current_device = 0
        return r

    monkeypatch.setattr(check_mod, "check", fake)
    return check_mod


def test_validate_startup_refuses_sage_on_12_1_without_opt_in(monkeypatch):
    monkeypatch.delenv(unvalidated.ENV, raising=False)
    check_mod = _fake_check(monkeypatch, "12.1", "sm_120f")
    with pytest.raises(StartupValidationError,
                       match=r"compute capability 12\.1, sm_120f\): compute_mode='sage_fp8' is "
                             r"UNVALIDATED on this GPU: FlashInfer enables its SM120 Sage kernel on "
                             r"compute capability 12\.0 only.*Fix: use compute_mode='bf16'.*"
                             r"SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1"):
        check_mod.validate_startup("sage_fp8", device=0)
    check_mod.validate_startup("bf16", device=0)  # bf16 on 12.x stays allowed
    check_mod.validate_startup("sage_fp8", device=0, allow_unvalidated=True)
    monkeypatch.setenv(unvalidated.ENV, "1")
    check_mod.validate_startup("sage_fp8", device=0)
    with pytest.raises(StartupValidationError, match="UNVALIDATED"):
        check_mod.validate_startup("sage_fp8", device=0, allow_unvalidated=False)


def test_validate_startup_allows_sage_on_12_0(monkeypatch):
    monkeypatch.delenv(unvalidated.ENV, raising=False)
    check_mod = _fake_check(monkeypatch, "12.0", "sm_120a")
    check_mod.validate_startup("sage_fp8", device=0)


def test_validate_startup_raises_the_timeout_type(monkeypatch):
    check_mod = _fake_check(monkeypatch, "12.1", "sm_120f", timed_out=True)
    with pytest.raises(SelfTestTimeoutError, match=r"sm_120f\): bf16 self-test of the sm_120f kernels "
                                                   r"did not finish within the 60 s deadline"):
        check_mod.validate_startup("bf16", device=0)
