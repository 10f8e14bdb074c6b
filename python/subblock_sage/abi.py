"""The C ABI of a kernel library from Python: pack torch tensors and scalars into the argument
structs an exported kernel takes, and launch it (``launch`` / ``prepare``).

(Named ``abi``, not ``marshal``, so as not to shadow the standard library's ``marshal``.)

Each tensor argument is ``struct { void *data; int32_t dynamic_shapes[n]; int64_t
dynamic_strides[m]; }``: the data pointer, then the dynamic extents and strides in mode order,
static modes skipped (the layout comes from the library's embedded exports, i.e. from the header
the DSL generated). Everything the kernel was compiled to assume (static extents and strides,
divisibility of dynamic ones, pointer alignment, equal symbolic extents across arguments) is
checked here, before the launch: the kernel itself never re-checks it.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from functools import lru_cache
from typing import Callable, Mapping

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


_FMT = {"int32_t": "i", "int64_t": "q", "float": "f", "int32": "i", "float32": "f"}


def _tensor_fmt(spec: dict) -> tuple[str, int]:
    """The C struct {void *data; shape_t dynamic_shapes[n]; stride_t dynamic_strides[m];} of one
    tensor argument as a struct-module format with the padding the C compiler inserts, and its size."""
    n_shape = sum(isinstance(x, dict) for x in spec["shape"])
    n_stride = sum(isinstance(x, dict) for x in spec["stride"])
    st = _struct_type(n_shape, spec["shape_ctype"], n_stride, spec["stride_ctype"])
    fmt, pos = "Q", 8
    if n_shape:
        fmt += _FMT[spec["shape_ctype"]] * n_shape
        pos = st.dynamic_shapes.offset + st.dynamic_shapes.size
    if n_stride:
        fmt += "x" * (st.dynamic_strides.offset - pos) + _FMT[spec["stride_ctype"]] * n_stride
        pos = st.dynamic_strides.offset + st.dynamic_strides.size
    return fmt + "x" * (ctypes.sizeof(st) - pos), ctypes.sizeof(st)


class _Slow(Exception):
    pass


class _Block:
    """The whole argument block of one kernel entry as one ``struct.Struct``: every argument's
    C struct / scalar at a fixed 8-byte-aligned offset, so that a launch is one ``pack_into``
    plus a ``void*[]`` of precomputed offsets (instead of one ctypes object per argument)."""

    def __init__(self, entry: KernelEntry):
        self.where = f"{entry.name}/{entry.variant}"
        self.names = frozenset(a["name"] for a in entry.args if a["kind"] != "stream")
        fmt, offsets, pos = "<", [], 0
        for a in entry.args:
            offsets.append(pos)
            if a["kind"] == "tensor":
                tfmt, size = _tensor_fmt(a)
                fmt += tfmt
            elif a["kind"] == "scalar":
                fmt += _FMT[a["dtype"]]
                size = 4
            else:
                fmt += "Q"
                size = 8
            pad = -size % 8
            fmt += "x" * pad
            pos += size + pad
        self.struct = struct.Struct(fmt)
        self.offsets = tuple(offsets)
        self.argv_type = ctypes.c_void_p * len(offsets)
        self.fast = _compile_fast(entry, len(self.names))
        self.local = threading.local()  # launch(): one reusable argument buffer per thread

    def new_buffer(self):
        """An argument block and the void*[] pointing into it."""
        buf = ctypes.create_string_buffer(self.struct.size)
        base = ctypes.addressof(buf)
        return buf, self.argv_type(*[base + off for off in self.offsets])

    def thread_buffer(self):
        """This thread's reusable block: the launch copies the parameters before it returns,
        so the next launch of this entry on this thread may overwrite them."""
        try:
            return self.local.slot
        except AttributeError:
            self.local.slot = self.new_buffer()
            return self.local.slot


def _compile_fast(entry: KernelEntry, n_values: int):
    """The checks of :func:`_pack_tensor` for every argument of one entry, generated as one
    straight-line Python function (specs are constants, no loops over modes): about 3x cheaper per
    launch than the generic loops, which matters because a Sage call makes six launches. It
    returns the flat values of the argument block, or raises _Slow (or a lookup / attribute /
    type error) on anything unexpected; the caller then runs the generic path for the precise error."""
    env = {"_Slow": _Slow}
    body = [f"    if len(values) != {n_values}:", "        raise _Slow"]
    seen: dict[str, str] = {}  # symbolic extent -> local variable holding its first value
    parts = []
    for ai, a in enumerate(entry.args):
        kind, name = a["kind"], a["name"]
        if kind == "stream":
            parts.append("(stream,)")
            continue
        if kind == "scalar":
            parts.append(f"(values[{name!r}],)")
            continue
        t = f"t{ai}"
        env[f"D{ai}"] = torch_dtype(a["dtype"])
        shape, stride = a["shape"], a["stride"]
        shape_max, stride_max = _LIMITS[a["shape_ctype"]], _LIMITS[a["stride_ctype"]]
        body += [f"    {t} = values[{name!r}]",
                 f"    if {t}.dtype is not D{ai} or {t}.dim() != {len(shape)}:", "        raise _Slow",
                 f"    sh = {t}.shape", f"    st = {t}.stride()"]
        conds, dyn_shape, dyn_stride = [], [], []
        for m, (x, y) in enumerate(zip(shape, stride)):
            if isinstance(x, dict):
                dyn_shape.append(f"sh[{m}]")
                if x["div"] > 1:
                    conds.append(f"sh[{m}] % {x['div']}")
                prev = seen.get(x["sym"])
                if prev is None:
                    seen[x["sym"]] = prev = f"y{len(seen)}"
                    body.append(f"    {prev} = sh[{m}]")
                    conds.append(f"{prev} > {shape_max}")
                else:
                    conds.append(f"sh[{m}] != {prev}")
            else:
                conds.append(f"sh[{m}] != {int(x)}")
            if isinstance(y, dict):
                dyn_stride.append(f"st[{m}]")
                if y["div"] > 1:
                    conds.append(f"st[{m}] % {y['div']}")
                conds.append(f"st[{m}] < 0 or st[{m}] > {stride_max}")
            else:
                conds.append(f"(st[{m}] != {int(y)} and sh[{m}] != 1)")
        body += [f"    p{ai} = {t}.data_ptr()"]
        conds.append(f"p{ai} % {int(a['align'])}")
        body += ["    if " + " or ".join(conds) + ":", "        raise _Slow"]
        body.append(f"    r{ai} = ({', '.join([f'p{ai}'] + dyn_shape + dyn_stride)},)")
        parts.append(f"r{ai}")
    body.append("    return (" + ", ".join("*" + p for p in parts) + ",)" if parts else "    return ()")
    src = "def fast(values, stream):\n" + "\n".join(body) + "\n"
    exec(compile(src, f"<abi fast path {entry.name}/{entry.variant}>", "exec"), env)
    return env["fast"]


_blocks: dict[int, tuple] = {}


def _block_for(entry: KernelEntry) -> "_Block":
    p = _blocks.get(id(entry))
    if p is None or p[0] is not entry:
        p = (entry, _Block(entry))
        _blocks[id(entry)] = p
    return p[1]


def pack(entry: KernelEntry, values: dict, stream: int):
    """Return (argv, keepalive): argv is the void*[] the C ABI takes."""
    blk = _block_for(entry)
    buf, argv = blk.new_buffer()
    _fill(entry, blk, buf, values, stream)
    return argv, buf


def _fill(entry: KernelEntry, blk: "_Block", buf, values: dict, stream: int) -> None:
    try:
        flat = blk.fast(values, stream)
    except (_Slow, KeyError, AttributeError, TypeError, IndexError):
        flat = _flat_checked(entry, blk, values, stream)  # raises the precise error
    try:
        blk.struct.pack_into(buf, 0, *flat)
    except struct.error as e:
        raise ValueError(f"{entry.name}/{entry.variant}: a scalar argument does not fit its C type ({e})") from None


def _flat_checked(entry: KernelEntry, blk: "_Block", values: dict, stream: int) -> list:
    """The generic path (when the fast path refused): every check with its own message, through
    the ctypes reference packer; returns the same values as the fast path if all pass."""
    if values.keys() != blk.names:
        missing = sorted(blk.names - values.keys())
        extra = sorted(values.keys() - blk.names)
        raise TypeError(f"{entry.name}/{entry.variant}: missing {missing}, unexpected {extra}")
    syms: dict[str, int] = {}
    flat = []
    for a in entry.args:
        if a["kind"] == "tensor":
            obj = _pack_tensor(blk.where, a, values[a["name"]], syms)
            flat.append(obj.data or 0)
            for field in ("dynamic_shapes", "dynamic_strides"):
                if hasattr(obj, field):
                    flat += list(getattr(obj, field))
        elif a["kind"] == "scalar":
            flat.append(values[a["name"]])
        else:
            flat.append(stream)
    return flat


def _current_stream(index: int) -> int:
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # fast; same value as below
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def _resolve(kernel: str, params: Mapping, values: dict, device, library):
    import torch

    if device is None:
        device = next(v.device for v in values.values() if isinstance(v, torch.Tensor))
    index = device if isinstance(device, int) else torch.device(device).index
    if index is None:
        index = torch.cuda.current_device()
    lib = library or library_for_device(index)
    entry = lib.kernel(kernel, **params)
    return index, lib, entry, _block_for(entry)


# Launch recording (replay.py): while a recorder is set on this thread, every launch is also
# handed to it (entry, library, device, packed block, values) right before it is made.
_recording = threading.local()


def recorder():
    return getattr(_recording, "rec", None)


def set_recorder(rec) -> None:
    _recording.rec = rec


def launch(kernel: str, params: Mapping, values: dict, *, device=None, library: Library | None = None) -> None:
    """Launch the variant of ``kernel`` selected by ``params`` (``Library.kernel``) on the current
    stream of ``device`` (graph-capturable)."""
    index, lib, entry, blk = _resolve(kernel, params, values, device, library)
    buf, argv = blk.thread_buffer()
    _fill(entry, blk, buf, values, _current_stream(index))
    rec = getattr(_recording, "rec", None)
    if rec is not None:
        rec.add(entry, blk, lib, index, buf.raw, values)
    lib.launch_raw(entry, index, argv)  # copies the argument structs into the kernel's parameters


def prepare(kernel: str, params: Mapping, values: dict, *, device=None,
            library: Library | None = None) -> Callable[[], None]:
    """Check and pack a launch now (same checks and errors as :func:`launch`), for the current
    stream; the returned function only launches it. Lets a caller that must wait for something
    (the plan summary) do all of its Python work before the wait, so the GPU idles less after it."""
    index, lib, entry, blk = _resolve(kernel, params, values, device, library)
    buf, argv = blk.new_buffer()  # its own block: other launches of this entry may come first
    _fill(entry, blk, buf, values, _current_stream(index))

    def go() -> None:
        rec = getattr(_recording, "rec", None)
        if rec is not None:
            rec.add(entry, blk, lib, index, buf.raw, values)
        lib.launch_raw(entry, index, argv)

    go.block, go.values = buf, values  # argv points into buf, buf at the tensors in values
    return go
