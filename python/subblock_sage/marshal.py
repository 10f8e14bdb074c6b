"""Pack torch tensors and scalars into the argument structs an exported kernel takes.

Each tensor argument is ``struct { void *data; int32_t dynamic_shapes[n]; int64_t
dynamic_strides[m]; }``: the data pointer, then the dynamic extents and strides in mode order,
static modes skipped (the layout comes from the library's embedded exports, i.e. from the header
the DSL generated). Everything the kernel was compiled to assume (static extents and strides,
divisibility of dynamic ones, pointer alignment, equal symbolic extents across arguments) is
checked here, before the launch: the kernel itself never re-checks it.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

from .loader import KernelEntry, Library, library_for_device

_CTYPES = {
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "int32": ctypes.c_int32,
    "float32": ctypes.c_float,
}


def torch_dtype(name: str):
    import torch

    return {
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "float32": torch.float32,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "int32": torch.int32,
        "int64": torch.int64,
        "float8_e4m3fn": torch.float8_e4m3fn,
    }[name]


@lru_cache(maxsize=None)
def _struct_type(n_shape: int, shape_ct: str, n_stride: int, stride_ct: str):
    fields = [("data", ctypes.c_void_p)]
    if n_shape:
        fields.append(("dynamic_shapes", _CTYPES[shape_ct] * n_shape))
    if n_stride:
        fields.append(("dynamic_strides", _CTYPES[stride_ct] * n_stride))
    return type("TensorArg", (ctypes.Structure,), {"_fields_": fields})


_LIMITS = {"int32_t": 2**31 - 1, "int64_t": 2**63 - 1}


def _pack_tensor(kernel: str, spec: dict, t, syms: dict[str, int]):
    import torch

    name = spec["name"]
    where = f"{kernel}: argument '{name}'"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where} must be a torch.Tensor, got {type(t).__name__}")
    want = torch_dtype(spec["dtype"])
    if t.dtype != want:
        raise TypeError(f"{where} must have dtype {want}, got {t.dtype}")
    shape, stride = spec["shape"], spec["stride"]
    if t.dim() != len(shape):
        raise ValueError(f"{where} must have rank {len(shape)}, got shape {tuple(t.shape)}")
    dyn_shapes, dyn_strides = [], []
    for mode, (want_s, got_s, want_st, got_st) in enumerate(
        zip(shape, t.shape, stride, t.stride())
    ):
        if isinstance(want_s, dict):
            if got_s % want_s["div"]:
                raise ValueError(f"{where}: size of mode {mode} ({got_s}) must be a multiple of {want_s['div']}")
            prev = syms.setdefault(want_s["sym"], got_s)
            if prev != got_s:
                raise ValueError(
                    f"{where}: size of mode {mode} is {got_s} but another argument has {prev} "
                    f"for the same extent '{want_s['sym']}'"
                )
            if got_s > _LIMITS[spec["shape_ctype"]]:
                raise ValueError(f"{where}: size {got_s} of mode {mode} does not fit {spec['shape_ctype']}")
            dyn_shapes.append(got_s)
        elif got_s != want_s:
            raise ValueError(f"{where}: mode {mode} must have size {want_s}, got {got_s}")
        if isinstance(want_st, dict):
            if got_st % want_st["div"]:
                raise ValueError(
                    f"{where}: stride of mode {mode} ({got_st}) must be a multiple of "
                    f"{want_st['div']} elements; pass a tensor with aligned rows (e.g. .contiguous())"
                )
            if got_st < 0 or got_st > _LIMITS[spec["stride_ctype"]]:
                raise ValueError(f"{where}: stride {got_st} of mode {mode} is not supported")
            dyn_strides.append(got_st)
        elif got_st != want_st and got_s != 1:
            raise ValueError(
                f"{where}: mode {mode} must have stride {want_st}, got {got_st} "
                f"(strides {tuple(t.stride())}); the kernel needs that mode contiguous"
            )
    ptr = t.data_ptr()
    if ptr % spec["align"]:
        raise ValueError(
            f"{where}: data pointer must be {spec['align']}-byte aligned (got an offset of "
            f"{ptr % spec['align']} bytes); pass an aligned view or a .clone()"
        )
    st = _struct_type(len(dyn_shapes), spec["shape_ctype"], len(dyn_strides), spec["stride_ctype"])
    obj = st()
    obj.data = ptr
    if dyn_shapes:
        obj.dynamic_shapes[:] = dyn_shapes
    if dyn_strides:
        obj.dynamic_strides[:] = dyn_strides
    return obj


class _TensorPacker:
    """Per-argument fast path, precomputed once per kernel entry: the same checks as
    :func:`_pack_tensor`, in a tight loop; any failure falls back to it for the detailed error.
    (The host cost of a launch matters: a Sage call makes five of them.)"""

    __slots__ = ("spec", "where", "dtype", "rank", "modes", "struct", "align", "shape_max",
                 "stride_max")

    def __init__(self, where: str, spec: dict):
        self.spec, self.where = spec, where
        self.dtype = torch_dtype(spec["dtype"])
        self.rank = len(spec["shape"])
        self.modes = tuple(
            (m,
             None if isinstance(sh, dict) else sh, sh["sym"] if isinstance(sh, dict) else None,
             sh["div"] if isinstance(sh, dict) else 1,
             None if isinstance(st, dict) else st, st["div"] if isinstance(st, dict) else 1)
            for m, (sh, st) in enumerate(zip(spec["shape"], spec["stride"]))
        )
        n_shape = sum(isinstance(x, dict) for x in spec["shape"])
        n_stride = sum(isinstance(x, dict) for x in spec["stride"])
        self.struct = _struct_type(n_shape, spec["shape_ctype"], n_stride, spec["stride_ctype"])
        self.align = spec["align"]
        self.shape_max = _LIMITS[spec["shape_ctype"]]
        self.stride_max = _LIMITS[spec["stride_ctype"]]

    def __call__(self, t, syms: dict):
        try:
            if t.dtype is not self.dtype or t.dim() != self.rank:
                raise _Slow
            shape, stride = t.shape, t.stride()
            ds, dst = [], []
            for m, want_s, key, sdiv, want_st, stdiv in self.modes:
                n, st = shape[m], stride[m]
                if want_s is None:
                    prev = syms.setdefault(key, n)
                    if n % sdiv or prev != n or n > self.shape_max:
                        raise _Slow
                    ds.append(n)
                elif n != want_s:
                    raise _Slow
                if want_st is None:
                    if st % stdiv or st < 0 or st > self.stride_max:
                        raise _Slow
                    dst.append(st)
                elif st != want_st and n != 1:
                    raise _Slow
            ptr = t.data_ptr()
            if ptr % self.align:
                raise _Slow
        except (_Slow, AttributeError):
            return _pack_tensor(self.where, self.spec, t, dict(syms))  # raises the precise error
        fields = [ptr]
        if ds:
            fields.append(tuple(ds))
        if dst:
            fields.append(tuple(dst))
        return self.struct(*fields)


class _Slow(Exception):
    pass


_packers: dict[int, tuple] = {}


def _packers_for(entry: KernelEntry) -> tuple:
    key = id(entry)
    p = _packers.get(key)
    if p is None or p[0] is not entry:
        where = f"{entry.name}/{entry.variant}"
        p = (entry, tuple(
            (a["name"], a["kind"],
             _TensorPacker(where, a) if a["kind"] == "tensor" else _CTYPES.get(a.get("dtype")))
            for a in entry.args
        ), frozenset(a["name"] for a in entry.args if a["kind"] != "stream"))
        _packers[key] = p
    return p


def pack(entry: KernelEntry, values: dict, stream: int):
    """Return (argv, keepalive): argv is the void*[] the C ABI takes."""
    _, packers, names = _packers_for(entry)
    if values.keys() != names:
        missing = sorted(names - values.keys())
        extra = sorted(values.keys() - names)
        raise TypeError(f"{entry.name}/{entry.variant}: missing {missing}, unexpected {extra}")
    syms: dict[str, int] = {}
    objs = []
    for name, kind, packer in packers:
        if kind == "tensor":
            objs.append(packer(values[name], syms))
        elif kind == "scalar":
            objs.append(packer(values[name]))
        else:
            objs.append(ctypes.c_void_p(stream))
    argv = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
    return argv, objs


def _current_stream(index: int) -> int:
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # fast; same value as below
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def launch(kernel: str, variant: str, values: dict, *, device=None, library: Library | None = None) -> None:
    """Launch ``kernel/variant`` on the current stream of ``device`` (graph-capturable)."""
    import torch

    if device is None:
        device = next(v.device for v in values.values() if isinstance(v, torch.Tensor))
    index = torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    lib = library or library_for_device(index)
    entry = lib.entry(kernel, variant)
    argv, keep = pack(entry, values, _current_stream(index))
    lib.launch_raw(entry, index, argv)
    del keep  # the launch copied the argument structs into the kernel's parameters
