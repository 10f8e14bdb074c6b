"""SGLang plugin: SGLang's SubBlock sparse-attention backend runs subblock-sage's kernels, with no
edit to SGLang.

Installed with the runtime as the entry point ``subblock_sage`` of the group
``sglang.multimodal_gen.plugins`` (SGLang 0.5.23 ``runtime/platforms/plugins.py``). Every
diffusion process calls :func:`register` from ``load_plugins()``; it only *registers* REPLACE hooks
on SGLang's ``HookRegistry`` (the diffusion registry in ``platforms.plugins``), and SGLang's
``apply_plugin_hooks()`` swaps them in:

``..._get_subblock_sparse_attention_runner`` (the per-device runner resolver)
    devices whose compute capability our kernels manifest serves get
    :func:`subblock_sage.integrations.sglang.get_runner` for SGLang's configured ``compute_mode``
    where :func:`replaces` gives that mode to ours; other devices and modes keep SGLang's own
    resolver (one log line says so).
``..._sage_key_block_size`` (Sage key-block size, feeds the router and the default ``n_k``)
    device-aware: 128 on sm_90a Sage, 64 on every other target we serve; SGLang's answer on
    devices we do not serve.
``..._SubBlockSparseAttentionBackendResolver.resolve`` (the backend gate in platforms/cuda.py)
    admits every capability our manifest serves and runs our startup validation there, so a
    broken install, an old driver or an unserved GPU fails at server start with the fix named.

``...subblock_sparse.router.SubBlockRouter.route`` (SGLang's router: four Triton launches,
compiled in every fresh process) only when the router switch is on (:func:`router_enabled`,
``SUBBLOCK_SAGE_SGLANG_ROUTER``; its default and the reason: :data:`ROUTER_DEFAULT`)
    on a GPU our kernels serve, with key blocks of 64 or 128, :func:`subblock_sage.route` with the
    router's own ``n_q``, ``n_k``, ``block_size_k`` and ``budget_granularity`` and SGLang's
    ``sparsity`` and ``softmax_scale``, returned as SGLang's ``RoutingPlan`` (``index`` int32
    ``[B, H, Gq, topk]``, each row ascending; ``topk``; ``num_blocks``). Everything around the
    router stays SGLang's: dense steps (``skip_first_steps``), ``min_seq_len``, the layer gate,
    the head split, the non-video dense rows it builds from the plan with ``block_counts``.

Why a REPLACE of ``resolve`` rather than of ``supported_capabilities``: a hook target must be a
function or class (``HookRegistry`` wraps what it finds; a set would become a function), so the
class attribute cannot be a target. The replacement ``resolve`` widens the class's
``supported_capabilities`` to SGLang's set plus ours on its first call (so anything reading it
sees the truth) and gates on that itself, delegating to SGLang's own ``resolve`` for the
capabilities only SGLang serves.

Why the lru-cached resolver is still a plain REPLACE target: SGLang looks
``_get_subblock_sparse_attention_runner`` up in module globals at call time
(``_run_subblock_sparse_attention``, ``_sparse_attention_heads``), so rebinding the module
attribute is enough; the replacement is lru-cached itself (same per-(device, mode) resolution
cost as SGLang's). The original of each target is reached through the REPLACE wrapper's
``__wrapped__`` (``inspect.unwrap``), i.e. SGLang's own definition, even if another plugin wrapped
it too.

Checking the targets without importing them: ``load_plugins()`` deliberately does not import hook
targets (that would pull in the worker runtime before platform initialization), so
:func:`missing_targets` finds each module's source with ``importlib.machinery.PathFinder`` (no
package ``__init__`` runs) and checks the names with ``ast``. If anything differs (another SGLang
version), the plugin registers nothing and logs one warning: SGLang keeps its own kernels and the
server starts as it would without us.

Which (compute capability, compute mode) pairs it takes over: :data:`DEFAULTS` (one table, the
reason next to each entry; the rule: SGLang's kernel is replaced only where ours was measured
faster on SGLang-like plans, or where SGLang's gives wrong results), or the modes listed in
``SUBBLOCK_SAGE_SGLANG_MODES`` (:func:`modes_from_env`). A pair left to SGLang keeps SGLang's own
runner, key-block size and gate, exactly as without the plugin.

Switch it off without uninstalling: ``SUBBLOCK_SAGE_SGLANG_PLUGIN=0`` (or SGLang's own allow list,
``SGLANG_PLUGINS``, without ``subblock_sage``). ``compute_mode`` is SGLang's (``bf16`` unless
``--attention-backend-config '{"compute_mode": "sage_fp8"}'``); the plugin never changes it.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import inspect
import logging
import os
import sys
import threading
from dataclasses import dataclass
from types import MappingProxyType

from ..contract import BF16, COMPUTE_MODES, DEFAULT_COMPUTE_MODE, SAGE_FP8

log = logging.getLogger(__name__)

ENV_SWITCH = "SUBBLOCK_SAGE_SGLANG_PLUGIN"
ENV_MODES = "SUBBLOCK_SAGE_SGLANG_MODES"
ENV_ROUTER = "SUBBLOCK_SAGE_SGLANG_ROUTER"
SGLANG_VERSION_TESTED = "0.5.23"


class PluginConfigError(ValueError):
    """A plugin setting that cannot be followed; the message names it and has a Fix."""


@dataclass(frozen=True)
class Default:
    replace: bool  # our kernel serves this (capability, mode) unless SUBBLOCK_SAGE_SGLANG_MODES says
    reason: str
    # ours only with the unvalidated opt-in (SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1), else SGLang's path
    opt_in: bool = False


# The plugin's default per (compute capability with a SubBlock kernel of SGLang's own, mode).
# Rule: SGLang's kernel is replaced only where ours was measured faster on SGLang-like plans, or
# where SGLang's gives wrong results; unmeasured means SGLang's stays. `subblock-sage bench
# --shapes sglang` (its contender groups, SGLang's SM90 kernel included) is the measurement.
DEFAULTS = MappingProxyType({
    ((9, 0), BF16.name): Default(True, (
        "ours is faster than SGLang's own CuTe-DSL SM90 bf16 kernel on SGLang-like plans (sparsity "
        "0.75, capacity every key block, a tenth of the rows dense, 64-key blocks): H100, S=37760, "
        "timed in turn, whole call 1.047 / 1.090 / 1.119x its kernel's speed at H=14 / 6 / 2, "
        "level on dense plans (0.99-1.03x); same outputs within bf16 bounds on SGLang's own suite; "
        "no JIT compile at first use (MEASUREMENTS.md 2026-12-07)")),
    ((9, 0), SAGE_FP8.name): Default(True, (
        "ours is faster than SpargeAttn's SM90 kernel, which SGLang's sm_90a Sage path calls: "
        "H200, H=14 S=37760, 128-key plans, 3.14 vs 3.27 ms at density 0.25 and 12.16 vs 12.99 ms "
        "dense (MEASUREMENTS.md); SGLang's path also needs SpargeAttn built from source")),
    ((10, 0), BF16.name): Default(False, (
        "SGLang's SM100 kernel is FlashInfer's SM100 blk64 class, the class ours compiles ahead of "
        "time; ours has not run on SM100 hardware, so SGLang's stays until measured")),
    ((10, 0), SAGE_FP8.name): Default(False, (
        "SGLang has no SubBlock Sage kernel for SM100 (its own error); ours (cuDNN frontend's SM100 "
        "Sage FP8 kernel, compiled ahead of time) has never run on a B200: UNVALIDATED, so it "
        "serves only with SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1 (docs/design/sage-sm100.md)"), opt_in=True),
    ((12, 0), BF16.name): Default(True, (
        "correctness: SGLang JIT-compiles FlashInfer's released SM120 classes, which have a K/V "
        "shared-memory stage-reuse race; ours are the same classes with upstream's fix "
        "(aot/upstream/PATCHES.md), compiled ahead of time. Speed not measured on SM120 hardware: "
        "the same classes, so no difference is expected")),
    ((12, 0), SAGE_FP8.name): Default(True, (
        "correctness, as for bf16: the same FlashInfer SM120 Sage class with the stage-reuse race "
        "fixed, no JIT compile at first use; speed not measured on SM120 hardware")),
})
# Every other capability our kernels serve (10.3, 12.1): SGLang has no SubBlock kernel there
# (its gate refuses them), so ours replaces nothing.
ELSEWHERE = Default(True, "SGLang has no SubBlock kernel for this GPU: nothing of SGLang's is replaced")
# ... except these pairs, whose kernel of ours has never run: SGLang's path (its gate's refusal)
# stays unless SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1
ELSEWHERE_OPT_IN = MappingProxyType({
    ((10, 3), SAGE_FP8.name): Default(False, (
        "SGLang's gate refuses B300; ours (cuDNN frontend's SM100 Sage FP8 kernel, compiled ahead of "
        "time) has never run on one: UNVALIDATED, so it serves only with "
        "SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1 (docs/design/sage-sm100.md)"), opt_in=True),
})

# Whether SGLang's SubBlockRouter runs our router kernels when SUBBLOCK_SAGE_SGLANG_ROUTER is unset
# (the one place this default and its reason are stated; the switch: :func:`router_enabled`), and
# the compute capabilities where that default applies: those whose GPUs have run our router
# (SUBBLOCK_SAGE_SGLANG_ROUTER=1 takes every capability our libraries serve).
ROUTER_DEFAULT = Default(True, (
    "our plans are the exact top-k of the float64 block scores (up to ties) where SGLang's Triton "
    "selector misses blocks scoring up to 13.8 nats above the row's threshold on 0.2-1.6 % of rows; "
    "SGLang's SubBlock suite passes with ours; no JIT compile at first use; the price is 0.02-0.04 ms "
    "per route call (H100, S=37760, H=2-14, MEASUREMENTS.md 2026-12-07); only where our router has "
    "run on a GPU (ROUTER_RUN_CAPABILITIES)"))
ROUTER_RUN_CAPABILITIES = frozenset({(9, 0)})  # H100 (2026-12-07); H200, GH200: the same capability

BACKEND_MODULE = "sglang.multimodal_gen.runtime.layers.attention.backends.subblock_sparse_attn"
CUDA_MODULE = "sglang.multimodal_gen.runtime.platforms.cuda"
GATE_CLASS = "_SubBlockSparseAttentionBackendResolver"
BACKEND_CLASS = "SubBlockSparseAttentionBackend"

RUNNER_TARGET = f"{BACKEND_MODULE}._get_subblock_sparse_attention_runner"
KEY_BLOCK_TARGET = f"{BACKEND_MODULE}._sage_key_block_size"
GATE_TARGET = f"{CUDA_MODULE}.{GATE_CLASS}.resolve"
TARGETS = (RUNNER_TARGET, KEY_BLOCK_TARGET, GATE_TARGET)
ROUTER_MODULE = "sglang.multimodal_gen.runtime.layers.attention.backends.subblock_sparse.router"
ROUTER_CLASS = "SubBlockRouter"
ROUTER_TARGET = f"{ROUTER_MODULE}.{ROUTER_CLASS}.route"

# What each module must define for the hooks to be right (not just resolvable): top-level
# functions, classes with the members we use, and module constants we read.
_EXPECTED = {
    BACKEND_MODULE: {
        "functions": {"_get_subblock_sparse_attention_runner", "_sage_key_block_size",
                      "_run_subblock_sparse_attention"},
        "classes": {BACKEND_CLASS: set()},
        "constants": {"DEFAULT_COMPUTE_MODE"},
    },
    CUDA_MODULE: {
        "functions": set(),
        "classes": {GATE_CLASS: {"resolve", "supported_capabilities"}},
        "constants": set(),
    },
}

# What the router hook needs (registered only with the switch on; missing, the other hooks stay)
_EXPECTED_ROUTER = {
    ROUTER_MODULE: {"functions": set(), "classes": {ROUTER_CLASS: {"route", "__init__"}, "RoutingPlan": set()},
                    "constants": set()},
}

_lock = threading.Lock()
_logged: set = set()
_sglang_capabilities: frozenset | None = None  # SGLang's own gate set, before we widen it


def _log_once(key, level, msg, *args) -> None:
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    log.log(level, msg, *args)


def enabled() -> bool:
    """False when SUBBLOCK_SAGE_SGLANG_PLUGIN is 0/false/off/no (any case)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def modes_from_env(value: str | None = None) -> frozenset | None:
    """The compute modes SUBBLOCK_SAGE_SGLANG_MODES (or ``value``) hands to our kernels on every
    GPU they serve, or None for the per-(capability, mode) defaults of :data:`DEFAULTS`.

    Unset, empty or ``default``: the defaults. ``none``: no mode (SGLang's kernels everywhere,
    nothing registered). Otherwise modes separated by commas or spaces, e.g. ``sage_fp8`` (SGLang's
    bf16 kernel stays) or ``bf16,sage_fp8``. Anything else raises PluginConfigError with the fix."""
    text = os.environ.get(ENV_MODES, "") if value is None else value
    words = [w for w in text.replace(",", " ").lower().split()]
    if not words or words == ["default"]:
        return None
    if words == ["none"]:
        return frozenset()
    bad = [w for w in words if w not in COMPUTE_MODES]
    if bad or len(words) != len(set(words)):
        what = f"unknown {', '.join(map(repr, bad))}" if bad else "a mode named twice"
        raise PluginConfigError(
            f"{ENV_MODES}={text!r}: {what}. Fix: set it to a comma-separated list of "
            f"{', '.join(COMPUTE_MODES)} (e.g. {ENV_MODES}=sage_fp8), to none (SGLang's kernels "
            "everywhere), or unset it (the plugin's defaults)")
    return frozenset(words)


