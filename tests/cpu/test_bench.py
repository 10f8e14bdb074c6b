"""`subblock-sage bench` without a GPU: shape presets and options, the eager / CUDA-graph rows and
the header (one FLOP convention); and the lab bench's (benchmark/lab, never shipped) options and
cuDNN's FP8 SDPA contender up to the GPU: the note when nvidia-cudnn-frontend is missing or builds
no plan, and the graph it describes, against a fake `cudnn` module (the real API is only exercised
by the GPU run)."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from benchmark.lab import bench as lab
from benchmark.lab import cudnn_fp8
from subblock_sage.cli import _parser
from subblock_sage.tools import bench, power


# ---- shapes and options -------------------------------------------------------------------------

def test_host_preset_is_the_issue_shapes():
    assert bench.resolve_shapes("host") == ((4, 8192), (2, 37760), (14, 37760))
    assert bench.SHAPE_PRESETS["host"] == bench.HOST_SHAPES


def test_defaults_unchanged():
    assert bench.resolve_shapes() == bench.SHAPES == ((14, 37760), (7, 75776), (14, 75776))
    assert bench.resolve_shapes(quick=True) == bench.QUICK_SHAPES
    assert bench.resolve_shapes(shapes=[(3, 100)], quick=True) == ((3, 100),)  # --shape wins over --quick


def test_preset_then_shapes_in_order_without_repeats():
    got = bench.resolve_shapes("host", [(14, 37760), (1, 128), (1, 128)])
    assert got == ((4, 8192), (2, 37760), (14, 37760), (1, 128))


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown shape preset 'nope'; one of standard, quick, host, sglang"):
        bench.resolve_shapes("nope")


def test_parse_bench_options():
    ns = _parser().parse_args(["bench", "--shapes", "host", "--shape", "1,128", "--calls", "10"])
    assert (ns.shapes, ns.shape, ns.calls) == ("host", [(1, 128)], 10)
    ns = _parser().parse_args(["bench"])
    assert (ns.shapes, ns.shape, ns.calls, ns.quick) == (None, None, bench.CALLS, False)
    assert _parser().parse_args(["bench", "--calls", "0"]).calls == 0
    # the lab's contenders are not the user's bench: none of their options
    assert not {"no_cudnn_fp8", "no_contenders", "test_libs"} & set(vars(ns))


def test_parse_lab_bench_options(capsys):
    """The lab bench's own options, and every other one parsed by `subblock-sage bench`'s parser."""
    own, ns = lab.parse_args(["--shapes", "host", "--no-cudnn-fp8", "--shape", "1,128", "--calls", "10"])
    assert (own.no_cudnn_fp8, own.no_contenders, own.test_libs) == (True, False, None)
    assert (ns.shapes, ns.shape, ns.calls) == ("host", [(1, 128)], 10)
    own, ns = lab.parse_args([])
    assert (own.no_cudnn_fp8, ns.shapes, ns.calls, ns.quick) == (False, None, bench.CALLS, False)
    with pytest.raises(SystemExit, match="^2$"):  # a bad bench option: the runtime CLI's one-line error
        lab.parse_args(["--calls", "x"])
    assert "subblock-sage bench: error: argument --calls: 'x' is not a whole number of calls" in capsys.readouterr().err


def _cli(*args, block_torch=False):
    pre = "import sys; sys.modules['torch'] = None; " if block_torch else ""
    code = "import sys; " + pre + "from subblock_sage.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)


@pytest.mark.parametrize("args, match", [(("--calls", "x"), "not a whole number of calls"),
                                         (("--calls", "-1"), "calls must be 0..200"),
                                         (("--calls", "201"), "calls must be 0..200"),
                                         (("--shapes", "nope"), "invalid choice: 'nope'")])
def test_bad_bench_options_are_one_line(args, match):
    r = _cli("bench", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and match in r.stderr, r.stderr


def test_help_lists_the_presets():
    r = _cli("bench", "--help")
    assert r.returncode == 0
    assert "host = 4,8192 2,37760 14,37760" in " ".join(r.stdout.split())


def test_presets_without_torch_still_one_line():
    r = _cli("bench", "--shapes", "host", block_torch=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "needs PyTorch" in r.stderr


# ---- rows and header ----------------------------------------------------------------------------

def test_eager_and_graph_rows():
    pw = power.summarize([(1755, 690.0, 0x4)])
    eager, graph = bench.host_rows("sage_fp8", (4, 8192), "0.25 random bk64", 0.32, 0.091, 20,
                                   4e12, 1e12, 0.5, pw, None)
    assert eager["contender"] == "sage_fp8 (eager x20)" and graph["contender"] == "sage_fp8 (cuda graph x20)"
    assert eager["ms"] == 0.32 and graph["ms"] == 0.091  # per call
    assert graph["eager/graph"] == 3.52 and "eager/graph" not in eager
    # the same FLOP convention as every row: per-call time
    assert eager["dense_tflops"] == round(4e12 / 0.32 / 1e9, 1)
    assert graph["kept_tflops"] == round(1e12 / 0.091 / 1e9, 1)
    assert eager["MHz"] == 1755 and "MHz" not in graph
    table = bench.format_table([eager, graph])
    head = table.splitlines()[0].split()
    assert head.index("eager/graph") < head.index("MHz")
    assert "3.52" in table.splitlines()[3]


def test_header_states_one_flop_convention():
    rows = [{"contender": "x", "ms": 1.0}]
    lines = bench.header("NVIDIA H200", 20, 2.0, 20, rows)
    assert lines[0] == "GPU: NVIDIA H200  (median of 20 runs after 2 s of warm-up, CUDA events)"
    assert sum("TFLOPS =" in line for line in lines) == 1 and bench.FLOPS_LINE in lines
    assert any(line.startswith("eager x20: 20 whole calls back to back") for line in lines)
    assert not any("rel_err" in line for line in lines)
    assert any("nvidia-ml-py" in line for line in lines)
    lines = bench.header("g", 5, 0.0, 0, [{"rel_err": 0.03, "MHz": 1800}])
    assert not any(line.startswith("eager") for line in lines)
    assert not any(line.startswith("rel_err:") for line in lines)  # a lab column: the lab's header says it
    assert any(line.startswith("MHz / W") for line in lines)
    lines = lab.header("g", 5, 0.0, 0, [{"rel_err": 0.03, "MHz": 1800}])
    assert any(line.startswith("rel_err:") and cudnn_fp8.ROW in line for line in lines)
    assert lines[-1].startswith("MHz / W")  # the lab's lines before the clocks-and-power line


# ---- cuDNN FP8 SDPA -----------------------------------------------------------------------------

def test_cudnn_missing_is_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # `import cudnn` raises ImportError
    with pytest.raises(cudnn_fp8.Unavailable, match=r"not importable \((ModuleNotFound|Import)Error: .*\); pip install nvidia-cudnn-frontend to add it$"):
        cudnn_fp8.load()
    try:
        cudnn_fp8.load()
    except cudnn_fp8.Unavailable as e:
        note = str(e)
    assert "\n" not in note and note.startswith(cudnn_fp8.ROW) and "(fp8 out)" in note


def test_cudnn_broken_install_is_a_note(monkeypatch):
    """A frontend whose cuDNN library does not load raises OSError at import: also a note."""
    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name == "cudnn":
                raise OSError("libcudnn_graph.so.9: cannot open shared object file")
            return None

    monkeypatch.delitem(sys.modules, "cudnn", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    with pytest.raises(cudnn_fp8.Unavailable, match=r"OSError: libcudnn_graph.so.9"):
        cudnn_fp8.load()


torch = pytest.importorskip("torch")


class _T:
    """A tensor descriptor of the fake frontend (identity hash, chained setters)."""

    def __init__(self, name, dim=None, stride=None, data_type=None):
        self.name, self.dim, self.stride, self.data_type, self.output = name, dim, stride, data_type, None

    def set_output(self, v):
        self.output = v
        return self

    def set_dim(self, d):
        self.dim = list(d)
        return self

    def set_stride(self, s):
        self.stride = list(s)
        return self

    def set_data_type(self, t):
        self.data_type = t
        return self


def _fake_cudnn(fail_at=None, executed=None):
    """Just the slice of nvidia-cudnn-frontend 1.32's API that cudnn_fp8.py uses, recording it."""
    log = {"graphs": [], "executed": executed if executed is not None else []}

    class Graph:
        def __init__(self, **kw):
            self.kw, self.tensors, self.steps = kw, {}, []
            log["graphs"].append(self)

        def tensor(self, name, dim, stride, data_type):
            self.tensors[name] = t = _T(name, list(dim), list(stride), data_type)
            return t

        def sdpa_fp8(self, *args, **kw):
            self.sdpa_args, self.sdpa_kw = args, kw
            self.outs = [_T("O"), None, _T("Amax_S"), _T("Amax_O")]
            return list(self.outs)

        def _step(name):
            def f(self, *a):
                self.steps.append(name)
                if fail_at == name:
                    raise RuntimeError(f"cudnnGraphNotSupportedError: {name} declined")
            return f

        validate, build_operation_graph, check_support, build_plans = (
            _step("validate"), _step("build_operation_graph"), _step("check_support"), _step("build_plans"))

        def create_execution_plans(self, modes):
            self.steps.append(("create_execution_plans", tuple(modes)))

        def get_workspace_size(self):
            return 0

        def execute(self, pack, workspace, handle=None):
            log["executed"].append((self, pack, handle))

    dt = types.SimpleNamespace(FP8_E4M3="e4m3", FLOAT="f32")
    mod = types.SimpleNamespace(pygraph=Graph, data_type=dt, heur_mode=types.SimpleNamespace(A="A", FALLBACK="FB"),
                                create_handle=lambda: "handle", set_stream=lambda handle, stream: None)
    return mod, log


