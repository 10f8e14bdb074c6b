"""The text report of ``subblock-sage check`` (``--json`` prints ``Report.to_dict()`` instead)."""

from __future__ import annotations

from .. import loader
from ..torch_support import TORCH_MIN, TORCH_TESTED, dotted
from .report import Report, router_brief

ROUTER = "router (route, subblock_attention):"


def format_report(r: Report, *, verbose: bool = False) -> str:
    """The report as text: one line per library of the install (``verbose``: followed by what it
    serves, kernel by kernel, and its router's run in full), each GPU, the warnings, every problem
    with its fix, the result."""

    def yes(b, good="ok", bad="MISMATCH", none="-"):
        return none if b is None else (good if b else bad)

    kv = r.kernels_version or "not installed"
    if r.kernels_version is not None:
        kv += " (matches)" if r.versions_match else " (MISMATCH)"
    driver = r.driver_cuda or "none"
    if r.driver_cuda:
        driver += f" (needs >= {r.min_driver_cuda}: {'ok' if r.driver_ok else 'TOO OLD'})"
    rows = [
        ("subblock-sage", r.runtime_version),
        (loader.KERNELS_DIST, kv),
        ("kernels folder", (r.kernels_dir or "-") + (f" (OVERRIDE: {loader.ENV_LIBRARY_DIR}, not the installed wheel)"
                                                      if r.library_source == "override" else "")),
        ("build commit", r.build_commit or "-"),
        ("toolchain", ", ".join(f"{k} {v}" for k, v in sorted(r.toolchain.items())) or "-"),
        ("NVIDIA driver (CUDA)", driver),
        ("CUDA runtime (static)", r.runtime_cuda or "-"),
        ("torch", (r.torch or "not installed") + (f" (CUDA {r.torch_cuda})" if r.torch_cuda else "")
         + f"; supported: >= {dotted(TORCH_MIN)}, tested up to {dotted(TORCH_TESTED)}"),
        ("python", f"{r.python} ({r.machine})"),
    ]
    width = max(len(k) for k, _ in rows)
    out = ["subblock-sage check", ""]
    out += [f"{k:<{width}}  {v}" for k, v in rows]
    if r.targets:
        out += ["", "Libraries in this install:"]
        for n, t in sorted(r.targets.items()):
            integ = "MISSING" if not t.present else f"sha256 {yes(t.sha256_ok)}"
            parts = [f"{t.library}, {integ}",
                     "compute modes " + ", ".join(t.compute_modes) if t.compute_modes else "",
                     t.hardware_status,
                     f"{ROUTER} {router_brief(t.router)}" if t.router else "",
                     *t.unvalidated]
            out.append(f"  {n:<8} {t.gpus} (compute capability {', '.join(t.capabilities)}): "
                       + "; ".join(p for p in parts if p))
            if verbose:
                out += [f"           serves {s}" for s in t.serves]
                if t.router and router_brief(t.router) != t.router:
                    out.append(f"           {ROUTER} {t.router}")
    if r.gpus:
        out += ["", "GPUs:"]
        for g in r.gpus:
            cur = " (current)" if g.index == r.current_device else ""
            out.append(f"  [{g.index}]{cur} {g.name} (compute capability {g.capability}) -> "
                       f"{g.target or 'no target'}: {'SERVED' if g.served else 'NOT SERVED'}")
            if g.library:
                out.append(f"      library {g.library}: sha256 {yes(g.sha256_ok)}, "
                           f"{'loaded' if g.loaded else 'not loaded'}; {g.target_status}")
            for mode, res in g.self_tests.items():
                out.append(f"      {mode:<10} {res}")
            for mode, why in g.unvalidated.items():
                out.append(f"      {mode:<10} UNVALIDATED on {g.capability}: {why}")
    out.append("")
    if r.warnings:
        out.append("Warnings:")
        out += [f"  - {w}" for w in r.warnings]
    problems = r.all_problems
    if problems:
        out.append("Problems:")
        out += [f"  - {p}" for p in problems]
    if r.ok:
        verdict = "OK: the current GPU is fully served"
        if r.library_source == "override":
            verdict += f" by the libraries in {loader.ENV_LIBRARY_DIR} (not the installed wheel)"
        if not r.all_served:
            verdict += " (not every visible GPU is: see above)"
    else:
        verdict = "NOT SERVED"
    out.append("Result: " + verdict)
    return "\n".join(out)
