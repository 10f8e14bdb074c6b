"""The project's lab bench: `subblock-sage bench` (python/subblock_sage/tools/bench.py) with other
libraries' kernels timed next to ours, on the same shapes and plans. Never shipped (the runtime
wheel holds only what serves a call, and `subblock-sage bench`, which times our kernels and torch's
SDPA); run from the repository root, with the runtime installed or on PYTHONPATH:

    python -m benchmark.lab.bench [--no-cudnn-fp8] [--no-contenders] [--test-libs DIR] [BENCH OPTIONS]

BENCH OPTIONS are `subblock-sage bench`'s (--quick, --json, --shape, --shapes, --calls, --plans,
--warm-s), parsed by its own parser. The table, header, notes and JSON are the runtime bench's;
these rows are added through its ``Extra`` hooks (``Lab``), each where the runtime bench printed
them before they moved here:

- cuDNN's FP8 SDPA dense (FP8 in and out, cudnn_fp8.py; only with nvidia-cudnn-frontend
  installed) after each shape's SDPA rows, and on the dense plan alternated with the dense Sage
  kernel, in the same power state (``alternated``: vs_fp8).
- Contender groups (``contender_group``, on every 64-key plan): our bf16 whole call and its kernel
  alone timed in turn with FlexAttention, cuDNN's block-sparse attention, SGLang's own SM90 bf16
  kernel (compiled ahead of time into the never-shipped test library: sglang_sm90.py,
  test_library.py) and cuDNN's dense bf16 SDPA, all on the same plan (contenders.py: ours_x).
- Sage contender groups (``sage_contender_group``): our Sage call against cuDNN's SM90 Sage FP8
  path (its quantizer and kernel, from the test library: cudnn_sm90.py) on the plan padded to a
  fixed count (padded_x).

Clocks and power come from the runtime's sampler (subblock_sage.tools.power), which
`subblock-sage bench` uses too (its ``[bench]`` extra): one implementation for both.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys

from subblock_sage.tools import bench
from subblock_sage.tools.bench import kept_flops, kernel_only, result_row, time_ms
from subblock_sage.tools.power import summarize

from . import contenders as ctd
from . import cudnn_fp8

# rounds of the dense Sage kernel alternated with cuDNN's FP8 SDPA (``alternated``): the two
# are compared in the same power state (the ">= 0.98x" bar). Timed one after the other,
# minutes apart, the board warms up in between: cuDNN was seen at 1830 MHz and our kernel at
# 1740 MHz (0.95x); alternated, the same kernels were 0.99-1.0x (MEASUREMENTS.md).
ALTERNATE_ROUNDS = 3
# the rows every contender group is compared by: our bf16 call, and cuDNN's dense bf16 SDPA
OURS_BF16 = "bf16 (whole call)"
SDPA_CUDNN = bench.SDPA_CUDNN
# the runtime bench's columns and the lab's (range_ms, vs_fp8, ours_x, rel_err, first_use), in order
COLUMNS = ("contender", "H", "S", "plan", "ms", "range_ms", "dense_tflops", "kept_tflops", "vs_cudnn_dense",
           "vs_fp8", "ours_x", "whole/kernel", "host_us", "eager/graph", "rel_err", "GB/s", "of_copy", "MHz", "W",
           "slowed", "first_use", "error")
assert set(bench.COLUMNS) <= set(COLUMNS)


class Lab(bench.Extra):
    """The lab's rows in the runtime bench (``bench.run(..., extra=Lab(...))``): ``cudnn``: cuDNN's
    FP8 SDPA row and its alternated rows; ``contenders``: the contender groups; ``test_libs``: the
    test-library folder holding SGLang's and cuDNN's AOT-compiled SM90 kernels."""

    columns = COLUMNS

    def __init__(self, cudnn: bool = True, contenders: bool = True, test_libs=None):
        self.cudnn, self.contenders, self.test_libs = cudnn, contenders, test_libs
        self.cudnn_mod = None
        self.loaded = None  # the block-sparse contenders that can run here (load_contenders)
        self.fp8_call = None  # the shape's cuDNN FP8 SDPA call, kept for the alternated rows

    def start(self, ctx):
        if self.cudnn:
            try:
                self.cudnn_mod = cudnn_fp8.load()
            except cudnn_fp8.Unavailable as e:
                ctx.notes.append(str(e))
        if self.contenders and "bf16" in ctx.modes:
            self.loaded = load_contenders(ctx.notes, self.test_libs)

    def shape_rows(self, ctx):
        if self.cudnn_mod is None:
            return []
        qt, kt, vt = (x.transpose(1, 2) for x in (ctx.q, ctx.k, ctx.v))
        row, self.fp8_call = _cudnn_fp8_row(self.cudnn_mod, ctx.q, ctx.k, ctx.v, qt, kt, vt, ctx.timed,
                                            ctx.dense_flops, ctx.base_ms, ctx.notes)
        return [] if row is None else [row]

    def kernel_rows(self, ctx, mode, plan, density, kernel):
        if self.fp8_call is None or mode != "sage_fp8" or density < 1.0:
            return []
        return alternated({f"{mode} (kernel only)": kernel, cudnn_fp8.ROW: self.fp8_call}, ctx.shape, plan,
                          ctx.sampler, ctx.reps, ctx.warm_s, ctx.dense_flops, ctx.base_ms)

    def plan_rows(self, ctx, index, counts, block_size_k, plan):
        rows = []
        if self.loaded is None:
            return rows
        (H, S), bk = ctx.shape, block_size_k
        if bk == ctd.BLOCK_K:
            rows += contender_group(self.loaded, ctx.q, ctx.k, ctx.v, index, counts, ctx.shape, plan, ctx.sampler,
                                    ctx.reps, ctx.warm_s, ctx.dense_flops, kept_flops(counts, bk, S, S, H),
                                    ctx.base_ms, ctx.notes, library=ctx.lib, backend=ctx.backend)
            gc.collect()
        if self.loaded.get(ctd.CUDNN_BSA_BF16) is not None and "sage_fp8" in ctx.modes:
            rows += sage_contender_group(self.loaded[ctd.CUDNN_BSA_BF16], ctx.q, ctx.k, ctx.v, index, counts, bk,
                                         ctx.shape, plan, ctx.sampler, ctx.reps, ctx.warm_s, ctx.dense_flops,
                                         ctx.base_ms, ctx.notes, library=ctx.lib, backend=ctx.backend)
            gc.collect()
        return rows

    def end_shape(self, ctx):
        self.fp8_call = None  # cuDNN's graph and handle

    def header_lines(self, rows):
        return header_lines(rows)


def load_contenders(notes: list, test_libs=None) -> dict:
    """{name: loader result} of the block-sparse contenders that can run here (FlexAttention needs
    nothing to load); a note for each that cannot."""
    loaded = {ctd.FLEX: None}
    for name, load in ((ctd.CUDNN_BSA, ctd.load_cudnn_bsa),
                       (ctd.SGLANG_SM90, lambda: ctd.load_sglang_sm90(test_libs)),
                       (ctd.CUDNN_BSA_BF16, lambda: ctd.load_cudnn_sm90(test_libs))):
        try:
            loaded[name] = load()
        except ctd.Unavailable as e:
            notes.append(str(e))
    return loaded


def sorted_prefix(index, counts):
    """A copy of ``index`` whose first ``counts`` ids per row are ascending (the order SGLang's
    caller gives its SM90 kernel; the ids and counts are unchanged)."""
    import torch

    cap = index.shape[-1]
    live = torch.arange(cap, device=index.device) < counts.unsqueeze(-1).to(torch.int64)
    big = torch.iinfo(torch.int32).max
    keys = torch.where(live, index, torch.full_like(index, big))
    prefix = keys.sort(dim=-1).values
    return torch.where(live, prefix, index).contiguous()


def contender_group(loaded, q, k, v, index, counts, shape, plan, sampler, reps, warm_s, dense_flops, kept,
                    base_ms, notes, *, library=None, backend=None, rounds=None) -> list:
    """Our bf16 call, its kernel alone, the block-sparse contenders of ``loaded`` and cuDNN's dense
    bf16 SDPA on one 64-key plan (active prefixes sorted for all of them, as SGLang hands plans to
    its SM90 kernel), timed in turn (``alternated``): one power state for every row. Each row's
    ``ours_x`` = our whole call's kept-block TFLOPS / the row's (on the plan's rows: its ms / ours;
    on the dense row: ours against cuDNN's dense throughput). A contender that cannot run is a
    note; a first call's compile time is on its row (``first_use``), never in the timing."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from subblock_sage import sparse_attention

    H, S = shape
    index = sorted_prefix(index, counts)
    calls = {OURS_BF16: lambda: sparse_attention(q, k, v, index, counts, block_size_k=ctd.BLOCK_K,
                                                 compute_mode="bf16")}
    first_use = {}
    if backend is not None:
        calls["bf16 (kernel only)"] = kernel_only(q, k, v, index, counts, ctd.BLOCK_K, "bf16", library=library,
                                                  backend=backend)
    for name, handle in loaded.items():
        try:
            if name == ctd.FLEX:
                built = ctd.build_flex(q, k, v, index, counts)
            elif name == ctd.CUDNN_BSA:
                built = ctd.build_cudnn_bsa(handle, q, k, v, index, counts)
            elif name == ctd.CUDNN_BSA_BF16:
                built = ctd.build_cudnn_bsa_bf16(handle, q, k, v, index, counts)
            else:
                built = ctd.build_sglang_sm90(handle, q, k, v, index, counts)
        except ctd.Unavailable as e:
            if str(e) not in notes:
                notes.append(str(e))
            continue
        calls[name] = built.call
        if built.note:
            first_use[name] = built.note
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    dense = SDPA_CUDNN

    def cudnn_dense():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt)

    try:
        cudnn_dense()
        calls[dense] = cudnn_dense
    except RuntimeError as e:
        notes.append(f"{dense}: not in the contender group at H={H} S={S}: {ctd.short(e, 80)}")
    kept_of = {n: (dense_flops if n == dense else kept) for n in calls}
    try:
        rows = alternated(calls, shape, plan, sampler, reps, warm_s, dense_flops, base_ms,
                          rounds=rounds or ALTERNATE_ROUNDS, kept=kept_of, dense_names=(dense,), versus=OURS_BF16)
    except Exception as e:  # noqa: BLE001 - reported in the table; the bench goes on
        torch.cuda.synchronize()
        return [{"contender": f"contender group ({', '.join(calls)})", "H": H, "S": S, "plan": plan,
                 "error": f"{type(e).__name__}: {ctd.short(e, 80)}"}]
    for r in rows:
        name = r["contender"].rsplit(", alternated", 1)[0]
        if name in first_use:
            r["first_use"] = first_use[name]
    calls = None  # noqa: F841 - the contenders' buffers go back before the next plan
    torch.cuda.synchronize()
    return rows


