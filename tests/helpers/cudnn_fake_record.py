"""The recorders of the cuDNN fake-mode runs (tests/helpers/cudnn_fake.py for SM90,
tests/helpers/cudnn_fake_sm100.py for SM100): ``from_dlpack`` becomes :class:`Marked` (the tensor,
the marking the wrapper asks for, the alignment it assumes), ``cute.compile`` a recorder of the
class instance and its arguments that launches nothing, and every pinned class's constructor a
recorder of its arguments. :data:`record` collects them."""

from __future__ import annotations

record: dict = {"compiles": [], "ctors": []}


class Marked:
    """What from_dlpack(t, assumed_align=...).mark_layout_dynamic(...) would describe."""

    def __init__(self, t, assumed_align=None, **_):
        self.shape, self.stride = list(t.shape), list(t.stride())
        self.dtype = str(t.dtype).replace("torch.", "")
        self.align = assumed_align if assumed_align is not None else t.element_size()
        self.leading = None
        self.marked = False

    def mark_layout_dynamic(self, leading_dim=None):
        if leading_dim is None:  # the DSL's rule: the one stride-1 dimension
            ones = [i for i, s in enumerate(self.stride) if s == 1]
            leading_dim = ones[0] if len(ones) == 1 else None
        self.leading, self.marked = leading_dim, True
        return self

    def mark_compact_shape_dynamic(self, **kw):
        raise AssertionError("the recorded paths mark no compact shapes")

    def describe(self):
        dtype = getattr(self, "element_type", None)
        return {"dtype": dtype.__name__ if dtype is not None else self.dtype, "align": self.align,
                "shape": self.shape, "stride": self.stride, "leading": self.leading, "marked": self.marked}


def fake_compile(fn, *args, **kw):
    seen = []
    for a in args:
        if isinstance(a, Marked):
            same = [i for i, b in enumerate(args) if b is a]
            seen.append({**a.describe(), "first": same[0]})
        elif type(a).__name__ in ("Int32", "Float32"):
            seen.append({"scalar": type(a).__name__, "value": a.value if hasattr(a, "value") else None})
        elif isinstance(a, (int, float)):
            seen.append({"scalar": type(a).__name__, "value": a})
        else:
            seen.append({"other": type(a).__name__})
    record["compiles"].append({"class": type(fn).__name__, "args": seen, "kwargs": sorted(kw),
                               "options": kw.get("options")})
    return lambda *a, **k: None


def install(cute, iface, utils, cudnn_import) -> None:
    """Put the recorders in place of ``from_dlpack`` (in ``_interface`` and the DSL utilities),
    ``cute.compile`` and every pinned class's ``__init__``."""
    iface.from_dlpack = Marked
    utils.from_dlpack = Marked
    cute.compile = fake_compile
    for key in cudnn_import.CLASSES:
        cls = cudnn_import.load_class(key)
        real = cls.__init__

        def spy(self, *a, _real=real, _name=cls.__name__, **kw):
            record["ctors"].append({"class": _name, "args": [repr(x) for x in a],
                                    "kwargs": {k: repr(v) for k, v in kw.items()}})
            return _real(self, *a, **kw)

        cls.__init__ = spy


def views(values: dict) -> dict:
    """Shapes and strides of the tensors in ``values`` (C order), scalars as they are."""
    import torch

    return {n: ({"shape": list(t.shape), "stride": list(t.stride())} if isinstance(t, torch.Tensor) else t)
            for n, t in values.items()}
