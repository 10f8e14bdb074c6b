"""Export step: compile each registered (kernel, variant, target) with symbolic fake tensors and
write ``<prefix>.h`` / ``<prefix>.o`` / ``<prefix>.json`` (its argument layout); then per library
``exports.json`` and the C shim.

By job: :mod:`.plan` (what is built, in which processes), :mod:`.fake` (fake arguments),
:mod:`.header` (the generated header parsed), :mod:`.layout` (argument layouts),
:mod:`.metadata` (an export's record, ``exports.json`` and the shim), :mod:`.identity` (the
cache's unit key, the files a unit read, its depfile), :mod:`.unit` (one export process),
:mod:`.summary` (export times), :mod:`.cli` (``python -m aot.export``).

One export per process and per CMake custom command (``python -m aot.export unit ...``), so Ninja
runs them in parallel and re-runs only the exports whose inputs changed: each unit writes a depfile
listing exactly the repository files it opened (its kernel module, shared helpers, the registry,
FlashInfer patch rules) plus the metadata of the pinned DSL / FlashInfer distributions. Results go
through the content-addressed export cache (:mod:`aot.export_cache`), shared by every clone.
``assemble`` joins a library's units into ``exports.json`` + ``shim.c`` (no DSL import); ``plan``
lists what would be built. One library per GPU target, plus ``test_<target>`` libraries for
test-only builds (never installed into a wheel). Only variants the runtime can select are
planned (:mod:`aot.serving`).
"""

from aot.export.fake import dsl, dsl_dtype, make_fakes
from aot.export.header import parse_header
from aot.export.identity import ROOT, repo_inputs, unit_identity
from aot.export.layout import arg_layouts
from aot.export.metadata import assemble, unit_entry
from aot.export.plan import MAX_UNITS_PER_PROCESS, Job, module_weight, plan, process_groups
from aot.export.summary import summary
from aot.export.unit import export_job, run_unit, run_units

__all__ = ["Job", "MAX_UNITS_PER_PROCESS", "ROOT", "arg_layouts", "assemble", "dsl", "dsl_dtype",
           "export_job", "make_fakes", "module_weight", "parse_header", "plan", "process_groups", "repo_inputs", "run_unit",
           "run_units", "summary", "unit_entry", "unit_identity"]
