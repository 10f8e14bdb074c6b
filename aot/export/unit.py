"""One export unit (one process, one CMake custom command), through the export cache: compile a
(kernel, variant, target) with fake arguments and write ``<prefix>.o`` / ``.h`` / ``.json``."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from aot import registry
from aot.export.fake import dsl, make_fakes
from aot.export.header import parse_header
from aot.export.identity import ROOT, OpenRecorder, dist_metadata_files, repo_inputs, unit_identity, write_depfile
from aot.export.layout import arg_layouts
from aot.export.metadata import unit_entry
from aot.export.plan import Job


def export_job(job: Job, out_dir: Path, host_arch: str, spec: registry.CompileSpec | None = None) -> dict:
    """Compile ``job`` with fake arguments into ``out_dir`` (``<prefix>.o`` / ``.h``); returns its
    record (:func:`aot.export.metadata.unit_entry`) and the compile time."""
    _, cute = dsl()
    spec = spec or job.kernel.compile_spec(job.target, job.variant)
    fakes = make_fakes(spec.args)
    opts = f"--gpu-arch {job.target}"
    if host_arch == "aarch64":
        opts += " --host-target linux-aarch64"
    t0 = time.perf_counter()
    args, kwargs = spec.bind(fakes)
    compiled = cute.compile(spec.fn, *args, **kwargs, options=opts)
    compiled.export_to_c(str(out_dir), job.prefix, job.prefix)
    seconds = time.perf_counter() - t0
    header = parse_header((out_dir / f"{job.prefix}.h").read_text(), job.prefix)
    return {**unit_entry(job, header["ciface"], arg_layouts(job, spec, header)),
            "compile_seconds": round(seconds, 2)}


def run_unit(module: str, kernel_name: str, variant_name: str, target: str, test: bool,
             host_arch: str, out_dir: Path, depfile: Path | None, use_cache: bool = True,
             other_hosts: tuple[str, ...] = ()) -> dict:
    """One unit: :func:`run_units` with a single (kernel, variant)."""
    return run_units(module, [(kernel_name, variant_name)], target, test, host_arch, out_dir,
                     depfile, use_cache, other_hosts)[0]


def _cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_units(module: str, units: list[tuple[str, str]], target: str, test: bool, host_arch: str,
              out_dir: Path, depfile: Path | None, use_cache: bool = True,
              other_hosts: tuple[str, ...] = ()) -> list[dict]:
    """Export units of one kernel module for one target into ``out_dir``
    (``<prefix>.o/.h/.json`` each), each from the cache when its inputs are unchanged. One
    progress line per unit. Every unit of a kernel module imports the same files, so one process
    (one DSL import, ~0.8 CPU-s, about half of a quantizer export) serves them all; the cache
    still stores and finds each unit by itself.

    ``other_hosts``: host CPUs this build also makes (``SBS_EXPORT_HOSTS``). On a miss, the same
    process compiles the unit for them too and stores the results in the cache, where that host
    CPU's build finds them. The bytes equal those of a process of their own (checked)."""
    from aot import export_cache

    t_start = time.perf_counter()
    recorder = OpenRecorder()
    cache = export_cache.default_cache() if use_cache else None
    folder = registry.TARGETS[target].folder
    hosts = tuple(dict.fromkeys((host_arch, *other_hosts)))
    # Every key now, before anything is imported: nothing the import or a compile does (files,
    # environment) may leak into a key, or another process computing it up front would differ.
    keys = {(k, v, h): export_cache.digest(unit_identity(module, k, v, target, test, h))
            for k, v in units for h in hosts}
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    misses = []
    all_deps: dict[str, str] = {}
    for k, v in units:
        t0, c0 = time.perf_counter(), _cpu()
        prefix = registry.symbol_prefix(k, v, target, test=test)
        hit = cache.lookup(keys[(k, v, host_arch)]) if cache is not None else None
        if hit is not None:
            try:
                cache.fetch(hit[0], out_dir)
            except OSError as e:
                print(f"export cache: {e}; recompiling", file=sys.stderr)
                hit = None
        if hit is None:
            misses.append((k, v, prefix))
            continue
        all_deps.update(hit[1])
        rows.append({"prefix": prefix, "host_arch": host_arch, "cached": True, "extra": "",
                     "seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0})
    if misses:
        t_imp, c_imp = time.perf_counter(), _cpu()  # the import is charged to the first miss
        mod = importlib.import_module(module)
        stored = []
        for i, (k, v, prefix) in enumerate(misses):
            t0, c0 = (t_imp, c_imp) if i == 0 else (time.perf_counter(), _cpu())
            kernel = next((x for x in mod.KERNELS if x.name == k), None)
            variant = kernel and next((x for x in (*kernel.variants, *kernel.test_variants) if x.name == v), None)
            if variant is None:
                raise SystemExit(f"{module} has no kernel {k!r} with variant {v!r}. "
                                 "Fix: re-run CMake configure (the plan changed)")
            job = Job(f"test_{folder}" if test else folder, target, kernel, variant, prefix, module, test)
            extra = ""
            for h in hosts if cache is not None else (host_arch,):
                if h != host_arch and cache.lookup(keys[(k, v, h)], count=False) is not None:
                    continue  # the other host CPU's unit is cached already
                hdir = out_dir if h == host_arch else out_dir / f".{prefix}.{h}"
                hdir.mkdir(exist_ok=True)
                entry = export_job(job, hdir, h)
                entry.pop("compile_seconds")  # varies run to run: kept out of what is embedded
                tmp = hdir / f".{prefix}.json.tmp"
                tmp.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
                os.replace(tmp, hdir / f"{prefix}.json")
                stored.append((keys[(k, v, h)], hdir, prefix))
                extra += f" +{h}" if h != host_arch else ""
            rows.append({"prefix": prefix, "host_arch": host_arch, "cached": False, "extra": extra,
                         "seconds": time.perf_counter() - t0, "cpu_seconds": _cpu() - c0})
        recorder.active = False
        outs = str(out_dir.resolve()) + os.sep
        deps = repo_inputs({p for p in recorder.paths if not p.startswith(outs)})
        all_deps.update(deps)
        if cache is not None:
            for key, hdir, prefix in stored:
                cache.store(key, deps, {f"{prefix}{s}": hdir / f"{prefix}{s}" for s in (".o", ".h", ".json")})
                if hdir != out_dir:
                    shutil.rmtree(hdir, ignore_errors=True)
    recorder.active = False
    if depfile is not None:
        first = registry.symbol_prefix(*units[0], target, test=test)
        write_depfile(depfile, out_dir / f"{first}.o",
                       [ROOT / rel for rel in sorted(all_deps)] + dist_metadata_files())
    results = []
    order = {registry.symbol_prefix(k, v, target, test=test): i for i, (k, v) in enumerate(units)}
    for r in sorted(rows, key=lambda r: order[r["prefix"]]):
        extra = r.pop("extra")
        r.update(seconds=round(r["seconds"], 2), cpu_seconds=round(r["cpu_seconds"], 2),
                 inputs=sorted(all_deps))
        (out_dir / f"{r['prefix']}.time.json").write_text(json.dumps(r, indent=1) + "\n")
        print(f"export {r['prefix']:<44} {host_arch:<7} {r['seconds']:6.1f} s  "
              f"{'cache hit' if r['cached'] else 'compiled' + extra}", flush=True)
        results.append(r)
    if len(rows) > 1:
        print(f"       ({len(rows)} units of {module} for {target} in one process, "
              f"{time.perf_counter() - t_start:.1f} s)", flush=True)
    return results
