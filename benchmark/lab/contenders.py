"""Block-sparse contenders of the lab bench (``python -m benchmark.lab.bench``) that run the very plan our bf16 kernel gets
(64-row query blocks, 64-key blocks, ``q2k_block_index`` + ``block_counts``): FlexAttention,
cuDNN's block-sparse attention and SGLang's own SM90 bf16 SubBlock kernel. Each one is optional:
when it cannot run here, ``build`` raises :class:`Unavailable`, whose text is the one line the
bench prints, and the bench goes on.

A contender is built once per (shape, plan) outside the timing; ``build`` returns a
:class:`Built` whose ``call()`` is one timed call (BSHD bf16 in, bf16 out into a buffer allocated
at build time) and whose ``setup_s`` is what its first call cost (compilation included), reported
on its row and never timed.

- FlexAttention (``torch.nn.attention.flex_attention``): a ``BlockMask`` made from the plan with
  ``BlockMask.from_kv_blocks`` (``flex_block_mask``), compiled with ``torch.compile`` on first
  use. Inputs BHSD (its layout), transposed and copied once at
  build time.
- cuDNN block-sparse attention: nvidia-cudnn-frontend's
  ``cudnn.block_sparse_attention.block_sparse_attention_forward`` (1.32: SM90 64x64 bf16 path,
  ``q2k_block_index`` + ``q2k_block_nums``, BSHD). Its kernels are CuTe-DSL programs compiled at
  first call, so it also needs ``nvidia-cutlass-dsl`` importable at run time.
- SGLang's SM90 kernel: compiled ahead of time into the test-library build
  (``benchmark.lab.sglang_sm90``, which loads it from the test-library folder) and launched
  as SGLang's ``flash_attn_func`` launches it.
"""

from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass
from typing import Callable

from subblock_sage.contract import ceil_div

from . import test_library

FLEX = "flex_attention bf16"
CUDNN_BSA = "cudnn block-sparse bf16"
SGLANG_SM90 = "sglang sm90 bf16 (AOT)"
# the key-block size every one of them takes here (SGLang's bf16 plans; cuDNN's and SGLang's SM90
# kernels tile 64x64)
BLOCK_K = 64
TEST_LIBS_ENV = test_library.ENV


class Unavailable(Exception):
    """The contender cannot run here; str() is the one-line note the bench prints."""


@dataclass
class Built:
    name: str
    call: Callable[[], object]  # one timed call; returns the output tensor
    setup_s: float  # first call (compilation, plan building), excluded from the timing
    note: str = ""  # what the row says about setup_s


def short(e: BaseException, n: int = 140) -> str:
    """``e`` as one line of at most ``n`` characters (the notes are one line each)."""
    text = " ".join(str(e).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _first_call(fn, name: str, H: int, S: int) -> float:
    """Seconds of ``fn()``'s first call, synchronized (compilation and first launch); a failure
    (a compile or launch error) is :class:`Unavailable`, a note in the table, not a crash."""
    import torch

    t0 = time.perf_counter()
    try:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"{name}: failed at H={H} S={S}: {type(e).__name__}: {short(e)}") from None
    return time.perf_counter() - t0


# ---- FlexAttention --------------------------------------------------------------------------------