def router_enabled(value: str | None = None) -> bool:
    """Whether SGLang's SubBlockRouter runs our router (SUBBLOCK_SAGE_SGLANG_ROUTER, or
    ``value``): 1/true/on/yes or 0/false/off/no (any case); unset, empty or ``default``:
    :data:`ROUTER_DEFAULT`. Anything else raises PluginConfigError with the fix."""
    text = os.environ.get(ENV_ROUTER, "") if value is None else value
    word = text.strip().lower()
    if word in ("", "default"):
        return ROUTER_DEFAULT.replace
    if word in ("1", "true", "on", "yes"):
        return True
    if word in ("0", "false", "off", "no"):
        return False
    raise PluginConfigError(f"{ENV_ROUTER}={text!r} is not a switch value. Fix: set it to 1 (our router "
                            f"kernels in SGLang's SubBlockRouter), 0 (SGLang's own), or unset it (default: "
                            f"{'on' if ROUTER_DEFAULT.replace else 'off'})")


def replaces(cap, compute_mode: str, modes: frozenset | None = None) -> bool:
    """Whether our kernel takes over SGLang's ``compute_mode`` on capability ``cap`` (our kernels
    must also serve ``cap``): the listed ``modes`` (default: SUBBLOCK_SAGE_SGLANG_MODES), else
    :data:`DEFAULTS`."""
    if modes is None:
        modes = modes_from_env()
    if modes is not None:
        return compute_mode in modes
    d = _default(cap, compute_mode)
    if d.opt_in:
        from .. import unvalidated

        return unvalidated.allowed()
    return d.replace