def sage_contender_group(kernel, q, k, v, index, counts, block_k, shape, plan, sampler, reps, warm_s,
                         dense_flops, base_ms, notes, *, library=None, backend=None, rounds=None) -> list:
    """Our Sage call (whole and kernel only) and cuDNN's SM90 Sage FP8 path (its quantizer and its
    ``block_k``-key kernel, one timed call) timed in turn on the plan padded to one fixed count
    (``contenders.fixed_count_plan``: what cuDNN's SM90 Sage kernels take), all three on that same
    padded plan. Every row carries ``padded_x`` (kept blocks of the padded plan / the plan's, the
    padding's cost, which only cuDNN needs: our rows on the unpadded plan are in the table above)
    and ``ours_x`` against our whole call; the kept-block TFLOPS count the padded plan's blocks."""
    import torch

    from subblock_sage import sparse_attention

    H, S = shape
    try:
        padded, count, padded_x = ctd.fixed_count_plan(index, counts)
    except ValueError as e:
        notes.append(f"{ctd.CUDNN_BSA_SAGE}: not timed on {plan}: {ctd.short(e, 120)}")
        return []
    fixed = torch.full_like(counts, count)
    padded = sorted_prefix(padded, fixed)
    # cuDNN's 128-key kernels take 128-row query blocks: the even 64-row blocks' lists, which
    # ours gets for both halves of each 128-row block (one plan for all three rows)
    cudnn_index = padded[:, :, ::2].contiguous() if block_k == 128 else padded
    if block_k == 128:
        padded = cudnn_index.repeat_interleave(2, dim=2)[:, :, :counts.shape[2]].contiguous()
    ours = "sage_fp8 (whole call), fixed-count plan"
    calls = {ours: lambda: sparse_attention(q, k, v, padded, fixed, block_size_k=block_k, compute_mode="sage_fp8")}
    if backend is not None:
        calls["sage_fp8 (kernel only), fixed-count plan"] = kernel_only(q, k, v, padded, fixed, block_k, "sage_fp8",
                                                                        library=library, backend=backend)
    try:
        built = ctd.build_cudnn_bsa_sage(kernel, q, k, v, cudnn_index, count, block_k)
    except ctd.Unavailable as e:
        if str(e) not in notes:
            notes.append(str(e))
        return []
    calls[built.name] = built.call
    kept = kept_flops(fixed, block_k, S, S, H)
    plan = f"{plan} padded to {count}"
    try:
        rows = alternated(calls, shape, plan, sampler, reps, warm_s, dense_flops, base_ms,
                          rounds=rounds or ALTERNATE_ROUNDS, kept={n: kept for n in calls}, dense_names=(),
                          versus=ours)
    except Exception as e:  # noqa: BLE001 - reported in the table; the bench goes on
        torch.cuda.synchronize()
        return [{"contender": f"sage contender group ({', '.join(calls)})", "H": H, "S": S, "plan": plan,
                 "error": f"{type(e).__name__}: {ctd.short(e, 80)}"}]
    for r in rows:
        r["padded_x"] = round(padded_x, 3)
        if r["contender"].startswith(built.name) and built.note:
            r["first_use"] = built.note
    calls = None  # noqa: F841 - the contenders' buffers go back before the next plan
    torch.cuda.synchronize()
    return rows