def flex_block_mask(index, counts, Sq: int, Sk: int, block_size_k: int = BLOCK_K):
    """A FlexAttention ``BlockMask`` holding exactly the plan: query block i of head h attends to
    the first ``counts[b,h,i]`` ids of ``index[b,h,i]`` (distinct ids in ``[0, ceil(Sk/bk))``, as
    our plans and SGLang's router give; repeats would be computed twice).

    The plan's blocks are FlexAttention's *full* blocks (no mask_mod evaluated in them: the kernel
    only walks the listed blocks, as ours does), except a ragged last key block (Sk not a multiple
    of the key-block size), which is a *partial* block whose mask_mod hides keys at or past Sk.
    The mask_mod states the whole plan (block kept and key < Sk), because FlexAttention defines
    the result by its mask_mod: its eager path evaluates it on every score. Lists are padded to
    every key block (FlexAttention derives the per-key-block lists from a dense block matrix as
    wide as its kv_indices) with ids past each row's count, never read."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    B, H, gq, cap = index.shape
    gk = ceil_div(Sk, block_size_k)
    dev = index.device
    live = torch.arange(cap, device=dev) < counts.to(torch.int64).unsqueeze(-1)
    dense = torch.zeros(B, H, gq, gk + 1, dtype=torch.bool, device=dev)
    dense.scatter_(3, torch.where(live, index.to(torch.int64), gk), True)
    dense = dense[..., :gk].contiguous()  # the plan as a block matrix
    ragged = Sk % block_size_k != 0
    full = dense.clone()
    if ragged:
        full[..., gk - 1] = False
    partial = dense & ~full

    def lists(blocks):
        # kept ids first (ascending), the others after them: a permutation of the key blocks
        order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return blocks.sum(-1, dtype=torch.int32).contiguous(), order.contiguous()

    full_num, full_idx = lists(full)
    part_num, part_idx = lists(partial)

    def mask_mod(b, h, q_idx, kv_idx):
        return dense[b, h, q_idx // 64, kv_idx // block_size_k] & (kv_idx < Sk)

    kwargs = {"BLOCK_SIZE": (64, block_size_k), "mask_mod": mask_mod}
    if "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters:
        kwargs["seq_lengths"] = (Sq, Sk)
    return BlockMask.from_kv_blocks(part_num, part_idx, full_num, full_idx, **kwargs)


# FlexAttention's kernel tile on the plan's 64-row query blocks: 64x64, 4 warps, 3 stages (its
# default configuration for 64-row tiles on other GPUs)
FLEX_KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
_compiled_flex = None


def _flex_fn(compiled: bool):
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if _compiled_flex is None:
        import torch

        # one compiled function for every shape (dynamic=False: each (H, S) compiles once, the
        # plan is a tensor input and recompiles nothing)
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def build_flex(q, k, v, index, counts, softmax_scale=None, *, compiled: bool = True) -> Built:
    """FlexAttention on the plan. ``compiled=False``: eager (the reference path; CPU tests)."""
    try:
        import torch  # noqa: F401
        from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
    except Exception as e:  # noqa: BLE001 - an old torch
        raise Unavailable(f"{FLEX}: skipped: torch.nn.attention.flex_attention is not importable "
                          f"({type(e).__name__}: {short(e)})") from None
    Sq, Sk = q.shape[1], k.shape[1]
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    try:
        mask = flex_block_mask(index, counts, Sq, Sk)
    except Exception as e:  # noqa: BLE001 - an API other than the one this was written for
        raise Unavailable(f"{FLEX}: skipped: BlockMask.from_kv_blocks failed "
                          f"({type(e).__name__}: {short(e)})") from None
    fn = _flex_fn(compiled)
    # the kernel's tile must divide the BlockMask's 64x64 blocks: FlexAttention's own Hopper
    # default for bf16, D = 128 is 128x64 (8 warps), which it refuses on 64-row blocks
    options = dict(FLEX_KERNEL_OPTIONS) if q.is_cuda else None

    def call():
        return fn(qh, kh, vh, block_mask=mask, scale=softmax_scale, kernel_options=options)

    setup = _first_call(call, FLEX, q.shape[2], Sq)
    note = f"compiles at first use: {setup:.1f} s, excluded" if compiled else "eager"
    return Built(FLEX, call, setup, note)


# ---- cuDNN block-sparse attention -------------------------------------------------------------------

CUDNN_BSA_API = "cudnn.block_sparse_attention.block_sparse_attention_forward"


def load_cudnn_bsa():
    """cuDNN's block-sparse forward, or Unavailable naming what is missing."""
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001 - ImportError, OSError of a missing libcudnn
        raise Unavailable(f"{CUDNN_BSA}: skipped: nvidia-cudnn-frontend is not importable "
                          f"({type(e).__name__}: {short(e)}); pip install nvidia-cudnn-frontend to add it") from None
    version = getattr(cudnn, "__version__", "?")
    try:
        from cudnn.block_sparse_attention import block_sparse_attention_forward
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"{CUDNN_BSA}: skipped: nvidia-cudnn-frontend {version} has no {CUDNN_BSA_API} "
                          f"({type(e).__name__}: {short(e)})") from None
    try:
        import cutlass  # noqa: F401  (its kernels are CuTe-DSL programs compiled at first call)
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"{CUDNN_BSA}: skipped: {CUDNN_BSA_API} (nvidia-cudnn-frontend {version}) compiles "
                          f"CuTe-DSL kernels at first call and nvidia-cutlass-dsl is not importable "
                          f"({type(e).__name__}: {short(e)})") from None
    return block_sparse_attention_forward


