"""Argument marshalling for the AOT-built FlashInfer block-sparse attention kernels (pure torch).

Given the user's tensors (BSHD or BHSD) and routing plan, produce, for one kernel launch, the
variant to launch and the exact tensor/scalar per kernel argument name (``Launch.values``, the
``values`` dict :func:`subblock_sage.marshal.launch` takes). Tensors are passed as permuted *views*
wherever the kernel's layout allows (it does for every Q/K/V/O here); the only copies are the plan
fixes below and, on SM100 with Sk not a multiple of 64, zero-padded K/V.

Kernels (see aot/kernels/flashinfer_sm120.py, flashinfer_sm100.py and NOTES-flashinfer.md):
  ``fi_sm120_sage_fwd``  sm_120a (and the sm_90a test library): pre-quantized INT8 Q/K, FP8 V (HDS)
  ``fi_sm120_bf16_fwd``  sm_120a (and the sm_90a test library): bf16 Q/K/V, writes an fp32 LSE
  ``fi_sm100_bf16_fwd``  sm_100a: bf16 Q/K/V

The routing plan contract: ``q2k_block_index`` int32 ``[B,H,ceil(Sq/64),cap]``; ``block_counts``
int32 ``[B,H,ceil(Sq/64)]`` or None (every row uses ``topk``). FlashInfer's own preprocessing
(``_prepare_sm120_sparse_metadata``: int32, ``.contiguous()``, ``(B,H,Q,K) -> (K,Q,H,B)``) is done
here, plus what FlashInfer leaves to its caller: nothing out of range may reach a kernel. The
public API hands in plans prepared by the ``plan_prepare`` kernel (``ops/plan.py``: counts clamped,
ids outside ``[0, ceil(Sk/64))`` and repeats dropped, 128-key blocks split into 64-key pairs), so
the backends always launch the per-row-counts variants; :func:`sanitize_plan` is the same repair
in PyTorch (the fallback, and the reference the plan kernel is tested against).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

BLOCK = 64
HEAD_DIM = 128
Q_SCALE_ROWS = 32  # SM120 Sage: one Q scale per 32 rows, 4 per 128-row group

SM120_SAGE = "fi_sm120_sage_fwd"
SM120_BF16 = "fi_sm120_bf16_fwd"
SM100_BF16 = "fi_sm100_bf16_fwd"

# Upstream sm100_blk64_requires_int64_kv_strides: the rank-6 Int32 TMA coordinate basis is unsafe
# once a block or batch stride reaches 2**27 elements or any stride leaves int32.
_SM100_COORD_STRIDE_LIMIT = 1 << 27
_INT32_MAX = 2**31 - 1


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


@dataclass
class Launch:
    """One kernel launch: ``values`` maps every non-stream argument name to its tensor/scalar.

    ``zero_output``: nothing to compute (every row selects zero blocks); ``out`` was zero-filled
    and the launch must be skipped. ``scratch`` keeps temporaries alive until after the launch.
    """

    kernel: str
    variant: str
    values: dict[str, Any]
    out: torch.Tensor
    zero_output: bool = False
    scratch: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Layouts


def bhsd_view(x: torch.Tensor, layout: str, name: str = "tensor") -> torch.Tensor:
    """A ``[B, H, S, D]`` view of a ``layout`` tensor (no copy)."""
    if x.dim() != 4:
        raise ValueError(f"{name} must be rank 4 ({layout}), got shape {tuple(x.shape)}")
    if layout == "BSHD":
        return x.transpose(1, 2)
    if layout == "BHSD":
        return x
    raise ValueError(f"layout must be 'BSHD' or 'BHSD', got {layout!r}")


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _as_head_contiguous(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous head dimension (stride(-1) == 1)")
    return x


# ---------------------------------------------------------------------------------------------
# Routing plan


@dataclass
class Plan:
    """A routing plan ready for the kernels: int32, last dim contiguous, in range."""

    index: torch.Tensor  # [B, H, Gq, cap]
    counts: Optional[torch.Tensor]  # [B, H, Gq] or None (then every row uses topk)
    topk: int  # used when counts is None
    num_k_blocks: int

    @property
    def capacity(self) -> int:
        return int(self.index.shape[-1])

    @property
    def empty(self) -> bool:
        return self.counts is None and self.topk == 0


def _row_mask(index: torch.Tensor, counts: Optional[torch.Tensor], topk: int) -> torch.Tensor:
    pos = torch.arange(index.shape[-1], device=index.device, dtype=torch.int32)
    if counts is None:
        return (pos < topk).expand(index.shape)
    return pos < counts.unsqueeze(-1)


def sanitize_plan(index: torch.Tensor, counts: Optional[torch.Tensor], topk: int,
                  num_k_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Device-only (no host sync, graph-capturable) plan repair to the routing-plan contract:
    counts clamped to [0, cap]; among each row's first ``count`` entries, ids outside
    [0, num_k_blocks) and repeats of an earlier id are dropped (the FlashInfer kernels would read
    out of bounds / count a block twice); the survivors are compacted to the front in their order.
    Returns (index [B,H,Gq,cap] contiguous int32, counts [B,H,Gq] int32)."""
    cap = index.shape[-1]
    dev = index.device
    if counts is None:
        cnt = torch.full(index.shape[:3], int(topk), dtype=torch.int32, device=dev)
    else:
        cnt = counts.clamp(0, cap)
    valid = _row_mask(index, cnt, 0) & (index >= 0) & (index < num_k_blocks)
    key = torch.where(valid, index, num_k_blocks).long()  # invalid -> a spare bucket
    pos = torch.arange(cap, dtype=torch.int32, device=dev).expand(index.shape).contiguous()
    first = torch.full((*index.shape[:3], num_k_blocks + 1), cap, dtype=torch.int32, device=dev)
    first.scatter_reduce_(-1, key, pos, reduce="amin")
    valid &= first.gather(-1, key) == pos  # first occurrence of its id in the row
    new_counts = valid.sum(-1, dtype=torch.int32)
    dest = torch.cumsum(valid, -1, dtype=torch.int64) - 1
    dest = torch.where(valid, dest, cap)  # dropped entries -> a dump column
    out = torch.zeros((*index.shape[:3], cap + 1), dtype=torch.int32, device=dev)
    out.scatter_(-1, dest, index)
    return out[..., :cap].contiguous(), new_counts


