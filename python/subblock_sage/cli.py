"""`subblock-sage` command line: `check` (startup validation report) and `bench`.

Every failure ends in one line naming the cause and the fix, with exit status 1 (2 for bad
options, argparse's convention), never a traceback. No command at all prints the help and exits
with 0 (a request for help, as `pip` and `docker` treat it, not a usage error)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from ._version import __version__

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _shape(text: str) -> tuple[int, int]:
    try:
        h, s = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HEADS,SEQLEN (e.g. 14,37760)") from None
    if h < 1 or s < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: heads and sequence length must be positive")
    return h, s


def _calls(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of calls") from None
    if not 0 <= n <= 200:
        raise argparse.ArgumentTypeError(f"{text!r}: calls must be 0..200 (a CUDA graph holds them all)")
    return n


def _shape_presets() -> dict:
    """bench's named shape sets (tools/bench.py imports no torch at module level)."""
    from .tools.bench import SHAPE_PRESETS

    return SHAPE_PRESETS


def _log_level(default: str) -> str:
    """The --log-level default from SUBBLOCK_SAGE_LOG_LEVEL; an invalid value is ignored with a
    warning (as the package does at import), not a ValueError traceback."""
    if default.upper() in _LEVELS:
        return default.upper()
    print(f"subblock-sage: warning: ignoring SUBBLOCK_SAGE_LOG_LEVEL={default!r} (not one of "
          f"{', '.join(_LEVELS)})", file=sys.stderr)
    return "WARNING"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="subblock-sage", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="version", version=f"subblock-sage {__version__}")
    ap.add_argument("--log-level", type=str.upper, choices=_LEVELS,
                    default=_log_level(os.environ.get("SUBBLOCK_SAGE_LOG_LEVEL", "WARNING")))
    sub = ap.add_subparsers(dest="cmd", metavar="{check,bench}")
    p_check = sub.add_parser("check", help="report whether this machine is fully served")
    p_check.add_argument("--json", action="store_true", help="print the report as JSON")
    p_check.add_argument("-v", "--verbose", action="store_true",
                         help="also list what each library serves, kernel by kernel, and its router's run in "
                              "full (default: one line per library; --json always holds everything)")
    p_check.add_argument("--no-launch", action="store_true", help="skip the kernel self-tests")
    p_check.add_argument("--device", type=int, action="append", metavar="N",
                         help="inspect only GPU N (repeatable); default: every visible GPU")
    p_check.add_argument("--traffic", action="store_true",
                         help="also run the traffic repeatability check on every GPU (default: on "
                              "compute capability 12.x only)")
    p_bench = sub.add_parser("bench", help="benchmark the kernels on the current GPU")
    p_bench.add_argument("--quick", action="store_true", help="one small shape (smoke test)")
    p_bench.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p_bench.add_argument("--shape", action="append", metavar="H,S", type=_shape,
                         help="heads,sequence length (repeatable; default: the three standard shapes)")
    p_bench.add_argument("--shapes", metavar="PRESET", choices=_shape_presets(),
                         help="a named set of shapes, run before any --shape: " + "; ".join(
                             f"{name} = " + " ".join(f"{h},{s}" for h, s in shapes)
                             for name, shapes in _shape_presets().items()))
    p_bench.add_argument("--calls", type=_calls, default=20, metavar="N",
                         help="back-to-back calls of the eager and CUDA-graph rows (default 20; 0: no such rows)")
    from .tools.bench import PLAN_SETS

    p_bench.add_argument("--plans", choices=PLAN_SETS,
                         help="the plan set (default: sglang with --shapes sglang, else standard): " + "; ".join(
                             f"{name} = " + ", ".join(p[0] for p in plans) for name, plans in PLAN_SETS.items()))
    p_bench.add_argument("--warm-s", type=float, default=0.0, metavar="SECONDS",
                         help="run each contender this long before timing it (steady power-capped clocks; "
                              "e.g. 2); default: a few calls")
    return ap


def _run(ns: argparse.Namespace) -> int:
    if ns.cmd == "check":
        from .diagnostics.format import format_report
        from .diagnostics.probes import check

        report = check(run_kernels=not ns.no_launch, devices=ns.device, traffic=ns.traffic or None)
        if ns.json:
            print(json.dumps(report.to_dict(), indent=1))
        else:
            print(format_report(report, verbose=ns.verbose))
        return 0 if report.ok else 1
    if ns.cmd == "bench":
        from .torch_support import gpu_problem, require_torch

        require_torch("this command")  # bench times torch tensors
        problem = gpu_problem()
        if problem:
            print(f"subblock-sage bench: {problem}", file=sys.stderr)
            return 1
        from .tools.bench import main as bench_main

        return bench_main(quick=ns.quick, json_path=ns.json, shapes=ns.shape, warm_s=ns.warm_s,
                          preset=ns.shapes, calls=ns.calls, plans=ns.plans)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    ns = ap.parse_args(argv)
    if ns.cmd is None:
        ap.print_help()
        return 0
    logging.basicConfig(level=ns.log_level, format="%(name)s %(levelname)s: %(message)s")
    from .errors import SubblockSageError

    try:
        return _run(ns)
    except SubblockSageError as e:
        print(f"subblock-sage {ns.cmd}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
