"""Run SGLang 0.5.23's own code with the subblock-sage plugin loaded by SGLang's own loader.

Used by tests/sglang/test_sglang_plugin.py (CPU, in subprocesses: hook application is once per
process) and by tests/sglang/run_h200.sh (GPU). Every stand-in it installs is printed to stderr
with the prefix ``[harness stand-in]`` so a log shows what was not the real thing.

    python tests/sglang/harness.py report                # plugin activation as JSON (CPU)
    python tests/sglang/harness.py unittest [options]    # SGLang's test_subblock_sparse_attention
    python tests/sglang/harness.py serve                 # the commands above, one forked child each

``serve`` (the CPU tests' fast path): imports SGLang's heavy third-party dependencies once
(torch, transformers, diffusers: ~5.4 of a command's ~9.5 s on the build machine, none of them
reading our or SGLang's plugin variables), then reads one JSON request per line on stdin,
``{"args": [...], "env": {...}}``, and runs each in a child forked from that state with exactly
``env`` as its environment, so SGLang, its plugin loader and subblock-sage are imported afresh in
every child (hooks once per process, as in a new process). It answers one JSON line per request:
``{"returncode", "stdout", "stderr"}``. The interpreter's startup state (``sys.path`` from
PYTHONPATH) is the server's: a request's PYTHONPATH must be the one it was started with.

Options of ``unittest``:
    --gpu                    GPU run: the kernel gate of SGLang's test module probes subblock-sage
                             (validate) instead of SGLang's own SM90/SM100/SM120 loaders, and the
                             dense path uses SGLang's TORCH_SDPA backend (sgl-kernel is a stand-in)
    --compute-mode sage_fp8  the SubBlock schedule of every test that builds its plan through
                             SGLang's router runs in sage_fp8 (only those tests run)
    --json PATH              write {test id: outcome} there
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_MODULE = "sglang.multimodal_gen.test.unit.test_subblock_sparse_attention"
BACKEND_MODULE = "sglang.multimodal_gen.runtime.layers.attention.backends.subblock_sparse_attn"

# Tests of TestSubBlockNumerics that build their plan through SGLang's router (and so follow the
# schedule's compute_mode). The mixed-query-mask tests hand-write 64-key plans (16 key blocks over
# 1024 keys): they apply to targets whose Sage plans use 64-key blocks (sm_120a/sm_120f), not to
# sm_90a Sage, whose router plans 128-key blocks. test_presorted_ragged_tail_oversubscribes_sms
# calls the runner directly with SGLang's default compute mode (bf16): part of the bf16 run.
ROUTER_PLAN_TESTS = (
    "TestSubBlockNumerics.test_full_budget_reproduces_dense",
    "TestSubBlockNumerics.test_ragged_tail_reproduces_dense",
    "TestSubBlockNumerics.test_routing_finds_the_blocks_that_carry_the_mass",
    "TestSubBlockNumerics.test_head_chunks_match_one_call",
    "TestSubBlockNumerics.test_skipped_step_is_bitwise_dense",
    "TestSubBlockNumerics.test_varlen_routes_each_document",
)
HAND_WRITTEN_64_KEY_TESTS = (
    "TestSubBlockNumerics.test_sm90_kernel_backed_mixed_query_mask",
    "TestSubBlockNumerics.test_sm100_kernel_backed_mixed_query_mask",
    "TestSubBlockNumerics.test_sm120_kernel_backed_mixed_query_mask",
)


def stand_in(msg: str) -> None:
    print(f"[harness stand-in] {msg}", file=sys.stderr, flush=True)


def log_stand_ins() -> None:
    for name in ("triton", "torchvision", "sgl_kernel"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "STAND_IN", None):
            stand_in(f"{name}: {mod.STAND_IN} (import only; calling it raises)")


def activate() -> None:
    """What a diffusion worker does at boot (worker_bootstrap.py), nothing more."""
    from sglang.multimodal_gen.runtime.platforms.plugins import apply_plugin_hooks, load_plugins

    load_plugins()
    apply_plugin_hooks()


def report() -> dict:
    import importlib

    from sglang.multimodal_gen.runtime.platforms.plugins import HookRegistry

    activate()
    from subblock_sage.integrations import sglang_plugin as plugin

    hooks = {t: [(ht.value, getattr(h, "__qualname__", repr(h)),
                  src.plugin_name if src else None, src.dist_name if src else None)
                 for ht, h, src in hs] for t, hs in HookRegistry._hooks.items()}
    out = {"hooks": hooks, "patched": sorted(HookRegistry._patched), "ours_bound": {}}
    for target in plugin.TARGETS:
        if target not in HookRegistry._patched:
            continue
        mod_name, _, attr = target.rpartition(".")
        if attr == "resolve":
            mod_name, _, cls_name = mod_name.rpartition(".")
            obj = getattr(importlib.import_module(mod_name), cls_name).__dict__["resolve"].__func__
        else:
            obj = getattr(importlib.import_module(mod_name), attr)
        # SGLang's REPLACE wrapper calls our hook; its closure holds it
        cells = [c.cell_contents for c in (getattr(obj, "__closure__", None) or ())]
        out["ours_bound"][target] = any(getattr(c, "__module__", "") == plugin.__name__
                                        for c in cells)
    return out


def _install_gpu_stand_ins(compute_mode: str) -> None:
    import functools

    import torch

    from sglang.multimodal_gen.runtime.layers.attention.backends import subblock_sparse
    from sglang.multimodal_gen.runtime.layers.attention.backends import subblock_sparse_attn as b
    from sglang.multimodal_gen.runtime.platforms import AttentionBackendEnum
    from subblock_sage.integrations.sglang import validate

    def probe():
        # SGLang's test gate asks SGLang's own per-capability loaders whether a kernel exists;
        # with the plugin the kernel that runs is ours: ask ours (raises, with the fix, if not).
        validate(0, "bf16")
        validate(0, compute_mode)

        def not_here(*a, **k):
            raise RuntimeError("SGLang's own SubBlock kernel was called although the "
                               "subblock-sage plugin replaces the runner")

        return not_here, not_here

    cap = torch.cuda.get_device_capability(0)
    b._load_sm90_block_sparse_attention = functools.lru_cache(maxsize=1)(probe)
    subblock_sparse.load_bsa_attn_blk64_fwd = probe
    subblock_sparse.load_bsa_attn_sm120_blk64_fwd = probe
    stand_in(f"kernel gate of {TEST_MODULE} (_subblock_kernel_available on {cap}) probes "
             "subblock-sage's validate() instead of SGLang's CuTe-DSL/FlashInfer loaders")

    from sglang.multimodal_gen.runtime.layers.attention.selector import get_attn_backend

    def dense_sdpa(self, *, causal):
        backend = get_attn_backend(self.head_size, torch.bfloat16,
                                   supported_attention_backends={AttentionBackendEnum.TORCH_SDPA},
                                   selected_attention_backend=AttentionBackendEnum.TORCH_SDPA)
        return backend.get_impl_cls()(num_heads=self.num_heads, head_size=self.head_size,
                                      causal=causal, softmax_scale=self.softmax_scale,
                                      num_kv_heads=self.num_kv_heads, prefix=f"{self.prefix}.dense")

    b.SubBlockSparseAttentionImpl._build_dense_impl = dense_sdpa
    stand_in("dense path: SGLang's TORCH_SDPA attention backend instead of FA (sgl-kernel's "
             "FlashAttention is not installed); test_skipped_step_is_bitwise_dense compares "
             "against that dense path")


def run_unittest(args) -> int:
    import importlib

    activate()
    if args.gpu:
        _install_gpu_stand_ins(args.compute_mode)
    mod = importlib.import_module(TEST_MODULE)
    log_stand_ins()
    stand_in(f"test module: {mod.__file__} (the installed SGLang package)")
    names = None
    if args.compute_mode != "bf16":
        original = mod._patch_schedule

        def patch_schedule(config, _orig=original):
            return _orig({"compute_mode": args.compute_mode, **config})

        mod._patch_schedule = patch_schedule
        names = list(ROUTER_PLAN_TESTS)
        import torch

        from subblock_sage.integrations.sglang import key_block_size

        if torch.cuda.is_available() and key_block_size(0, args.compute_mode) == 64:
            names += HAND_WRITTEN_64_KEY_TESTS
        print(f"compute_mode={args.compute_mode}: running {names}", file=sys.stderr)
    loader = unittest.TestLoader()
    suite = (loader.loadTestsFromNames(names, mod) if names else loader.loadTestsFromModule(mod))
    outcomes = {test.id(): "passed" for test in _iter(suite)}  # the runner empties the suite
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    for kind, rows in (("failed", result.failures), ("error", result.errors),
                       ("skipped", result.skipped)):
        for test, detail in rows:
            outcomes[test.id()] = kind if kind != "skipped" else f"skipped: {detail}"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"compute_mode": args.compute_mode, "outcomes": outcomes}, f, indent=1)
    return 0 if result.wasSuccessful() else 1


def _iter(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _iter(t)
        else:
            yield t


class _FakePlatform:
    def __init__(self, cap):
        self.cap = cap

    def get_device_capability(self):
        from sglang.multimodal_gen.runtime.platforms.interface import DeviceCapability

        return DeviceCapability(*self.cap)


def scenario(name: str) -> dict:
    """CPU checks of what the applied hooks do (torch.cuda's capability queries are patched, the
    manifest is the test's fixture, validate/get_runner are recorded instead of run)."""
    from unittest.mock import patch

    import torch

    if name == "target-differs":
        from subblock_sage.integrations import sglang_plugin as plugin

        real = plugin._module_source

        def renamed(module):  # this SGLang renamed the per-device resolver
            src = real(module)
            return src and src.replace("def _get_subblock_sparse_attention_runner(",
                                       "def _get_subblock_runner(")

        plugin._module_source = renamed
        from sglang.multimodal_gen.runtime.platforms.plugins import HookRegistry

        activate()
        import importlib

        b = importlib.import_module(BACKEND_MODULE)
        return {"hooks": sorted(HookRegistry._hooks), "patched": sorted(HookRegistry._patched),
                "runner_is_sglangs": not hasattr(b._get_subblock_sparse_attention_runner,
                                                 "__closure__")}
    activate()
    import sglang.multimodal_gen.runtime.platforms.cuda as cuda
    from sglang.multimodal_gen.runtime.layers.attention.backends import subblock_sparse_attn as b
    from subblock_sage.integrations import sglang as ours
    from subblock_sage.integrations import sglang_plugin as plugin

    out = {}
    calls = []

    def fake_validate(device=None, compute_mode="bf16"):
        calls.append([device, compute_mode])

    def caps(cap):
        return (patch("torch.cuda.is_available", return_value=True),
                patch("torch.cuda.get_device_capability", return_value=cap))

    if name == "replacements":
        out["key_block"] = {}
        for cap in ((9, 0), (10, 0), (10, 3), (12, 0), (12, 1), (8, 0)):
            a, c = caps(cap)
            with a, c:
                out["key_block"][f"{cap[0]}.{cap[1]}"] = b._sage_key_block_size()
        out["runner"] = {}
        with patch.object(ours, "get_runner", side_effect=lambda d, m: f"ours:{d}:{m}"):
            for cap, mode in (((9, 0), "sage_fp8"), ((10, 3), "bf16"), ((12, 1), "bf16"),
                              ((8, 0), "bf16")):
                a, c = caps(cap)
                with a, c:
                    try:
                        r = b._get_subblock_sparse_attention_runner(torch.device("cuda", 0), mode)
                        out["runner"][f"{cap[0]}.{cap[1]}"] = r
                    except Exception as e:  # noqa: BLE001
                        out["runner"][f"{cap[0]}.{cap[1]}"] = f"{type(e).__name__}: {e}"
                plugin.get_subblock_sparse_attention_runner.cache_clear()  # per-device cache
        resolver = cuda._SubBlockSparseAttentionBackendResolver
        out["gate"] = {}
        for cap in ((10, 3), (12, 1), (9, 0), (8, 0)):
            with patch.object(ours, "validate", side_effect=fake_validate):
                try:
                    out["gate"][f"{cap[0]}.{cap[1]}"] = resolver.resolve(_FakePlatform(cap))
                except Exception as e:  # noqa: BLE001
                    out["gate"][f"{cap[0]}.{cap[1]}"] = f"{type(e).__name__}: {e}"
        out["validate_calls"] = list(calls)
        out["supported_capabilities"] = sorted(list(c) for c in resolver.supported_capabilities)
        # SGLang's configured compute mode is followed, not changed
        from sglang.multimodal_gen.runtime import server_args

        class _Args:
            attention_backend_config = {"compute_mode": "sage_fp8"}

        calls.clear()
        with patch.object(server_args, "get_global_server_args", return_value=_Args()), \
                patch.object(ours, "validate", side_effect=fake_validate):
            resolver.resolve(_FakePlatform((9, 0)))
        out["validate_calls_sage_config"] = list(calls)
        out["sglang_default_compute_mode"] = b.DEFAULT_COMPUTE_MODE
    elif name == "modes":
        # every (capability, mode) under the SUBBLOCK_SAGE_SGLANG_MODES of this process: whose
        # runner, whose gate (and whether ours validated), whose key-block size
        from sglang.multimodal_gen.runtime import server_args

        resolver = cuda._SubBlockSparseAttentionBackendResolver
        out["runner"], out["gate"], out["key_block"] = {}, {}, {}
        for cap in ((9, 0), (10, 0), (12, 0), (10, 3), (12, 1)):
            key = f"{cap[0]}.{cap[1]}"
            a, c = caps(cap)
            with a, c:
                out["key_block"][key] = b._sage_key_block_size()
            for mode in ("bf16", "sage_fp8"):
                with patch.object(ours, "get_runner", side_effect=lambda d, m: f"ours:{m}"):
                    a, c = caps(cap)
                    with a, c:
                        try:
                            r = b._get_subblock_sparse_attention_runner(torch.device("cuda", 0), mode)
                            r = r if isinstance(r, str) else f"sglang:{r.__name__}"
                        except Exception as e:  # noqa: BLE001 - SGLang's own refusal
                            r = f"sglang-error:{type(e).__name__}"
                    plugin.get_subblock_sparse_attention_runner.cache_clear()
                out["runner"][f"{key} {mode}"] = r

                class _Args:
                    attention_backend_config = {"compute_mode": mode}

                calls.clear()
                plugin._validated.clear()
                with patch.object(server_args, "get_global_server_args", return_value=_Args()), \
                        patch.object(ours, "validate", side_effect=fake_validate):
                    try:
                        g = resolver.resolve(_FakePlatform(cap))
                    except Exception as e:  # noqa: BLE001
                        g = f"error:{type(e).__name__}"
                out["gate"][f"{key} {mode}"] = [g, bool(calls)]
    elif name == "router":
        out.update(_router_scenario(b, plugin, caps))
    elif name == "gate-real-validate":
        # no fakes: the startup validation itself runs (broken install / no GPU on this machine)
        try:
            out["gate"] = cuda._SubBlockSparseAttentionBackendResolver.resolve(_FakePlatform((10, 3)))
        except Exception as e:  # noqa: BLE001
            out["error_type"] = type(e).__name__
            out["error"] = str(e)
    return out


class _SGLangRouterRan(Exception):
    pass


# SubBlockRouter geometries to route through the hook: (n_q, n_k, block_size_k, budget_granularity),
# SGLang's two defaults (64-key bf16, sm_90a Sage's 128-key) and two others
ROUTER_GEOMETRIES = ((4, 4, 64, 8), (4, 8, 128, 1), (2, 1, 64, 8), (8, 2, 128, 8))


def _router_scenario(b, plugin, caps) -> dict:
    """SGLang's SubBlockRouter (and its backend's plan handling) with the router hook applied, on
    fake CUDA tensors (torch's FakeTensorMode: shapes only, no kernel): which router ran, with
    which arguments, and what it returned."""
    import math
    from unittest.mock import patch

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sglang.multimodal_gen.runtime.platforms.plugins import HookRegistry
    from subblock_sage import loader
    from subblock_sage import api as R

    out = {"patched": plugin.ROUTER_TARGET in HookRegistry._patched}
    router_mod = sys.modules[plugin.ROUTER_MODULE]
    calls = []
    real_route = R.route

    def recorded(q, k, **kw):
        calls.append({"q": list(q.shape), "k": list(k.shape), **kw})
        return real_route(q, k, **kw)

    class _Lib:
        target = "sm_90a"

        def has_kernel(self, name):
            return True

    a, c = caps((9, 0))
    with a, c, patch.object(R, "route", recorded), patch("torch.cuda.current_device", return_value=0), \
            patch.object(loader, "library_for_device", return_value=_Lib()):
        mode = FakeTensorMode()
        S, H, scale = 4096 + 37, 3, 128 ** -0.5
        out["routes"] = []
        for n_q, n_k, bk, g in ROUTER_GEOMETRIES:
            router = router_mod.SubBlockRouter(n_k=n_k, n_q=n_q, block_size_k=bk, budget_granularity=g)
            with mode:
                q = torch.empty(1, S, H, 128, dtype=torch.bfloat16, device="cuda")
                plan = router.route(q, q, sparsity=0.75, softmax_scale=scale)
            gk = -(-S // bk)
            out["routes"].append({
                "geometry": [n_q, n_k, bk, g], "type": type(plan).__name__,
                "plan_type_is_sglangs": type(plan) is router_mod.RoutingPlan,
                "index": [list(plan.index.shape), str(plan.index.dtype), str(plan.index.device)],
                "topk": plan.topk, "num_blocks": plan.num_blocks,
                # SGLang's own budget rule on the same numbers
                "sglang_topk": router_mod._snap_up(math.ceil((1.0 - 0.75) * gk), gk, g), "sglang_num_blocks": gk,
            })
        # a key-block width our kernels do not take, and CPU tensors: SGLang's own router (its
        # first Triton launch, fused_pool, recorded instead of run)
        out["fallback"] = {}
        for what, bk, dev in (("block_size_k=96", 96, "cuda"), ("cpu tensors", 64, "cpu")):
            router = router_mod.SubBlockRouter(n_k=4, n_q=4, block_size_k=bk)
            n, pooled = len(calls), []

            def sglang_pool(*a, **kw):
                pooled.append(True)
                raise _SGLangRouterRan

            try:
                with mode, patch.object(router_mod, "fused_pool", sglang_pool):
                    q = torch.empty(1, S, H, 128, dtype=torch.bfloat16, device=dev)
                    router.route(q, q, 0.75, scale)
            except _SGLangRouterRan:
                pass
            out["fallback"][what] = {"ours_called": len(calls) > n, "sglang_called": bool(pooled)}
        # SGLang's backend consuming the plan: its sparse path with a mixed query-block mask
        # (non-video rows dense via block_counts), on CPU tensors (its indexing needs real ones):
        # our route's operator gives the plan's shapes (fake), handed over as zero CPU tensors
        got = {}

        def runner(q, k, v, index, topk, scale, counts):
            got.update(index=[list(index.shape), str(index.dtype)], topk=topk,
                       counts=None if counts is None else [list(counts.shape), str(counts.dtype)])
            return torch.empty_like(q)

        def shaped(q, k, **kw):
            calls.append({"q": list(q.shape), "k": list(k.shape), **kw})
            with FakeTensorMode():
                fq = torch.empty(q.shape, dtype=q.dtype, device="cuda")
                fk = torch.empty(k.shape, dtype=k.dtype, device="cuda")
                p = real_route(fq, fk, **kw)
            return type(p)(torch.zeros(p.index.shape, dtype=p.index.dtype), torch.zeros(p.counts.shape, dtype=p.counts.dtype),
                           p.topk, p.block_size_k, p.seqlen_k)

        impl = b.SubBlockSparseAttentionImpl.__new__(b.SubBlockSparseAttentionImpl)
        impl.schedule = b.SubBlockSparseSchedule(sparsity=0.75, skip_first_steps=10, skip_first_layers=0,
                                                 n_k=4, n_q=4, min_seq_len=4096, compute_mode="bf16")
        impl.router = router_mod.SubBlockRouter(n_k=4, n_q=4, block_size_k=64, budget_granularity=8)
        impl.softmax_scale = scale
        n = len(calls)
        gq = -(-S // 64)
        with patch.object(b, "_get_subblock_sparse_attention_runner", lambda dev, m: runner), \
                patch.object(R, "route", shaped), patch.object(plugin, "routes_here", lambda router, q: True):
            q = torch.zeros(1, S, H, 128, dtype=torch.bfloat16)
            mask = torch.arange(gq) % 3 != 0  # every third query block dense
            o = impl._sparse_attention_heads(q, q, q, sparse_query_block_mask=mask)
        out["calls"] = list(calls)
        out["backend"] = {"ours_called": len(calls) > n, "runner": got, "out": list(o.shape),
                          "num_key_blocks": -(-S // 64), "query_blocks": gq}
    return out


# imported once by ``serve`` before its first fork: the bulk of a command's import time, and
# none of them reads SUBBLOCK_SAGE_* or SGLANG_PLUGINS
HEAVY_DEPENDENCIES = ("torch", "numpy", "PIL", "transformers", "diffusers")


def _child(req: dict, out: int, err: int) -> None:
    """In a forked child: ``req`` with its environment, stdout and stderr into ``out`` / ``err``;
    never returns."""
    rc = 1
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.environ.clear()
        os.environ.update(req["env"])
        rc = main(req["args"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported to the caller, as a process would
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def serve() -> int:
    """The ``serve`` command (module docstring)."""
    import importlib

    for name in HEAVY_DEPENDENCIES:
        importlib.import_module(name)
    for line in sys.stdin:
        req = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(req, out.fileno(), err.fileno())
            _, status = os.waitpid(pid, 0)
            reply = {"returncode": os.waitstatus_to_exitcode(status)}
            for name, f in (("stdout", out), ("stderr", err)):
                f.seek(0)
                reply[name] = f.read().decode("utf-8", "replace")
        print(json.dumps(reply), flush=True)
    return 0


def main(argv=None) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("report")
    sub.add_parser("serve")
    sc = sub.add_parser("scenario")
    sc.add_argument("name", choices=("replacements", "modes", "target-differs", "gate-real-validate", "router"))
    u = sub.add_parser("unittest")
    u.add_argument("--gpu", action="store_true")
    u.add_argument("--compute-mode", default="bf16", choices=("bf16", "sage_fp8"))
    u.add_argument("--json")
    args = p.parse_args(argv)
    if args.cmd == "serve":
        return serve()
    if args.cmd == "scenario":
        print(json.dumps(scenario(args.name)))
        return 0
    if args.cmd == "report":
        print(json.dumps(report()))
        log_stand_ins()
        return 0
    return run_unittest(args)


if __name__ == "__main__":
    sys.exit(main())