def _default(cap, compute_mode: str) -> Default:
    key = (tuple(cap), compute_mode)
    return DEFAULTS.get(key) or ELSEWHERE_OPT_IN.get(key, ELSEWHERE)


def default_reason(cap, compute_mode: str) -> str:
    return _default(cap, compute_mode).reason


# ---------------------------------------------------------------------------------------------
# Target checks (no import of the targets)


def _module_source(name: str) -> str | None:
    """Source text of module ``name`` found without executing any package ``__init__``."""
    parts = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0])
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]),
                                                        list(spec.submodule_search_locations))
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        with open(spec.origin, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _defined_names(source: str):
    tree = ast.parse(source)
    functions, classes, constants = set(), {}, set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.add(node.name)
        elif isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.Assign):
                    members.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            classes[node.name] = members
        elif isinstance(node, ast.Assign):
            constants.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            constants.add(node.target.id)
    return functions, classes, constants


def missing_targets(expected: dict | None = None) -> list:
    """What of the hook targets (and the names the hooks read) this SGLang lacks, as dotted
    names; empty when every target is as in SGLang 0.5.23."""
    missing = []
    for module, want in (expected or _EXPECTED).items():
        source = _module_source(module)
        if source is None:
            missing.append(module)
            continue
        functions, classes, constants = _defined_names(source)
        missing += [f"{module}.{n}" for n in sorted(want["functions"] - functions)]
        missing += [f"{module}.{n}" for n in sorted(want["constants"] - constants)]
        for cls, members in sorted(want["classes"].items()):
            if cls not in classes:
                missing.append(f"{module}.{cls}")
            else:
                missing += [f"{module}.{cls}.{m}" for m in sorted(members - classes[cls])]
    return missing


