"""Export step: compile each registered (kernel, variant, target) with symbolic fake tensors and
write ``<prefix>.h`` / ``<prefix>.o`` / ``<prefix>.json`` (its argument layout); then per library
``exports.json`` and the C shim.

One export per process and per CMake custom command (``python -m aot.export unit ...``), so Ninja
runs them in parallel and re-runs only the exports whose inputs changed: each unit writes a depfile
listing exactly the repository files it opened (its kernel module, shared helpers, the registry,
FlashInfer patch rules) plus the metadata of the pinned DSL / FlashInfer distributions. Results go
through the content-addressed export cache (:mod:`aot.export_cache`), shared by every clone.
``assemble`` joins a library's units into ``exports.json`` + ``shim.c`` (no DSL import); ``plan``
lists what would be built. One library per GPU target, plus ``test_<target>`` libraries for
test-only builds (never installed into a wheel). Only variants the runtime can select are
planned (:mod:`aot.serving`).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aot import registry, serving
from aot.contract import ABI_VERSION
from aot.registry import ScalarArg, StreamArg, Sym, TensorArg

ROOT = Path(__file__).resolve().parent.parent
# Distributions whose version is an input of every export (the DSL compiles; FlashInfer supplies
# the SM100/SM120 classes; cuda-bindings supplies the stream type).
INPUT_DISTS = ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core",
               "nvidia-cutlass-dsl-libs-cu12", "nvidia-cutlass-dsl-libs-cu13", "cuda-bindings",
               "flashinfer-python")
# Imported by a unit but not an input of what it produces.
NOT_INPUTS = frozenset({"aot/export_cache.py", "aot/serving.py"})


@dataclass(frozen=True)
class Job:
    lib: str  # library name: target folder, or "test_<folder>"
    target: str
    kernel: registry.Kernel
    variant: registry.Variant
    prefix: str
    module: str = ""  # the kernel module that registers `kernel`
    test: bool = False


def plan(host_arch: str = "x86_64", targets: list[str] | None = None,
         experiments: bool = False) -> dict[str, list[Job]]:
    """Every export the runtime can select, grouped by the library it is linked into
    (deterministic order). ``experiments``: the registry's timing experiments replace the kernels
    of the same name (registry.EXPERIMENT_MODULES; never shipped), with every variant they define:
    aot/serving.py filters only what ships."""
    registry.all_kernels(experiments)  # validates names and targets
    swap: dict[str, tuple[str, registry.Kernel]] = {}
    if experiments:
        for m in registry.EXPERIMENT_MODULES:
            for k in importlib.import_module(m).KERNELS:
                swap[k.name] = (m, k)
    libs: dict[str, list[Job]] = {}
    for mod_name in registry.kernel_modules():
        for product in importlib.import_module(mod_name).KERNELS:
            module, kernel = swap.get(product.name, (mod_name, product))
            for test, tlist in ((False, kernel.targets), (True, kernel.test_targets)):
                for target in tlist:
                    if targets and target not in targets:
                        continue
                    folder = registry.TARGETS[target].folder
                    lib = f"test_{folder}" if test else folder
                    for variant in kernel.variants:
                        if module == mod_name and not serving.is_served(kernel.name, variant.name, variant.params):
                            continue
                        prefix = registry.symbol_prefix(kernel, variant, target, test=test)
                        libs.setdefault(lib, []).append(
                            Job(lib, target, kernel, variant, prefix, module, test))
    return dict(sorted(libs.items()))


# ---------------------------------------------------------------------------------------------
# Fake arguments


def _dsl():
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import find_runtime_libraries

    # DESIGN.md fact 2: export of a non-default arch without a GPU needs the DSL runtime loaded
    # globally, or the JIT session cannot resolve _cudaLibraryLoadData & co.
    if not getattr(_dsl, "_loaded", False):
        for p in find_runtime_libraries(enable_tvm_ffi=False):
            ctypes.CDLL(p, mode=os.RTLD_GLOBAL)
        _dsl._loaded = True
    return cutlass, cute


def dsl_dtype(name: str):
    cutlass, _ = _dsl()
    return {
        "bfloat16": cutlass.BFloat16,
        "float16": cutlass.Float16,
        "float32": cutlass.Float32,
        "int8": cutlass.Int8,
        "uint8": cutlass.Uint8,
        "int32": cutlass.Int32,
        "int64": cutlass.Int64,
        "float8_e4m3fn": cutlass.Float8E4M3FN,
    }[name]


def make_fakes(args):
    """Fake tensors/scalars/stream for cute.compile; equal Sym keys share one SymInt."""
    cutlass, cute = _dsl()
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    syms: dict[tuple[str, int, int], object] = {}

    def dim(x):
        if isinstance(x, Sym):
            k = (x.key, x.div, x.width)
            if k not in syms:
                maker = cute.sym_int64 if x.width == 64 else cute.sym_int32
                syms[k] = maker(divisibility=x.div, symbol=x.key)
            return syms[k]
        return x

    fakes = []
    for a in args:
        if isinstance(a, TensorArg):
            fakes.append(
                make_fake_tensor(
                    dsl_dtype(a.dtype),
                    tuple(dim(s) for s in a.shape),
                    tuple(dim(s) for s in a.stride),
                    assumed_align=a.align,
                )
            )
        elif isinstance(a, ScalarArg):
            fakes.append(dsl_dtype(a.dtype)(a.example))
        elif isinstance(a, StreamArg):
            fakes.append(make_fake_stream())
        else:
            raise TypeError(f"unknown argument spec {a!r}")
    return fakes


# ---------------------------------------------------------------------------------------------
# Header parsing: the generated header is the ground truth of the C argument structs.

_STRUCT_RE = re.compile(r"typedef struct \{(?P<body>[^}]*)\}\s*(?P<name>\w+)_t;", re.S)
_FIELD_RE = re.compile(r"(?P<ctype>\w+)\s+\*?(?P<field>\w+)(?:\[(?P<n>\d+)\])?;")


def parse_header(text: str, prefix: str) -> dict:
    structs = {}
    for m in _STRUCT_RE.finditer(text):
        fields = [
            (f["ctype"], f["field"], int(f["n"]) if f["n"] else None)
            for f in _FIELD_RE.finditer(m["body"])
        ]
        structs[m["name"]] = fields
    wrap = re.search(
        rf"cute_dsl_{prefix}_wrapper\({prefix}_Kernel_Module_t \*module,?(?P<params>[^)]*)\)", text
    )
    if not wrap:
        raise RuntimeError(f"{prefix}: wrapper not found in exported header")
    params = [p.strip() for p in wrap["params"].split(",") if p.strip()]
    ciface = re.search(rf"void (_mlir_{prefix}__mlir_ciface_\w+)\(void \*\*args", text)
    if not ciface:
        raise RuntimeError(f"{prefix}: launch entry not found in exported header")
    return {"structs": structs, "params": params, "ciface": ciface[1]}


def arg_layouts(job: Job, spec: registry.CompileSpec, header: dict) -> list[dict]:
    """Cross-check the spec against the header and describe each C argument for the runtime."""
    params = header["params"]
    if len(params) != len(spec.args):
        raise RuntimeError(
            f"{job.prefix}: header has {len(params)} parameters {params}, spec has {len(spec.args)}"
        )
    out = []
    for a, p in zip(spec.args, params):
        if isinstance(a, TensorArg):
            sname = f"{job.prefix}_Tensor_{a.name}"
            fields = header["structs"].get(sname)
            if fields is None:
                raise RuntimeError(f"{job.prefix}: no struct {sname}_t in header (param {p!r})")
            counts = {f: (ct, n) for ct, f, n in fields}
            dyn_shape = [i for i, s in enumerate(a.shape) if isinstance(s, Sym)]
            dyn_stride = [i for i, s in enumerate(a.stride) if isinstance(s, Sym)]
            n_shape = counts.get("dynamic_shapes", ("int32_t", 0))
            n_stride = counts.get("dynamic_strides", ("int64_t", 0))
            if (n_shape[1] or 0) != len(dyn_shape) or (n_stride[1] or 0) != len(dyn_stride):
                raise RuntimeError(
                    f"{job.prefix}: tensor {a.name}: header has {n_shape[1]} dynamic shapes and "
                    f"{n_stride[1]} dynamic strides; spec has {len(dyn_shape)} and {len(dyn_stride)}"
                )
            out.append(
                {
                    "name": a.name,
                    "kind": "tensor",
                    "dtype": a.dtype,
                    "align": a.align,
                    "shape": [
                        {"sym": s.key, "div": s.div} if isinstance(s, Sym) else s for s in a.shape
                    ],
                    "stride": [
                        {"sym": s.key, "div": s.div} if isinstance(s, Sym) else s for s in a.stride
                    ],
                    "shape_ctype": n_shape[0],
                    "stride_ctype": n_stride[0],
                }
            )
        elif isinstance(a, ScalarArg):
            out.append({"name": a.name, "kind": "scalar", "dtype": a.dtype, "ctype": p.split()[0]})
        else:
            out.append({"name": a.name, "kind": "stream"})
    return out


def export_job(job: Job, out_dir: Path, host_arch: str, spec: registry.CompileSpec | None = None) -> dict:
    _, cute = _dsl()
    spec = spec or job.kernel.compile_spec(job.target, job.variant)
    fakes = make_fakes(spec.args)
    opts = f"--gpu-arch {job.target}"
    if host_arch == "aarch64":
        opts += " --host-target linux-aarch64"
    t0 = time.perf_counter()
    compiled = cute.compile(spec.fn, *fakes, **dict(spec.extra_kwargs), options=opts)
    compiled.export_to_c(str(out_dir), job.prefix, job.prefix)
    seconds = time.perf_counter() - t0
    header = parse_header((out_dir / f"{job.prefix}.h").read_text(), job.prefix)
    return {
        "kernel": job.kernel.name,
        "variant": job.variant.name,
        "params": dict(job.variant.params),
        "target": job.target,
        "prefix": job.prefix,
        "ciface": header["ciface"],
        "upstream": job.kernel.upstream,
        "args": arg_layouts(job, spec, header),
        "compile_seconds": round(seconds, 2),
    }


# ---------------------------------------------------------------------------------------------
# One export unit (one process, one CMake custom command), through the export cache.


@functools.cache
def _input_dists() -> dict:
    from importlib import metadata

    out = {}
    for name in INPUT_DISTS:
        try:
            out[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _dist_versions() -> dict[str, str | None]:
    return {n: d.version if d is not None else None for n, d in _input_dists().items()}


def _dist_metadata_files() -> list[Path]:
    """METADATA of each installed input distribution: in the depfile, so that Ninja re-runs the
    exports after a DSL / FlashInfer upgrade (the cache key has the versions themselves)."""
    out = []
    for dist in _input_dists().values():
        if dist is None:
            continue
        # the dist-info folder of a PathDistribution; `dist.files` would find METADATA too but
        # parses the whole RECORD (14k entries for the DSL: ~0.5 s, most of a cache hit's time)
        base = getattr(dist, "_path", None)
        if base is not None and (Path(base) / "METADATA").is_file():
            out.append((Path(base) / "METADATA").resolve())
            continue
        meta = next((f for f in dist.files or () if f.name == "METADATA"), None)
        if meta is not None:
            out.append(Path(dist.locate_file(meta)).resolve())
    return out


def _compile_env() -> dict[str, str]:
    """Environment variables that can change what the DSL or a kernel module compiles."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(("CUTE_DSL_", "CUTLASS_", "SBS_SM90_"))
            and not any(w in k for w in ("CACH", "LOG", "PRINT", "DUMP", "KEEP"))}