def build_cudnn_bsa(forward, q, k, v, index, counts, softmax_scale=None) -> Built:
    """cuDNN's block-sparse forward on the plan (BSHD, 64x64 blocks, per-row counts)."""
    Sq = q.shape[1]

    def call():
        return forward(q, k, v, index, q2k_block_nums=counts, sparse_block_size=BLOCK_K,
                       allow_empty_block_nums=True, softmax_scale=softmax_scale, layout="bshd")["o_tensor"]

    setup = _first_call(call, CUDNN_BSA, q.shape[2], Sq)
    return Built(CUDNN_BSA, call, setup, f"compiles at first use: {setup:.1f} s, excluded")


# ---- SGLang's SM90 bf16 kernel (AOT) ----------------------------------------------------------------

def test_libs_dir(option=None):
    """The test-library folder: ``--test-libs`` when given, else $SUBBLOCK_SAGE_TEST_LIBS, else None."""
    if option:
        return option
    return os.environ.get(TEST_LIBS_ENV) or None


def load_sglang_sm90(test_libs=None):
    """The AOT-compiled SGLang SM90 kernel (``sglang_sm90.load``: the test library in ``test_libs``,
    else its environment variables), or Unavailable with ``sglang_sm90.load_failure``."""
    try:
        from . import sglang_sm90
    except Exception as e:  # noqa: BLE001 - not in this build
        raise Unavailable(f"{SGLANG_SM90}: skipped: benchmark.lab.sglang_sm90 is not importable "
                          f"({type(e).__name__}: {short(e)})") from None
    try:
        got = sglang_sm90.load(test_libs)
    except Exception as e:  # noqa: BLE001
        raise Unavailable(f"{SGLANG_SM90}: skipped: loading it failed ({type(e).__name__}: {short(e)})") from None
    if got is None:  # sglang_sm90.load_failure: why, with the fix
        why = " ".join(str(getattr(sglang_sm90, "load_failure", "") or "no reason given").split())
        prefix = "SGLang's SM90 kernel: "
        raise Unavailable(f"{SGLANG_SM90}: {why[len(prefix):] if why.startswith(prefix) else why}")
    return got


def build_sglang_sm90(kernel, q, k, v, index, counts, softmax_scale=None) -> Built:
    """SGLang's SM90 kernel on the plan, into an output allocated once."""
    import torch

    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = torch.empty_like(q)

    def call():
        return kernel.run(q, k, v, index, counts, scale, out=out)

    setup = _first_call(call, SGLANG_SM90, q.shape[2], q.shape[1])
    return Built(SGLANG_SM90, call, setup, "")


# ---- cuDNN's SM90 block-sparse kernels (AOT, test library) -----------------------------------------

CUDNN_BSA_BF16 = "cudnn_bsa_bf16 (AOT sm90 blk64)"
CUDNN_BSA_SAGE = "cudnn_bsa_sage (AOT sm90, its quantizer included)"
# every contender row the lab bench can print (`python -m benchmark.lab.bench --help` lists them)
ROWS = (FLEX, CUDNN_BSA, SGLANG_SM90, CUDNN_BSA_BF16, CUDNN_BSA_SAGE)
# The small shape the cuDNN contenders are checked on against the float64 reference before any
# timing (a fast wrong kernel must not win): S a multiple of 128 (the Sage blk128 kernel's block)
CHECK_SHAPE = (1, 2, 512)  # B, H, S
# bf16: within twice the bf16 rounding of the output itself (+1e-3), SGLang's contender test's
# bar; Sage FP8: the larger of 5 % relative L1 (E4M3 keeps 3 mantissa bits; a skipped or wrongly
# scaled block lands far above 10 %) and 1.5x our own Sage kernel's error on the same inputs and
# plan. Measured (H100, 2026-12-07, MEASUREMENTS.md): on these peaked rows cuDNN's Sage path (its
# quantizer + kernel) lands at 5.0-5.1 %, ours at 3.7 %: 1.35-1.38x, a coarser quantization, not
# a fault; the bench prints both errors
SAGE_CHECK_REL_L1 = 0.05
SAGE_CHECK_VS_OURS = 1.5


def rel_l1(a, b) -> float:
    """sum |a - b| / sum |b| in float64."""
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).abs().sum() / b.abs().sum().clamp_min(1e-30))


