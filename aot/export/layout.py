"""Argument layouts: each C argument of an export described for the runtime (``exports.json``),
after cross-checking the registry's spec against the parsed header."""

from __future__ import annotations

from aot import registry
from aot.export.plan import Job
from aot.registry import ScalarArg, Sym, TensorArg


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
