"""What both upstream importers (:mod:`aot.upstream.flashinfer_import`,
:mod:`aot.upstream.sglang_import`) do to import a pinned package's kernel modules without running
its ``__init__``: *stub parent packages* whose ``__path__`` points at the installed folders, a
``torch`` placeholder while a module that imports torch for unused annotations runs (the build env
has no torch), and the check of the pinned signatures."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator

STUB_MARK = "__subblock_sage_stub__"


class UpstreamMismatch(RuntimeError):
    """The installed upstream package is not the pinned one, or a pinned class changed shape."""


def install_stub_packages(root: Path, names: tuple[str, ...], upstream: str,
                          refuse: Callable[[str, types.ModuleType], None] | None = None) -> None:
    """Register a stub package for each of ``names`` (parents first) whose ``__path__`` is its
    folder under ``root`` (the folder holding the top-level package). A name already imported is
    kept: a stub of an earlier call, or, unless ``refuse`` (which raises) is given, the real
    package (it resolves submodules from the same files)."""
    for name in names:
        mod = sys.modules.get(name)
        if mod is not None:
            if refuse is not None and not getattr(mod, STUB_MARK, False):
                refuse(name, mod)
            continue
        path = root.joinpath(*name.split("."))
        stub = types.ModuleType(name, f"stub parent package of {upstream} (subblock-sage build)")
        stub.__path__ = [str(path)]
        stub.__package__ = name
        stub.__file__ = None
        setattr(stub, STUB_MARK, True)
        stub.__spec__ = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        stub.__spec__.submodule_search_locations = [str(path)]
        sys.modules[name] = stub
        if "." in name:
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, stub)


@contextlib.contextmanager
def torch_placeholder_if_missing(placeholder: Callable[[], types.ModuleType]) -> Iterator[None]:
    """While the block runs, ``sys.modules["torch"]`` is ``placeholder()`` (marked ``STUB_MARK``)
    when torch is neither imported nor installed; otherwise the real torch is left alone."""
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        yield
        return
    sys.modules["torch"] = placeholder()
    try:
        yield
    finally:
        if getattr(sys.modules.get("torch"), STUB_MARK, False):
            del sys.modules["torch"]


def signature_of(fn: Any) -> tuple[tuple[str, str | None], ...]:
    fn = inspect.unwrap(fn)
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append((p.name, None if p.default is inspect.Parameter.empty else repr(p.default)))
    return tuple(out)


def check_signatures(pins: dict[str, tuple[tuple[str, str | None], ...]], cls: type, upstream: str,
                     spec: str) -> None:
    """Every pinned method of ``cls`` (``pins``: method -> :func:`signature_of`) as pinned; else
    :class:`UpstreamMismatch` naming each change (``spec``: what no longer matches)."""
    problems = []
    for method, want in pins.items():
        got = signature_of(getattr(cls, method))
        if got != want:
            problems.append(f"  {cls.__name__}.{method}:\n    pinned    {want}\n    installed {got}")
    if problems:
        raise UpstreamMismatch(
            f"{upstream}: the signature of {cls.__name__} changed, so {spec}:\n" + "\n".join(problems)
        )


def env_site(site_env: str) -> Path | None:
    """The folder named by the environment variable ``site_env`` (a pinned build-time install of
    the test library's upstream packages), resolved, or None when it is unset or empty."""
    import os

    value = os.environ.get(site_env, "")
    return Path(value).resolve() if value else None


def activate_site(site_env: str, pins: dict, requirements: str, what: str, package: str | None = None) -> Path:
    """Put the folder of ``site_env`` first on ``sys.path`` after checking that it holds exactly the
    ``pins`` (distribution -> version; and the ``package`` folder, when given); return it. A missing
    folder or another version raises :class:`UpstreamMismatch` naming ``what`` needs it and the
    install that fixes it (``requirements``, installed by wheels/build.sh when SBS_TEST_LIBS=ON)."""
    import importlib.metadata

    where = env_site(site_env)
    if where is None or not (where / (package or "")).is_dir():
        have = "unset" if where is None else f"{where} ({f'no {package} package in it' if package else 'not a folder'})"
        raise UpstreamMismatch(
            f"{site_env} is {have}; {what} is built from pinned packages there. Fix: pip install --no-deps "
            f"--require-hashes --target <folder> -r {requirements} and export {site_env}=<folder> "
            "(wheels/build.sh does this when SBS_TEST_LIBS=ON)"
        )
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    importlib.invalidate_caches()
    for dist, want in pins.items():
        found = [d for d in importlib.metadata.distributions(path=[str(where)])
                 if d.metadata["Name"].lower().replace("_", "-") == dist]
        got = found[0].version if found else None
        if got != want:
            raise UpstreamMismatch(
                f"{dist} in {where} is {got or 'missing'}; {what} is built from exactly {dist}=={want}. "
                f"Fix: reinstall from {requirements} (pip install --no-deps --target)"
            )
    return where