def _qkv(H=2, S=96, D=128):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, S, H, D, generator=g).to(torch.bfloat16) * (i + 1) for i in range(3)]


def test_cudnn_graph_is_fp8_dense_bhsd_over_bshd_storage():
    mod, log = _fake_cudnn()
    q, k, v = _qkv()
    call, result = cudnn_fp8.build(mod, q, k, v)
    (g,) = log["graphs"]
    assert g.kw == {"io_data_type": "e4m3", "intermediate_data_type": "f32", "compute_data_type": "f32",
                    "handle": "handle"}
    # logical (B, H, S, D) over the BSHD buffers: strides (S*H*D, D, H*D, 1)
    for name in "qkv":
        t = g.tensors[name]
        assert (t.dim, t.stride, t.data_type) == ([1, 2, 96, 128], [96 * 2 * 128, 128, 2 * 128, 1], "e4m3")
    o, _, amax_s, amax_o = g.outs
    assert (o.output, o.dim, o.stride, o.data_type) == (True, [1, 2, 96, 128], [96 * 256, 128, 256, 1], "e4m3")
    assert amax_o.output is True and amax_s.output is False  # amax_s left virtual first
    assert g.sdpa_kw["generate_stats"] is False and g.sdpa_kw["attn_scale"] == pytest.approx(128 ** -0.5)
    assert not any(key.startswith(("use_causal", "diagonal", "right_bound")) for key in g.sdpa_kw)  # dense
    names = [a.name for a in g.sdpa_args]
    assert names == ["q", "k", "v", "descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"]
    assert g.steps == ["validate", "build_operation_graph", ("create_execution_plans", ("A", "FB")),
                       "check_support", "build_plans"]
    # built once, executed once inside the build; every timed call is one execute
    assert len(log["executed"]) == 1
    call()
    call()
    assert len(log["executed"]) == 3
    pack = log["executed"][-1][1]
    assert {t.name for t in pack} == {"q", "k", "v", "descale_q", "descale_k", "descale_v", "descale_s",
                                      "scale_s", "scale_o", "O", "Amax_O"}
    by = {t.name: x for t, x in pack.items()}
    assert by["q"].dtype == torch.float8_e4m3fn and by["q"].stride() == (96 * 256, 128, 256, 1)
    assert by["O"].dtype == torch.float8_e4m3fn
    # amax-derived scales: Q reaches +-448 exactly; S in [0, 1] -> [0, 448]; O in V's range
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        assert float(by[f"descale_{name}"]) * 448 == pytest.approx(float(x.float().abs().max()), rel=1e-6)
        assert float(by[name].float().abs().max()) == 448.0
    assert float(by["scale_s"]) == 448.0 and float(by["descale_s"]) == pytest.approx(1 / 448)
    assert float(by["scale_o"]) == pytest.approx(448 / float(v.float().abs().max()), rel=1e-6)
    by["O"].copy_(by["v"])  # "the kernel wrote V's values at O's scale": result() undoes scale_o
    assert cudnn_fp8.rel_err(result(), v.float()) < 0.1