# ---------------------------------------------------------------------------------------------
# What our manifest serves


def served_capabilities() -> dict:
    """{(major, minor): target} for every compute capability the installed kernels serve
    (reads manifest.json; raises the loader's error, with its fix, on a broken install)."""
    from .. import loader

    out = {}
    for target, meta in loader.manifest()["targets"].items():
        for cap in meta["capabilities"]:
            major, minor = cap.split(".")
            out[(int(major), int(minor))] = target
    return out


def _capability(device=None) -> tuple:
    import torch

    return tuple(torch.cuda.get_device_capability(device))


def _original(target_fn):
    """SGLang's own definition behind a (possibly hooked) function."""
    return inspect.unwrap(target_fn)


def _configured_compute_mode() -> str:
    """SGLang's configured SubBlock compute mode (its default when not configured)."""
    backend = sys.modules.get(BACKEND_MODULE)
    default = getattr(backend, "DEFAULT_COMPUTE_MODE", DEFAULT_COMPUTE_MODE)
    try:
        from sglang.multimodal_gen.runtime.server_args import get_global_server_args

        config = get_global_server_args().attention_backend_config or {}
    except Exception:  # noqa: BLE001 - no server args (e.g. a library caller): SGLang's default
        return default
    return str(config.get("compute_mode", default))