def unit_identity(module: str, kernel: str, variant: str, target: str, test: bool,
                  host_arch: str) -> dict:
    """Everything that identifies an export before importing anything (the cache's unit key);
    the repository files it reads are added by the cache (recorded dependency sets)."""
    return {"schema": 1, "abi": ABI_VERSION, "module": module, "kernel": kernel,
            "variant": variant, "target": target, "test": test, "host_arch": host_arch,
            "python": list(sys.version_info[:2]), "dists": _dist_versions(), "env": _compile_env()}


class _OpenRecorder:
    """Records every file opened (audit event ``open``: ``open()``, ``Path.read_text``, the
    import system's ``io.open_code``), so that data files a module reads at import time (e.g.
    FlashInfer patch rules) count as inputs, like the modules themselves."""

    def __init__(self):
        self.paths: set[str] = set()
        self.active = True
        sys.addaudithook(self._hook)

    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def _hook(self, event, args):
        # ("open", (path, mode, flags)): only reads are inputs; what the export writes (its own
        # outputs, possibly inside the repository when the build dir is) must not become one
        if not (self.active and event == "open" and args and isinstance(args[0], (str, bytes))):
            return
        mode, flags = (list(args) + [None, None])[1:3]
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            return
        if isinstance(flags, int) and flags & self._WRITE_FLAGS:
            return
        self.paths.add(os.path.abspath(os.fsdecode(args[0])))


