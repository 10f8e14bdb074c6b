"""Structure guards: no import cycle and no import against the layering, in ``python/subblock_sage``
(the runtime), ``aot`` (the build) and ``benchmark/lab`` (the project's lab, never shipped). The
graph is read from the source with ``ast`` (``tests/helpers/imports.py``): module-level and
function-level imports alike.

The layers follow "data flows one way" (README.md, developer section): a module may import its
own layer and the layers below it, never above, and neither the runtime nor the build imports the
other (``aot`` reads the runtime's dependency-free files as its package ``aot.runtime``:
aot/runtime/__init__.py; they are graphed under those names too). The lab sits above the runtime:
it imports the runtime, which never imports it (``CROSS``). Each test is shown to fail on a
synthetic tree with the fault it guards against."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.imports import cycles, graph, module_names

ROOT = Path(__file__).resolve().parents[2]

# module (or package: every module under it) -> layer, bottom to top. A new module must be given
# a layer here (the test says so).
LAYERS = {
    # the runtime, python/subblock_sage
    "subblock_sage.contract": 0,  # imports nothing: the build imports it as aot.runtime.contract
    "subblock_sage.errors": 1, "subblock_sage._version": 1, "subblock_sage.router_spec": 1,
    "subblock_sage.loader": 2, "subblock_sage.reference": 2, "subblock_sage.unvalidated": 2,
    "subblock_sage.deadline": 2, "subblock_sage.torch_support": 2,
    "subblock_sage.oplib": 2,  # how the torch.library operators are registered (torch only)
    "subblock_sage.abi": 3,  # argument packing and launch, on a loaded library
    "subblock_sage.workspace": 4,  # per-stream device memory of both call paths
    "subblock_sage.plan": 5,  # the plan kernel's launch
    "subblock_sage.validation": 6, "subblock_sage.backends": 6,
    "subblock_sage.ops": 7,  # a call's description -> served once -> its launches (ops/pipeline.py)
    "subblock_sage.replay": 8,  # replays what the full path (ops) launched: above it
    "subblock_sage.calls": 9,  # an entry point's real call: replay, else the full path recorded
    "subblock_sage.torch_ops": 10,  # the operators only; their real implementations are calls'
    "subblock_sage.api": 11,  # the public calls: eager -> calls, traced -> the operators
    "subblock_sage": 12, "subblock_sage.diagnostics": 12,  # the package's API; `check`
    "subblock_sage.tools": 13, "subblock_sage.integrations": 13,  # optional extras over the API
    "subblock_sage.cli": 14, "subblock_sage.__main__": 14,
    # the project's lab, benchmark/lab (never shipped): above the whole runtime
    "benchmark.lab": 20, "benchmark.lab.test_library": 20,  # where the test library is, how it opens
    "benchmark.lab.sglang_sm90": 21, "benchmark.lab.cudnn_sm90": 21,  # its contenders' launchers
    "benchmark.lab.cudnn_fp8": 21,
    "benchmark.lab.contenders": 22,
    "benchmark.lab.bench": 23,  # `subblock-sage bench` (subblock_sage.tools.bench) + the contenders
    # the build, aot
    "aot.runtime": 0, "aot.contract": 0,  # aot.runtime.<name>: python/subblock_sage/<name>.py
    "aot": 1, "aot.registry": 1, "aot.serving": 1, "aot.export_cache": 1, "aot.toolchain_paths": 1,
    "aot.cross_libs": 1, "aot.tools": 1, "aot.upstream": 1,
    "aot.kernels": 2, "aot.experiments": 2,  # kernel experiments: the kernels' layer, never shipped
    "aot.shim": 3, "aot.summary": 3, "aot.manifest": 3,
    "aot.export": 4,
    "aot.export.cli": 5, "aot.export.__main__": 5,
}

# tree -> the trees it may import (any other import across trees is refused): the lab uses the
# runtime; the runtime and the build import nothing of each other, nor of the lab
CROSS = {"benchmark": ("subblock_sage",)}


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of ``module``: its own entry or its nearest package's; a tree's root package
    entry covers only the root itself (its ``__init__``)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in layers and (n > 1 or module == name):
            return layers[name]
    return None


def wrong_way(g: dict[str, dict[str, int]], layers: dict[str, int], cross=None) -> list[str]:
    """Every import that goes up a layer or across trees (other than ``cross``'s, default
    ``CROSS``), and every module without a layer."""
    cross = CROSS if cross is None else cross
    out = []
    for mod in sorted(g):
        la = layer_of(mod, layers)
        if la is None:
            out.append(f"{mod}: no layer. Fix: add it to LAYERS in tests/cpu/test_layering.py")
            continue
        for dep, line in sorted(g[mod].items()):
            lb = layer_of(dep, layers)
            tree, dep_tree = mod.split(".")[0], dep.split(".")[0]
            if dep_tree != tree and dep_tree not in cross.get(tree, ()):
                out.append(f"{mod}:{line} imports {dep}: the runtime, the build and the lab import nothing of "
                           "each other but the lab the runtime")
            elif lb is not None and lb > la:
                out.append(f"{mod}:{line} (layer {la}) imports {dep} (layer {lb}), a higher layer")
    return out


def _project_graph():
    from aot.runtime import FILES

    seen_by_build = {f"aot.runtime.{n}": ROOT / "python" / "subblock_sage" / f"{n}.py" for n in FILES}
    return graph({**module_names(ROOT / "python", "subblock_sage"), **module_names(ROOT, "aot"), **seen_by_build,
                  **module_names(ROOT, "benchmark/lab")})


def test_no_import_cycle():
    found = [" -> ".join(c) for c in cycles(_project_graph())]
    assert not found, "import cycles (module- or function-level): " + "; ".join(found)


def test_imports_follow_the_layers():
    bad = wrong_way(_project_graph(), LAYERS)
    assert not bad, "\n".join(bad)


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, dict[str, int]]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return graph(module_names(tmp_path, "pkg"))


def test_the_checks_catch_a_function_level_cycle_and_a_wrong_way_import(tmp_path):
    """A cycle closed only inside a function, through a relative import of a subpackage's module,
    and an import from a low layer into a high one are found; the tree without them passes."""
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": "from . import util\n",
        "pkg/util.py": "import os\n\ndef f():\n    from .sub import high  # closes the cycle, at call time\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/high.py": "from ..low import thing\nfrom pkg import util\n",
    }
    layers = {"pkg": 1, "pkg.low": 0, "pkg.util": 0, "pkg.sub": 1}
    g = _tree(tmp_path, files)
    assert g["pkg.util"] == {"pkg.sub.high": 4} and g["pkg.sub.high"] == {"pkg.low": 1, "pkg.util": 2}
    assert [" -> ".join(c) for c in cycles(g)] == ["pkg.low -> pkg.util -> pkg.sub.high -> pkg.low"]
    assert wrong_way(g, layers) == ["pkg.util:4 (layer 0) imports pkg.sub.high (layer 1), a higher layer"]
    assert wrong_way(g, {"pkg": 1, "pkg.low": 0}) == [
        f"{m}: no layer. Fix: add it to LAYERS in tests/cpu/test_layering.py" for m in ("pkg.sub", "pkg.sub.high",
                                                                                       "pkg.util")]
    (tmp_path / "pkg" / "util.py").write_text("import os\n")
    g = _tree(tmp_path, {})
    assert cycles(g) == [] and wrong_way(g, layers) == []


def test_the_project_table_rejects_the_named_wrong_ways():
    """The imports the layering exists to forbid, each checked against the real table."""
    for src, dst in (("subblock_sage.backends.base", "subblock_sage.ops.quantize"),
                     ("subblock_sage.ops.quantize", "subblock_sage.replay"),
                     ("subblock_sage.loader", "subblock_sage.ops.attention"),
                     ("subblock_sage.abi", "subblock_sage.ops"),
                     # the call pipeline: steps below the replay, the replay below the real calls,
                     # the real calls below the operators, the operators below the public calls
                     ("subblock_sage.ops.pipeline", "subblock_sage.replay"),
                     ("subblock_sage.ops.pipeline", "subblock_sage.calls"),
                     ("subblock_sage.backends.sm90", "subblock_sage.ops.pipeline"),
                     ("subblock_sage.validation", "subblock_sage.ops.pipeline"),
                     ("subblock_sage.ops.route", "subblock_sage.calls"),  # no hook up to the replay
                     ("subblock_sage.replay", "subblock_sage.calls"),
                     ("subblock_sage.calls", "subblock_sage.torch_ops"),
                     ("subblock_sage.calls", "subblock_sage.api"),
                     ("subblock_sage.torch_ops", "subblock_sage.api"),
                     ("subblock_sage.contract", "subblock_sage.errors"),
                     ("subblock_sage.diagnostics.probes", "subblock_sage.tools.bench"),
                     ("benchmark.lab.test_library", "benchmark.lab.bench"),
                     ("aot.kernels.sage_quant", "aot.export.unit"),
                     ("aot.export.unit", "aot.export.cli"),
                     ("aot.contract", "aot.registry")):
        assert wrong_way({src: {dst: 1}, dst: {}}, LAYERS), (src, dst)
    assert wrong_way({"aot.shim": {"subblock_sage.contract": 3}, "subblock_sage.contract": {}}, LAYERS) == [
        "aot.shim:3 imports subblock_sage.contract: the runtime, the build and the lab import nothing of each "
        "other but the lab the runtime"]
    # the runtime ships what serves a call: nothing of it imports the lab; the lab imports the runtime
    for src in ("subblock_sage.tools.bench", "subblock_sage.cli", "subblock_sage.tools.power"):
        assert wrong_way({src: {"benchmark.lab.contenders": 7}, "benchmark.lab.contenders": {}}, LAYERS) == [
            f"{src}:7 imports benchmark.lab.contenders: the runtime, the build and the lab import nothing of "
            "each other but the lab the runtime"]
    assert wrong_way({"benchmark.lab.bench": {"subblock_sage.tools.bench": 1}, "subblock_sage.tools.bench": {}},
                     LAYERS) == []
    assert wrong_way({"benchmark.lab.bench": {"aot.registry": 1}, "aot.registry": {}}, LAYERS)
