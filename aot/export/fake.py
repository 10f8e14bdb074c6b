"""Fake arguments for ``cute.compile``: tensors with symbolic sizes, scalars and a stream, from
the registry's argument specs (no GPU, no real memory)."""

from __future__ import annotations

import ctypes
import os

from aot.registry import ScalarArg, StreamArg, Sym, TensorArg


def dsl():
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import find_runtime_libraries

    # docs/design/build.md, "Facts the pipeline rests on" (2): export of a non-default arch without a GPU needs the DSL runtime loaded
    # globally, or the JIT session cannot resolve _cudaLibraryLoadData & co.
    if not getattr(dsl, "_loaded", False):
        for p in find_runtime_libraries(enable_tvm_ffi=False):
            ctypes.CDLL(p, mode=os.RTLD_GLOBAL)
        dsl._loaded = True
    return cutlass, cute


def dsl_dtype(name: str):
    cutlass, _ = dsl()
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
    cutlass, cute = dsl()
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
