"""cuDNN frontend 1.32.0's SM90 block-sparse attention as bench contenders (H100/H200).

nvidia-cudnn-frontend's ``cudnn.block_sparse_attention`` JIT-compiles CuTe-DSL kernels at the first
call; the H200 has no room for the DSL, so the build compiles them ahead of time into the
never-shipped test library (``aot/kernels/cudnn_sm90.py``; ``SBS_TEST_LIBS=ON ./wheels/build.sh``
installs it under ``wheels/test-libs/<cpu>/test_libs/test_sm90a/``). This module launches them
through our C ABI with the arguments the public wrappers pass, built here the way the wrappers
build them (the same ``permute`` views; ``tests/cpu/test_cudnn_sm90_aot.py`` compares them with
the wrapper's own under a fake mode):

- :meth:`CudnnSM90.run_bf16` = ``block_sparse_attention_forward(q, k, v, index,
  q2k_block_nums=counts, sparse_block_size=64, allow_empty_block_nums=True, layout="bshd")``:
  BSHD bf16, per-row counts (a count of 0 writes zeros), kv_splits 1 (what the wrapper's heuristic
  picks on every bench shape: aot/kernels/cudnn_sm90.py). It writes LSE (float32 [B, H, Sq]) too,
  as the wrapper has it write.
- :meth:`CudnnSM90.run_sage` = ``block_sparse_attention_fp8_forward(q, k, v, index, count,
  sparse_block_size=64|128)``: two launches, both cuDNN's, both timed: its quantizer
  (``_quantize_sage_bhsd(..., v_layout="bhds")``: Q per token, K minus its per-head mean per 16
  keys, V per channel into BHDS) and the FP8 attention kernel; contiguous BHSD bf16 in, BHSD bf16
  out; one fixed count for every query block; S a multiple of the key block (full blocks only).

What differs from calling the wrappers: buffers (output, LSE, the quantizer's FP8 tensors, scales
and partial sums) are allocated once per shape (:class:`SageBuffers`), not per call, as for every
other contender of the bench; the wrappers' host-side checks run once, in :meth:`check_bf16` /
:meth:`check_sage`, not per launch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from subblock_sage.contract import BLOCK_SIZES_K, HEAD_DIM, Q_BLOCK, ceil_div

from . import test_library

BF16 = "cudnn_bsa_sm90_bf16"
SAGE = "cudnn_sage_sm90_fp8"
QUANT = "cudnn_sage_quant_sm90"
KERNELS = (BF16, SAGE, QUANT)
BLOCK = Q_BLOCK  # the bf16 kernel's query and key blocks: 64
SAGE_BLOCKS = BLOCK_SIZES_K  # the Sage kernels' key (and query) blocks: 64 or 128
NUM_SMS = 132  # the blk64 Sage kernel's persistent grid was compiled for it (aot/kernels/cudnn_sm90.py)
K_SCALE_ROWS = 16  # keys per K scale
QUANT_ROWS_PER_CHUNK = 64  # the quantizer's reduction chunk on SM90

load_failure = ""  # why the last load() returned None (one line)


def load(test_libs_dir: str | os.PathLike | None = None) -> CudnnSM90 | None:
    """The contenders from the test library in ``test_libs_dir`` (default: ``$SUBBLOCK_SAGE_TEST_LIBS``,
    then ``$SUBBLOCK_SAGE_TEST_LIB_DIR``: ``test_library.find``), or None with the reason in
    :data:`load_failure`."""
    global load_failure
    lib, load_failure = test_library.open_library("cuDNN's SM90 block-sparse kernels", KERNELS, test_libs_dir)
    return None if lib is None else CudnnSM90(lib)


def _bad(what: str, fix: str) -> ValueError:
    return ValueError(f"cuDNN SM90 contender: {what}. Fix: {fix}")


@dataclass
class SageBuffers:
    """What the Sage wrapper allocates per call, allocated once per (B, H, Sq, Sk): the
    quantizer's outputs and partial sums, the attention's output and LSE."""

    q_fp8: object
    k_fp8: object
    v_fp8: object  # BHDS
    q_scale: object
    k_scale: object
    v_scale: object
    k_mean_partial: object
    k_mean: object
    v_amax_partial: object
    out: object  # BHSD bf16
    lse: object

    @classmethod
    def like(cls, q, k) -> SageBuffers:
        """Buffers for BHSD ``q`` [B, H, Sq, 128] and ``k`` [B, H, Sk, 128] (as _quantize_sage_bhsd
        and _bsa_attn_fwd_sm90_fp8 shape them)."""
        import torch

        B, H, Sq, D = q.shape
        Sk = k.shape[2]
        f8, f32 = torch.float8_e4m3fn, torch.float32

        def new(*shape, dtype=f32):
            return torch.empty(shape, dtype=dtype, device=q.device)

        return cls(q_fp8=new(B, H, Sq, D, dtype=f8), k_fp8=new(B, H, Sk, D, dtype=f8),
                   v_fp8=new(B, H, D, Sk, dtype=f8), q_scale=new(B, H, Sq),
                   k_scale=new(B, H, ceil_div(Sk, K_SCALE_ROWS)), v_scale=new(H, D),
                   k_mean_partial=new(B * H, ceil_div(Sk, QUANT_ROWS_PER_CHUNK), D), k_mean=new(B * H, D),
                   v_amax_partial=new(H, ceil_div(B * Sk, QUANT_ROWS_PER_CHUNK), D),
                   out=new(B, H, Sq, D, dtype=torch.bfloat16), lse=new(B, H, Sq))


class CudnnSM90:
    """Launches cuDNN's SM90 block-sparse kernels from a loaded test library."""

    def __init__(self, library) -> None:
        self.library = library

    # ---- bf16, 64x64 blocks, per-row counts ----------------------------------------------------

    @staticmethod
    def bf16_values(q, k, v, q2k_block_index, block_counts, out, lse, softmax_scale) -> dict:
        """The C arguments of the bf16 kernel: the CuTe views _bsa_attn_fwd_sm90_blk64 builds from
        BSHD tensors (``layout="bshd"``: q.transpose(1, 2), then ``permute(2, 3, 1, 0)``)."""
        def qo(t):  # BSHD -> (S, D, H, B)
            return t.transpose(1, 2).permute(2, 3, 1, 0)

        return {"q": qo(q), "k": qo(k), "v": v.transpose(1, 2).permute(3, 2, 1, 0), "out": qo(out),
                "lse": lse.permute(2, 1, 0), "q2k_block_index": q2k_block_index.contiguous().permute(3, 2, 1, 0),
                "block_counts": block_counts.contiguous().permute(2, 1, 0), "softmax_scale": float(softmax_scale)}

    @staticmethod
    def check_bf16(q, k, v, q2k_block_index, block_counts, out=None) -> None:
        """What the wrapper and the export require, as one-line errors with a fix."""
        import torch

        test_library.check_bshd({"q": q, "k": k, "v": v, "out": out}, 128, _bad)
        B, Sq, H, _ = q.shape
        Sk = k.shape[1]
        if tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or k.shape[2] != H:
            raise _bad(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [B={B}, Sk, H={H}, 128]",
                       "the export has one query head per K/V head (no GQA)")
        if Sq % BLOCK or Sk % BLOCK:
            raise _bad(f"Sq = {Sq} and Sk = {Sk} must be multiples of 64 (cuDNN's SM90 forward requires "
                       "it of Sq; a ragged last key block needs its block_sizes variant, not exported)",
                       "time it on S a multiple of 64")
        if out is not None and tuple(out.shape) != tuple(q.shape):
            raise _bad(f"out {tuple(out.shape)} must have q's shape {tuple(q.shape)}", "pass out like q")
        gq = Sq // BLOCK
        for name, t, rank in (("q2k_block_index", q2k_block_index, 4), ("block_counts", block_counts, 3)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != rank \
                    or tuple(t.shape[:3]) != (B, H, gq):
                raise _bad(f"{name} must be int32 [{B}, {H}, {gq}{', cap' if rank == 4 else ''}], got "
                           f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}",
                           "pass the plan of 64-row query blocks")
        if q2k_block_index.shape[-1] < 1:
            raise _bad("q2k_block_index has capacity 0", "give every row at least one slot")
        if any(t.device != q.device for t in (k, v, q2k_block_index, block_counts)):
            raise _bad("all tensors must be on one device", "move them to q's device")

    def run_bf16(self, q, k, v, q2k_block_index, block_counts, softmax_scale, out=None, lse=None):
        """cuDNN's SM90 bf16 block-sparse forward on the current stream; returns ``out`` (BSHD)."""
        import torch

        from subblock_sage import abi

        self.check_bf16(q, k, v, q2k_block_index, block_counts, out)
        if out is None:
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if lse is None:
            lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
        abi.launch(BF16, {}, self.bf16_values(q, k, v, q2k_block_index, block_counts, out, lse, softmax_scale),
                   device=q.device, library=self.library)
        return out

    # ---- Sage FP8: cuDNN's quantizer, then its 64- or 128-key kernel ---------------------------

    @staticmethod
    def quant_values(q, k, v, bufs: SageBuffers) -> dict:
        """The quantizer's C arguments as _quantize_sage_bhsd passes them: every tensor flattened,
        the shape as scalars."""
        B, H, Sq, _ = q.shape
        Sk = k.shape[2]
        flat = {n: getattr(bufs, n).view(-1) for n in ("q_fp8", "k_fp8", "v_fp8", "q_scale", "k_scale", "v_scale",
                                                        "k_mean_partial", "k_mean", "v_amax_partial")}
        return {"q": q.view(-1), "k": k.view(-1), "v": v.view(-1), **flat, "batch_size": B, "num_heads": H,
                "seqlen_q": Sq, "seqlen_k": Sk, "num_k_chunks": ceil_div(Sk, QUANT_ROWS_PER_CHUNK),
                "num_v_chunks": ceil_div(B * Sk, QUANT_ROWS_PER_CHUNK), "seqlen_k_float": float(Sk)}

    @staticmethod
    def sage_values(bufs: SageBuffers, q2k_block_index, block_sparse_num: int, softmax_scale) -> dict:
        """The FP8 kernel's C arguments: the views _bsa_attn_fwd_sm90_fp8 builds (``permute(2, 3, 1,
        0)`` of BHSD Q/K, BHDS V and BHSD O; LSE and scales reversed; the plan as given)."""
        def r4(t):
            return t.permute(2, 3, 1, 0)

        return {"q": r4(bufs.q_fp8), "k": r4(bufs.k_fp8), "v": r4(bufs.v_fp8), "out": r4(bufs.out),
                "lse": bufs.lse.permute(2, 1, 0), "q2k_block_index": q2k_block_index.permute(3, 2, 1, 0),
                "block_sparse_num": int(block_sparse_num), "q_scale": bufs.q_scale.permute(2, 1, 0),
                "k_scale": bufs.k_scale.permute(2, 1, 0), "v_scale": bufs.v_scale.permute(1, 0),
                "softmax_scale": float(softmax_scale)}

    @staticmethod
    def check_sage(q, k, v, q2k_block_index, block_sparse_num, block_k: int, num_sms=None) -> None:
        """What block_sparse_attention_fp8_forward requires on SM90, plus the export's SM count."""
        import torch

        if block_k not in SAGE_BLOCKS:
            raise _bad(f"block_k {block_k} is not one of {SAGE_BLOCKS}", "use 64- or 128-key plans")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16 or t.dim() != 4 \
                    or t.shape[-1] != HEAD_DIM or not t.is_contiguous():
                raise _bad(f"{name} must be a contiguous bf16 [B, H, S, {HEAD_DIM}] tensor (BHSD), got "
                           f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}",
                           "pass x.transpose(1, 2).contiguous() of a BSHD tensor")
            if t.data_ptr() % 16:
                raise _bad(f"{name} is not 16-byte aligned", "pass a freshly allocated tensor")
        B, H, Sq, _ = q.shape
        Sk = k.shape[2]
        if tuple(k.shape) != (B, H, Sk, HEAD_DIM) or tuple(v.shape) != tuple(k.shape):
            raise _bad(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [B={B}, H={H}, Sk, 128]",
                       "the Sage kernels take one query head per K/V head")
        if Sq % block_k or Sk % block_k:
            raise _bad(f"Sq = {Sq} and Sk = {Sk} must be multiples of {block_k} (SM90 Sage FP8: full "
                       "blocks only)", f"time it on S a multiple of {block_k}")
        gq = Sq // block_k
        if not isinstance(q2k_block_index, torch.Tensor) or q2k_block_index.dtype != torch.int32 \
                or q2k_block_index.dim() != 4 or tuple(q2k_block_index.shape[:3]) != (B, H, gq) \
                or q2k_block_index.stride(-1) != 1:
            raise _bad(f"q2k_block_index must be int32 [{B}, {H}, {gq}, cap] with a unit last stride, got "
                       f"{getattr(q2k_block_index, 'dtype', '?')} {tuple(getattr(q2k_block_index, 'shape', ()))}",
                       f"pass the plan of {block_k}-row query blocks, .contiguous()")
        if not isinstance(block_sparse_num, int) or not 1 <= block_sparse_num <= q2k_block_index.shape[-1]:
            raise _bad(f"block_sparse_num {block_sparse_num!r} must be an int in [1, capacity "
                       f"{q2k_block_index.shape[-1]}] (SM90 Sage FP8 takes one fixed count)",
                       "pad the plan to a fixed count (benchmark/lab/contenders.py: fixed_count_plan)")
        if block_k == 64 and num_sms is not None and num_sms != NUM_SMS:
            raise _bad(f"this GPU has {num_sms} SMs; the blk64 Sage export's persistent grid was compiled "
                       f"for {NUM_SMS} (H100 SXM, H200)", "time it on an H100 SXM or an H200")

    def run_sage(self, q, k, v, q2k_block_index, block_sparse_num: int, softmax_scale, block_k: int,
                 bufs: SageBuffers | None = None, *, checked: bool = False):
        """cuDNN's Sage FP8 forward on the current stream: its quantizer, then its ``block_k``-key
        kernel. BHSD in, ``bufs.out`` (BHSD bf16) out. ``checked``: :meth:`check_sage` already ran
        for these arguments (the bench checks once per plan, not per timed call)."""
        import torch

        from subblock_sage import abi

        if not checked:
            num_sms = (torch.cuda.get_device_properties(q.device).multi_processor_count
                       if q.device.type == "cuda" else None)
            self.check_sage(q, k, v, q2k_block_index, block_sparse_num, block_k, num_sms)
        if bufs is None:
            bufs = SageBuffers.like(q, k)
        abi.launch(QUANT, {}, self.quant_values(q, k, v, bufs), device=q.device, library=self.library)
        abi.launch(SAGE, {"block_k": block_k}, self.sage_values(bufs, q2k_block_index, block_sparse_num,
                                                                softmax_scale),
                   device=q.device, library=self.library)
        return bufs.out
