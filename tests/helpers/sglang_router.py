"""SGLang 0.5.23's ``SubBlockRouter`` (its ``router.py`` + ``kernels.py``, Triton) loaded by path
under a package of its own: SGLang's parent packages pull in its whole runtime, and only these two
files are needed to run its router. Used by tests/gpu/test_router.py and benchmark/router_bench.py."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

ROUTER_DIR = "sglang/multimodal_gen/runtime/layers/attention/backends/subblock_sparse"
NAME = "_sbs_sglang_subblock_router"


class SGLangRouterUnavailable(RuntimeError):
    """SGLang's router cannot run here (the message says why)."""


def load_sglang_router(site: str | None = None):
    """The loaded ``router`` module, from ``site`` (default ``$SBS_SGLANG_SITE``, where
    tests/run.sh and the device runs put SGLang 0.5.23). Raises SGLangRouterUnavailable when the
    files or a real Triton are missing. msgspec, when absent, is replaced by a plain record for
    ``RoutingPlan`` (logged on stderr with ``[stand-in]``)."""
    site = site or os.environ.get("SBS_SGLANG_SITE")
    if not site:
        raise SGLangRouterUnavailable("SBS_SGLANG_SITE not set (tests/run.sh installs SGLang 0.5.23 there)")
    d = Path(site) / ROUTER_DIR
    if not (d / "router.py").is_file():
        raise SGLangRouterUnavailable(f"no SGLang router at {d}")
    try:
        import triton
    except ImportError as e:
        raise SGLangRouterUnavailable(f"triton is not importable ({e})") from None
    if getattr(triton, "STAND_IN", None):
        raise SGLangRouterUnavailable("triton is an import-only stand-in")
    if f"{NAME}.router" in sys.modules:
        return sys.modules[f"{NAME}.router"]
    try:
        import msgspec  # noqa: F401
    except ImportError:
        # router.py only uses msgspec.Struct for its frozen plan record: a plain record stands in
        class Struct:
            def __init_subclass__(cls, **kw):
                super().__init_subclass__()

            def __init__(self, *a, **kw):
                names = list(type(self).__annotations__)
                for n, v in zip(names, a):
                    object.__setattr__(self, n, v)
                for n, v in kw.items():
                    object.__setattr__(self, n, v)

        stub = types.ModuleType("msgspec")
        stub.Struct = Struct
        stub.STAND_IN = "msgspec.Struct as a plain record"
        sys.modules["msgspec"] = stub
        print("[stand-in] msgspec.Struct: a plain record (router.py's plan type)", file=sys.stderr)
    pkg = types.ModuleType(NAME)
    pkg.__path__ = [str(d)]
    sys.modules[NAME] = pkg
    for mod in ("kernels", "router"):
        spec = importlib.util.spec_from_file_location(f"{NAME}.{mod}", d / f"{mod}.py")
        m = importlib.util.module_from_spec(spec)
        sys.modules[f"{NAME}.{mod}"] = m
        spec.loader.exec_module(m)
    return sys.modules[f"{NAME}.router"]