# ---------------------------------------------------------------------------------------------
# The replacements


@functools.lru_cache(maxsize=None)
def get_subblock_sparse_attention_runner(device, compute_mode=None):
    """Replacement of SGLang's ``_get_subblock_sparse_attention_runner(device, compute_mode)``."""
    backend = sys.modules[BACKEND_MODULE]
    if compute_mode is None:
        compute_mode = backend.DEFAULT_COMPUTE_MODE
    cap = _capability(device)
    target = _served_target(cap, "runner")
    if target is None:
        return _original(backend._get_subblock_sparse_attention_runner)(device, compute_mode)
    if not replaces(cap, compute_mode):
        _log_left(cap, compute_mode)
        return _original(backend._get_subblock_sparse_attention_runner)(device, compute_mode)
    from .sglang import get_runner

    runner = get_runner(device, compute_mode)
    _log_once(("runner", str(device), compute_mode), logging.INFO,
              "subblock-sage: SubBlock sparse attention on %s (compute capability %d.%d, %s, "
              "compute_mode=%s) runs subblock-sage kernels", device, cap[0], cap[1], target,
              compute_mode)
    return runner


def _served_target(cap, what: str):
    """The installed library's target serving compute capability ``cap``, or None after one log
    line saying that SGLang's own SubBlock ``what`` ("runner", "router") stays on such devices."""
    target = served_capabilities().get(cap)
    if target is None:
        _log_once((f"sglang-{what}-left", cap), logging.INFO,
                  "subblock-sage: compute capability %d.%d is not served by the installed kernels; "
                  "SGLang's own SubBlock %s stays on this device", cap[0], cap[1], what)
    return target


