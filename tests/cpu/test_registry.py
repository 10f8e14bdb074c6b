"""Registry: every kernel names known targets, unique names, unique symbol prefixes."""

import pytest

pytestmark = pytest.mark.aot


def test_registry_lists_kernels_for_all_targets():
    from aot import registry

    kernels = registry.all_kernels()
    assert kernels, "registry is empty"
    shipped = {t for k in kernels for t in k.targets}
    assert {"sm_90a", "sm_100a", "sm_120a"} <= shipped
    prefixes = [
        registry.symbol_prefix(k.name, v.name, t, test=test)
        for k in kernels
        for test, ts in ((False, k.targets), (True, k.test_targets))
        for t in ts
        for v in k.variants
    ]
    assert len(prefixes) == len(set(prefixes))
    for k in kernels:
        assert k.variants and len({v.name for v in k.variants}) == len(k.variants)


def test_duplicate_and_unknown_targets_rejected(monkeypatch):
    from aot import registry

    monkeypatch.setenv("SUBBLOCK_SAGE_KERNEL_MODULES",
                       "tests.cpu.fixtures.scale_kernel,tests.cpu.fixtures.scale_kernel")
    with pytest.raises(ValueError, match="duplicate kernel names"):
        registry.all_kernels()


def test_plan_groups_test_builds_separately():
    from aot import export

    libs = export.plan()
    assert {"sm90a", "sm100a", "sm120a"} <= set(libs)
    for lib, jobs in libs.items():
        assert all(j.lib == lib for j in jobs)
        assert all(j.prefix.startswith("sbs_t") == lib.startswith("test_") for j in jobs)


def test_hardware_status_is_keyed_by_target_and_cpu():
    """An x86_64 run on an H200 says nothing about the aarch64 library a GH200 loads."""
    from aot import manifest, registry

    runs = manifest.hardware_runs()
    assert set(runs) == {t.name for t in registry.TARGETS.values()}
    for target, per_cpu in runs.items():
        assert set(per_cpu) == {"x86_64", "aarch64"}, target
        for cpu, status in per_cpu.items():
            assert status["status"], (target, cpu)
            if status["run_on_hardware"]:
                assert status.get("gpu") and status.get("date"), (target, cpu)
    assert manifest.hardware_status(runs, "sm_90a", "x86_64")["run_on_hardware"]
    assert not manifest.hardware_status(runs, "sm_90a", "aarch64")["run_on_hardware"]
    assert not manifest.hardware_status(runs, "sm_90a", "riscv64")["run_on_hardware"]


def test_every_product_kernel_says_what_it_serves():
    """aot/serving.py lists every kernel of the product registry (an unlisted kernel would ship
    every variant and print "not in aot/serving.py" in the manifest and `check`)."""
    from aot import registry, serving

    names = {k.name for k in registry.all_kernels()}
    assert names == set(serving.SERVED), names ^ set(serving.SERVED)
    assert serving.serves("no_such_kernel") == "no_such_kernel (not in aot/serving.py)"
    assert serving.is_served("no_such_kernel", "anything")
    assert not serving.is_served("fi_sm120_sage_fwd", "topk_bs0")


def test_export_weights_live_in_registered_kernel_modules():
    """Each ``EXPORT_WEIGHT`` is set by a module the registry builds (so none names a module that
    no longer exists), and the plan weighs every export process by its module's: the SM90 attention
    processes outweigh the quantizer's, which start later (CMakeLists.txt orders by weight)."""
    import ast
    from pathlib import Path

    from aot import export, registry

    root = Path(__file__).resolve().parents[2]
    setters = set()
    for p in sorted((root / "aot").rglob("*.py")):
        tree = ast.parse(p.read_text())
        if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "EXPORT_WEIGHT" for t in n.targets)
               for n in tree.body):
            parts = p.relative_to(root).with_suffix("").parts
            setters.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert setters and setters <= set(registry.KERNEL_MODULES) | set(registry.experiment_modules()), setters
    groups = export.process_groups(export.plan("x86_64", ["sm_90a"]))["sm90a"]
    for g in groups:
        assert g["weight"] == export.module_weight(g["module"]) * len(g["units"]), g
    weight = {g["module"]: g["weight"] / len(g["units"]) for g in groups}
    assert weight["aot.kernels.sm90"] > weight["aot.kernels.sage_quant"] == 1, weight


def test_the_export_prefix_is_spelled_once():
    """``registry.symbol_prefix`` is the only place in the build and the runtime that spells an
    export's prefix (``sbs_...``): the plan, the export processes and the depfiles call it."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spelled = re.compile(r"""f?["']sbs_(t|\{)""")
    hits = [f"{p.relative_to(root)}:{i}" for top in ("aot", "python") for p in sorted((root / top).rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if spelled.search(line)]
    assert [h.split(":")[0] for h in hits] == ["aot/registry.py"], hits
    assert spelled.search('''first = f"sbs_{'t' if test else ''}{folder}_{k}.o"''')  # the detector finds a copy