def test_cudnn_no_plan_is_a_note_after_both_variants():
    mod, log = _fake_cudnn(fail_at="check_support")
    with pytest.raises(cudnn_fp8.Unavailable, match=r"skipped at B=1 H=2 S=96: no plan \(RuntimeError: "
                                                     r"cudnnGraphNotSupportedError: check_support declined\)"):
        cudnn_fp8.build(mod, *_qkv())
    assert [g.outs[2].output for g in log["graphs"]] == [False, True]  # amax_s virtual, then an output


def test_cudnn_row_note_path_keeps_the_bench_going():
    mod, _ = _fake_cudnn(fail_at="build_plans")
    q, k, v = _qkv()
    notes = []
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    row, call = lab._cudnn_fp8_row(mod, q, k, v, qt, kt, vt, timed=None, dense_flops=1, base_ms=None, notes=notes)
    assert row is None and call is None
    assert len(notes) == 1 and notes[0].startswith(cudnn_fp8.ROW + ": skipped at B=1 H=2 S=96")
    # an API unlike the one cudnn_fp8.py was written for (here: no pygraph) is a note too
    notes.clear()
    del mod.pygraph
    row, call = lab._cudnn_fp8_row(mod, q, k, v, qt, kt, vt, timed=None, dense_flops=1, base_ms=None, notes=notes)
    assert row is None and call is None and len(notes) == 1 and "AttributeError" in notes[0]