def _log_left(cap, compute_mode: str) -> None:
    modes = modes_from_env()
    why = (f"{ENV_MODES} lists {', '.join(sorted(modes)) or 'none'}" if modes is not None
           else f"the plugin's default: {default_reason(cap, compute_mode)}")
    _log_once(("left", cap, compute_mode), logging.INFO,
              "subblock-sage: SGLang's own SubBlock kernel stays for compute_mode=%s on compute "
              "capability %d.%d (%s)", compute_mode, cap[0], cap[1], why)


def sage_key_block_size() -> int:
    """Replacement of SGLang's ``_sage_key_block_size()`` (no device argument: like SGLang, it
    asks the worker's current device): 128 on sm_90a Sage, 64 on every other target we serve;
    SGLang's answer where its own Sage kernel stays."""
    import torch

    backend = sys.modules[BACKEND_MODULE]
    if torch.cuda.is_available():
        cap = _capability()
        target = served_capabilities().get(cap)
        if target is not None and replaces(cap, SAGE_FP8.name):
            from .sglang import plan_block_size

            return plan_block_size(target, SAGE_FP8.name)
    return _original(backend._sage_key_block_size)()


_validated: set = set()


def _validate(compute_mode: str) -> None:
    """Startup validation of the current device for ``compute_mode``, once per (device, mode)
    that passed (SGLang caches backend resolution, but not across every selector path)."""
    from .sglang import validate

    try:
        import torch

        key = (torch.cuda.current_device() if torch.cuda.is_available() else None, compute_mode)
    except Exception:  # noqa: BLE001 - validate reports the missing GPU itself
        key = (None, compute_mode)
    if key in _validated:
        return
    validate(None, compute_mode)  # StartupValidationError: every problem with its fix
    with _lock:
        _validated.add(key)


def resolve(cls, platform):
    """Replacement of SGLang's ``_SubBlockSparseAttentionBackendResolver.resolve`` (classmethod):
    the gate admits our capabilities and validates the install, driver and GPU at server start."""
    global _sglang_capabilities
    original = _original(cls.__dict__["resolve"].__func__)
    with _lock:
        if _sglang_capabilities is None:
            _sglang_capabilities = frozenset(cls.supported_capabilities)
    compute_mode = _configured_compute_mode()
    try:
        served = served_capabilities()
    except Exception:  # noqa: BLE001 - a broken install: validation names the problem and its fix
        _validate(compute_mode)
        raise
    modes = modes_from_env()
    ours = {c for c in served if replaces(c, compute_mode, modes)}
    cls.supported_capabilities = set(_sglang_capabilities) | ours
    capability = platform.get_device_capability()
    cap = (capability.major, capability.minor) if capability is not None else None
    if cap in served and cap not in ours:
        _log_left(cap, compute_mode)
        return original(cls, platform)
    if cap in served:
        _validate(compute_mode)
        _log_once(("gate", cap, compute_mode), logging.INFO,
                  "subblock-sage: SubBlock backend admitted on compute capability %d.%d (%s, "
                  "compute_mode=%s), install validated", cap[0], cap[1], served[cap], compute_mode)
        return f"{BACKEND_MODULE}.{BACKEND_CLASS}"
    if cap in _sglang_capabilities:
        _log_once(("sglang-gate", cap), logging.INFO,
                  "subblock-sage: compute capability %d.%d is not served by the installed kernels; "
                  "SGLang's own SubBlock kernels are used on it", *cap)
        return original(cls, platform)
    _validate(compute_mode)  # names the supported GPUs and the fix
    return original(cls, platform)