def alternated(contenders: dict, shape, plan, sampler, reps, warm_s, dense_flops, base_ms,
               rounds: int = ALTERNATE_ROUNDS, *, kept=None, dense_names=(cudnn_fp8.ROW,), versus=None) -> list:
    """Rows of ``contenders`` (name -> call) timed in turn, ``rounds`` times (A B A B ...): the
    median over rounds of each one's ``time_ms``, with the SM clock and power pooled over its
    rounds, so that all of them are compared in the same power state. Rows of ``dense_names``
    have the plan "dense". Without ``versus``: the first contender's row carries ``vs_fp8`` =
    (the last one's ms) / (its ms). With ``versus`` (a contender's name): every other row carries
    ``ours_x`` = that one's kept-block TFLOPS / the row's. ``kept``: name -> kept-block FLOPs
    (default: dense_flops)."""
    times = {n: [] for n in contenders}
    samples = {n: [] for n in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            with sampler:
                times[name].append(time_ms(fn, reps=reps, warm_s=warm_s))
            samples[name] += sampler.samples
    out = []
    for name in contenders:
        ms = statistics.median(times[name])
        pw = summarize(samples[name])
        flops = (kept or {}).get(name, dense_flops)
        row = result_row(f"{name}, alternated x{rounds}", shape, "dense" if name in dense_names else plan, ms,
                         dense_flops, flops, base_ms, pw)
        row["range_ms"] = f"{min(times[name]):.4g}-{max(times[name]):.4g}"
        out.append(row)
    if versus is None:
        first, last = out[0], out[-1]
        first["vs_fp8"] = round(last["ms"] / first["ms"], 3)
        return out
    names = list(contenders)
    ours = out[names.index(versus)]
    ours_rate = (kept or {}).get(versus, dense_flops) / ours["ms"]
    for name, row in zip(names, out):
        if name != versus:
            row["ours_x"] = round(ours_rate / ((kept or {}).get(name, dense_flops) / row["ms"]), 3)
    return out


def _cudnn_fp8_row(cudnn_mod, q, k, v, qt, kt, vt, timed, dense_flops, base_ms, notes):
    """cuDNN's FP8 SDPA row of one shape (with its error against bf16 SDPA) and its call (kept for
    the alternated rows), or (None, None) with a note."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, S = q.shape[2], q.shape[1]
    try:
        call, result = cudnn_fp8.build(cudnn_mod, q, k, v)
    except cudnn_fp8.Unavailable as e:
        notes.append(str(e))
        return None, None
    except Exception as e:  # noqa: BLE001 - an API other than the one cudnn_fp8.py was written for
        notes.append(f"{cudnn_fp8.ROW}: skipped at H={H} S={S}: {type(e).__name__}: {str(e)[:100]}")
        return None, None
    try:
        ms, pw = timed(call)
    except Exception as e:  # noqa: BLE001
        notes.append(f"{cudnn_fp8.ROW}: failed at H={H} S={S}: {type(e).__name__}: {str(e)[:100]}")
        return None, None
    row = result_row(cudnn_fp8.ROW, (H, S), "dense", ms, dense_flops, dense_flops, base_ms, pw)
    try:  # a garbage-fast contender would show here (FP8 everywhere: a few percent is expected)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
            ref = F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)
        call()
        row["rel_err"] = round(cudnn_fp8.rel_err(result(), ref), 4)
    except Exception:  # noqa: BLE001 - the check is extra; the timing stands
        pass
    # collect what the check left now, not in a later garbage collection that could run inside the
    # CUDA-graph capture of the host-cost rows (the call stays referenced until the shape ends)
    del result
    gc.collect()
    return row, call


def header_lines(rows) -> list[str]:
    """The header lines of the lab's columns (those some row has)."""
    lines = []
    if any("vs_fp8" in r for r in rows):
        lines.append(f"alternated xN: the dense Sage kernel and {cudnn_fp8.ROW} timed in turn N times (the same "
                     "power state); ms = median over the rounds (range_ms: their range), vs_fp8 = cuDNN ms / ours")
    if any("ours_x" in r for r in rows):
        lines.append(f"contender groups (64-key plans, active prefixes sorted): {OURS_BF16}, its kernel alone, "
                     "the block-sparse contenders on the same plan and cuDNN's dense bf16 SDPA, timed in turn "
                     f"(alternated xN, one power state); ours_x = kept-block TFLOPS of {OURS_BF16} / the row's "
                     "(same plan: its ms / ours); first_use: a contender's first call (compilation), never timed")
    if any("rel_err" in r for r in rows):
        lines.append(f"rel_err: ||out - bf16 SDPA|| / ||bf16 SDPA|| of {cudnn_fp8.ROW} (FP8 Q, K, V, P and O)")
    return lines


def header(gpu: str, reps: int, warm_s: float, calls: int, rows) -> list[str]:
    """The runtime bench's header with the lab's lines."""
    return bench.header(gpu, reps, warm_s, calls, rows, header_lines(rows))


def format_table(rows) -> str:
    """The runtime bench's table with the lab's columns."""
    return bench.format_table(rows, COLUMNS)


def parser() -> argparse.ArgumentParser:
    """The lab's own options; every other one is `subblock-sage bench`'s (``parse_args``)."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmark.lab.bench", allow_abbrev=False,
        description="subblock-sage bench with the lab's contenders (benchmark/lab, never shipped)",
        epilog="Every other option is `subblock-sage bench`'s (subblock-sage bench --help): --quick, --json, "
               "--shape, --shapes, --calls, --plans, --warm-s.")
    ap.add_argument("--no-cudnn-fp8", action="store_true",
                    help="leave out cuDNN's FP8 SDPA (otherwise timed when nvidia-cudnn-frontend imports)")
    ap.add_argument("--no-contenders", action="store_true",
                    help="leave out the block-sparse contender groups, whose rows are: " + "; ".join(ctd.ROWS))
    ap.add_argument("--test-libs", metavar="DIR",
                    help="test-library folder holding the AOT-compiled contenders (SGLang's and cuDNN's SM90 "
                         f"kernels; default: ${ctd.TEST_LIBS_ENV})")
    return ap


def parse_args(argv=None):
    """(the lab's options, `subblock-sage bench`'s options): the rest of ``argv`` goes to the runtime
    CLI's own bench parser (its checks, defaults and one-line errors)."""
    from subblock_sage.cli import _parser

    own, rest = parser().parse_known_args(argv)
    return own, _parser().parse_args(["bench", *rest])


def main(argv=None) -> int:
    own, ns = parse_args(argv)
    from subblock_sage.errors import SubblockSageError
    from subblock_sage.torch_support import gpu_problem, require_torch

    try:
        require_torch("the lab bench")
    except SubblockSageError as e:
        print(f"benchmark.lab.bench: {e}", file=sys.stderr)
        return 1
    problem = gpu_problem()
    if problem:
        print(f"benchmark.lab.bench: {problem}", file=sys.stderr)
        return 1
    lab = Lab(cudnn=not own.no_cudnn_fp8, contenders=not own.no_contenders, test_libs=ctd.test_libs_dir(own.test_libs))
    return bench.main(quick=ns.quick, json_path=ns.json, shapes=ns.shape, warm_s=ns.warm_s, preset=ns.shapes,
                      calls=ns.calls, plans=ns.plans, extra=lab)


if __name__ == "__main__":
    sys.exit(main())
