"""A GPU target or a compute mode is declared once (``python/subblock_sage/contract.py``: ``TARGETS``,
``MODES``, ``ATTENTION``) and every layer reads the declaration (docs/design/extending.md lists the
files a new one needs).

- A fake target, or a fake mode with its attention kernel, added to the contract's declarations
  only (a copy of ``python/`` and ``aot/`` in a temporary folder, its contract.py edited there) is
  seen by the build's registry, kernel target lists and serving rules, and by the runtime's backend
  map, backends, mode validation, router granularity, launch bounds and self-tests.
- No file of ``python/subblock_sage`` but contract.py spells a compute mode's name, an attention
  kernel's name or a target's name in code: the rule is "no string constant equal to such a name"
  (read with ``ast``); prose is allowed (docstrings, and error and log texts, whose constants are
  longer strings), so the public values stay "sage_fp8" / "bf16" in messages.
- No file of ``aot/`` lists targets (a tuple of two or more target names) or spells an attention
  kernel's name in code: both come from the contract.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from aot.runtime import contract as C  # the contract file, importable in the build env too (no torch)

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "python" / "subblock_sage"
BUILD = ROOT / "aot"


def _code_constants(path: Path):
    """Every string constant of ``path`` that is not a docstring: (line, value)."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value, node


def _py_files(folder: Path):
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_mode_kernel_or_target_name_in_runtime_code():
    names = set(C.MODES) | set(C.ATTENTION_KERNELS) | set(C.TARGETS)
    found = [f"{p.relative_to(ROOT)}:{line}: {value!r}"
             for p in _py_files(RUNTIME) if p.name != "contract.py"
             for line, value, _ in _code_constants(p) if value in names]
    assert not found, ("declared names spelled outside contract.py (read MODES / TARGETS / ATTENTION "
                       "instead):\n" + "\n".join(found))


def test_the_finder_sees_a_comparison():
    """The rule above fails on the fault it guards against (a comparison with a mode's name)."""
    src = 'def f(mode):\n    """Sage: "sage_fp8"."""\n    return mode == "sage_fp8"\n'
    hits = [v for _, v, _ in _code_constants_of(src)]
    assert hits == ["sage_fp8"]


def _code_constants_of(src: str):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    try:
        return list(_code_constants(Path(f.name)))
    finally:
        os.unlink(f.name)


def test_no_target_list_or_attention_kernel_name_in_build_code():
    targets, kernels = set(C.TARGETS), set(C.ATTENTION_KERNELS)
    found = []
    for p in _py_files(BUILD):
        if p.parent.name == "runtime":
            continue
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in targets]
                if len(names) > 1:
                    found.append(f"{p.relative_to(ROOT)}:{node.lineno}: a list of targets {names}")
        found += [f"{p.relative_to(ROOT)}:{line}: {value!r}" for line, value, _ in _code_constants(p)
                  if value in kernels]
    assert not found, "build code restating the contract's targets / kernels:\n" + "\n".join(found)


# --- a fake target / mode added to the declarations only ------------------------------------------

FAKE_TARGET = '        Target("sm_130a", "sm130a", 130, ((13, 0),), "a fake GPU", "sm100"),\n'
FAKE_MODE = ('FAKE = ComputeMode("fake_fp4", quantizes=False, budget_granularity=4, router_blocks=(),\n'
             '                   max_launches=2, max_routed_launches=4, sm90_mode="fake",\n'
             '                   self_test_limits=(0.2, 0.99))\n')
FAKE_KERNEL = '    AttentionKernel("fi_sm100_fake_fwd", "sm100", "fake_fp4"),\n'


