"""``python -m aot.export {plan,unit,assemble,summary}``: the commands CMakeLists.txt runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import aot.export as package
from aot.export.identity import ROOT, repo_inputs
from aot.export.metadata import assemble
from aot.export.plan import plan, process_groups
from aot.export.summary import summary
from aot.export.unit import run_units


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.export", description=package.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_plan = sub.add_parser("plan", help="print the libraries and their export units as JSON")
    p_unit = sub.add_parser("unit", help="export one (kernel, variant, target) for one host CPU")
    p_asm = sub.add_parser("assemble", help="exports.json + shim.c of one library from its units")
    p_sum = sub.add_parser("summary", help="export times of a build directory, slowest first")
    for p in (p_plan, p_unit, p_asm):
        p.add_argument("--host-arch", default="x86_64", choices=("x86_64", "aarch64"))
    p_plan.add_argument("--targets", default="", help="comma-separated subset of targets")
    p_plan.add_argument("--experiments", action="store_true",
                        help="add the timing experiments (aot/experiments; never shipped)")
    p_plan.add_argument("--inputs-out", type=Path,
                        help="write the repository files the plan imported here, one a line")
    for a in ("--module", "--target"):
        p_unit.add_argument(a, required=True)
    p_unit.add_argument("--kernel", help="one unit: --kernel K --variant V")
    p_unit.add_argument("--variant")
    p_unit.add_argument("--unit", action="append", default=[], metavar="KERNEL:VARIANT",
                        help="a unit of --module (repeatable)")
    p_unit.add_argument("--test", action="store_true", help="test-only library unit")
    p_unit.add_argument("--no-cache", action="store_true", help="bypass the export cache")
    p_unit.add_argument("--depfile", type=Path)
    p_asm.add_argument("--lib", required=True)
    p_asm.add_argument("--target", required=True)
    p_asm.add_argument("prefixes", nargs="+")
    for p in (p_unit, p_asm):
        p.add_argument("--out", required=True, type=Path)
    p_sum.add_argument("build_dir", type=Path)
    ns = ap.parse_args(argv)
    if ns.cmd == "plan":
        targets = [t for t in ns.targets.split(",") if t] or None
        json.dump(process_groups(plan(ns.host_arch, targets, ns.experiments)), sys.stdout, indent=1)
        print()
        if ns.inputs_out:
            files = sorted(str(ROOT / rel) for rel in repo_inputs(set(), exclude=frozenset()))
            ns.inputs_out.write_text("".join(f"{f}\n" for f in files))
    elif ns.cmd == "unit":
        hosts = tuple(os.environ.get("SBS_EXPORT_HOSTS", "").replace(",", " ").split())
        units = [tuple(u.split(":", 1)) for u in ns.unit]
        if ns.kernel or ns.variant:
            units.insert(0, (ns.kernel, ns.variant))
        if not units or not all(len(u) == 2 and all(u) for u in units):
            ap.error("give --kernel K --variant V or --unit K:V (repeatable)")
        run_units(ns.module, units, ns.target, ns.test, ns.host_arch, ns.out, ns.depfile,
                  use_cache=not ns.no_cache, other_hosts=hosts)
    elif ns.cmd == "assemble":
        assemble(ns.lib, ns.target, ns.host_arch, ns.out, ns.prefixes)
    else:
        print(summary(ns.build_dir))
    return 0
