"""A self-test that never finishes makes `check` / `validate_startup` fail within the deadline
(issue 23): the self-test stream is made busy with ``torch.cuda._sleep`` (a test-only spinning
kernel, far longer than the deadline), the deadline is set to 3 s, and both must return with a
timeout error instead of hanging. Runs in a subprocess, so a hang fails the test (timeout) instead
of hanging pytest, and the spinning kernel dies with that process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

# marker `gpu` and the skip without a GPU: tests/conftest.py (every module under tests/gpu/)

DEADLINE_S = 3.0
SPIN_S = 60.0

_CHILD = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import importlib
    from subblock_sage import deadline
    check_mod = importlib.import_module("subblock_sage.diagnostics.probes")
    from subblock_sage.errors import SelfTestTimeoutError
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    hz = getattr(props, "clock_rate", 0) * 1e3 or 2.0e9
    # Warm-up: libraries loaded, kernels loaded onto the device, allocator pools made. Loading a
    # module while another kernel runs can wait for that kernel (seen on the H200: the first
    # check then took the whole spin, 60 s); a real hang is in a self-test launch, after loading.
    check_mod.check(devices=[dev])
    torch.cuda.synchronize(dev)
    with torch.cuda.stream(deadline.selftest_stream(dev)):
        torch.cuda._sleep(int(hz * float(sys.argv[1])))  # a kernel that outlives the deadline
    out = {}
    t = time.monotonic()
    r = check_mod.check(devices=[dev])
    g = r.gpu(dev)
    out["check"] = {"seconds": time.monotonic() - t, "ok": r.ok, "timed_out": g.timed_out,
                    "self_tests": g.self_tests, "problems": r.all_problems}
    t = time.monotonic()
    try:
        check_mod.validate_startup("bf16", device=dev)
        out["validate"] = {"raised": None}
    except SelfTestTimeoutError as e:
        out["validate"] = {"raised": type(e).__name__, "message": str(e)}
    out["validate"]["seconds"] = time.monotonic() - t
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # leave the spinning kernel to the driver's teardown of this process
""")


def test_busy_selftest_stream_fails_startup_within_the_deadline():
    env = dict(os.environ, SUBBLOCK_SAGE_SELFTEST_TIMEOUT_S=str(DEADLINE_S))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _CHILD, str(SPIN_S)], env=env, capture_output=True,
                       text=True, timeout=SPIN_S * 3)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    c, v = out["check"], out["validate"]
    assert c["timed_out"] and not c["ok"], c
    assert c["seconds"] < DEADLINE_S + 10, c["seconds"]
    first = next(iter(c["self_tests"].values()))
    assert first.startswith("TIMED OUT") and "did not finish within 3 s" in first, c["self_tests"]
    assert any("did not finish within the 3 s deadline" in p and "Fix:" in p
               and "SUBBLOCK_SAGE_SELFTEST_TIMEOUT_S" in p for p in c["problems"]), c["problems"]
    assert v["raised"] == "SelfTestTimeoutError" and v["seconds"] < DEADLINE_S + 10, v
    assert "did not finish within" in v["message"], v
    print(f"subprocess total {time.monotonic() - t0:.1f} s; check {c['seconds']:.1f} s, "
          f"validate_startup {v['seconds']:.1f} s")
