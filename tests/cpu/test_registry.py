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
        registry.symbol_prefix(k, v, t, test=test)
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