@functools.lru_cache(maxsize=None)
def router_serves(device_index: int) -> bool:
    """Whether our router runs on CUDA device ``device_index``: its compute capability is served
    by the installed kernels, is one our router has run on (:data:`ROUTER_RUN_CAPABILITIES`) unless
    the switch was set explicitly, and that library has the router's kernels (once per device)."""
    cap = _capability(device_index)
    target = _served_target(cap, "router")
    if target is None:
        return False
    if cap not in ROUTER_RUN_CAPABILITIES and os.environ.get(ENV_ROUTER, "").strip().lower() in ("", "default"):
        _log_once(("router-unrun", target), logging.INFO,
                  "subblock-sage: SGLang's own SubBlock router stays on compute capability %d.%d: our router "
                  "has not run on such a GPU (the default replaces it on %s only; %s=1 replaces it here too)",
                  cap[0], cap[1], ", ".join("%d.%d" % c for c in sorted(ROUTER_RUN_CAPABILITIES)), ENV_ROUTER)
        return False
    from .. import loader
    from ..backends.router import ROUTER_KERNELS

    lib = loader.library_for_device(device_index)
    missing = [k for k in ROUTER_KERNELS if not lib.has_kernel(k)]
    if missing:
        _log_once(("router-missing", target), logging.WARNING,
                  "subblock-sage: the %s kernel library has no %s; SGLang's own SubBlock router stays. "
                  "Fix: install a subblock-sage-kernels wheel built with the router", target, ", ".join(missing))
        return False
    _log_once(("router", target), logging.INFO,
              "subblock-sage: SGLang's SubBlockRouter runs subblock-sage's router kernels on %s "
              "(compute capability %d.%d; %s=1)", target, cap[0], cap[1], ENV_ROUTER)
    return True


def routes_here(router, q) -> bool:
    """Whether our router takes this call of SGLang's ``router``: q on a CUDA device
    :func:`router_serves`, in key blocks our kernels take (64 or 128)."""
    import torch

    from ..router_spec import ROUTER_BLOCK_SIZES_K

    if q.device.type != "cuda" or router.block_size_k not in ROUTER_BLOCK_SIZES_K:
        return False
    return router_serves(q.device.index if q.device.index is not None else torch.cuda.current_device())


def subblock_router_route(router, q, k, sparsity, softmax_scale):
    """Replacement of SGLang's ``SubBlockRouter.route(self, q, k, sparsity, softmax_scale)``: our
    router with the router object's geometry where :func:`router_serves` the device and the key
    blocks are ones our kernels take (64 or 128), SGLang's own router otherwise. Returns SGLang's
    ``RoutingPlan`` (the type its backend reads: ``index``, ``topk``, ``num_blocks``)."""
    import torch

    mod = sys.modules[ROUTER_MODULE]
    if not routes_here(router, q):
        with torch.no_grad():  # SGLang's route is a torch.no_grad function; unwrap() went past it
            return _original(mod.SubBlockRouter.route)(router, q, k, sparsity, softmax_scale)
    from .. import api

    plan = api.route(q, k, sparsity=sparsity, softmax_scale=softmax_scale, n_q=router.n_q, n_k=router.n_k,
                   block_size_k=router.block_size_k, budget_granularity=router.budget_granularity, layout="BSHD")
    return mod.RoutingPlan(index=plan.index, topk=plan.topk, num_blocks=plan.num_key_blocks)


# ---------------------------------------------------------------------------------------------
# Entry point


