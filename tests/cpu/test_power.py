"""power.py: clock / power sampling for `subblock-sage bench`, against a fake NVML binding."""

import sys
import time
import types

import pytest

from subblock_sage.tools import bench, power


def _fake_nvml(readings, *, event_api=True):
    """A pynvml stand-in that replays `readings` (MHz, W, reason bits), repeating the last one."""
    state = {"i": 0, "init": 0}

    def nxt():
        return readings[min(state["i"], len(readings) - 1)]

    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM = 1

    def init():
        state["init"] += 1

    def clock(h, kind):
        assert h == "H" and kind == 1
        return nxt()[0]

    def usage(h):
        return int(nxt()[1] * 1000)  # NVML reports mW

    def reasons(h):
        r = nxt()[2]
        state["i"] += 1
        return r

    m.nvmlInit = init
    m.nvmlDeviceGetHandleByUUID = lambda u: "H"
    m.nvmlDeviceGetHandleByIndex = lambda i: "H"
    m.nvmlDeviceGetClockInfo = clock
    m.nvmlDeviceGetPowerUsage = usage
    if event_api:
        m.nvmlDeviceGetCurrentClocksEventReasons = reasons
    else:  # drivers / bindings before the rename
        m.nvmlDeviceGetCurrentClocksThrottleReasons = reasons
    return m, state


def test_summarize_medians_and_dominant_reason():
    s = power.summarize([(1980, 600.0, 0), (1700, 695.0, 0x4), (1650, 699.0, 0x4 | 0x20), (1720, 690.0, 0x4)])
    assert s.sm_mhz == 1710 and s.watts == pytest.approx(692.5)
    assert s.slowed == pytest.approx(0.75) and s.reason == "power cap" and s.samples == 4
    assert s.as_row() == {"MHz": 1710, "W": 692, "slowed": "75% power cap"}
    assert power.summarize([]) is None
    idle = power.summarize([(1980, 120.0, 0x1)])  # GpuIdle is not a slowdown
    assert idle.slowed == 0 and idle.reason == "" and idle.as_row()["slowed"] == "0%"


@pytest.mark.parametrize("event_api", [True, False])
def test_sampler_reads_nvml_while_the_block_runs(monkeypatch, event_api):
    fake, state = _fake_nvml([(1980, 650.0, 0), (1785, 691.0, 0x4)], event_api=event_api)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = power.Sampler(0, interval_s=0.005)
    assert s.available and state["init"] == 1
    with s:
        time.sleep(0.15)
    summ = s.summary()
    assert summ.samples >= 3
    assert summ.sm_mhz == 1785 and summ.reason == "power cap" and 0.5 <= summ.slowed < 1.0
    # a second block starts from no samples
    with s:
        pass
    assert s.summary().samples >= 1 and s.summary().slowed == 1.0


def test_sampler_without_nvml_is_inert(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    s = power.Sampler(0)
    assert not s.available
    with s:
        pass
    assert s.summary() is None


def test_sampler_when_nvml_init_fails(monkeypatch):
    fake, _ = _fake_nvml([(1980, 100.0, 0)])

    def boom():
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = boom
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert not power.Sampler(0).available


def test_bench_rows_carry_the_power_columns():
    pw = power.summarize([(1800, 691.7, 0x4)])
    row = bench.result_row("sage_fp8 (kernel only)", (14, 37760), "0.25 random bk128", 3.2, 4e15, 1e15, 16.7, pw)
    assert row["MHz"] == 1800 and row["W"] == 692 and row["slowed"] == "100% power cap"
    plain = bench.result_row("bf16", (14, 37760), "1.0", 20.0, 4e15, 4e15, 16.7)
    assert "MHz" not in plain
    table = bench.format_table([row, plain])
    header = table.splitlines()[0].split()
    assert header[-3:] == ["MHz", "W", "slowed"]
    assert "100% power cap" in table
