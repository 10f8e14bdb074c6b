"""The Sage quantizer under a spinning kernel that holds most of the GPU's thread slots: does
``sage_quant_kv`` (whose CTAs wait on one another, aot/kernels/sage_quant/) progress with only a
few CTAs resident? Prints one JSON line: ms from the start event to the end of the quantize call and
to the end of the spinner, how many SMs kept room (one 1024-thread spinner block instead of two),
the spinner's registers, and whether the outputs equal an unhindered call's.

To run (GPU machine, wheels installed; a fresh process, so that the environment applies):
    CUDA_DEVICE_MAX_CONNECTIONS=32 python benchmark/residency_probe.py

Observed on the H200 (2026-12-01, MEASUREMENTS.md "Residency probe"): the quantize call ended
right after the spinner (1001.5 vs 1000.1 ms), with 4 SMs holding one spinner block (10 registers
per thread: room for four quantizer CTAs each by threads and registers) and bit-identical outputs.
Not understood yet: the ticket order rules out waits on CTAs that have not started, so either no
quantizer CTA could be placed next to the spinner (hypothesis: the SMs' shared-memory carveout as
configured for the spinner, which uses none, leaves no room for the quantizer's few KiB), or the
launch waits on something else. Next: the same with a spinner that allocates shared memory, and
%smid recorded by the quantizer's CTAs.
"""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl

import subblock_sage


@triton.jit
def _clock_ns():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _spin(sm_ptr, ns):
    start = _clock_ns()
    now = start
    while now - start < ns:
        now = _clock_ns()
    tl.store(sm_ptr + tl.program_id(0), _smid())


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(1, 8192, 4, 128, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3))
    want = subblock_sage.quantize_sage(q, k, v)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = 2 * (sms - 2)  # 2 x 1024 threads fill an SM's 2048 thread slots
    where = torch.zeros(blocks, dtype=torch.int32, device="cuda")
    opts = dict(num_warps=32, maxnreg=32)  # <= 32 registers: one block leaves room for 2+ quantizer CTAs
    kern = _spin[(blocks,)](where, 10**6, **opts)  # compile and warm up outside the timed part
    torch.cuda.synchronize()
    side, main_s = torch.cuda.Stream(), torch.cuda.Stream()
    ev = {n: torch.cuda.Event(enable_timing=True) for n in ("start", "quant", "spin")}
    with torch.cuda.stream(side):
        ev["start"].record()
        _spin[(blocks,)](where, 10**9, **opts)
        ev["spin"].record()
    with torch.cuda.stream(main_s):
        main_s.wait_event(ev["start"])
        torch.cuda._sleep(2_000_000)  # ~1 ms on one SM: the spinner's blocks are resident first
        got = subblock_sage.quantize_sage(q, k, v)
        ev["quant"].record()
    torch.cuda.synchronize()
    per_sm = torch.bincount(where.long(), minlength=sms).tolist()
    same = all(torch.equal(want[x].view(torch.uint8) if want[x].dtype == torch.float8_e4m3fn else want[x],
                           got[x].view(torch.uint8) if got[x].dtype == torch.float8_e4m3fn else got[x]) for x in want)
    print(json.dumps({"quant_ms": round(ev["start"].elapsed_time(ev["quant"]), 3),
                      "spin_ms": round(ev["start"].elapsed_time(ev["spin"]), 3),
                      "sms_with_one_spinner_block": sum(1 for c in per_sm if c == 1),
                      "sms_without": sum(1 for c in per_sm if c == 0), "spinner_regs": kern.n_regs,
                      "identical": same}))


if __name__ == "__main__":
    main()
