"""`subblock-sage` command line: `check` (startup validation report) and `bench`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="subblock-sage", description=__doc__)
    ap.add_argument("--log-level", default=os.environ.get("SUBBLOCK_SAGE_LOG_LEVEL", "WARNING"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_check = sub.add_parser("check", help="report whether this machine is fully served")
    p_check.add_argument("--json", action="store_true", help="print the report as JSON")
    p_check.add_argument("--no-launch", action="store_true", help="skip the kernel self-tests")
    p_check.add_argument("--device", type=int, action="append", metavar="N",
                         help="inspect only GPU N (repeatable); default: every visible GPU")
    p_check.add_argument("--traffic", action="store_true",
                         help="also run the traffic repeatability check on every GPU (default: on "
                              "compute capability 12.x only)")
    p_bench = sub.add_parser("bench", help="benchmark the kernels on the current GPU")
    p_bench.add_argument("--quick", action="store_true", help="one small shape (smoke test)")
    p_bench.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p_bench.add_argument("--shape", action="append", metavar="H,S",
                         help="heads,sequence length (repeatable; default: the three standard shapes)")
    p_bench.add_argument("--warm-s", type=float, default=0.0, metavar="SECONDS",
                         help="run each contender this long before timing it (steady power-capped clocks; "
                              "e.g. 2); default: a few calls")
    ns = ap.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(name)s %(levelname)s: %(message)s")

    if ns.cmd == "check":
        from .check import check, format_report

        report = check(run_kernels=not ns.no_launch, devices=ns.device, traffic=ns.traffic or None)
        if ns.json:
            print(json.dumps(report.to_dict(), indent=1))
        else:
            print(format_report(report))
        return 0 if report.ok else 1
    if ns.cmd == "bench":
        from .bench import main as bench_main

        shapes = [tuple(int(x) for x in sh.split(",")) for sh in ns.shape] if ns.shape else None
        return bench_main(quick=ns.quick, json_path=ns.json, shapes=shapes, warm_s=ns.warm_s)
    return 2


if __name__ == "__main__":
    sys.exit(main())