def _sm120_block_sizes(block_sizes: Optional[torch.Tensor], B: int, H: int, Gk: int):
    """(mode, kernel view) of optional per-key-block valid-token counts (FlashInfer semantics)."""
    if block_sizes is None:
        return 0, None
    if block_sizes.dtype != torch.int32:
        raise TypeError(f"block_sizes must be int32, got {block_sizes.dtype}")
    shapes = {1: (Gk,), 2: (B, Gk), 3: (B, H, Gk)}
    mode = block_sizes.dim()
    if mode not in shapes or tuple(block_sizes.shape) != shapes[mode]:
        raise ValueError(
            f"block_sizes must have shape [{Gk}], [{B}, {Gk}] or [{B}, {H}, {Gk}], "
            f"got {tuple(block_sizes.shape)}"
        )
    bs = _last_contiguous(block_sizes)
    return mode, bs.permute(*reversed(range(mode)))


def _sm120_plan_values(plan: Plan, block_sizes, B, H) -> tuple[str, dict[str, Any]]:
    # FlashInfer _prepare_sm120_sparse_metadata: (B, H, Q, K) -> (K, Q, H, B); counts (Q, H, B).
    values: dict[str, Any] = {"q2k_block_index": plan.index.permute(3, 2, 1, 0)}
    if plan.counts is not None:
        values["block_counts"] = plan.counts.permute(2, 1, 0)
    values["block_sparse_num"] = int(plan.topk)
    mode, bs = _sm120_block_sizes(block_sizes, B, H, plan.num_k_blocks)
    if bs is not None:
        values["block_sizes"] = bs
    variant = f"{'rows' if plan.counts is not None else 'topk'}_bs{mode}"
    return variant, values


def _scale(softmax_scale: Optional[float]) -> float:
    if softmax_scale is None:
        return HEAD_DIM**-0.5
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError("softmax_scale must be a number")
    s = float(softmax_scale)
    if not math.isfinite(s) or s <= 0.0:
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")
    return s


def _check_dims(name, x, B, H, S, D=HEAD_DIM):
    if tuple(x.shape) != (B, H, S, D):
        raise ValueError(f"{name} must have (B, H, S, D) = {(B, H, S, D)}, got {tuple(x.shape)}")


# ---------------------------------------------------------------------------------------------
# SM120 (and the sm_90a test build of the same classes)


