"""Where a kernel's warps wait, per SASS instruction, from an Nsight Compute source-page export.

How the 2026-11-30 sm90 Sage numbers in MEASUREMENTS.md (appendix "sm_90a kernel notes") were made (on the H200):

    ncu --kernel-name regex:Sm90SparseAttention --launch-count 1 --section SourceCounters \\
        --section WarpStateStats -o rep python3 one_launch.py
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 benchmark/ncu_sass_stalls.py sass.csv --per QGMMA --top 30

(then ``regex:sm90_attention``: the kernel name carries the Python module and class of the kernel
object, and the class has lived in ``aot/kernels/sm90/kernel.py`` since issue 16.)
It prints the stall-reason mix, the instructions with the most warp samples, and samples and
executed instructions per opcode, normalised by the executions of the ``--per`` instruction
(e.g. the P.V WGMMA: one per tile and warp in the flat Sage kernel).
Without a GPU, the same SASS (with control codes: stall counts, scoreboards) comes from
``nvdisasm -hex`` of a cubin that ``ptxas`` built from the kept PTX (docs/design/kernels-sm90.md, "Checking a kernel change without a GPU").
"""

from __future__ import annotations

import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def opcode(source: str) -> str:
    text = source.strip()
    if text.startswith("@"):
        text = text.split(None, 1)[1]
    return text.split()[0].split(".")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--per", default="QGMMA", help="opcode whose execution count is one loop trip")
    ap.add_argument("--top", type=int, default=25, help="instructions to list")
    args = ap.parse_args()

    rows = list(csv.reader(open(args.csv)))
    header = next(i for i, r in enumerate(rows) if SAMPLES in r)
    ix = {h: i for i, h in enumerate(rows[header])}
    data = [r for r in rows[header + 1:] if len(r) == len(rows[header])]
    stalls = [h for h in rows[header] if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, key):
        return int(r[ix[key]] or 0)

    total = sum(num(r, SAMPLES) for r in data) or 1
    mix = collections.Counter({s[6:]: sum(num(r, s) for r in data) for s in stalls})
    print(f"{len(data)} instructions, {total} warp samples")
    print("stall mix:", ", ".join(f"{k} {v / total:.1%}" for k, v in mix.most_common(10)))

    trips = max((num(r, EXECUTED) for r in data if opcode(r[1]) == args.per), default=0) or 1
    print(f"\n{args.top} instructions with the most samples (executions per {args.per} trip):")
    for r in sorted(data, key=lambda r: -num(r, SAMPLES))[: args.top]:
        top3 = sorted(((num(r, s), s[6:]) for s in stalls), reverse=True)[:3]
        why = ", ".join(f"{n / max(num(r, SAMPLES), 1):.0%} {s}" for n, s in top3 if n)
        print(f"  {num(r, SAMPLES) / total:6.2%} x{num(r, EXECUTED) / trips:5.2f}  {r[1].strip()[:56]:56s} {why}")

    per_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for r in data:
        per_op[opcode(r[1])][0] += num(r, SAMPLES)
        per_op[opcode(r[1])][1] += num(r, EXECUTED)
    print(f"\nper opcode: share of samples, executions per {args.per} trip")
    for op, (n, e) in sorted(per_op.items(), key=lambda kv: -kv[1][0])[:20]:
        print(f"  {op:12s} {n / total:6.1%} {e / trips:8.1f}")
    print(f"  all instructions per trip: {sum(e for _, e in per_op.values()) / trips:.1f}")


if __name__ == "__main__":
    main()