def fixed_count_plan(index, counts):
    """(index, count, padded_x): the plan padded to one fixed count per query block, as cuDNN's
    SM90 Sage kernels take it: every row keeps its ``counts`` blocks and gets the next entries of
    its list up to the largest count (distinct blocks the plan did not keep: our plans list each
    row as a permutation of the key blocks, or keep a fixed count already). ``padded_x`` = kept
    blocks after / before, the padding's cost: 1.0 on fixed-count plans, ~3.1 on SGLang's (10 %
    dense rows lift every routed row from a quarter of the key blocks to all of them)."""
    import torch

    count = int(counts.max())
    if index.shape[-1] < count:
        raise ValueError(f"fixed_count_plan: capacity {index.shape[-1]} < the largest count {count}. "
                         "Fix: list every row's blocks up to the largest count")
    padded = index[..., :count].contiguous()
    # rows shorter than the count must list distinct blocks past their own: check it
    srt = padded.sort(dim=-1).values
    if count > 1 and bool((srt[..., 1:] == srt[..., :-1]).any()):
        raise ValueError("fixed_count_plan: a row lists a block twice within the largest count. Fix: "
                         "give each row a permutation of the key blocks (make_plan and make_sglang_plan do)")
    return padded, count, count * counts.numel() / max(1, int(counts.sum(dtype=torch.int64)))


def load_cudnn_sm90(test_libs=None, check: bool = True):
    """cuDNN's AOT-compiled SM90 kernels (``cudnn_sm90.load``), checked against the float64
    reference on :data:`CHECK_SHAPE` (``check``); Unavailable with the reason otherwise."""
    try:
        from . import cudnn_sm90
    except Exception as e:  # noqa: BLE001 - not in this build
        raise Unavailable(f"{CUDNN_BSA_BF16}: skipped: benchmark.lab.cudnn_sm90 is not importable "
                          f"({type(e).__name__}: {short(e)})") from None
    got = cudnn_sm90.load(test_libs)
    if got is None:
        raise Unavailable(f"{CUDNN_BSA_BF16}: {short(cudnn_sm90.load_failure, 300)} (the same for {CUDNN_BSA_SAGE})")
    if check:
        check_cudnn_sm90(got)
    return got


