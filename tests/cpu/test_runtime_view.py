"""The build reads the runtime's dependency-free files as the package ``aot.runtime``
(aot/runtime/__init__.py): one mechanism, the same in any import order, for exactly the files it
lists, each of them dependency-free, all present in the kernels sdist."""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aot.runtime import FILES  # noqa: E402

RUNTIME = ROOT / "python" / "subblock_sage"
# the build's names for the runtime files, and one of them reached through the other's import
ENTRY_POINTS = ("aot.contract", "aot.kernels.router.spec", "aot.runtime.router_spec", "aot.export.identity")


@pytest.mark.parametrize("order", list(itertools.permutations(ENTRY_POINTS, 2)), ids="-then-".join)
def test_any_import_order_gives_one_module_per_file(order):
    """Whichever name comes first, each runtime file runs once, as ``aot.runtime.<name>``, and
    the build's names are views of those modules (the router's Q_BLOCK is the contract's)."""
    code = f"""
import sys
for name in {order!r}:
    __import__(name)
import aot.contract, aot.kernels.router.spec as spec
rt = [m for m in sys.modules.values() if getattr(m, "__file__", "") and "python/subblock_sage" in m.__file__]
print(sorted(m.__name__ for m in rt))
c = sys.modules["aot.runtime.contract"]
assert aot.contract.SelectionPolicy is c.SelectionPolicy and spec.Q_BLOCK is c.Q_BLOCK
assert spec.router_budget is sys.modules["aot.runtime.router_spec"].router_budget
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == str(sorted(f"aot.runtime.{n}" for n in FILES)), out.stdout


def test_the_export_cache_sees_the_runtime_files_as_inputs():
    """aot/export/identity.py records every imported module's file: the runtime file itself and
    the package that maps it."""
    code = ("import json, aot.kernels.router.spec; from aot.export.identity import repo_inputs; "
            "print(json.dumps(sorted(repo_inputs(set()))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    inputs = json.loads(out.stdout)
    assert {"aot/runtime/__init__.py", "python/subblock_sage/contract.py",
            "python/subblock_sage/router_spec.py"} <= set(inputs), inputs


def stray_imports(path: Path, allowed: tuple[str, ...]) -> list[str]:
    """Imports of ``path`` that are neither the standard library nor a sibling in ``allowed``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            names = [node.module] if node.module else [a.name for a in node.names]
            out += [f"{path.name}:{node.lineno} .{n}" for n in names if n.split(".")[0] not in allowed]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.module.split(".")[0] not in sys.stdlib_module_names:
                out.append(f"{path.name}:{node.lineno} {node.module}")
        elif isinstance(node, ast.Import):
            out += [f"{path.name}:{node.lineno} {a.name}" for a in node.names
                    if a.name.split(".")[0] not in sys.stdlib_module_names]
    return out


def test_the_listed_files_are_dependency_free(tmp_path):
    """Each listed file imports the standard library and listed siblings only (the build has no
    torch and must not run the runtime's package); the check finds a runtime import and a
    third-party one."""
    bad = [s for n in FILES for s in stray_imports(RUNTIME / f"{n}.py", FILES)]
    assert not bad, f"{bad}. Fix: keep these files dependency-free, or do not read them from the build"
    f = tmp_path / "x.py"
    f.write_text("import math\nfrom .contract import Q_BLOCK\nfrom .errors import E\nimport torch\n")
    assert stray_imports(f, FILES) == ["x.py:3 .errors", "x.py:4 torch"]


def test_the_build_reads_only_listed_runtime_files():
    """Every ``aot.runtime.<name>`` the build imports is in FILES, and every listed file is read."""
    used = set()
    for p in sorted((ROOT / "aot").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            mods = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                    else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            used |= {m.split(".")[2] for m in mods if m.startswith("aot.runtime.")}
    assert used == set(FILES), used


def test_the_kernels_sdist_carries_the_listed_files():
    """wheels/kernels (the kernels sdist's root) links the runtime files the build reads: the
    listed ones, and _version.py (the version, read as text by aot/manifest.py)."""
    links = {p.name for p in (ROOT / "wheels" / "kernels" / "python" / "subblock_sage").iterdir()}
    assert links == {f"{n}.py" for n in FILES} | {"_version.py"}, (
        f"{sorted(links)}. Fix: a symlink per aot.runtime.FILES entry in wheels/kernels/python/subblock_sage")
