"""IMPORT-ONLY STAND-INS used by the tests/sglang harness (never by subblock-sage itself).

SGLang 0.5.23 imports some heavy or CUDA-only packages at module scope on the path to its
SubBlock backend, although nothing the SubBlock tests run ever calls them:
  - ``triton`` (~1 GB unpacked; CPU runs only: the H200 run uses the real Triton),
  - ``torchvision`` (``sglang.srt.multimodal.internvl_utils``; needs a torch-matched build),
  - ``sgl_kernel`` (~370 MB CUDA wheel).
``make_package(globals(), name)`` turns a stub package into an inert one: decorators return the
function unchanged, every attribute and every ``name.<sub>`` submodule resolves to a placeholder,
and *calling* a placeholder raises, so a test that really needs the package fails loudly instead
of passing on a stand-in. Every stand-in module carries ``STAND_IN`` so the harness can log it.
"""

import importlib.abc
import importlib.util
import sys
import types


class StandInCalled(RuntimeError):
    pass


class Inert:
    """Placeholder for any object of a stood-in package."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Inert(f"{self._name}.{attr}")

    def __getitem__(self, key):
        return self

    def __or__(self, other):  # used in type annotations evaluated at import
        return self

    __ror__ = __or__

    def __mro_entries__(self, bases):  # `class X(stood_in.Base):` at import
        return (object,)

    def __call__(self, *args, **kwargs):
        # decorator use: @pkg.jit / @pkg.jit(...) / @pkg.autotune(configs=...)
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], Inert):
            return args[0]
        if not args or all(not callable(a) for a in args):
            return _Decorator(self._name)
        raise StandInCalled(f"{self._name} was called, but it is an import-only stand-in "
                            f"(tests/sglang/stubs): this test needs the real package")

    def __repr__(self):
        return f"<import-only stand-in {self._name}>"


class _Decorator(Inert):
    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]):
            return args[0]
        raise StandInCalled(f"{self._name}(...) was called, but it is an import-only stand-in")


class _InertMeta(type):
    """Stood-in classes: class attributes (enum members, constants) are placeholders too."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Inert(f"{cls.__module__}.{cls.__name__}.{attr}")


class constexpr:  # Triton kernel signatures annotate with tl.constexpr
    def __init__(self, value=None):
        self.value = value


def _populate(mod, name, label):
    mod.STAND_IN = label
    mod.__path__ = []
    mod.constexpr = constexpr
    mod.__version__ = "0.0.0+stand-in"

    classes = {}

    def _attr(attr, _n=name):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr.lstrip("_")[:1].isupper():  # a class name: isinstance()/subclassing must work
            return classes.setdefault(attr, _InertMeta(attr, (), {"__module__": _n, "STAND_IN": label}))
        return Inert(f"{_n}.{attr}")

    mod.__getattr__ = _attr


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root, label):
        self.root, self.label = root, label

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name, f"import-only stand-in for {spec.name}")
        _populate(mod, spec.name, self.label)
        return mod

    def exec_module(self, module):
        pass


def make_package(namespace: dict, name: str, version: str) -> None:
    label = f"subblock-sage test harness: import-only stand-in for {name}"
    mod = sys.modules[name]
    _populate(mod, name, label)
    mod.__version__ = version
    namespace.update(cdiv=lambda a, b: -(-a // b),
                     next_power_of_2=lambda n: 1 if n <= 1 else 1 << (int(n) - 1).bit_length())
    sys.meta_path.append(_SubmoduleFinder(name, label))