def check_cudnn_sm90(kernel) -> dict:
    """Run each cuDNN contender on :data:`CHECK_SHAPE` against the float64 reference; return the
    relative L1 errors; Unavailable naming the first one over its bar."""
    import torch

    from subblock_sage.reference import reference_sparse_attention

    from . import cudnn_sm90

    B, H, S = CHECK_SHAPE
    gen = torch.Generator().manual_seed(52)
    q, k, v = (torch.randn(B, S, H, 128, generator=gen).to(torch.bfloat16).cuda() for _ in range(3))
    k += (3.0 * torch.randn(1, 1, H, 128, generator=gen)).to(torch.bfloat16).cuda()  # peaked rows
    scale = 128 ** -0.5
    errors = {}
    gk = S // BLOCK_K
    idx = torch.stack([torch.randperm(gk, generator=gen) for _ in range(B * H * (S // 64))]).view(B, H, S // 64, gk)
    counts = torch.randint(0, gk + 1, (B, H, S // 64), generator=gen)
    counts[0, 0, 0] = 0
    idx, counts = idx.int().cuda(), counts.int().cuda()
    out = kernel.run_bf16(q, k, v, idx, counts, scale)
    ref = reference_sparse_attention(q, k, v, idx, counts, softmax_scale=scale)
    floor = rel_l1(reference_sparse_attention(q, k, v, idx, counts, softmax_scale=scale,
                                              dtype=torch.float32).to(torch.bfloat16), ref)
    errors[CUDNN_BSA_BF16] = rel_l1(out, ref)
    if not errors[CUDNN_BSA_BF16] <= 2 * floor + 1e-3:
        raise Unavailable(f"{CUDNN_BSA_BF16}: wrong result on B,H,S={CHECK_SHAPE}: relative L1 "
                          f"{errors[CUDNN_BSA_BF16]:.3g} against the float64 reference (bar {2 * floor + 1e-3:.3g})")
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    for bk in cudnn_sm90.SAGE_BLOCKS:
        g = S // bk
        count = g // 4
        sidx = torch.stack([torch.randperm(g, generator=gen) for _ in range(B * H * (S // bk))]).view(B, H, S // bk, g)
        sidx = sidx.int().cuda().contiguous()
        got = kernel.run_sage(qh, kh, vh, sidx, count, scale, bk).transpose(1, 2)
        ref = reference_sparse_attention(q, k, v, sidx, torch.full(sidx.shape[:3], count, dtype=torch.int32,
                                                                   device=q.device),
                                         block_size_k=bk, softmax_scale=scale) if bk == 64 else \
            _reference_128(q, k, v, sidx, count, scale)
        name = f"{CUDNN_BSA_SAGE} bk{bk}"
        errors[name] = rel_l1(got, ref)
        bar, ours = sage_check_bar(q, k, v, sidx, count, scale, bk, ref)
        if not errors[name] <= bar:
            raise Unavailable(f"{name}: wrong result on B,H,S={CHECK_SHAPE}: relative L1 {errors[name]:.3g} "
                              f"against the float64 reference (bar {bar:.3g}; our Sage kernel: {ours:.3g})")
    return errors


def sage_check_bar(q, k, v, index, count, scale, block_k, ref):
    """``(bar, ours)``: the relative L1 a Sage contender must meet on a fixed-count plan of
    ``block_k``-row query blocks, and our own Sage kernel's error on the same inputs and plan
    (``SAGE_CHECK_*`` say why)."""
    import torch

    import subblock_sage

    idx64 = index.repeat_interleave(block_k // 64, dim=2).contiguous()
    counts = torch.full(idx64.shape[:3], count, dtype=torch.int32, device=q.device)
    ours = rel_l1(subblock_sage.sparse_attention(q, k, v, idx64, counts, block_size_k=block_k, softmax_scale=scale,
                                                 compute_mode="sage_fp8"), ref)
    return max(SAGE_CHECK_REL_L1, SAGE_CHECK_VS_OURS * ours), ours


def _reference_128(q, k, v, index, count, scale):
    """The float64 reference of a 128x128-block plan: each 128-row query block's list given to
    both of its 64-row halves (our reference's query blocks are 64 rows)."""
    import torch

    from subblock_sage.reference import reference_sparse_attention

    idx64 = index.repeat_interleave(2, dim=2)
    counts = torch.full(idx64.shape[:3], count, dtype=torch.int32, device=q.device)
    return reference_sparse_attention(q, k, v, idx64, counts, block_size_k=128, softmax_scale=scale)


def build_cudnn_bsa_bf16(kernel, q, k, v, index, counts, softmax_scale=None) -> Built:
    """cuDNN's SM90 bf16 kernel on the plan (BSHD, per-row counts), into buffers allocated once."""
    import torch

    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    try:
        kernel.check_bf16(q, k, v, index, counts, out)
    except ValueError as e:
        raise Unavailable(f"{CUDNN_BSA_BF16}: skipped at H={q.shape[2]} S={q.shape[1]}: {short(e)}") from None

    def call():
        return kernel.run_bf16(q, k, v, index, counts, scale, out=out, lse=lse)

    setup = _first_call(call, CUDNN_BSA_BF16, q.shape[2], q.shape[1])
    return Built(CUDNN_BSA_BF16, call, setup, "")


def build_cudnn_bsa_sage(kernel, q, k, v, index, count: int, block_k: int, softmax_scale=None) -> Built:
    """cuDNN's SM90 Sage FP8 path on a fixed-count plan: one timed call = its quantizer + its
    ``block_k``-key kernel, as ``block_sparse_attention_fp8_forward`` runs them. Its inputs are
    contiguous BHSD (the wrapper refuses other layouts): q, k, v transposed and copied once here,
    not timed (a BSHD caller would pay that copy; ours reads BSHD)."""
    import torch

    from .cudnn_sm90 import SageBuffers

    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    index = index.contiguous()
    try:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        kernel.check_sage(qh, kh, vh, index, count, block_k, sms)
    except ValueError as e:
        raise Unavailable(f"{CUDNN_BSA_SAGE} bk{block_k}: skipped at H={q.shape[2]} S={q.shape[1]}: "
                          f"{short(e)}") from None
    bufs = SageBuffers.like(qh, kh)

    def call():
        return kernel.run_sage(qh, kh, vh, index, count, scale, block_k, bufs, checked=True)

    setup = _first_call(call, f"{CUDNN_BSA_SAGE} bk{block_k}", q.shape[2], q.shape[1])
    return Built(f"{CUDNN_BSA_SAGE} bk{block_k}", call, setup, "BHSD copies of q, k, v made once, not timed")