def sm120_sage_launch(q_int8: torch.Tensor, k_int8: torch.Tensor, v_fp8: torch.Tensor,
                      q_scale: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
                      plan: Plan, out_bhsd: torch.Tensor, out: torch.Tensor, *,
                      softmax_scale: Optional[float] = None,
                      block_sizes: Optional[torch.Tensor] = None) -> Launch:
    """``fi_sm120_sage_fwd`` arguments from the Sage quantizer's outputs.

    ``q_int8``/``k_int8``: ``[B,H,S,128]`` int8 views with a contiguous head dim (BHSD or BSHD
    memory); ``v_fp8``: HDS ``[B,H,128,round_up(Sk,64)]`` float8_e4m3fn, key axis contiguous, pad
    keys zero, FlashInfer's 16-token row permutation applied; ``q_scale [B,H,ceil(Sq/128)*4]``,
    ``k_scale [B,H,ceil(Sk/64)]``, ``v_scale [B,H,128]`` float32; ``out_bhsd`` a bf16 ``[B,H,Sq,128]``
    view of ``out``.
    """
    B, H, Sq, _ = q_int8.shape
    Sk = k_int8.shape[2]
    Gk = ceil_div(Sk, BLOCK)
    _check_dims("q_int8", q_int8, B, H, Sq)
    _check_dims("k_int8", k_int8, B, H, Sk)
    _check_dims("v_fp8", v_fp8, B, H, HEAD_DIM, Gk * BLOCK)
    _check_dims("out", out_bhsd, B, H, Sq)
    for name, t, g in (("q_scale", q_scale, ceil_div(Sq, 128) * 4), ("k_scale", k_scale, Gk),
                       ("v_scale", v_scale, HEAD_DIM)):
        if t.dtype != torch.float32 or tuple(t.shape) != (B, H, g):
            raise ValueError(f"{name} must be float32 [{B}, {H}, {g}], got {t.dtype} {tuple(t.shape)}")
    if plan.num_k_blocks != Gk:
        raise ValueError("plan was checked against a different Sk")
    variant, values = _sm120_plan_values(plan, block_sizes, B, H)
    values = {
        "q": _as_head_contiguous(q_int8, "q_int8").permute(2, 3, 1, 0),
        "k": _as_head_contiguous(k_int8, "k_int8").permute(2, 3, 1, 0),
        "v": _as_head_contiguous(v_fp8, "v_fp8").permute(2, 3, 1, 0),
        "out": _as_head_contiguous(out_bhsd, "out").permute(2, 3, 1, 0),
        "q_scale": _last_contiguous(q_scale).permute(2, 1, 0),
        "k_scale": _last_contiguous(k_scale).permute(2, 1, 0),
        "v_scale": _last_contiguous(v_scale).permute(2, 1, 0),
        **values,
        "softmax_scale": _scale(softmax_scale),
    }
    return _finish(Launch(SM120_SAGE, variant, values, out), plan)