def register() -> bool:
    """Entry point of ``sglang.multimodal_gen.plugins``: register the REPLACE hooks (SGLang's
    ``apply_plugin_hooks()`` applies them). Returns whether anything was registered."""
    if not enabled():
        _log_once("disabled", logging.INFO,
                  "subblock-sage SGLang plugin is off (%s=%s): SGLang's own SubBlock kernels stay",
                  ENV_SWITCH, os.environ.get(ENV_SWITCH))
        return False
    modes = modes_from_env()  # PluginConfigError with its fix: SGLang logs it and keeps its kernels
    if modes is not None and not modes:
        _log_once("no-modes", logging.INFO,
                  "subblock-sage SGLang plugin: %s=none: SGLang's own SubBlock kernels stay", ENV_MODES)
        return False
    missing = missing_targets()
    if missing:
        try:
            from importlib.metadata import version

            sglang_version = version("sglang")
        except Exception:  # noqa: BLE001
            sglang_version = "unknown"
        _log_once("missing", logging.WARNING,
                  "subblock-sage SGLang plugin steps aside: SGLang %s lacks %s (the plugin is "
                  "written against SGLang %s). SGLang's own SubBlock kernels stay. Fix: use SGLang "
                  "%s, or a subblock-sage release that supports SGLang %s; %s=0 silences this",
                  sglang_version, ", ".join(missing), SGLANG_VERSION_TESTED, SGLANG_VERSION_TESTED,
                  sglang_version, ENV_SWITCH)
        return False
    from sglang.multimodal_gen.runtime.platforms.plugins import HookRegistry, HookType

    HookRegistry.register(RUNNER_TARGET, get_subblock_sparse_attention_runner, HookType.REPLACE)
    HookRegistry.register(KEY_BLOCK_TARGET, sage_key_block_size, HookType.REPLACE)
    HookRegistry.register(GATE_TARGET, resolve, HookType.REPLACE)
    router = _register_router(HookRegistry, HookType)
    try:
        served = ", ".join(
            f"{t} ({c[0]}.{c[1]}: {'/'.join(m for m in COMPUTE_MODES if replaces(c, m, modes)) or 'none'})"
            for c, t in sorted(served_capabilities().items()))
    except Exception as e:  # noqa: BLE001 - reported again, with its fix, when the backend resolves
        served = f"none ({e})"
    _log_once("registered", logging.INFO,
              "subblock-sage SGLang plugin: replacing %s with subblock-sage's for the compute "
              "capabilities and modes it serves: %s (%s; other GPUs and modes keep SGLang's "
              "kernels; %s picks the modes, %s=0 switches this off)",
              ", ".join(TARGETS + ((ROUTER_TARGET,) if router else ())), served,
              f"{ENV_MODES}={os.environ.get(ENV_MODES)}" if modes is not None else "the plugin's defaults",
              ENV_MODES, ENV_SWITCH)
    return True


def _register_router(HookRegistry, HookType) -> bool:
    """Register the router hook when the router switch is on and SGLang's router is as expected;
    returns whether it was registered (a bad switch value or a changed router leaves it SGLang's,
    with one log line; the other hooks stay)."""
    try:
        on = router_enabled()
    except PluginConfigError as e:
        _log_once("router-config", logging.WARNING, "subblock-sage SGLang plugin: %s; SGLang's own SubBlock "
                  "router stays", e)
        return False
    if not on:
        _log_once("router-off", logging.INFO,
                  "subblock-sage SGLang plugin: SGLang's own SubBlock router stays (%s; %s=1 replaces its "
                  "kernels with subblock-sage's)", "the plugin's default: " + ROUTER_DEFAULT.reason
                  if not os.environ.get(ENV_ROUTER, "").strip() else f"{ENV_ROUTER}={os.environ[ENV_ROUTER]}",
                  ENV_ROUTER)
        return False
    missing = missing_targets(_EXPECTED_ROUTER)
    if missing:
        _log_once("router-missing-target", logging.WARNING,
                  "subblock-sage SGLang plugin: %s=1 but this SGLang lacks %s (written against SGLang %s); "
                  "SGLang's own SubBlock router stays", ENV_ROUTER, ", ".join(missing), SGLANG_VERSION_TESTED)
        return False
    HookRegistry.register(ROUTER_TARGET, subblock_router_route, HookType.REPLACE)
    return True