def repo_inputs(opened: set[str], exclude: frozenset[str] = NOT_INPUTS) -> dict[str, str]:
    """{repo-relative path: sha256} of the repository files this process imported or opened."""
    from aot.export_cache import file_sha256

    files = set(opened)
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f:
            files.add(os.path.abspath(f))
    out = {}
    for f in sorted(files):
        p = Path(f)
        try:
            rel = p.relative_to(ROOT).as_posix()
        except ValueError:
            continue
        if "__pycache__" in p.parts or rel in exclude or not p.is_file():
            continue
        out[rel] = file_sha256(p)
    return out


def _write_depfile(path: Path, output: Path, deps: list[Path]) -> None:
    def esc(p: Path) -> str:
        return str(p).replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")

    lines = [f"{esc(output)}:"] + [f" {esc(d)}" for d in deps]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(" \\\n".join(lines) + "\n")
    os.replace(tmp, path)


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
    recorder = _OpenRecorder()
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
        prefix = f"sbs_{'t' if test else ''}{folder}_{k}_{v}"  # = registry.symbol_prefix
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
            variant = kernel and next((x for x in kernel.variants if x.name == v), None)
            if variant is None:
                raise SystemExit(f"{module} has no kernel {k!r} with variant {v!r}. "
                                 "Fix: re-run CMake configure (the plan changed)")
            if registry.symbol_prefix(kernel, variant, target, test=test) != prefix:
                raise SystemExit(f"{prefix}: differs from registry.symbol_prefix. Fix: keep both equal")
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
        first = f"sbs_{'t' if test else ''}{folder}_{units[0][0]}_{units[0][1]}.o"
        _write_depfile(depfile, out_dir / first,
                       [ROOT / rel for rel in sorted(all_deps)] + _dist_metadata_files())
    results = []
    order = {f"sbs_{'t' if test else ''}{folder}_{k}_{v}": i for i, (k, v) in enumerate(units)}
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


