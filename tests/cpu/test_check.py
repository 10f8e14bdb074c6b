"""`subblock_sage.check()` / `subblock-sage check` / `validate_startup()` on simulated machines.

The real kernel libraries are loaded from a private copy of the built wheel; the driver's answers
(status, compute capability) and torch's view of the GPUs are simulated, and the launch
self-tests are replaced by hooks defined here (same contract as the real ones).
"""

from __future__ import annotations

import contextlib
import importlib
import json

import pytest

torch = pytest.importorskip("torch")

from subblock_sage import loader  # noqa: E402
from subblock_sage.errors import StartupValidationError  # noqa: E402

check_mod = importlib.import_module("subblock_sage.diagnostics.probes")
from subblock_sage.diagnostics.format import format_report  # noqa: E402
HERE = __name__


def machine(monkeypatch, caps, *, current=0, torch_cuda=True, driver=13000):
    """Simulate len(caps) GPUs with these compute capabilities and a driver of ``driver``."""
    monkeypatch.setattr(loader.Library, "status", lambda self: (0, driver, 13000, len(caps)))
    monkeypatch.setattr(loader.Library, "capability", lambda self, d: caps[d])
    monkeypatch.setattr(loader.Library, "preload", lambda self, d: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: torch_cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: f"Fake GPU {caps[d]}")
    # no real stream to wait on; the traffic check (12.x) gets a hook that records no CALLS
    monkeypatch.setattr(check_mod.deadline, "on_selftest_stream", lambda d, what: contextlib.nullcontext())
    monkeypatch.setattr(check_mod, "TRAFFIC_TEST", (HERE, "hook_quiet"))


# Self-test hooks with the real contract: fn(device) -> str, fn.supported(lib) -> bool
CALLS: list = []


def hook_ok(device):
    CALLS.append(("ok", device))
    return "matches the reference"


def hook_fail(device):
    CALLS.append(("fail", device))
    raise RuntimeError("output differs from the reference: cosine 0.12")


def hook_unsupported(device):  # pragma: no cover - never launched
    raise AssertionError("launched a mode the library does not ship")


def hook_quiet(device):
    return "bit-identical"


hook_ok.supported = lambda lib: True
hook_quiet.supported = lambda lib: True
hook_fail.supported = lambda lib: True
hook_unsupported.supported = lambda lib: False


@pytest.fixture
def hooks(monkeypatch):
    CALLS.clear()

    def use(**modes):
        monkeypatch.setattr(check_mod, "SELF_TESTS", {m: (HERE, fn) for m, fn in modes.items()})

    return use


# ---------------------------------------------------------------------------------------------


def test_report_is_structured_and_json(kdir, monkeypatch):
    machine(monkeypatch, [(9, 0)])
    r = check_mod.check(run_kernels=False)
    d = r.to_dict()
    json.dumps(d)  # serialisable
    for key in ("runtime_version", "kernels_version", "versions_match", "driver_cuda", "runtime_cuda",
                "min_driver_cuda", "driver_ok", "targets", "gpus", "problems", "ok", "all_served"):
        assert key in d
    assert {"sm_90a", "sm_100a", "sm_120a"} <= set(d["targets"])
    for t in d["targets"].values():  # every library checked, not only the one in use
        assert t["present"] and t["sha256_ok"] and "hardware_status" in t and "run_on_hardware" in t
    g = d["gpus"][0]
    assert g["capability"] == "9.0" and g["target"] == "sm_90a" and g["loaded"] and g["served"]
    assert d["ok"] is True