def _tree_with(tmp_path: Path, *, target=False, mode=False) -> Path:
    """A copy of python/subblock_sage and aot/ whose contract.py alone declares the fakes."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(RUNTIME, tmp_path / "python" / "subblock_sage", ignore=ignore)
    shutil.copytree(BUILD, tmp_path / "aot", ignore=ignore)
    path = tmp_path / "python" / "subblock_sage" / "contract.py"
    text = path.read_text()

    def after(anchor: str, line: str) -> None:
        nonlocal text
        assert text.count(anchor) == 1, anchor
        text = text.replace(anchor, anchor + line)

    if target:
        after("TARGETS: dict[str, Target] = {\n    t.name: t\n    for t in (\n", FAKE_TARGET)
    if mode:
        anchor = "MODES: dict[str, ComputeMode] = {m.name: m for m in (SAGE_FP8, BF16)}"
        assert text.count(anchor) == 1
        text = text.replace(anchor, FAKE_MODE + anchor.replace("BF16)", "BF16, FAKE)"))
        after("ATTENTION: tuple[AttentionKernel, ...] = (\n", FAKE_KERNEL)
    path.write_text(text)
    return tmp_path


def _run(root: Path, code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "python"), str(root)])}
    env.pop("SUBBLOCK_SAGE_KERNEL_MODULES", None)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_target_needs_only_its_declaration(tmp_path):
    root = _tree_with(tmp_path, target=True)
    got = _run(root, """
        import json
        from aot import registry, serving
        from aot.kernels.sage_quant import spec
        from subblock_sage import contract
        from subblock_sage.backends import BACKENDS, backend_for
        kernels = {k.name: k.targets for k in registry.all_kernels()}
        print(json.dumps({
            "registry": "sm_130a" in registry.TARGETS,
            "every_target": sorted(n for n, t in kernels.items() if "sm_130a" in t),
            "ctas": spec.KV_CTAS_PER_SM["sm_130a"],
            "backend": BACKENDS["sm_130a"],
            "family": backend_for("sm_130a").target_family,
            "modes": {m.name: "sm_130a" in m.targets for m in contract.MODES.values()},
        }))
    """)
    assert got["registry"] and got["backend"] == ".sm100" and got["family"] == "sm100"
    # the kernels every target ships, and the attention kernel of its family
    family = [k for k in C.ATTENTION if k.family == "sm100"]
    assert got["every_target"] == sorted([C.SAGE_QUANT_KERNEL, C.PLAN_KERNEL, "router_pool", "router_select",
                                          *(k.name for k in family), *(k.quantizer for k in family if k.quantizer)])
    assert got["ctas"] == 3
    assert got["modes"] == {m.name: "sm100" in m.kernels for m in C.MODES.values()}


def test_a_mode_needs_only_its_declaration(tmp_path):
    """A new mode also needs its kernels and its backends' launches (docs/design/extending.md);
    everything that only asks about the mode reads the declaration."""
    root = _tree_with(tmp_path, mode=True)
    got = _run(root, """
        import json
        from aot import serving
        from subblock_sage import contract, reference, router_spec, validation
        from subblock_sage.backends import backend_for
        from subblock_sage.diagnostics import probes
        from subblock_sage.integrations import sglang_plugin
        from subblock_sage.ops import attention

        class Lib:
            target = "sm_100a"
            def has_kernel(self, name):
                return name == "fi_sm100_fake_fwd"
        be = backend_for("sm_100a")
        be.can_implement(Lib(), "fake_fp4", 64)
        print(json.dumps({
            "validated": validation.check_compute_mode("fake_fp4"),
            "modes": list(contract.COMPUTE_MODES),
            "served": list(contract.modes_served(["fi_sm100_fake_fwd"])),
            "backend": be.kernels.get("fake_fp4"),
            "fuses_plan": be.fuses_plan(Lib(), "fake_fp4"),
            "geometry": list(be.router_geometry("fake_fp4")),
            "granularity": router_spec.BUDGET_GRANULARITY["fake_fp4"],
            "launches": [contract.MAX_LAUNCHES["fake_fp4"], contract.MAX_ROUTED_LAUNCHES["fake_fp4"]],
            "limits": list(reference.SELF_TEST_LIMITS["fake_fp4"]),
            "needs": list(probes.MODE_NEEDS["fake_fp4"]),
            "self_test": probes.SELF_TESTS["fake_fp4"][2] in attention.SELF_TESTS,
            "plugin": "fake_fp4" in sglang_plugin.COMPUTE_MODES,
            "serving": serving.SERVED["fi_sm100_fake_fwd"][0] == serving.ATTENTION_SERVED["sm100"],
        }))
    """)
    assert got == {
        "validated": "fake_fp4", "modes": [*C.COMPUTE_MODES, "fake_fp4"], "served": ["fake_fp4"],
        "backend": "fi_sm100_fake_fwd", "fuses_plan": False, "geometry": [C.Q_BLOCK, 4], "granularity": 4,
        "launches": [2, 4], "limits": [0.2, 0.99], "needs": ["fake_fp4"], "self_test": True,
        "plugin": True, "serving": True,
    }
