"""The SGLang plugin against the real SGLang 0.5.23 code (CPU).

tests/run.sh installs SGLang 0.5.23 without its dependency tree, plus the pinned packages its
SubBlock backend and plugin loader import (tests/requirements-sglang.txt), into a separate folder
($SBS_SGLANG_SITE) so the test env's `pip check` stays meaningful. Each case runs a
tests/sglang/harness.py command in a process of its own, because SGLang applies plugin hooks once
per process: a child forked by one ``harness.py serve`` per test worker, which has imported
SGLang's heavy third-party dependencies once (~5 s of each command's ~10 s), not SGLang.
Triton, torchvision and sgl_kernel are import-only stand-ins here (tests/sglang/stubs; the harness
prints "[harness stand-in]" lines); no kernel runs. The manifest is a fixture serving sm_90a,
sm_100a, sm_100f (10.3), sm_120a and sm_120f (12.1), so the gate widening is visible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "harness.py"
SITE = os.environ.get("SBS_SGLANG_SITE")
BACKEND = "sglang.multimodal_gen.runtime.layers.attention.backends.subblock_sparse_attn"
TARGETS = (
    f"{BACKEND}._get_subblock_sparse_attention_runner",
    f"{BACKEND}._sage_key_block_size",
    "sglang.multimodal_gen.runtime.platforms.cuda._SubBlockSparseAttentionBackendResolver.resolve",
)
BACKEND_CLS = f"{BACKEND}.SubBlockSparseAttentionBackend"

needs_site = pytest.mark.skipif(
    not SITE or not Path(SITE, "sglang").is_dir(),
    reason="SGLang 0.5.23 test site not installed (tests/run.sh installs it and sets "
           "SBS_SGLANG_SITE)")


@pytest.fixture(scope="module")
def kernels_dir(tmp_path_factory):
    import subblock_sage

    d = tmp_path_factory.mktemp("kernels")
    targets = {"sm_90a": "9.0", "sm_100a": "10.0", "sm_100f": "10.3", "sm_120a": "12.0",
               "sm_120f": "12.1"}
    (d / "manifest.json").write_text(json.dumps({
        "version": subblock_sage.__version__, "abi_version": 1,
        # a well-formed manifest (the loader refuses entries without a library path and a
        # digest); nothing here loads the libraries
        "targets": {t: {"capabilities": [c], "gpus": f"GPUs of {t}", "library": f"{t}/lib.so",
                        "sha256": "0" * 64} for t, c in targets.items()},
    }))
    return d


def _base_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SUBBLOCK_SAGE_SGLANG_PLUGIN", "SUBBLOCK_SAGE_SGLANG_MODES", "SUBBLOCK_SAGE_SGLANG_ROUTER",
                        "SGLANG_PLUGINS", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([SITE, str(HERE / "stubs"), str(HERE / "stubs-cpu")])
    return env


class _Server:
    """One ``harness.py serve`` (its module docstring) for this test process, started on first use."""

    proc = None

    @classmethod
    def run(cls, args, env) -> subprocess.CompletedProcess:
        if cls.proc is None or cls.proc.poll() is not None:
            cls.proc = subprocess.Popen([sys.executable, str(HARNESS), "serve"], env=_base_env(),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        cls.proc.stdin.write(json.dumps({"args": list(args), "env": env}) + "\n")
        cls.proc.stdin.flush()
        timer = threading.Timer(600, cls.proc.kill)  # as subprocess.run's timeout: a hung child fails the test
        timer.start()
        try:
            line = cls.proc.stdout.readline()
        finally:
            timer.cancel()
        assert line, "harness.py serve exited without answering (killed after 600 s, or crashed)"
        r = json.loads(line)
        return subprocess.CompletedProcess(args, r["returncode"], r["stdout"], r["stderr"])


@pytest.fixture(scope="session", autouse=True)
def _stop_server():
    yield
    if _Server.proc is not None:
        _Server.proc.stdin.close()
        _Server.proc.wait(timeout=60)


def harness(*args, kernels, extra_env=None):
    env = _base_env()
    env["SUBBLOCK_SAGE_LIBRARY_DIR"] = str(kernels)
    env.update(extra_env or {})
    if not hasattr(os, "fork"):  # a fresh process per command where children cannot be forked
        return subprocess.run([sys.executable, str(HARNESS), *args], env=env, capture_output=True,
                              text=True, timeout=600)
    return _Server.run(args, env)


def json_out(p):
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_entry_point_in_installed_metadata():
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="sglang.multimodal_gen.plugins") if e.name == "subblock_sage"]
    assert len(eps) == 1
    assert eps[0].value == "subblock_sage.integrations.sglang_plugin:register"
    assert eps[0].dist.name == "subblock-sage"


@needs_site
def test_sglang_loader_activates_plugin_and_replaces_targets(kernels_dir):
    p = harness("report", kernels=kernels_dir)
    r = json_out(p)
    # the three kernel hooks and, the router switch being on by default, the router's
    assert sorted(r["hooks"]) == sorted(TARGETS + (ROUTER_TARGET,))
    for target in TARGETS:
        assert r["hooks"][target] == [["replace", r["hooks"][target][0][1], "subblock_sage",
                                       "subblock-sage"]]
        assert r["ours_bound"][target] is True
    assert r["hooks"][ROUTER_TARGET][0][:1] == ["replace"]
    assert sorted(r["patched"]) == sorted(TARGETS + (ROUTER_TARGET,))
    # one line says what was replaced, and SGLang logs each applied hook with our dist
    assert p.stderr.count("subblock-sage SGLang plugin: replacing") == 1
    # 10.3's Sage (cuDNN's SM100 kernel, UNVALIDATED) only with the opt-in: bf16 alone by default
    assert "sm_100f (10.3: bf16)" in p.stderr and "sm_120f (12.1: sage_fp8/bf16)" in p.stderr
    assert p.stderr.count("(from: plugin=subblock_sage, dist=subblock-sage)") == 4
    assert "[harness stand-in] triton" in p.stderr  # the log names the stand-ins


@needs_site
def test_replacements_serve_our_capabilities_and_leave_sglang_the_rest(kernels_dir):
    r = json_out(harness("scenario", "replacements", kernels=kernels_dir))
    # key-block size: 128 on sm_90a Sage, 64 on every other target where our Sage kernel serves;
    # SGLang's own answer (128) where its Sage path stays (10.0 and 10.3: ours is opt-in there,
    # docs/design/sage-sm100.md) and on a GPU we do not serve. SGLang alone says 128 for 10.x and 12.1.
    assert r["key_block"] == {"9.0": 128, "10.0": 128, "10.3": 128, "12.0": 64, "12.1": 64,
                              "8.0": 128}
    # runner resolver: ours where served (SGLang's compute_mode passed through), SGLang's else
    assert r["runner"]["9.0"] == "ours:cuda:0:sage_fp8"
    assert r["runner"]["10.3"] == "ours:cuda:0:bf16"
    assert r["runner"]["12.1"] == "ours:cuda:0:bf16"
    assert r["runner"]["8.0"].startswith("RuntimeError: SubBlock sparse attention supports")
    # the gate admits 10.3 and 12.1 (SGLang refuses both) after validating the install
    assert r["gate"]["10.3"] == BACKEND_CLS and r["gate"]["12.1"] == BACKEND_CLS
    # 9.0 with SGLang's default mode (bf16): ours too (the plugin's default: measured faster than
    # SGLang's SM90 kernel), so the gate admits it without SGLang's CuTe-DSL dependencies
    assert r["gate"]["9.0"] == BACKEND_CLS
    assert [10, 3] in r["supported_capabilities"] and [12, 1] in r["supported_capabilities"]
    assert [9, 0] in r["supported_capabilities"]
    # validated once per (device, mode) that passed (SGLang's default mode: bf16; 10.3 and 12.1)
    assert r["validate_calls"] == [[None, "bf16"]]
    # SGLang's configured compute mode is followed; its default stays bf16
    assert r["validate_calls_sage_config"] == [[None, "sage_fp8"]]
    assert r["sglang_default_compute_mode"] == "bf16"


@pytest.mark.parametrize("value,on", [("0", False), ("off", False), ("False", False), ("no", False),
                                      ("1", True), ("", True)])
def test_switch_values(monkeypatch, value, on):
    from subblock_sage.integrations import sglang_plugin

    monkeypatch.setenv("SUBBLOCK_SAGE_SGLANG_PLUGIN", value)
    assert sglang_plugin.enabled() is on


@needs_site
@pytest.mark.parametrize("env,says", [
    ({"SUBBLOCK_SAGE_SGLANG_PLUGIN": "0"}, "subblock-sage SGLang plugin is off (SUBBLOCK_SAGE_SGLANG_PLUGIN="),
    ({"SUBBLOCK_SAGE_SGLANG_MODES": "none"}, "SUBBLOCK_SAGE_SGLANG_MODES=none: SGLang's own SubBlock kernels stay"),
    ({"SUBBLOCK_SAGE_SGLANG_MODES": "bf16,fp4"},
     "PluginConfigError: SUBBLOCK_SAGE_SGLANG_MODES='bf16,fp4': unknown 'fp4'. Fix:"),
], ids=["switched-off", "modes-none", "modes-unknown-name"])
def test_registers_nothing_and_sglang_keeps_its_kernels(kernels_dir, env, says):
    """Switched off, no mode, or an unknown mode name (a Fix error): no hook, nothing patched."""
    p = harness("report", kernels=kernels_dir, extra_env=env)
    r = json_out(p)
    assert r["hooks"] == {} and r["patched"] == []
    assert says in p.stderr


@needs_site
def test_steps_aside_when_a_target_differs(kernels_dir):
    p = harness("scenario", "target-differs", kernels=kernels_dir)
    r = json_out(p)
    assert r == {"hooks": [], "patched": [], "runner_is_sglangs": True}
    assert "subblock-sage SGLang plugin steps aside" in p.stderr
    assert f"lacks {BACKEND}._get_subblock_sparse_attention_runner" in p.stderr
    assert "Fix:" in p.stderr


@needs_site
def test_broken_install_fails_at_backend_resolution(tmp_path):
    # kernels of another release next to this runtime: the gate's startup validation refuses
    (tmp_path / "manifest.json").write_text(json.dumps({"version": "0.0.0-other", "abi_version": 1,
                                                        "targets": {}}))
    r = json_out(harness("scenario", "gate-real-validate", kernels=tmp_path))
    assert r.get("error_type") == "StartupValidationError", r
    assert "0.0.0-other" in r["error"] and "Fix: pip install" in r["error"]


@needs_site
def test_sglangs_own_cpu_suite_passes_with_the_plugin(kernels_dir, tmp_path):
    out = tmp_path / "outcomes.json"
    p = harness("unittest", "--json", str(out), kernels=kernels_dir)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert p.stderr.count("(from: plugin=subblock_sage, dist=subblock-sage)") == 4  # the router's too
    # SGLang's own test file, from the installed package
    test_file = p.stderr.split("[harness stand-in] test module: ")[1].split()[0]
    assert Path(test_file).resolve().is_relative_to(Path(SITE).resolve()), test_file
    outcomes = json.loads(out.read_text())["outcomes"]
    assert len(outcomes) == 28
    cpu = {t: o for t, o in outcomes.items()
           if ".TestSubBlockNumerics." not in t and ".TestRouterPastInt32." not in t}
    assert len(cpu) == 17 and set(cpu.values()) == {"passed"}, cpu
    # the schedule test reads the key-block size through our replacement (fixture manifest)
    assert cpu["sglang.multimodal_gen.test.unit.test_subblock_sparse_attention."
               "TestSubBlockSparseSchedule.test_sage_fp8_uses_16_token_key_subblocks_by_default"
               ] == "passed"
    gpu_only = [o for t, o in outcomes.items() if t not in cpu]
    assert gpu_only and all(o.startswith("skipped") for o in gpu_only)


# ---- the per-(capability, mode) switch ------------------------------------------------------------

CAPS = ("9.0", "10.0", "12.0", "10.3", "12.1")


@pytest.mark.parametrize("value,modes", [(None, None), ("", None), ("default", None), (" Default ", None),
                                         ("none", frozenset()), ("sage_fp8", {"sage_fp8"}),
                                         ("bf16,sage_fp8", {"bf16", "sage_fp8"}),
                                         ("sage_fp8 , BF16", {"bf16", "sage_fp8"})])
def test_modes_values(monkeypatch, value, modes):
    from subblock_sage.integrations import sglang_plugin

    if value is None:
        monkeypatch.delenv("SUBBLOCK_SAGE_SGLANG_MODES", raising=False)
    else:
        monkeypatch.setenv("SUBBLOCK_SAGE_SGLANG_MODES", value)
    assert sglang_plugin.modes_from_env() == (None if modes is None else frozenset(modes))


@pytest.mark.parametrize("value,what", [("fp8", "unknown 'fp8'"), ("bf16,none", "unknown 'none'"),
                                        ("bf16,bf16", "a mode named twice")])
def test_modes_refuses_unknown_names(value, what):
    from subblock_sage.integrations.sglang_plugin import PluginConfigError, modes_from_env

    with pytest.raises(PluginConfigError, match="Fix: set it to a comma-separated list of") as e:
        modes_from_env(value)
    assert what in str(e.value) and "SUBBLOCK_SAGE_SGLANG_MODES" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_defaults_table_follows_the_rule():
    """One table: every (capability with a SubBlock kernel of SGLang's, mode) has an entry and a
    reason; sm_90a bf16 is ours (measured faster than SGLang's own SM90 kernel), sm_90a Sage is ours
    (measured faster than SpargeAttn's kernel), sm_120 is ours for correctness, SM100 stays
    SGLang's (unmeasured); capabilities without an SGLang kernel are ours."""
    from subblock_sage.contract import COMPUTE_MODES
    from subblock_sage.integrations import sglang_plugin as p

    assert set(p.DEFAULTS) == {(c, m) for c in ((9, 0), (10, 0), (12, 0)) for m in COMPUTE_MODES}
    got = {k: v.replace for k, v in p.DEFAULTS.items()}
    assert got == {((9, 0), "bf16"): True, ((9, 0), "sage_fp8"): True,
                   ((10, 0), "bf16"): False, ((10, 0), "sage_fp8"): False,
                   ((12, 0), "bf16"): True, ((12, 0), "sage_fp8"): True}
    assert all(len(v.reason) > 40 for v in p.DEFAULTS.values())
    assert "faster than SGLang's own" in p.DEFAULTS[((9, 0), "bf16")].reason
    assert "race" in p.DEFAULTS[((12, 0), "bf16")].reason
    assert p.replaces((10, 3), "bf16", None) and p.replaces((12, 1), "sage_fp8", None)  # ELSEWHERE
    assert p.replaces((9, 0), "bf16", None) and not p.replaces((9, 0), "bf16", frozenset({"sage_fp8"}))
    assert not p.replaces((12, 0), "sage_fp8", frozenset({"bf16"}))
    with pytest.raises(TypeError, match="does not support item assignment"):
        p.DEFAULTS[((9, 0), "bf16")] = p.Default(True, "x")  # read-only


def test_sm100_sage_is_ours_only_with_the_unvalidated_opt_in(monkeypatch):
    """B200/B300 Sage (cuDNN's SM100 kernel, compiled ahead of time, never run): SGLang's path
    (its error, its gate's refusal) unless SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1; a mode list still
    decides alone."""
    from subblock_sage.integrations import sglang_plugin as p

    monkeypatch.delenv("SUBBLOCK_SAGE_ALLOW_UNVALIDATED", raising=False)
    for cap in ((10, 0), (10, 3)):
        assert not p.replaces(cap, "sage_fp8", None)
        assert "UNVALIDATED" in p.default_reason(cap, "sage_fp8")
    assert p.replaces((10, 3), "bf16", None) and p.replaces((10, 3), "sage_fp8", frozenset({"sage_fp8"}))
    monkeypatch.setenv("SUBBLOCK_SAGE_ALLOW_UNVALIDATED", "1")
    assert p.replaces((10, 0), "sage_fp8", None) and p.replaces((10, 3), "sage_fp8", None)
    assert not p.replaces((10, 0), "bf16", None)


def _ours(expect_ours: set) -> dict:
    """(capability mode) -> whether our gate validated, for the CAPS x modes grid."""
    return {f"{c} {m}": (c, m) in expect_ours for c in CAPS for m in ("bf16", "sage_fp8")}


@needs_site
@pytest.mark.parametrize("env", [None, "sage_fp8", "bf16,sage_fp8", "bf16"])
def test_modes_decide_runner_gate_and_key_block(kernels_dir, env):
    """Under each SUBBLOCK_SAGE_SGLANG_MODES, every (capability, mode): ours where it says so
    (runner, gate with our validation, key-block size), SGLang's own everywhere else."""
    extra = {} if env is None else {"SUBBLOCK_SAGE_SGLANG_MODES": env}
    r = json_out(harness("scenario", "modes", kernels=kernels_dir, extra_env=extra))
    if env is None:  # the defaults table
        # 10.3 sage_fp8 (cuDNN's SM100 Sage kernel, never run): only with the unvalidated opt-in
        ours = {("9.0", "bf16"), ("9.0", "sage_fp8"), ("12.0", "bf16"), ("12.0", "sage_fp8"), ("10.3", "bf16"),
                ("12.1", "bf16"), ("12.1", "sage_fp8")}
    else:
        ours = {(c, m) for c in CAPS for m in env.split(",")}
    for key, is_ours in _ours(ours).items():
        assert (r["runner"][key] == f"ours:{key.split()[1]}") is is_ours, (key, r["runner"][key])
        assert r["gate"][key][1] is is_ours, (key, r["gate"][key])
    # SGLang's own runners where its kernel stays (and its refusal of SM100 Sage)
    if ("9.0", "bf16") not in ours:
        assert r["runner"]["9.0 bf16"] == "sglang:_sm90_sparse_attention"
    if ("10.0", "sage_fp8") not in ours:
        assert r["runner"]["10.0 sage_fp8"] == "sglang-error:RuntimeError"
    # a capability only we serve, its mode left to SGLang: SGLang's gate refuses it, as without us
    if ("10.3", "bf16") not in ours:
        assert r["gate"]["10.3 bf16"] == ["error:ValueError", False]
    # key-block size: ours where our Sage kernel serves, SGLang's answer elsewhere
    sglang_kb = {"9.0": 128, "10.0": 128, "12.0": 64, "10.3": 128, "12.1": 128}
    ours_kb = {"9.0": 128, "10.0": 64, "12.0": 64, "10.3": 64, "12.1": 64}
    assert r["key_block"] == {c: (ours_kb if (c, "sage_fp8") in ours else sglang_kb)[c] for c in CAPS}


@needs_site
def test_registration_line_names_the_modes(kernels_dir):
    p = harness("report", kernels=kernels_dir)
    assert "sm_90a (9.0: sage_fp8/bf16)" in p.stderr and "sm_120a (12.0: sage_fp8/bf16)" in p.stderr, p.stderr
    assert "sm_100a (10.0: none)" in p.stderr and "the plugin's defaults" in p.stderr


# ---- the router switch (SGLang's SubBlockRouter.route) -------------------------------------------

ROUTER_TARGET = ("sglang.multimodal_gen.runtime.layers.attention.backends.subblock_sparse.router."
                 "SubBlockRouter.route")


@pytest.mark.parametrize("value,on", [(None, True), ("", True), ("default", True), ("1", True), ("ON", True),
                                      ("yes", True), ("0", False), ("off", False)])
def test_router_switch_values(monkeypatch, value, on):
    from subblock_sage.integrations import sglang_plugin as p

    if value is None:
        monkeypatch.delenv("SUBBLOCK_SAGE_SGLANG_ROUTER", raising=False)
    else:
        monkeypatch.setenv("SUBBLOCK_SAGE_SGLANG_ROUTER", value)
    assert p.router_enabled() is on


def test_router_default_is_on_where_it_has_run_with_its_reason():
    """On since the H100 run (exact plans where SGLang's selector misses blocks): the default, its
    reason and the capabilities it covers in one place."""
    from subblock_sage.integrations import sglang_plugin as p

    assert p.ROUTER_DEFAULT.replace is True
    assert "exact top-k" in p.ROUTER_DEFAULT.reason and "MEASUREMENTS.md" in p.ROUTER_DEFAULT.reason
    assert p.ROUTER_RUN_CAPABILITIES == frozenset({(9, 0)})
    assert p.ROUTER_TARGET == ROUTER_TARGET
    with pytest.raises(p.PluginConfigError, match="Fix: set it to 1") as e:
        p.router_enabled("maybe")
    assert "SUBBLOCK_SAGE_SGLANG_ROUTER='maybe'" in str(e.value)


@needs_site
@pytest.mark.parametrize("env,registered", [(None, True), ("0", False), ("1", True), ("bogus", False)])
def test_router_hook_registered_only_when_switched_on(kernels_dir, env, registered):
    extra = {} if env is None else {"SUBBLOCK_SAGE_SGLANG_ROUTER": env}
    p = harness("report", kernels=kernels_dir, extra_env=extra)
    r = json_out(p)
    assert (ROUTER_TARGET in r["hooks"]) is registered and (ROUTER_TARGET in r["patched"]) is registered
    assert set(TARGETS) <= set(r["patched"])  # the other hooks whatever the router switch says
    assert p.stderr.count("(from: plugin=subblock_sage, dist=subblock-sage)") == 3 + registered
    if registered:
        assert r["hooks"][ROUTER_TARGET][0][:1] == ["replace"]
        assert "SubBlockRouter.route" in p.stderr.split("subblock-sage SGLang plugin: replacing")[1].split("\n")[0]
    elif env == "bogus":
        assert "SUBBLOCK_SAGE_SGLANG_ROUTER='bogus' is not a switch value. Fix:" in p.stderr
    else:
        assert "SGLang's own SubBlock router stays" in p.stderr


@needs_site
def test_router_hook_maps_sglangs_call_to_route(kernels_dir):
    """Through SGLang's real SubBlockRouter with the hook applied (fake CUDA tensors: shapes only):
    our route gets the router's n_q, n_k, block size and granularity and SGLang's sparsity and
    scale; what comes back is SGLang's RoutingPlan with SGLang's own budget; key blocks our kernels
    do not take and CPU tensors stay on SGLang's router; SGLang's backend builds its dense rows
    (block_counts) from our plan as from its own."""
    r = json_out(harness("scenario", "router", kernels=kernels_dir,
                         extra_env={"SUBBLOCK_SAGE_SGLANG_ROUTER": "1"}))
    assert r["patched"] is True
    S, H = 4096 + 37, 3
    gq = -(-S // 64)
    for route, call in zip(r["routes"], r["calls"]):
        n_q, n_k, bk, g = route["geometry"]
        assert call == {"q": [1, S, H, 128], "k": [1, S, H, 128], "sparsity": 0.75,
                        "softmax_scale": pytest.approx(128 ** -0.5), "n_q": n_q, "n_k": n_k,
                        "block_size_k": bk, "budget_granularity": g, "layout": "BSHD"}
        assert route["plan_type_is_sglangs"] and route["type"] == "RoutingPlan"
        assert route["topk"] == route["sglang_topk"] and route["num_blocks"] == route["sglang_num_blocks"]
        assert route["index"] == [[1, H, gq, route["topk"]], "torch.int32", "cuda:0"]
    assert len(r["calls"]) == len(r["routes"]) + 1  # + the backend's
    assert r["fallback"] == {"block_size_k=96": {"ours_called": False, "sglang_called": True},
                             "cpu tensors": {"ours_called": False, "sglang_called": True}}
    # the backend's mixed-mask path: every row gets capacity Gk, counts per row
    gk = -(-S // 64)
    assert r["backend"]["ours_called"]
    assert r["backend"]["runner"] == {"index": [[1, H, gq, gk], "torch.int32"], "topk": gk,
                                      "counts": [[1, H, gq], "torch.int32"]}
    assert r["backend"]["out"] == [1, S, H, 128]


@needs_site
def test_sglangs_own_cpu_suite_passes_with_the_router_switch_on(kernels_dir, tmp_path):
    out = tmp_path / "outcomes.json"
    p = harness("unittest", "--json", str(out), kernels=kernels_dir,
                extra_env={"SUBBLOCK_SAGE_SGLANG_ROUTER": "1"})
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert p.stderr.count("(from: plugin=subblock_sage, dist=subblock-sage)") == 4
    outcomes = json.loads(out.read_text())["outcomes"]
    cpu = {t: o for t, o in outcomes.items()
           if ".TestSubBlockNumerics." not in t and ".TestRouterPastInt32." not in t}
    assert len(cpu) == 17 and set(cpu.values()) == {"passed"}, cpu


@pytest.mark.parametrize("cap,env,serves", [((9, 0), None, True), ((12, 0), None, False), ((12, 0), "1", True),
                                            ((10, 0), "default", False), ((9, 0), "1", True)])
def test_router_default_covers_the_capabilities_it_ran_on(monkeypatch, cap, env, serves):
    """The default replaces SGLang's router on ROUTER_RUN_CAPABILITIES only; an explicit
    SUBBLOCK_SAGE_SGLANG_ROUTER=1 on every capability a library serves."""
    from subblock_sage import loader
    from subblock_sage.integrations import sglang_plugin as p

    if env is None:
        monkeypatch.delenv("SUBBLOCK_SAGE_SGLANG_ROUTER", raising=False)
    else:
        monkeypatch.setenv("SUBBLOCK_SAGE_SGLANG_ROUTER", env)
    monkeypatch.setattr(p, "_capability", lambda index: cap)
    monkeypatch.setattr(p, "_served_target", lambda c, what: "sm_x")
    monkeypatch.setattr(loader, "library_for_device", lambda index: type("L", (), {"has_kernel": lambda s, k: True})())
    if hasattr(p.router_serves, "cache_clear"):
        p.router_serves.cache_clear()
    try:
        assert p.router_serves(0) is serves
    finally:
        if hasattr(p.router_serves, "cache_clear"):
            p.router_serves.cache_clear()