def test_current_gpu_decides_exit_status(kdir, monkeypatch, capsys):
    from subblock_sage.cli import main

    machine(monkeypatch, [(9, 0), (7, 5)], current=0)
    r = check_mod.check(run_kernels=False)
    assert r.ok and not r.all_served
    assert r.gpus[1].target is None and "7.5" in r.gpus[1].problems[0]
    assert main(["check", "--no-launch"]) == 0
    out = capsys.readouterr().out
    assert "(current)" in out and "NOT SERVED" in out and "not every visible GPU" in out
    machine(monkeypatch, [(9, 0), (7, 5)], current=1)
    assert not check_mod.check(run_kernels=False).ok
    assert main(["check", "--no-launch", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] is False and d["current_device"] == 1
    assert main(["check", "--no-launch", "--device", "0"]) == 0


def test_self_tests_run_per_gpu_and_mode(kdir, monkeypatch, hooks):
    machine(monkeypatch, [(9, 0), (12, 0)])
    hooks(sage_quant="hook_ok", sage_fp8="hook_ok", bf16="hook_ok")
    r = check_mod.check()
    assert r.ok and r.all_served
    assert CALLS == [("ok", 0)] * 3 + [("ok", 1)] * 3
    assert r.gpus[1].target == "sm_120a"
    assert r.gpus[0].self_tests == {m: "ok: matches the reference" for m in ("sage_quant", "sage_fp8", "bf16")}


def test_failing_self_test_fails_the_gpu(kdir, monkeypatch, hooks):
    machine(monkeypatch, [(9, 0)])
    hooks(sage_quant="hook_ok", sage_fp8="hook_fail", bf16="hook_ok")
    r = check_mod.check()
    assert not r.ok and not r.gpus[0].served
    assert r.gpus[0].self_tests["sage_fp8"].startswith("FAILED: output differs")
    assert any("sage_fp8 self-test failed" in p and "pip install" in p for p in r.all_problems)
    # bf16 alone still validates; sage_fp8 does not
    check_mod.validate_startup(compute_mode="bf16", device=0)
    with pytest.raises(StartupValidationError, match="sage_fp8 self-test failed"):
        check_mod.validate_startup(compute_mode="sage_fp8", device=0)
    # only the modes asked for are launched
    CALLS.clear()
    check_mod.validate_startup(compute_mode="bf16", device=0)
    assert CALLS == [("ok", 0)]


def test_mode_not_shipped(kdir, monkeypatch, hooks):
    """A mode whose self-test says the library lacks it (here Sage on a B200, opted in, with a hook
    that reports it unsupported): sage_fp8 fails at startup naming the alternative."""
    machine(monkeypatch, [(10, 0)])
    hooks(sage_quant="hook_ok", sage_fp8="hook_unsupported", bf16="hook_ok")
    r = check_mod.check()
    assert r.ok and r.gpus[0].self_tests["sage_fp8"].startswith("not shipped for sm_100a")
    check_mod.validate_startup(compute_mode="bf16")
    with pytest.raises(StartupValidationError, match="not shipped for sm_100a") as e:
        check_mod.validate_startup(compute_mode="sage_fp8", allow_unvalidated=True)
    msg = str(e.value)
    assert "not shipped for sm_100a" in msg and "compute_mode='bf16'" in msg and "sm_90a" in msg


def test_missing_hook_module_is_not_a_failure(kdir, monkeypatch, hooks):
    machine(monkeypatch, [(9, 0)])
    monkeypatch.setattr(check_mod, "SELF_TESTS", {"bf16": ("ops.no_such_module", "self_test")})
    r = check_mod.check()
    assert r.gpus[0].self_tests["bf16"].startswith("not shipped")


def test_no_torch_cuda(kdir, monkeypatch, hooks):
    machine(monkeypatch, [(9, 0)], torch_cuda=False)
    hooks(bf16="hook_ok")
    r = check_mod.check()
    assert not r.ok and any("CUDA build of PyTorch" in p for p in r.all_problems)
    assert check_mod.check(run_kernels=False).ok


def test_validate_startup_devices(kdir, monkeypatch, hooks):
    machine(monkeypatch, [(9, 0), (8, 0)], current=0)
    hooks(sage_quant="hook_ok", sage_fp8="hook_ok", bf16="hook_ok")
    r = check_mod.validate_startup()  # current device only
    assert [g.index for g in r.gpus] == [0]
    check_mod.validate_startup(device="cuda:0")
    check_mod.validate_startup(device=torch.device("cuda", 0))
    with pytest.raises(StartupValidationError, match="8.0"):
        check_mod.validate_startup(device="cuda:1")
    with pytest.raises(StartupValidationError, match="GPU 1") as e:
        check_mod.validate_startup(device="all")
    assert "GPU 1" in str(e.value) and "Supported:" in str(e.value)
    with pytest.raises(StartupValidationError, match="not visible"):
        check_mod.validate_startup(device=5)


def test_every_problem_listed_once(kdir, monkeypatch, hooks):
    machine(monkeypatch, [(8, 0), (7, 5)])
    hooks(bf16="hook_ok")
    with pytest.raises(StartupValidationError, match=r"7\.5") as e:
        check_mod.validate_startup(compute_mode="bf16", device="all")
    probs = e.value.problems
    assert len(probs) == 2 and "8.0" in probs[0] and "7.5" in probs[1]
    assert len(set(probs)) == len(probs)


def test_hardware_status_reported(kdir, monkeypatch):
    m = json.loads((kdir / "manifest.json").read_text())
    m["targets"]["sm_90a"]["hardware"] = {"run_on_hardware": True, "gpu": "NVIDIA H200", "date": "2026-11-30"}
    (kdir / "manifest.json").write_text(json.dumps(m))
    loader.reset_cache()
    machine(monkeypatch, [(9, 0), (12, 0)])
    r = check_mod.check(run_kernels=False)
    assert r.targets["sm_90a"].run_on_hardware and "NVIDIA H200" in r.targets["sm_90a"].hardware_status
    assert not r.targets["sm_120a"].run_on_hardware
    assert r.gpus[0].run_on_hardware and not r.gpus[1].run_on_hardware
    assert any("GPU 1" in w and "not yet run" in w for w in r.warnings)
    text = format_report(r)
    assert "run on hardware (NVIDIA H200, 2026-11-30)" in text and "compile-verified" in text


def test_what_each_target_serves_is_printed(kdir, monkeypatch):
    """The manifest's ``serves`` lines (aot/serving.py via aot/manifest.py) are printed per library
    with ``--verbose`` only."""
    m = json.loads((kdir / "manifest.json").read_text())
    line = "fi_sm120_sage_fwd [rows_bs0]: sparse_attention compute_mode='sage_fp8'"
    m["targets"]["sm_90a"]["serves"] = [line]
    (kdir / "manifest.json").write_text(json.dumps(m))
    loader.reset_cache()
    machine(monkeypatch, [(9, 0)])
    r = check_mod.check(run_kernels=False)
    assert r.targets["sm_90a"].serves == [line]
    assert f"serves {line}" in format_report(r, verbose=True)
    assert "serves " not in format_report(r)


# What --json has held for every library and for the report (issue 59: --verbose changes neither).
TARGET_KEYS = {"gpus", "capabilities", "library", "present", "sha256_ok", "size", "run_on_hardware",
               "hardware_status", "kernels", "compute_modes", "serves", "unvalidated", "router", "problem"}
REPORT_KEYS = {"runtime_version", "kernels_version", "versions_match", "kernels_dir", "library_source",
               "build_commit", "toolchain", "driver_cuda", "runtime_cuda", "min_driver_cuda", "driver_ok", "torch",
               "torch_cuda", "python", "machine", "targets", "gpus", "current_device", "devices_requested",
               "problems", "warnings", "ok", "all_served", "all_problems"}


def _listing(text: str) -> list[str]:
    return text.split("Libraries in this install:\n", 1)[1].split("\n\n", 1)[0].splitlines()


@pytest.mark.parametrize("caps", [[], [(9, 0)]])
def test_one_line_per_library_unless_verbose(kdir, monkeypatch, capsys, caps):
    """Issue 59: `check` lists each library of the install on one line (integrity, compute modes,
    hardware status, its router's run in brief, any unvalidated label), GPU or none; `--verbose`
    adds what it serves, kernel by kernel, and the router's run in full; `--json` is the same with
    or without it, and keeps its keys."""
    from subblock_sage.cli import main
    from subblock_sage.diagnostics.report import router_brief

    machine(monkeypatch, caps)
    r = check_mod.check(run_kernels=False)
    assert r.targets
    short, full = _listing(format_report(r)), _listing(format_report(r, verbose=True))
    assert [line.split()[0] for line in short] == sorted(r.targets)
    for n, t in r.targets.items():
        (line,) = [x for x in short if x.startswith(f"  {n:<8} ")]
        assert f"{t.library}, sha256 ok" in line and t.hardware_status in line
        assert "compute modes " + ", ".join(t.compute_modes) in line and t.compute_modes
        assert f"router (route, subblock_attention): {router_brief(t.router)}" in line
        assert all(u in line for u in t.unvalidated)
        i = full.index(line)
        block = full[i:next((j for j in range(i + 1, len(full)) if not full[j].startswith(" " * 11)), len(full))]
        assert [f"           serves {s}" for s in t.serves] == block[1:1 + len(t.serves)] and t.serves
        assert t.router in "\n".join(block)
    assert router_brief("run on an H100 (2026-12-07): plans the exact top-k") == "run on an H100 (2026-12-07)"

    assert main(["check", "--no-launch"]) == main(["check", "--no-launch", "--verbose"])
    short_out, verbose_out = capsys.readouterr().out.split("subblock-sage check\n")[1:]
    assert len(_listing(short_out)) == len(r.targets) < len(_listing(verbose_out))
    main(["check", "--no-launch", "--json"])
    plain = capsys.readouterr().out
    main(["check", "--no-launch", "--json", "--verbose"])
    assert capsys.readouterr().out == plain
    d = json.loads(plain)
    assert set(d) == REPORT_KEYS and all(set(t) == TARGET_KEYS for t in d["targets"].values())


def test_real_hooks_keep_the_contract():
    from subblock_sage.ops import attention, quantize  # noqa: F401  (importable)

    for mode, (mod, fn, *key) in check_mod.SELF_TESTS.items():
        hook = getattr(importlib.import_module(f"subblock_sage.{mod}"), fn)
        if key:  # a mapping of hooks (ops/attention.py: one per compute mode)
            hook = hook[key[0]]
        assert callable(hook) and callable(hook.supported), mode


def test_check_is_the_function():
    """``subblock_sage.check`` stays the function whatever else is imported (no module of that
    name shadows it, no callable-module trick)."""
    import subblock_sage
    import subblock_sage.diagnostics.format  # noqa: F401

    subblock_sage.validate_startup
    assert subblock_sage.check is check_mod.check
    assert subblock_sage.validate_startup is check_mod.validate_startup


# ---------------------------------------------------------------------------------------------
# Operability: no network, no prints, standard logging, env overrides

import ast  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

PKG = Path(importlib.import_module("subblock_sage").__file__).resolve().parent
NETWORK_MODULES = {"socket", "ssl", "urllib", "urllib3", "requests", "http", "httpx", "aiohttp",
                   "ftplib", "smtplib", "xmlrpc", "websocket", "websockets", "grpc", "asyncio",
                   "telnetlib", "poplib", "imaplib", "nntplib", "huggingface_hub"}
CLI_FILES = {"cli.py", "bench.py", "__main__.py"}  # the command line may print


def _sources():
    files = sorted(PKG.rglob("*.py"))
    assert len(files) > 5
    return files


def test_runtime_imports_nothing_network_related():
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            for n in names:
                assert n.split(".")[0] not in NETWORK_MODULES, f"{path}:{node.lineno} imports {n}"
        text = path.read_text()
        for needle in ("http://", "https://", "urlopen", "socket."):
            assert needle not in text, f"{path} mentions {needle!r}"


def test_no_network_at_run_time(kdir, monkeypatch):
    """import, check() and the CLI never open a socket."""
    import socket

    def refuse(*a, **k):
        raise AssertionError("subblock-sage opened a network socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    machine(monkeypatch, [(9, 0)])
    check_mod.check(run_kernels=False)
    from subblock_sage.cli import main

    main(["check", "--no-launch", "--json"])


def test_library_does_not_print():
    for path in _sources():
        if path.name in CLI_FILES:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                raise AssertionError(f"{path}:{node.lineno} prints; use logging.getLogger('subblock_sage')")
            if isinstance(node, ast.Attribute) and node.attr in ("basicConfig",) and path.name not in CLI_FILES:
                raise AssertionError(f"{path}:{node.lineno} configures logging (the application's job)")


def test_loggers_are_namespaced():
    for path in _sources():
        text = path.read_text()
        for line in text.splitlines():
            if "getLogger(" in line and "getLogger()" in line.replace(" ", ""):
                raise AssertionError(f"{path}: uses the root logger")


def _run(code, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)


def test_log_level_env():
    code = "import logging, subblock_sage; print(logging.getLogger('subblock_sage').level)"
    assert _run(code, SUBBLOCK_SAGE_LOG_LEVEL="debug").stdout.strip() == str(10)
    r = _run(code, SUBBLOCK_SAGE_LOG_LEVEL="nonsense")
    assert r.returncode == 0 and r.stdout.strip() == "0"


def test_import_needs_no_gpu_no_torch_use():
    r = _run("import sys, subblock_sage; print('torch' in sys.modules)")
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_library_dir_env_override(kdir):
    assert loader.kernels_dir() == kdir
    r = check_mod.check(run_kernels=False)
    assert r.kernels_dir == str(kdir)


# ---------------------------------------------------------------------------------------------
# SGLang drop-in: signature and routing (launch replaced by a recorder)


@pytest.fixture
def recorded(monkeypatch):
    from subblock_sage import api

    calls = []

    def fake(q, k, v, idx, counts=None, **kw):
        calls.append(dict(kw, counts=counts))
        return torch.empty_like(q)

    monkeypatch.setattr(api, "sparse_attention", fake)
    return calls


def test_sglang_runner_signature_and_defaults(recorded):
    import inspect

    from subblock_sage.integrations import sglang

    run = sglang.make_runner("bf16")
    assert list(inspect.signature(run).parameters) == [
        "q", "k", "v", "q2k_block_index", "topk", "softmax_scale", "block_counts"]
    q = torch.empty(1, 200, 2, 128, dtype=torch.bfloat16)
    idx = torch.zeros(1, 2, 4, 3, dtype=torch.int32)
    out = run(q, q, q, idx, 3, 0.125)
    assert out.shape == q.shape
    assert recorded[-1] == dict(topk=3, block_size_k=64, softmax_scale=0.125, compute_mode="bf16",
                                layout="BSHD", check_plan=False, counts=None)
    cnt = torch.ones(1, 2, 4, dtype=torch.int32)
    sglang.make_runner("sage_fp8", block_size_k=128)(q, q, q, idx, 3, 0.1, cnt)
    assert recorded[-1]["block_size_k"] == 128 and recorded[-1]["counts"] is cnt
    sglang.subblock_sparse_attention(q, q, q, idx, 2, 0.1, compute_mode="sage_fp8")
    assert recorded[-1]["compute_mode"] == "sage_fp8" and recorded[-1]["topk"] == 2


@pytest.mark.parametrize("cap,mode,bk", [((9, 0), "sage_fp8", 128), ((9, 0), "bf16", 64),
                                         ((12, 0), "sage_fp8", 64), ((12, 0), "bf16", 64),
                                         ((10, 0), "bf16", 64)])
def test_sglang_key_block_size(kdir, monkeypatch, cap, mode, bk):
    from subblock_sage.integrations import sglang

    machine(monkeypatch, [cap])
    assert sglang.key_block_size(0, mode) == bk
    assert sglang.key_block_size("cuda:0", mode) == bk


def test_sglang_unsupported_gpu_refused_at_resolution(kdir, monkeypatch):
    from subblock_sage.errors import UnsupportedGPUError
    from subblock_sage.integrations import sglang

    machine(monkeypatch, [(8, 9)])
    with pytest.raises(UnsupportedGPUError, match="8.9"):
        sglang.get_runner(0, "bf16")
    with pytest.raises(StartupValidationError, match="Supported:"):
        sglang.validate(0, "bf16")


# ---------------------------------------------------------------------------------------------
# The 12.1 Sage label and the self-test deadline, through the real check()


def hook_never_finishes(device):
    CALLS.append(("never", device))

    class Never:
        def query(self):
            return False

    from subblock_sage import deadline

    deadline.wait_event(Never(), f"GPU {device} test self-test", timeout=0.2)


hook_never_finishes.supported = lambda lib: True


def test_sage_on_12_1_is_labelled_and_gated(kdir, monkeypatch, hooks, capsys):
    from subblock_sage import unvalidated
    from subblock_sage.cli import main

    monkeypatch.delenv(unvalidated.ENV, raising=False)
    machine(monkeypatch, [(12, 1)])
    hooks(sage_quant="hook_ok", sage_fp8="hook_ok", bf16="hook_ok")
    r = check_mod.check()
    g = r.gpus[0]
    assert g.target == "sm_120f" and set(g.unvalidated) == {"sage_fp8"}
    assert any("UNVALIDATED" in w and "12.1" in w for w in r.warnings)
    assert main(["check"]) == 0
    assert "sage_fp8   UNVALIDATED on 12.1" in capsys.readouterr().out
    with pytest.raises(StartupValidationError, match=r"compute_mode='sage_fp8' is UNVALIDATED.*Fix:"):
        check_mod.validate_startup(compute_mode="sage_fp8", device=0)
    check_mod.validate_startup(compute_mode="bf16", device=0)
    check_mod.validate_startup(compute_mode="sage_fp8", device=0, allow_unvalidated=True)
    machine(monkeypatch, [(12, 0)])
    assert check_mod.check().gpus[0].unvalidated == {}
    check_mod.validate_startup(compute_mode="sage_fp8", device=0)


@pytest.mark.parametrize("cap,target", [((10, 0), "sm_100a"), ((10, 3), "sm_100f")])
def test_sage_on_b200_b300_is_labelled_and_gated(kdir, monkeypatch, hooks, capsys, cap, target):
    """cuDNN's SM100 Sage kernel (never run): check runs its self-test and prints UNVALIDATED next to
    it; validate_startup refuses Sage without the opt-in, bf16 is served."""
    from subblock_sage import unvalidated
    from subblock_sage.cli import main

    monkeypatch.delenv(unvalidated.ENV, raising=False)
    machine(monkeypatch, [cap])
    hooks(sage_quant="hook_ok", sage_fp8="hook_ok", bf16="hook_ok")
    r = check_mod.check()
    g = r.gpus[0]
    where = f"{cap[0]}.{cap[1]}"
    assert g.target == target and set(g.unvalidated) == {"sage_fp8"} and g.self_tests["sage_fp8"].startswith("ok")
    assert any("UNVALIDATED" in w and where in w for w in r.warnings)
    assert main(["check"]) == 0
    assert f"sage_fp8   UNVALIDATED on {where}" in capsys.readouterr().out
    with pytest.raises(StartupValidationError, match=r"compute_mode='sage_fp8' is UNVALIDATED.*Fix:"):
        check_mod.validate_startup(compute_mode="sage_fp8", device=0)
    check_mod.validate_startup(compute_mode="bf16", device=0)
    check_mod.validate_startup(compute_mode="sage_fp8", device=0, allow_unvalidated=True)


@pytest.mark.parametrize("caps", [[], [(9, 0)], [(12, 0)]])
def test_library_listing_labels_sage_on_12_1_without_such_a_gpu(kdir, monkeypatch, caps, capsys):
    """The listing of the install's libraries says that Sage on sm_120f (12.1), sm_100a (10.0) and
    sm_100f (10.3) is unvalidated and opt-in, whatever GPUs the machine has (none, Hopper, a 12.0
    Blackwell)."""
    from subblock_sage import unvalidated
    from subblock_sage.cli import main

    machine(monkeypatch, caps)
    r = check_mod.check(run_kernels=False)
    labelled = {"sm_120f": "12.1", "sm_100a": "10.0", "sm_100f": "10.3"}
    for n in labelled:
        assert r.targets[n].unvalidated == [unvalidated.listing("sage_fp8", unvalidated.BUILTIN[n]["sage_fp8"])]
    assert all(t.unvalidated == [] for n, t in r.targets.items() if n not in labelled)
    main(["check", "--no-launch"])
    out = capsys.readouterr().out
    listing = out.split("Libraries in this install:", 1)[1].split("\n\n", 1)[0]
    sm120f = listing.split("  sm_120f ", 1)[1].split("\n  sm_", 1)[0]
    assert ("sage_fp8 on compute capability 12.1 is UNVALIDATED, opt-in only "
            "(SUBBLOCK_SAGE_ALLOW_UNVALIDATED=1)") in sm120f, listing
    for n, cap in labelled.items():
        block = listing.split(f"  {n} ", 1)[1].split("\n  sm_", 1)[0]
        assert f"sage_fp8 on compute capability {cap} is UNVALIDATED" in block, listing
    assert listing.count("is UNVALIDATED") == 3, listing
    main(["check", "--no-launch", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert "12.1" in report["targets"]["sm_120f"]["unvalidated"][0]


def test_never_finishing_self_test_fails_within_the_deadline(kdir, monkeypatch, hooks):
    from subblock_sage.errors import SelfTestTimeoutError

    machine(monkeypatch, [(9, 0)])
    hooks(sage_quant="hook_never_finishes", sage_fp8="hook_ok", bf16="hook_ok")
    t0 = __import__("time").monotonic()
    r = check_mod.check()
    assert __import__("time").monotonic() - t0 < 5
    g = r.gpus[0]
    assert g.timed_out and not g.served and not r.ok
    assert g.self_tests["sage_quant"].startswith("TIMED OUT: GPU 0 test self-test")
    # nothing else is launched on a GPU that may still run the stuck kernel
    assert CALLS == [("never", 0)]
    assert g.self_tests["bf16"].startswith("skipped")
    assert any("did not finish within" in p and "sm_90a" in p and "Fix:" in p for p in r.all_problems)
    with pytest.raises(SelfTestTimeoutError, match=r"sm_90a\): sage_quant self-test of the sm_90a kernels"):
        check_mod.validate_startup(compute_mode="sage_fp8", device=0)


def test_traffic_check_runs_on_12_x_only_by_default(kdir, monkeypatch, hooks):
    calls = []
    monkeypatch.setitem(globals(), "hook_quiet", lambda d: calls.append(d) or "bit-identical")
    globals()["hook_quiet"].supported = lambda lib: True
    machine(monkeypatch, [(9, 0), (12, 0)])
    hooks(sage_quant="hook_ok", sage_fp8="hook_ok", bf16="hook_ok")
    r = check_mod.check()
    assert calls == [1] and r.gpus[1].self_tests["traffic"] == "ok: bit-identical"
    assert "traffic" not in r.gpus[0].self_tests
    calls.clear()
    check_mod.check(traffic=True)
    assert calls == [0, 1]
    calls.clear()
    check_mod.validate_startup(compute_mode="bf16", device=1)  # startup: the mode's tests only
    assert calls == []