def assemble(lib: str, target: str, host_arch: str, out_dir: Path, prefixes: list[str]) -> dict:
    """``exports.json`` (argument layouts of every kernel, embedded in the library) and ``shim.c``
    from a library's units. Imports neither the DSL nor a kernel module."""
    from aot import shim

    entries = [json.loads((out_dir / f"{p}.json").read_text()) for p in prefixes]
    exports = {
        "abi_version": ABI_VERSION,
        "library": lib,
        "target": target,
        "host_arch": host_arch,
        "kernels": entries,
    }
    text = json.dumps(exports, indent=1, sort_keys=True) + "\n"
    (out_dir / "exports.json").write_text(text)
    (out_dir / "shim.c").write_text(shim.generate(exports))
    return exports


def summary(build_dir: Path, slowest: int = 8) -> str:
    """What the last build's export units cost: counts, compile vs cache time, the slowest."""
    rows = []
    for f in sorted(build_dir.glob("aot/*/*.time.json")):
        try:
            rows.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if not rows:
        return "exports: none recorded"
    compiled = [r for r in rows if not r["cached"]]
    hits = len(rows) - len(compiled)
    total = sum(r["seconds"] for r in rows)
    cpu = sum(r.get("cpu_seconds", 0.0) for r in rows)
    out = [f"exports: {len(rows)} units, {len(compiled)} compiled, {hits} from the export cache; "
           f"{total:.0f} s wall, {cpu:.0f} CPU-s in all (last run of each unit)"]
    for r in sorted(rows, key=lambda r: -r["seconds"])[:slowest]:
        out.append(f"  {r['seconds']:7.1f} s  {r.get('cpu_seconds', 0.0):6.1f} CPU-s  {r['prefix']} "
                   f"({r['host_arch']}{', cache hit' if r['cached'] else ''})")
    return "\n".join(out)


