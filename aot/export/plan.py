"""What a build exports: every (kernel, variant, target) the runtime can select, grouped by the
library it is linked into, and in export processes of one kernel module and target each."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from aot import registry, serving


@dataclass(frozen=True)
class Job:
    lib: str  # library name: target folder, or "test_<folder>"
    target: str
    kernel: registry.Kernel
    variant: registry.Variant
    prefix: str
    module: str = ""  # the kernel module that registers `kernel`
    test: bool = False


def plan(host_arch: str = "x86_64", targets: list[str] | None = None,
         experiments: bool = False) -> dict[str, list[Job]]:
    """Every export the runtime can select, grouped by the library it is linked into
    (deterministic order). ``experiments``: the registry's timing experiments replace the kernels
    of the same name (registry.experiment_modules(): aot/experiments; never shipped), with every variant they define:
    aot/serving.py filters only what ships."""
    registry.all_kernels(experiments)  # validates names and targets
    swap: dict[str, tuple[str, registry.Kernel]] = {}
    if experiments:
        for m in registry.experiment_modules():
            for k in importlib.import_module(m).KERNELS:
                swap[k.name] = (m, k)
    libs: dict[str, list[Job]] = {}
    for mod_name in registry.kernel_modules():
        for product in importlib.import_module(mod_name).KERNELS:
            module, kernel = swap.get(product.name, (mod_name, product))
            # (test library?, targets, variants, filtered by aot/serving.py?)
            builds = ((False, kernel.targets, kernel.variants, True), (True, kernel.test_targets, kernel.variants, True),
                      (True, kernel.targets, kernel.test_variants, False))
            for test, tlist, variants, filtered in builds:
                for target in tlist:
                    if targets and target not in targets:
                        continue
                    folder = registry.TARGETS[target].folder
                    lib = f"test_{folder}" if test else folder
                    for variant in variants:
                        if (filtered and module == mod_name
                                and not serving.is_served(kernel.name, variant.name, variant.params)):
                            continue
                        prefix = registry.symbol_prefix(kernel.name, variant.name, target, test=test)
                        libs.setdefault(lib, []).append(
                            Job(lib, target, kernel, variant, prefix, module, test))
    return dict(sorted(libs.items()))


MAX_UNITS_PER_PROCESS = 4


def module_weight(module: str) -> int:
    """Rough CPU cost of one unit of kernel module ``module``, a quantizer unit being 1: the
    module's own ``EXPORT_WEIGHT`` (the attention modules set 3 to 8), 1 where it sets none.
    CMake starts the export processes heaviest first, so that the slow ones do not form the tail
    of a fresh build (later builds: Ninja orders by the durations in its log itself). Kept in the
    module it describes, so a renamed or removed module takes its weight along."""
    return getattr(importlib.import_module(module), "EXPORT_WEIGHT", 1)


def _split(group: dict) -> list[dict]:
    """A (module, target) group in near-equal parts of at most MAX_UNITS_PER_PROCESS units: one
    process saves the DSL import per unit (what makes a quantizer edit fast), several keep a module
    with many slow units (the six SM90 attention variants) from serialising on one core."""
    units = group["units"]
    n = -(-len(units) // MAX_UNITS_PER_PROCESS)
    size = -(-len(units) // n)
    return [{**group, "units": units[i:i + size]} for i in range(0, len(units), size)]


def process_groups(libs: dict[str, list[Job]]) -> dict[str, list[dict]]:
    """The plan as CMake reads it (``python -m aot.export plan``): per library, its export
    processes (one kernel module and target, at most MAX_UNITS_PER_PROCESS units) with their
    units and a ``weight`` (``module_weight`` times the units) that orders them heaviest first."""
    out: dict[str, list[dict]] = {}
    for lib, jobs in libs.items():
        groups: dict[tuple, dict] = {}  # one export process per (kernel module, target)
        for j in jobs:
            g = groups.setdefault((j.module, j.target, j.test), {
                "module": j.module, "target": j.target, "test": j.test, "units": []})
            g["units"].append({"prefix": j.prefix, "kernel": j.kernel.name,
                               "variant": j.variant.name})
        out[lib] = [{**part, "weight": module_weight(part["module"]) * len(part["units"])}
                    for g in groups.values() for part in _split(g)]
    return out
