"""What a fresh process's first eager call imports: nothing of torch's tracing stack.

An eager call never traces, yet two pieces of the runtime could pull torch's compiler stack in
(``torch._dynamo`` and with it sympy, ``torch.fx`` and ``torch.distributed.fsdp``: 3.7 s on the
build machine without a bytecode cache, 4-5 s of the first call on an H100 host): registering the
operators (``oplib.define``) and the replay recorder's dispatch mode (``replay._op_watch``), whose
``__torch_dispatch__`` torch wraps in ``torch._disable_dynamo`` unless the mode opts out. Each
case runs in a fresh interpreter, so what an earlier test imported does not hide it. The GPU
side (the whole first call, timed): tests/gpu/test_cold_start.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

HEAVY = ("torch._dynamo", "sympy", "torch.fx.experimental.proxy_tensor", "torch.distributed.fsdp",
         "torch._higher_order_ops.triton_kernel_wrap", "triton")

_CHILD = """import sys
import torch
before = set(sys.modules)
{body}
heavy = sorted(m for m in set(sys.modules) - before if m.startswith({heavy!r}))
print("HEAVY", heavy[:8])
"""


def _heavy_after(body: str) -> str:
    src = _CHILD.format(body=body, heavy=HEAVY)
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return [line for line in p.stdout.splitlines() if line.startswith("HEAVY")][-1]


def test_registering_the_operators_imports_no_tracing_stack():
    got = _heavy_after("import subblock_sage, subblock_sage.ops.quantize_route\n"
                       "subblock_sage.subblock_attention, subblock_sage.route\n"
                       "assert torch.ops.subblock_sage.quantize_and_route is not None")
    assert got == "HEAVY []", got


def test_the_recorders_dispatch_mode_imports_no_tracing_stack():
    got = _heavy_after("from subblock_sage import replay\n"
                       "with replay._op_watch() as w:\n"
                       "    x = torch.empty(8).view(2, 4)\n"
                       "    torch.ones(3).add_(1)\n"
                       "assert w.bad == [], w.bad  # CPU work is not the watch's business")
    assert got == "HEAVY []", got