MAX_UNITS_PER_PROCESS = 4
# Rough CPU cost of one unit per kernel module (quantizer = 1; measured 2026-12-01): CMake starts
# the export processes heaviest first, so that the slow ones do not form the tail of a fresh build
# (later builds: Ninja orders by the durations in its log itself).
MODULE_WEIGHT = {"aot.kernels.flashinfer_sm100": 8, "aot.kernels.sm90_attention": 6,
                 "aot.kernels.flashinfer_sm120": 3}


def _split(group: dict) -> list[dict]:
    """A (module, target) group in near-equal parts of at most MAX_UNITS_PER_PROCESS units: one
    process saves the DSL import per unit (what makes a quantizer edit fast), several keep a module
    with many slow units (the six SM90 attention variants) from serialising on one core."""
    units = group["units"]
    n = -(-len(units) // MAX_UNITS_PER_PROCESS)
    size = -(-len(units) // n)
    return [{**group, "units": units[i:i + size]} for i in range(0, len(units), size)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.export", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_plan = sub.add_parser("plan", help="print the libraries and their export units as JSON")
    p_unit = sub.add_parser("unit", help="export one (kernel, variant, target) for one host CPU")
    p_asm = sub.add_parser("assemble", help="exports.json + shim.c of one library from its units")
    p_sum = sub.add_parser("summary", help="export times of a build directory, slowest first")
    for p in (p_plan, p_unit, p_asm):
        p.add_argument("--host-arch", default="x86_64", choices=("x86_64", "aarch64"))
    p_plan.add_argument("--targets", default="", help="comma-separated subset of targets")
    p_plan.add_argument("--experiments", action="store_true",
                        help="add the timing experiments (registry.EXPERIMENT_MODULES; never shipped)")
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
        libs = plan(ns.host_arch, targets, ns.experiments)
        out: dict[str, list[dict]] = {}
        for lib, jobs in libs.items():
            groups: dict[tuple, dict] = {}  # one export process per (kernel module, target)
            for j in jobs:
                g = groups.setdefault((j.module, j.target, j.test), {
                    "module": j.module, "target": j.target, "test": j.test, "units": []})
                g["units"].append({"prefix": j.prefix, "kernel": j.kernel.name,
                                   "variant": j.variant.name})
            out[lib] = [{**part, "weight": MODULE_WEIGHT.get(part["module"], 1) * len(part["units"])}
                        for g in groups.values() for part in _split(g)]
        json.dump(out, sys.stdout, indent=1)
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


if __name__ == "__main__":
    sys.exit(main())