def sm120_bf16_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan,
                      out_bhsd: torch.Tensor, out: torch.Tensor, *,
                      softmax_scale: Optional[float] = None,
                      block_sizes: Optional[torch.Tensor] = None,
                      lse: Optional[torch.Tensor] = None) -> Launch:
    """``fi_sm120_bf16_fwd`` arguments; ``q``/``k``/``v``/``out_bhsd``: bf16 ``[B,H,S,128]`` views
    with a contiguous head dim. ``lse``: optional float32 ``[B,H,Sq]`` (the kernel always writes
    one; a scratch buffer is allocated when omitted)."""
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    for name, t, s in (("q", q, Sq), ("k", k, Sk), ("v", v, Sk), ("out", out_bhsd, Sq)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
        _check_dims(name, t, B, H, s)
        _as_head_contiguous(t, name)
    if plan.num_k_blocks != ceil_div(Sk, BLOCK):
        raise ValueError("plan was checked against a different Sk")
    if lse is None:
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    elif lse.dtype != torch.float32 or tuple(lse.shape) != (B, H, Sq) or lse.stride(-1) != 1:
        raise ValueError(f"lse must be float32 [{B}, {H}, {Sq}] with a contiguous last dim")
    variant, values = _sm120_plan_values(plan, block_sizes, B, H)
    values = {
        "q": q.permute(2, 3, 1, 0),  # (Sq, D, H, B)
        "k": k.permute(2, 3, 1, 0),  # (Sk, D, H, B)
        "v": v.permute(3, 2, 1, 0),  # (D, Sk, H, B)
        "out": out_bhsd.permute(2, 3, 1, 0),
        "lse": lse.permute(2, 1, 0),  # (Sq, H, B)
        **values,
        "softmax_scale": _scale(softmax_scale),
    }
    return _finish(Launch(SM120_BF16, variant, values, out, scratch=[lse]), plan)


# ---------------------------------------------------------------------------------------------
# SM100


def sm100_requires_int64_kv_strides(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Upstream ``sm100_blk64_requires_int64_kv_strides`` on ``[B,H,Sk,D]`` views."""
    for t in (k, v):
        batch, heads, seqlen_k, _ = t.shape
        sb, sh, ss, sd = (int(s) for s in t.stride())
        nblk = ceil_div(seqlen_k, BLOCK)
        rank6_stride = (ss, sd, 64 * sd, sh, 64 * ss, sb)
        if any(s < 0 or s > _INT32_MAX for s in rank6_stride):
            return True
        if nblk > 1 and rank6_stride[4] >= _SM100_COORD_STRIDE_LIMIT:
            return True
        if batch > 1 and rank6_stride[5] >= _SM100_COORD_STRIDE_LIMIT:
            return True
    return False


def sm100_use_clc(B: int, H: int, Sq: int, topk: int, per_row_counts: bool) -> bool:
    """Upstream ``choose_sm100_blk64_use_clc`` (the scheduler heuristic)."""
    if per_row_counts:
        return True
    num_m_blocks = ceil_div(Sq, BLOCK)
    total_tiles = B * H * num_m_blocks
    if total_tiles >= 8192 and topk >= 256:
        return True
    if H == 1:
        return False
    enough_tiles = num_m_blocks >= 128 and total_tiles >= 512
    light_tile = topk <= (64 if H == 2 else 128)
    return enough_tiles and light_tile


def sm100_block_sizes(seqlen_k: int, device: torch.device) -> torch.Tensor:
    """``[ceil(Sk/64)]`` int32: 64 everywhere but the partial last block (graph-capturable)."""
    Gk = ceil_div(seqlen_k, BLOCK)
    bs = torch.full((Gk,), BLOCK, dtype=torch.int32, device=device)
    last = seqlen_k - (Gk - 1) * BLOCK
    if last != BLOCK:
        bs[Gk - 1 :].fill_(last)
    return bs


def _pad_keys(x: torch.Tensor, rows: int) -> torch.Tensor:
    B, H, S, D = x.shape
    padded = torch.zeros((B, H, rows, D), dtype=x.dtype, device=x.device)
    padded[:, :, :S].copy_(x)
    return padded


def sm100_bf16_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan,
                      out_bhsd: torch.Tensor, out: torch.Tensor, *,
                      softmax_scale: Optional[float] = None,
                      lse: Optional[torch.Tensor] = None,
                      use_clc: Optional[bool] = None,
                      unaligned_keys: str = "pad") -> Launch:
    """``fi_sm100_bf16_fwd`` arguments; bf16 ``[B,H,S,128]`` views with a contiguous head dim and
    every other stride a multiple of 8 elements.

    Sk not a multiple of 64: the kernel's fast (Int32) K/V views read whole 64-key blocks and it
    masks keys only through ``block_sizes``. ``unaligned_keys="pad"`` copies K/V into zero-padded
    ``[B,H,round_up(Sk,64),128]`` buffers (the upstream-tested view); ``"int64"`` keeps them in place
    and selects the Int64 (bounds-checked rank-5 TMA) variant instead. Either way the last block's
    valid-token count goes in through ``block_sizes``.
    """
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    Gk = ceil_div(Sk, BLOCK)
    for name, t, s in (("q", q, Sq), ("k", k, Sk), ("v", v, Sk), ("out", out_bhsd, Sq)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
        _check_dims(name, t, B, H, s)
        _as_head_contiguous(t, name)
    if plan.num_k_blocks != Gk:
        raise ValueError("plan was checked against a different Sk")
    if lse is None:
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    elif lse.dtype != torch.float32 or tuple(lse.shape) != (B, H, Sq) or lse.stride(-1) != 1:
        raise ValueError(f"lse must be float32 [{B}, {H}, {Sq}] with a contiguous last dim")
    scratch: list = [lse]
    unaligned = Sk % BLOCK != 0
    if unaligned and unaligned_keys == "pad":
        k, v = _pad_keys(k, Gk * BLOCK), _pad_keys(v, Gk * BLOCK)
        scratch += [k, v]
    elif unaligned and unaligned_keys != "int64":
        raise ValueError(f"unaligned_keys must be 'pad' or 'int64', got {unaligned_keys!r}")
    i64 = sm100_requires_int64_kv_strides(k, v) or (unaligned and unaligned_keys == "int64")
    rows = plan.counts is not None
    # Upstream forces block sizes with per-row counts; we also need them for a partial last block.
    has_bs = rows or unaligned
    clc = True if rows else (sm100_use_clc(B, H, Sq, plan.topk, False) if use_clc is None else use_clc)
    variant = (f"{'clc' if clc else 'static'}_{'rows' if rows else 'topk'}_"
               f"{'bs' if has_bs else 'nobs'}_{'i64' if i64 else 'i32'}")
    values: dict[str, Any] = {
        "q": q, "k": k, "v": v, "out": out_bhsd, "lse": lse,
        "softmax_scale": _scale(softmax_scale),
        "q2k_block_index": plan.index,
    }
    if has_bs:
        values["block_sizes"] = sm100_block_sizes(Sk, q.device)
        scratch.append(values["block_sizes"])
    values["block_sparse_num"] = int(plan.topk)
    if rows:
        values["block_counts"] = plan.counts
    return _finish(Launch(SM100_BF16, variant, values, out, scratch=scratch), plan)


def _finish(launch: Launch, plan: Plan) -> Launch:
    if plan.empty:
        launch.out.zero_()
        launch.zero_output = True
    return launch


# ---------------------------------------------------------------------------------------------
# Backends for ops.attention.sparse_attention: ``prepare(qc, kc, vc, mode)`` enqueues the input
# conversion (Sage quantizer) and returns its operands; ``run(lib, qc, kc, vc, plan, scale, mode,
# out_c, operands)`` with canonical (B, S, H, 128) views and an ops.plan.PreparedPlan calls
# ``plan.verify()`` right before its attention launch.


def plan_from_prepared(pplan) -> Plan:
    """The FlashInfer :class:`Plan` of an ``ops.plan.PreparedPlan`` already in 64-key blocks
    (``plan_block_size_k`` below asks for that: 128-key plans arrive split into block pairs)."""
    if pplan.block_size_k != BLOCK:
        raise ValueError(f"the FlashInfer classes take 64-key-block plans, got {pplan.block_size_k}")
    return Plan(pplan.index, pplan.counts, 0, pplan.num_key_blocks)


class _Backend:
    modes: tuple[str, ...] = ()
    block_sizes_k = (64, 128)

    def plan_block_size_k(self, block_size_k: int) -> int:
        return BLOCK  # 128-key plans are split into 64-key block pairs by the plan kernel

    def prepare(self, qc, kc, vc, compute_mode: str):
        """Enqueue the Sage quantizer (nothing for bf16); its output feeds ``run``."""
        if compute_mode != "sage_fp8":
            return None
        from .quantize import quantize_canonical

        return quantize_canonical(qc, kc, vc)

    def prepared(self, lib, L: Launch):
        """``L`` checked and packed now; the returned function launches it (after the plan's
        verify, so that only the launch itself follows that wait)."""
        from .. import marshal

        if L.zero_output:
            return lambda: None
        return marshal.prepare(L.kernel, L.variant, L.values, library=lib)


class SM120Backend(_Backend):
    """FlashInfer SM120 classes (sm_120a library, or the sm_90a test library)."""

    modes = ("sage_fp8", "bf16")

    def run(self, lib, qc, kc, vc, plan, scale, compute_mode, out_c, operands=None) -> None:
        fplan = plan_from_prepared(plan)
        out_bhsd = out_c.permute(0, 2, 1, 3)
        if compute_mode == "sage_fp8":
            z = operands if operands is not None else self.prepare(qc, kc, vc, compute_mode)
            L = sm120_sage_launch(z["q_int8"], z["k_int8"], z["v_fp8"], z["q_scale"],
                                  z["k_scale"], z["v_scale"], fplan, out_bhsd, out_c,
                                  softmax_scale=scale)
            L.scratch.append(z)
        elif compute_mode == "bf16":
            q, k, v = (t.permute(0, 2, 1, 3) for t in (qc, kc, vc))
            L = sm120_bf16_launch(q, k, v, fplan, out_bhsd, out_c, softmax_scale=scale)
        else:
            raise ValueError(f"compute_mode must be 'sage_fp8' or 'bf16', got {compute_mode!r}")
        go = self.prepared(lib, L)
        plan.verify()  # after the quantizer and plan launches, before the attention launch
        go()


class SM100Backend(_Backend):
    """FlashInfer SM100 blk64 bf16 class (sm_100a library)."""

    modes = ("bf16",)

    def run(self, lib, qc, kc, vc, plan, scale, compute_mode, out_c, operands=None) -> None:
        if compute_mode != "bf16":
            raise ValueError(f"compute_mode={compute_mode!r} is not available on sm_100a; use 'bf16'")
        fplan = plan_from_prepared(plan)
        q, k, v = (t.permute(0, 2, 1, 3) for t in (qc, kc, vc))
        L = sm100_bf16_launch(q, k, v, fplan, out_c.permute(0, 2, 1, 3), out_c,
                              softmax_scale=scale)
        go = self.prepared(lib, L)
        plan.verify()  # before the attention launch
        go()


SM120_BACKEND = SM120Backend()
SM100_BACKEND = SM100Backend()