def test_rel_err():
    x = torch.ones(4, 4)
    assert cudnn_fp8.rel_err(x, x) == 0.0
    assert cudnn_fp8.rel_err(x * 1.1, x) == pytest.approx(0.1, rel=1e-5)


class _FakeSampler:
    """the power Sampler without NVML: each block yields one reading (MHz, W, reasons)."""

    def __init__(self, readings):
        self.readings = iter(readings)
        self.samples = []

    def __enter__(self):
        self.samples = []
        return self

    def __exit__(self, *exc):
        self.samples = [next(self.readings)]


def test_alternated_times_in_turn_and_compares_in_one_power_state(monkeypatch):
    """The dense Sage kernel against cuDNN's FP8 SDPA: timed A B A B A B (not all of A, then all
    of B), the median over rounds per contender, the power pooled per contender, and vs_fp8 =
    cuDNN ms / ours on our row."""
    order = []
    ms = {"ours": iter([10.0, 12.0, 11.0]), "fp8": iter([10.5, 9.0, 30.0])}

    def fake_time_ms(fn, reps, warm_s):
        order.append(fn())
        return next(ms[order[-1]])

    monkeypatch.setattr(lab, "time_ms", fake_time_ms)
    sampler = _FakeSampler([(1700, 690.0, 0), (1800, 600.0, 0)] * 3)
    rows = lab.alternated({"sage_fp8 (kernel only)": lambda: "ours", cudnn_fp8.ROW: lambda: "fp8"},
                            (14, 37760), "1.0 bk128", sampler, reps=20, warm_s=1.0, dense_flops=4e12, base_ms=None)
    assert order == ["ours", "fp8"] * 3
    ours, fp8 = rows
    assert ours["contender"] == "sage_fp8 (kernel only), alternated x3" and ours["plan"] == "1.0 bk128"
    assert fp8["contender"] == f"{cudnn_fp8.ROW}, alternated x3" and fp8["plan"] == "dense"
    assert (ours["ms"], fp8["ms"]) == (11.0, 10.5)
    assert ours["range_ms"] == "10-12" and fp8["range_ms"] == "9-30"
    assert ours["vs_fp8"] == round(10.5 / 11.0, 3) and "vs_fp8" not in fp8
    assert (ours["MHz"], ours["W"]) == (1700, 690) and (fp8["MHz"], fp8["W"]) == (1800, 600)
    assert "vs_fp8" in lab.format_table(rows).splitlines()[0]
    assert "vs_fp8" not in bench.format_table(rows).splitlines()[0]  # not a column of the user's bench


def test_time_ms_reports_the_host_time_of_each_isolated_call(monkeypatch):
    """``host_us`` gets one host time per timed call (perf_counter around the call only, not the
    events or the wait), and the whole-call rows' column is in the table with its header line.
    A fake clock, not sleeps: on a loaded 2-core CI machine a 1 ms sleep took 3.2 ms (the test
    then failed on a correct bench)."""
    torch = pytest.importorskip("torch")

    clock = [0.0]  # seconds of the fake perf_counter

    class FakeEvent:
        ticks = 0.0

        def __init__(self, enable_timing=False):
            self.t = 0.0

        def record(self):
            FakeEvent.ticks += 1.0
            self.t = FakeEvent.ticks

        def synchronize(self):
            clock[0] += 0.003  # the wait for the GPU: not host time of the call

        def elapsed_time(self, other):
            return other.t - self.t

    def call():
        clock[0] += 0.001  # the call's own host time

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    host: list = []
    ms = bench.time_ms(call, warmup=0, reps=5, host_us=host)
    assert ms == 1.0 and len(host) == 5
    assert host == pytest.approx([1000.0] * 5), host  # the 1 ms call, without the 3 ms wait
    row = {"contender": "sage_fp8 (whole call)", "H": 2, "S": 37760, "plan": "p", "ms": 0.5, "host_us": 41.5}
    assert "host_us" in bench.format_table([row]).splitlines()[0]
    assert any(line.startswith("host_us:") for line in bench.header("GPU", 20, 1.0, 0, [row]))
    # ``wait``: called with each call's end event instead of its synchronize (benchmark/host_wait.py)
    waited: list = []
    t0 = clock[0]
    assert bench.time_ms(call, warmup=0, reps=3, wait=waited.append) == 1.0
    assert len(waited) == 3 and all(isinstance(e, FakeEvent) for e in waited)
    assert clock[0] - t0 == pytest.approx(0.003)  # the three calls, no synchronize
