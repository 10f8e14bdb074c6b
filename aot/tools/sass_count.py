"""What an export's kernel executes per loop iteration, read off its SASS without a GPU: static
instruction counts by opcode, and the instructions one iteration of the kernel's last loop
(after its last ``BAR.SYNC``, up to the branch back) executes when the loop's uniform branches are
decided by known values.

Written for ``router_select``, whose cell counts are runtime arguments: its fold steps are
uniform branches on ``log2 n_q`` / ``log2 n_k`` (``popc(n - 1)``), on ``n - 1`` (``n != 1``, a
key block's first cell ``j & (n_k - 1) == 0``) and on uniform predicates; ``--pair`` gives their
values, so the count is what a warp executes per key tile for that pair (MEASUREMENTS.md,
2026-12-07). The key-tile loop's counted body begins after its second barrier (the staged tile
is complete): ``--bar -2``, the fused launch's row selection after the loop has the last one. A
kernel without such branches (one compiled for a pair) executes its loop straight through.
Branches on anything else are counted as not taken and listed.

Needs ``nvdisasm`` (``--nvdisasm``, default ``$NVDISASM`` or on PATH; the ``nvidia-cuda-nvdisasm``
wheel ships one). Only our own exports are disassembled.

    python -m aot.tools.sass_count EXPORT.o [--pair 4 4 ...] [--log2-regs R70 R74]
        [--mask-regs R71 R69] [--bar -2] [--up UP0=q!=1 UP1=k!=1 UP2=k>=2]

The registers and uniform predicates are the compiled kernel's (read them off its SASS: the
``ISETP.GE.U32`` of a fold step against 0x2 / 0x3 names the ``log2 n`` register, the
``ISETP.NE.U32 ..., RZ`` and ``LOP3.LUT P, RZ, R, 0x1..0xf`` the ``n - 1`` one, a ``PLOP3`` on
a ``UP`` the uniform predicate); the defaults are the shipped ``router_select``'s as
nvidia-cutlass-dsl 4.8.1 compiles it for sm_90a; another kernel, target or compiler allocates
its own, passed as ``--log2-regs`` and ``--mask-regs``. Registers per thread: ``EIATTR_REGCOUNT``
(tests/helpers/elfcheck.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from aot.tools.cubin_identity import cuda_images

_INS = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_ISETP = re.compile(r"ISETP\.(GE|GT|LE|LT|EQ|NE)(?:\.U32)?\.AND (P\d), PT, (R\d+)(?:\.reuse)?, (?:0x([0-9a-f]+)|RZ), PT")
# predicates saved to a register (a fold's predicate kept across a stretch that needs P3..P6), and
# tested again later by an ISETP.NE against RZ
_P2R = re.compile(r"P2R (R\d+), PR, RZ, 0x([0-9a-f]+)")
# a predicate from a mask test: P = (R & imm) != 0
_LOPT = re.compile(r"LOP3\.LUT (P\d), RZ, (R\d+)(?:\.reuse)?, 0x([0-9a-f]+), RZ, 0xc0, !PT")
_CMP = {"GE": lambda a, b: a >= b, "GT": lambda a, b: a > b, "LE": lambda a, b: a <= b,
        "LT": lambda a, b: a < b, "EQ": lambda a, b: a == b, "NE": lambda a, b: a != b}
_PLOP = re.compile(r"PLOP3\.LUT (P\d), PT, PT, PT, (UP\d), 0x(40|80), 0x0")
_BRA = re.compile(r"@(!?)(P\d) BRA `\((\.L_x_\d+)\)")
# the uniform predicates' meanings (--up): a test on n_q or n_k
_UP_TESTS = {"q!=1": lambda q, k: q != 1, "k!=1": lambda q, k: k != 1, "k>=2": lambda q, k: k >= 2,
             "q>=2": lambda q, k: q >= 2}


def parse(sass: str) -> tuple[list[str], dict[str, int]]:
    """(instructions without their addresses, label -> index of the instruction it precedes)."""
    ins, labels = [], {}
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = _INS.match(line)
        if m:
            ins.append(m.group(2))
    return ins, labels


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def loop_trace(ins: list[str], labels: dict[str, int], regs: dict[str, int], up: dict[str, bool], bar: int = -1):
    """Walk the loop that begins after barrier ``bar`` (default the last) once: ``(executed count,
    opcode counts, static size, unevaluated branches)``. ``regs``: register -> value for the
    unsigned ``ISETP`` tests against an immediate or zero and the ``LOP3.LUT`` mask tests;
    ``up``: uniform predicate values."""
    bars = [i for i, t in enumerate(ins) if t.startswith("BAR.SYNC")]
    start = bars[bar] + 1
    back = next(i for i in range(start, len(ins)) if "BRA" in ins[i]
                and labels.get(re.search(r"`\((\.L_x_\d+)\)", ins[i]).group(1), len(ins)) < start)
    pred: dict[str, bool] = {}
    regs, saved = dict(regs), set()  # saved: registers P2R wrote, valid until rewritten
    ops, unknown, i, count = Counter(), [], start, 0
    while i < back:
        t = ins[i]
        count += 1
        ops[opcode(t)] += 1
        dest = re.sub(r"^@!?U?P\w+\s+", "", t).split(" ", 1)[-1].split(",")[0].strip()
        if (m := _P2R.match(t)):
            bits = [b for b in range(7) if int(m.group(2), 16) >> b & 1]
            if all(f"P{b}" in pred for b in bits):
                regs[m.group(1)] = sum(1 << b for b in bits if pred[f"P{b}"])
                saved.add(m.group(1))
            else:
                regs.pop(m.group(1), None)
        elif dest in saved:
            regs.pop(dest, None)
            saved.discard(dest)
        m = _BRA.match(t)
        if m:
            if m.group(2) in pred:
                if pred[m.group(2)] != (m.group(1) == "!"):
                    i = labels[m.group(3)]
                    continue
            else:
                unknown.append(t)
        elif re.match(r"(ISETP|PLOP3|FSETP|LOP3\.LUT P|UISETP)", t):
            for p in re.findall(r"\b(P\d)\b", t.split(",")[0]):
                pred.pop(p, None)  # redefined by a test this walk does not evaluate
            if (m := _ISETP.match(t)) and m.group(3) in regs:
                pred[m.group(2)] = _CMP[m.group(1)](regs[m.group(3)], int(m.group(4) or "0", 16))
            elif (m := _LOPT.match(t)) and m.group(2) in regs:
                pred[m.group(1)] = (regs[m.group(2)] & int(m.group(3), 16)) != 0
            elif (m := _PLOP.match(t)) and m.group(2) in up:
                pred[m.group(1)] = (not up[m.group(2)]) if m.group(3) == "40" else up[m.group(2)]
        i += 1
    return count, ops, back - start, unknown


def disassemble(obj: Path, nvdisasm: str) -> str:
    images = cuda_images(obj.read_bytes())
    if len(images) != 1:
        raise SystemExit(f"{obj}: {len(images)} CUDA images, expected 1")
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(images[0][1])
        return subprocess.run([nvdisasm, "-c", str(cubin)], check=True, capture_output=True, text=True).stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("obj", type=Path, help="an export's object file (<build>/aot/<lib>/<prefix>.o)")
    ap.add_argument("--pair", nargs=2, type=int, action="append", metavar=("N_Q", "N_K"),
                    help="decide the uniform branches for this (n_q, n_k) (repeatable; default 4 4)")
    ap.add_argument("--log2-regs", nargs=2, default=("R70", "R74"), metavar=("RQ", "RK"),
                    help="registers holding log2 n_q and log2 n_k")
    ap.add_argument("--mask-regs", nargs=2, default=("R71", "R69"), metavar=("RQ", "RK"),
                    help="registers holding n_q - 1 and n_k - 1")
    ap.add_argument("--bar", type=int, default=-2,
                    help="the barrier the loop's counted body begins after (index, -1: the last)")
    ap.add_argument("--up", nargs="*", default=("UP0=q!=1", "UP1=k!=1", "UP2=k>=2"),
                    help=f"uniform predicate=test, tests: {', '.join(_UP_TESTS)}")
    ap.add_argument("--nvdisasm", default=os.environ.get("NVDISASM") or shutil.which("nvdisasm"))
    a = ap.parse_args(argv)
    if not a.nvdisasm:
        raise SystemExit("no nvdisasm. Fix: pip install nvidia-cuda-nvdisasm and pass --nvdisasm PATH "
                         "(or set NVDISASM)")
    ins, labels = parse(disassemble(a.obj, a.nvdisasm))
    static = Counter(opcode(t) for t in ins)
    print(f"{a.obj.name}: {len(ins)} instructions; " + " ".join(f"{k}:{v}" for k, v in static.most_common(16)))
    ups = dict(u.split("=", 1) for u in a.up)
    for n_q, n_k in a.pair or [(4, 4)]:
        regs = {a.log2_regs[0]: n_q.bit_length() - 1, a.log2_regs[1]: n_k.bit_length() - 1,
                a.mask_regs[0]: n_q - 1, a.mask_regs[1]: n_k - 1}
        up = {name: _UP_TESTS[test](n_q, n_k) for name, test in ups.items()}
        count, ops, size, unknown = loop_trace(ins, labels, regs, up, a.bar)
        print(f"  n_q={n_q} n_k={n_k}: loop {count} executed of {size}; "
              + " ".join(f"{k}:{v}" for k, v in ops.most_common()))
        if unknown:
            print(f"    {len(unknown)} branches on other values, counted as not taken: {unknown[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
