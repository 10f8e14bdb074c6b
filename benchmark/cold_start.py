"""A fresh process's first call, broken down: what a user waits for before the first output.

Each case runs in a fresh Python process (``python -c`` of :data:`CHILD`), which times, in order:

  ``import_torch_s``   ``import torch``;
  ``cuda_init_s``      CUDA initialised and the inputs made on the GPU (synchronised);
  ``import_s``         ``import subblock_sage`` and the public call looked up (the lazy import of
                       ``api.py`` and everything it registers);
  ``first_call_s``     the first call of the entry point, synchronised (library load, kernels
                       loaded onto the GPU, the full path recorded for replay);
  ``second_call_s``    the same call again, synchronised (a replay);
  ``after_cuda_s``     ``import_s + first_call_s``: the issue's "first call after CUDA init".

It also lists what the import and the first call imported beyond ``subblock_sage`` (any of
:data:`HEAVY`: a compiler or torch's tracing stack, which an eager call needs none of) and, with
``--profile``, the first call's cProfile (cumulative, top 25). The ``check`` row times ``python -m
subblock_sage check --json`` as a user runs it (whole process; its self-tests launch every shipped
mode on the GPU).

To run (a GPU machine, the wheels installed; the device tool: ``benchmark/device_run.sh cold``)::

    python3 benchmark/cold_start.py [--reps 3] [--shape 14,4096] [--profile] [--json out.json]

Constraints: one GPU; bytecode caches as the machine has them (the row says whether torch's and
subblock_sage's modules have ``.pyc`` files: a container that keeps none pays Python's compile of
every module imported). Times are wall-clock ``time.perf_counter`` around synchronised steps,
medians over ``--reps`` fresh processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = (("sparse_attention", "bf16"), ("sparse_attention", "sage_fp8"),
         ("subblock_attention", "bf16"), ("subblock_attention", "sage_fp8"))
HEAVY = ("torch._dynamo", "torch._inductor", "torch._higher_order_ops", "torch.distributed", "torch.fx",
         "sympy", "triton", "cutlass")
PHASES = ("import_torch_s", "cuda_init_s", "import_s", "first_call_s", "second_call_s", "after_cuda_s")

CHILD = r"""
import json, sys, time
entry, mode, H, S, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.cuda.init()
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(1, S, H, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
bk = 128 if mode == "sage_fp8" else 64
gq, gk = -(-S // 64), -(-S // bk)
cap = max(1, gk // 4)
index = torch.argsort(torch.rand(1, H, gq, gk, device="cuda", generator=g), dim=-1)[..., :cap].to(torch.int32)
torch.cuda.synchronize()
t2 = time.perf_counter()
before = set(sys.modules)
if profile:
    import cProfile
    pr = cProfile.Profile()
    pr.enable()
import subblock_sage
fn = getattr(subblock_sage, entry)
t3 = time.perf_counter()
if entry == "sparse_attention":
    call = lambda: fn(q, k, v, index, None, block_size_k=bk, compute_mode=mode)
else:
    call = lambda: fn(q, k, v, sparsity=0.75, compute_mode=mode)
call()
torch.cuda.synchronize()
t4 = time.perf_counter()
if profile:
    pr.disable()
call()
torch.cuda.synchronize()
t5 = time.perf_counter()
new = sorted(set(sys.modules) - before)
row = {"import_torch_s": t1 - t0, "cuda_init_s": t2 - t1, "import_s": t3 - t2, "first_call_s": t4 - t3,
       "second_call_s": t5 - t4, "after_cuda_s": t4 - t2,
       "modules_imported": [m for m in new if not m.startswith("subblock_sage")],
       "subblock_sage_modules": len([m for m in new if m.startswith("subblock_sage")]),
       "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
       "dont_write_bytecode": sys.flags.dont_write_bytecode}
if profile:
    import io, pstats
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25)
    row["profile"] = s.getvalue()
print(json.dumps(row))
"""


def _has_pyc(module: str) -> bool:
    """Whether ``module``'s package has a bytecode cache next to its ``__init__.py`` (a fresh
    process then compiles none of those files), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return False
    cache = os.path.join(os.path.dirname(spec.origin), "__pycache__")
    return os.path.isdir(cache) and any(f.endswith(".pyc") for f in os.listdir(cache))


def run_case(entry: str, mode: str, H: int, S: int, profile: bool = False, timeout: float = 300) -> dict:
    """One fresh process's breakdown (the dict :data:`CHILD` prints), or ``{"error": ...}``."""
    p = subprocess.run([sys.executable, "-c", CHILD, entry, mode, str(H), str(S), "1" if profile else "0"],
                       capture_output=True, text=True, timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if p.returncode:
        return {"error": p.stderr[-3000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def time_check(timeout: float = 300, profile: bool = False) -> dict:
    """``python -m subblock_sage check --json`` as a user runs it: wall time and exit status;
    ``profile``: the same under cProfile (cumulative, top 40: where the whole process's time goes,
    ``import torch`` included) and ``import torch`` alone in a fresh process (the floor no change
    of ours moves: torch keeps no bytecode cache on the device hosts)."""
    cmd = [sys.executable, "-m", "subblock_sage", "check", "--json"]
    if profile:
        cmd = [sys.executable, "-c", CHECK_PROFILE]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    row = {"wall_s": time.perf_counter() - t0, "rc": p.returncode}
    if profile:
        row["profile"] = p.stdout[-12000:] + p.stderr[-2000:]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch; torch.cuda.init()"], capture_output=True, timeout=timeout)
        row["import_torch_cuda_init_s"] = time.perf_counter() - t0
    return row


# ``subblock-sage check --json`` in-process under cProfile; its JSON goes to a throwaway buffer,
# the profile to stdout
CHECK_PROFILE = """
import contextlib, cProfile, io, pstats, sys
sys.argv = ["subblock-sage", "check", "--json"]
pr = cProfile.Profile()
pr.enable()
with contextlib.redirect_stdout(io.StringIO()):
    try:
        from subblock_sage.cli import main
        main(["check", "--json"])
    except SystemExit:
        pass
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
print(s.getvalue())
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per case (median)")
    ap.add_argument("--shape", default="14,4096", help="H,S of the inputs (B=1, D=128)")
    ap.add_argument("--profile", action="store_true", help="one more process per case with cProfile")
    ap.add_argument("--no-check", action="store_true", help="skip the `subblock-sage check` row")
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args(argv)
    H, S = (int(x) for x in args.shape.split(","))
    env = {"torch_pyc": _has_pyc("torch"), "subblock_sage_pyc": _has_pyc("subblock_sage"),
           "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", "")}
    print(f"# cold start, B=1 H={H} S={S} D=128; {json.dumps(env)}")
    out = {"env": env, "shape": [H, S], "rows": []}
    print(f"{'entry':20s} {'mode':9s} " + " ".join(f"{p[:-2]:>13s}" for p in PHASES) + "  heavy imports")
    failed = False
    for entry, mode in CASES:
        reps = [run_case(entry, mode, H, S) for _ in range(args.reps)]
        bad = [r for r in reps if "error" in r]
        if bad:
            print(f"{entry:20s} {mode:9s} ERROR {bad[0]['error'][-600:]}")
            out["rows"].append({"entry": entry, "mode": mode, "error": bad[0]["error"]})
            failed = True
            continue
        med = {p: statistics.median(r[p] for r in reps) for p in PHASES}
        heavy = sorted({m.split(".")[0] if not m.startswith("torch.") else ".".join(m.split(".")[:2])
                        for r in reps for m in r["modules_imported"] if m.startswith(HEAVY)})
        row = {"entry": entry, "mode": mode, **med, "after_cuda_s_reps": [r["after_cuda_s"] for r in reps],
               "heavy_imports": heavy, "modules_imported": reps[0]["modules_imported"],
               "subblock_sage_modules": reps[0]["subblock_sage_modules"], "gpu": reps[0]["gpu"],
               "torch": reps[0]["torch"]}
        if args.profile:
            row["profile"] = run_case(entry, mode, H, S, profile=True).get("profile", "")
        out["rows"].append(row)
        print(f"{entry:20s} {mode:9s} " + " ".join(f"{med[p] * 1e3:10.1f} ms" for p in PHASES)
              + f"  {','.join(heavy) or '-'}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    if not args.no_check:
        checks = [time_check() for _ in range(2)]
        out["check"] = checks
        print("subblock-sage check --json: " + ", ".join(f"{c['wall_s']:.2f} s (rc {c['rc']})" for c in checks))
        if args.profile:
            prof = time_check(profile=True)
            out["check_profile"] = prof
            print(f"import torch + CUDA init alone: {prof.get('import_torch_cuda_init_s', 0):.2f} s; "
                  f"check under cProfile: {prof['wall_s']:.2f} s\n{prof['profile']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    for row in out["rows"]:
        if args.profile and row.get("profile"):
            print(f"\n## profile of the first call: {row['entry']} {row['mode']}\n{row['profile']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
