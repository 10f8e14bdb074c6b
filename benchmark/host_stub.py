"""The replayed call's Python on the build machine (no GPU): the public ``sparse_attention`` and
``subblock_attention`` of a recorded Sage-like signature each (a quantizer launch with the stream's
buffer, a launch with a temporary, an attention launch writing the result), with ``aot/shim.py``'s ``run_steps``
compiled against the stub kernels and CUDA runtime of ``tests/cpu/test_replay.py`` (which log
every launch) and the stream calls replaced by constants. What it times is the Python between
the caller and the C launch, which the H200 host multiplies 2-8x right after a host wait
(MEASUREMENTS.md, runs 68-69, 125, 128), so an A/B of a runtime change here says which way the
one-call rows of `subblock-sage bench` will move before any device time is spent.

To run (repository root, the test env; needs the tree's ``aot/`` and ``tests/`` and zig, as the
CPU tests do):
    PYTHONPATH=python:. .testenv/bin/python benchmark/host_stub.py [--rounds 4] [--calls 100000]

Prints us per call of each public call (median of ``rounds`` rounds of ``calls`` calls, the two
calls' rounds interleaved) and of ``sparse_attention``'s parts: ``keyed`` (key and pointers),
``lookup``, ``launch`` (the stream's state, the ``run_steps`` call, the next call's spare
allocated after it), and ``subblock_attention``'s key (``keyed_subblock``).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time

import torch

import subblock_sage
from aot.shim import generate
from subblock_sage import abi, loader, replay, workspace
from tests.cpu import test_replay as T
from tests.helpers.cc import zig_cc


def fake_library():
    """The stub library of tests/cpu/test_replay.py, its launch log a ring (any number of calls)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="sbs_host_stub_"))
    exports = {"library": "fake", "target": "sm_90a", "abi_version": T.ABI_VERSION, "host_arch": "x86_64",
               "kernels": [{"kernel": n, "variant": "default", "prefix": f"p{i}", "ciface": f"stub_p{i}",
                            "params": {}, "args": a} for i, (n, a) in enumerate(T.KERNELS.items())]}
    (d / "shim.c").write_text(generate(exports))
    stub = T.STUB.replace("__LOG_ARG__", str(T.LOG_ARG)).replace("int c = stub_calls++;", "int c = (stub_calls++) & 63;")
    assert "& 63" in stub, "tests/cpu/test_replay.py's stub changed: update the ring above"
    (d / "stub.c").write_text(stub + "".join(T._stub_kernel(i, f"p{i}") for i in range(len(T.KERNELS))))
    so = d / "libfake.so"
    zig_cc("-shared", "-fPIC", "-O2", "-o", str(so), str(d / "shim.c"), str(d / "stub.c"), "-lpthread")
    return loader.Library(so)


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=100000)
    ns = ap.parse_args(argv)
    lib = fake_library()
    abi._current_stream = lambda index: 0x5000
    workspace.current_stream = lambda device: 0x7000
    workspace.capturing = lambda: False

    B, S, H = 1, 256, 2
    q = torch.empty(B, S, H, 128, dtype=torch.bfloat16)
    k, v = torch.empty_like(q), torch.empty_like(q)
    idx = torch.zeros(B, H, 4, 4, dtype=torch.int32)
    cnt = torch.zeros(B, H, 4, dtype=torch.int32)

    def recorded(inputs):
        """The stub launches of one full path, recorded with ``inputs`` as the call's inputs."""
        rec = replay.Recorder(inputs)
        abi.set_recorder(rec)
        try:
            abi.launch("sq", {}, {"q": q, "sync": workspace.sync_buffer("cpu", 64)}, device=0, library=lib)
            res, _ = T._full_path(lib, q, k, idx)
        finally:
            abi.set_recorder(None)
        rep = rec.build(res)
        rep.alloc_device = "cpu"
        return rep

    rep = recorded((q, k, v, idx, cnt, None))
    args = (q, k, v, idx, cnt, None, None, 128, None, "sage_fp8", "BSHD")
    key, ptrs = replay.keyed(*args)
    replay._cache[key] = rep
    # a routed call's plan is a temporary of the call: the same launches with no plan input
    sub_args = (q, k, v, None, 0.75, "sage_fp8", 4, None, None, "BSHD")
    replay._cache[replay.keyed_subblock(*sub_args)[0]] = recorded((q, k, v, None, None, None))

    def call():
        return subblock_sage.sparse_attention(q, k, v, idx, cnt, block_size_k=128, compute_mode="sage_fp8")

    def sub_call():
        return subblock_sage.subblock_attention(q, k, v, compute_mode="sage_fp8")

    for fn in (call, sub_call):  # the second call of each in the steady state
        assert fn().shape == q.shape and fn().shape == q.shape
    whole, sub = [], []
    for _ in range(ns.rounds):
        whole.append(per_call_us(call, ns.calls))
        sub.append(per_call_us(sub_call, ns.calls))
    for name, xs in (("sparse_attention", whole), ("subblock_attention", sub)):
        print(f"{name}: {statistics.median(xs):.2f} us per call (rounds: {' '.join(f'{x:.2f}' for x in xs)})")
    for name, fn in (("keyed", lambda: replay.keyed(*args)), ("lookup", lambda: replay.lookup(key)),
                     ("launch", lambda: rep.launch(ptrs, None)),
                     ("keyed_subblock", lambda: replay.keyed_subblock(*sub_args))):
        print(f"  {name:14} {statistics.median(per_call_us(fn, ns.calls) for _ in range(ns.rounds)):.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
