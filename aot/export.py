"""Export step: compile every registered (kernel, variant, target) with symbolic fake tensors and
write ``<prefix>.h`` / ``<prefix>.o`` plus ``exports.json`` (the argument layouts) per library.

Run by CMake (``python -m aot.export build --lib sm90a --out DIR``); ``plan`` lists what would be
built without compiling anything. One library per GPU target, plus ``test_<target>`` libraries
for test-only builds (never installed into a wheel).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aot import registry
from aot.contract import ABI_VERSION
from aot.registry import ScalarArg, StreamArg, Sym, TensorArg


@dataclass(frozen=True)
class Job:
    lib: str  # library name: target folder, or "test_<folder>"
    target: str
    kernel: registry.Kernel
    variant: registry.Variant
    prefix: str


def plan(host_arch: str = "x86_64", targets: list[str] | None = None,
         experiments: bool = False) -> dict[str, list[Job]]:
    """Every export, grouped by the library it is linked into (deterministic order);
    ``experiments``: with the registry's timing experiments (never shipped)."""
    libs: dict[str, list[Job]] = {}
    for kernel in registry.all_kernels(experiments):
        for test, tlist in ((False, kernel.targets), (True, kernel.test_targets)):
            for target in tlist:
                if targets and target not in targets:
                    continue
                folder = registry.TARGETS[target].folder
                lib = f"test_{folder}" if test else folder
                for variant in kernel.variants:
                    prefix = registry.symbol_prefix(kernel, variant, target, test=test)
                    libs.setdefault(lib, []).append(Job(lib, target, kernel, variant, prefix))
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


def export_job(job: Job, out_dir: Path, host_arch: str) -> dict:
    _, cute = _dsl()
    spec = job.kernel.compile_spec(job.target, job.variant)
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


def build_lib(lib: str, jobs: list[Job], out_dir: Path, host_arch: str) -> dict:
    from aot import shim

    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, job in enumerate(jobs, 1):
        print(f"[{lib} {i}/{len(jobs)}] {job.kernel.name}/{job.variant.name} -> {job.target}",
              flush=True)
        entries.append(export_job(job, out_dir, host_arch))
    # Compile times vary run to run: keep them out of what gets embedded (reproducible builds).
    timings = {e["prefix"]: e.pop("compile_seconds") for e in entries}
    exports = {
        "abi_version": ABI_VERSION,
        "library": lib,
        "target": jobs[0].target,
        "host_arch": host_arch,
        "kernels": entries,
    }
    (out_dir / "exports.json").write_text(json.dumps(exports, indent=1, sort_keys=True) + "\n")
    (out_dir / "timings.json").write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n")
    (out_dir / "shim.c").write_text(shim.generate(exports))
    return exports


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot.export", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_plan = sub.add_parser("plan", help="print the libraries and their exports as JSON")
    p_build = sub.add_parser("build", help="export one library's kernels and generate its shim")
    for p in (p_plan, p_build):
        p.add_argument("--host-arch", default="x86_64", choices=("x86_64", "aarch64"))
        p.add_argument("--targets", default="", help="comma-separated subset of targets")
        p.add_argument("--experiments", action="store_true",
                       help="add the timing experiments (registry.EXPERIMENT_MODULES; never shipped)")
    p_build.add_argument("--lib", required=True)
    p_build.add_argument("--out", required=True, type=Path)
    ns = ap.parse_args(argv)
    targets = [t for t in ns.targets.split(",") if t] or None
    libs = plan(ns.host_arch, targets, ns.experiments)
    if ns.cmd == "plan":
        json.dump(
            {lib: [j.prefix for j in jobs] for lib, jobs in libs.items()}, sys.stdout, indent=1
        )
        print()
        return 0
    if ns.lib not in libs:
        print(f"unknown library {ns.lib!r}; planned: {sorted(libs)}", file=sys.stderr)
        return 2
    build_lib(ns.lib, libs[ns.lib], ns.out, ns.host_arch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
