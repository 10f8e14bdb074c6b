"""sm_100a / sm_100f backend: FlashInfer's SM100 blk64 bf16 class (``bf16``) and cuDNN frontend's
SM100 Sage FP8 forward with its quantizer (``sage_fp8``, UNVALIDATED: opt-in), AOT-built
(``aot/kernels/flashinfer_sm100.py``, docs/design/kernels-flashinfer.md;
``aot/kernels/cudnn_sm100.py``, docs/design/sage-sm100.md).

bf16: tensors go in as ``[B,H,S,128]`` views; the only copies are zero-padded K/V when Sk is not a
multiple of 64 (see :func:`sm100_bf16_launch`). The scheduler choice and the Int64 stride rule
are upstream's, restated here because the variant is chosen at run time.

sage_fp8: cuDNN's kernel takes one fixed count per launch, full 64-key blocks (Sq and Sk multiples
of 64) and the E4M3 operands of cuDNN's own quantizer (contiguous BHSD); :func:`sage_refusal`
states which plans map exactly, :func:`sage_launches` how they run.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import abi, unvalidated
from ..contract import ATTENTION_QUANTIZERS, BF16, HEAD_DIM, Q_BLOCK, SAGE_FP8, UNVALIDATED, ceil_div, family_kernels
from .base import Backend, Launch

FAMILY = "sm100"  # contract.Target.family of the targets served
KERNELS = family_kernels(FAMILY)  # compute mode -> kernel (contract.ATTENTION)

BLOCK = Q_BLOCK  # FlashInfer's sparse tiles: 64 query rows by 64 keys (128-key plans arrive as 64-key pairs)
# Upstream sm100_blk64_requires_int64_kv_strides: the rank-6 Int32 TMA coordinate basis is unsafe
# once a block or batch stride reaches 2**27 elements or any stride leaves int32.
_SM100_COORD_STRIDE_LIMIT = 1 << 27
_INT32_MAX = 2**31 - 1


def sm100_requires_int64_kv_strides(k, v) -> bool:
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


def sm100_block_sizes(seqlen_k: int, device):
    """``[ceil(Sk/64)]`` int32: 64 everywhere but the partial last block (graph-capturable)."""
    import torch

    Gk = ceil_div(seqlen_k, BLOCK)
    bs = torch.full((Gk,), BLOCK, dtype=torch.int32, device=device)
    last = seqlen_k - (Gk - 1) * BLOCK
    if last != BLOCK:
        bs[Gk - 1 :].fill_(last)
    return bs


def _pad_keys(x, rows: int):
    import torch

    B, H, S, D = x.shape
    padded = torch.zeros((B, H, rows, D), dtype=x.dtype, device=x.device)
    padded[:, :, :S].copy_(x)
    return padded


def sm100_bf16_launch(q, k, v, plan, out_bhsd, out, *, softmax_scale: float = HEAD_DIM**-0.5,
                      lse: Optional[Any] = None, use_clc: Optional[bool] = None,
                      unaligned_keys: str = "pad") -> Launch:
    """``fi_sm100_bf16_fwd`` arguments; bf16 ``[B,H,S,128]`` views with a contiguous head dim and
    every other stride a multiple of 8 elements.

    Sk not a multiple of 64: the kernel's fast (Int32) K/V views read whole 64-key blocks and it
    masks keys only through ``block_sizes``. ``unaligned_keys="pad"`` copies K/V into zero-padded
    ``[B,H,round_up(Sk,64),128]`` buffers (the upstream-tested view); ``"int64"`` keeps them in place
    and selects the Int64 (bounds-checked rank-5 TMA) variant instead. Either way the last block's
    valid-token count goes in through ``block_sizes``.
    """
    import torch

    if unaligned_keys not in ("pad", "int64"):
        raise ValueError(f"unaligned_keys must be 'pad' or 'int64', got {unaligned_keys!r}")
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    Gk = ceil_div(Sk, BLOCK)
    if lse is None:
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    scratch: list = [lse]
    unaligned = Sk % BLOCK != 0
    if unaligned and unaligned_keys == "pad":
        k, v = _pad_keys(k, Gk * BLOCK), _pad_keys(v, Gk * BLOCK)
        scratch += [k, v]
    i64 = sm100_requires_int64_kv_strides(k, v) or (unaligned and unaligned_keys == "int64")
    rows = plan.counts is not None
    # Upstream forces block sizes with per-row counts; we also need them for a partial last block.
    has_bs = rows or unaligned
    clc = True if rows else (sm100_use_clc(B, H, Sq, plan.topk, False) if use_clc is None else use_clc)
    params = {"use_clc_scheduler": clc, "has_block_nums": rows, "allow_empty_block_nums": rows,
              "has_block_sizes": has_bs, "use_int64_kv_strides": i64}
    values: dict[str, Any] = {
        "q": q, "k": k, "v": v, "out": out_bhsd, "lse": lse,
        "softmax_scale": float(softmax_scale),
        "q2k_block_index": plan.index,
    }
    if has_bs:
        values["block_sizes"] = sm100_block_sizes(Sk, q.device)
        scratch.append(values["block_sizes"])
    values["block_sparse_num"] = int(plan.topk)
    if rows:
        values["block_counts"] = plan.counts
    return Launch(KERNELS[BF16.name], params, values, out, scratch=scratch).finish(plan)


# --- sage_fp8: cuDNN frontend's SM100 Sage FP8 forward (aot/kernels/cudnn_sm100.py) -----------

SAGE_KERNEL = KERNELS[SAGE_FP8.name]
SAGE_QUANT = ATTENTION_QUANTIZERS[SAGE_KERNEL]
SAGE_QUANT_PARAMS = {"v_layout": "bhsd"}
K_SCALE_ROWS = 16  # cuDNN's K scale group (_SageFp8Quantizer.K_BLOCK_ROWS)
QUANT_ROWS_PER_CHUNK = 256  # its K-mean / V-amax chunk on SM100 (_SageFp8Quantizer.ROWS_PER_CHUNK)
_WHERE = "compute_mode='sage_fp8' on B200/B300 (cuDNN frontend's SM100 Sage FP8 kernel)"


def sage_refusal(args) -> str:
    """'' when cuDNN's kernel runs ``args`` (a checked ``AttentionArgs``) with exactly the plan's
    semantics, else the reason with its Fix. Host values only (shapes, ``topk``, whether counts
    were given), never a GPU read.

    The kernel reads one count for every row of a launch, whole 64-key blocks, and masks no key
    past Sk (``bsa_attn_fwd_blk64_cutedsl``: Sq, Sk multiples of 64, no per-row counts, no block
    sizes for FP8). So: a caller's ``topk`` plan (``block_counts=None``) or a routed plan whose rows
    all hold ``topk`` blocks (``subblock_attention``'s) maps; per-row counts (``route(...,
    dense_rows=...)``'s plan passed on with its counts, SGLang's heterogeneous plans) and Sq / Sk
    off the 64-key grid (a 128-key plan: off the 128-key grid, whose last block would lose its
    second half) do not: padding them would change which keys are attended."""
    spec = args.spec
    B, Sq, H, _ = args.q.shape
    Sk = args.k.shape[1]
    grid = max(BLOCK, spec.block_size_k)
    if Sq % BLOCK or Sk % grid:
        return (f"{_WHERE} takes whole blocks only: Sq a multiple of {BLOCK} and Sk of {grid} "
                f"(block_size_k={spec.block_size_k}), got Sq={Sq}, Sk={Sk}; it masks no key past Sk. "
                f"Fix: use compute_mode='bf16' for this shape (any Sq, Sk), or lengths on that grid")
    if args.plan is None and spec.capacity != spec.topk:  # a routed plan whose rows may hold more
        return (f"{_WHERE} takes one count per launch, and this routed plan's rows hold up to "
                f"{spec.capacity} or {spec.topk} blocks, known only on the GPU. Fix: route without dense "
                f"rows, or use compute_mode='bf16'")
    if args.plan is not None and spec.counts_given:
        return (f"{_WHERE} takes one count per launch, not per-row block_counts. Fix: pass "
                f"block_counts=None and topk=<the count> when every row holds the same number of "
                f"blocks, or use compute_mode='bf16' (per-row counts)")
    return ""


def cudnn_sage_buffers(B: int, H: int, Sq: int, Sk: int, device) -> dict:
    """The quantizer's outputs and workspaces, shaped as ``_quantize_sage_bhsd`` allocates them
    on SM100: E4M3 Q/K/V ``[B,H,S,128]`` (V stays BHSD), per-token ``q_scale [B,H,Sq]``, per-16-key
    ``k_scale [B,H,ceil(Sk/16)]`` of K minus its per-head mean, per-channel ``v_scale [H,128]``
    (one amax over the whole batch), and the chunk partials (256-row chunks)."""
    import torch

    f32 = {"dtype": torch.float32, "device": device}
    e4m3 = {"dtype": torch.float8_e4m3fn, "device": device}
    nkc, nvc = ceil_div(Sk, QUANT_ROWS_PER_CHUNK), ceil_div(B * Sk, QUANT_ROWS_PER_CHUNK)
    return {
        "q_fp8": torch.empty((B, H, Sq, HEAD_DIM), **e4m3),
        "k_fp8": torch.empty((B, H, Sk, HEAD_DIM), **e4m3),
        "v_fp8": torch.empty((B, H, Sk, HEAD_DIM), **e4m3),
        "q_scale": torch.empty((B, H, Sq), **f32),
        "k_scale": torch.empty((B, H, ceil_div(Sk, K_SCALE_ROWS)), **f32),
        "v_scale": torch.empty((H, HEAD_DIM), **f32),
        "k_mean_partial": torch.empty((B * H, nkc, HEAD_DIM), **f32),
        "k_mean": torch.empty((B * H, HEAD_DIM), **f32),
        "v_amax_partial": torch.empty((H, nvc, HEAD_DIM), **f32),
    }


def cudnn_quant_values(q, k, v, bufs: dict) -> dict:
    """``cudnn_sage_quant_sm100``'s C arguments (C order) for contiguous bf16 BHSD ``q, k, v``:
    every tensor flattened, the sizes as scalars, as the wrapper passes them."""
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    values = {"q": q.view(-1), "k": k.view(-1), "v": v.view(-1)}
    values.update({n: t.view(-1) for n, t in bufs.items()})
    values.update(batch_size=B, num_heads=H, seqlen_q=Sq, seqlen_k=Sk,
                  num_k_chunks=ceil_div(Sk, QUANT_ROWS_PER_CHUNK),
                  num_v_chunks=ceil_div(B * Sk, QUANT_ROWS_PER_CHUNK), seqlen_k_float=float(Sk))
    return values


def cudnn_sage_values(bufs: dict, index, count: int, softmax_scale: float, out_bhsd, lse) -> dict:
    """``cudnn_sage_sm100_fp8``'s C arguments (C order): the quantized operands as the wrapper
    hands them to ``bsa_attn_fwd_blk64_cutedsl`` (q/k/v ``[B,H,S,128]``, scales reshaped
    ``[B,H,-1]`` and ``[H,128]``), ``out`` ``[B,H,Sq,128]``, fp32 ``lse [B,H,Sq]``, the index and
    the fixed count."""
    B, H = bufs["q_scale"].shape[:2]
    return {
        "q": bufs["q_fp8"], "k": bufs["k_fp8"], "v": bufs["v_fp8"], "out": out_bhsd, "lse": lse,
        "q_scale": bufs["q_scale"].reshape(B, H, -1), "k_scale": bufs["k_scale"].reshape(B, H, -1),
        "v_scale": bufs["v_scale"].reshape(H, HEAD_DIM), "softmax_scale": float(softmax_scale),
        "q2k_block_index": index, "block_sparse_num": int(count),
    }


def sage_short_tile(capacity: int, seqlen_k: int) -> bool:
    """Upstream's ``short_tile_opt``: the index's capacity is under 90 % of the key blocks."""
    return capacity * 10 < ceil_div(seqlen_k, BLOCK) * 9


def _batches(bufs: dict) -> bool:
    """Whether the wrapper's rank-6 Int32 K/V rule (:func:`sm100_requires_int64_kv_strides`, the
    variant the wrapper would pick is not built) refuses the whole tensors but not one batch
    element: then one launch per batch element. Q takes the same rank-6 view, so it is judged by
    the same rule. A stride past int32 even for one element raises (Sk or Sq past 16M tokens)."""
    ops = (bufs["k_fp8"], bufs["v_fp8"], bufs["q_fp8"])
    if not any(sm100_requires_int64_kv_strides(t, t) for t in ops):
        return False
    if any(sm100_requires_int64_kv_strides(t[:1], t[:1]) for t in ops):
        raise ValueError(f"{_WHERE}: one head's sequence ({bufs['k_fp8'].shape[2]} keys, "
                         f"{bufs['q_fp8'].shape[2]} queries) exceeds the kernel's 32-bit TMA coordinates. "
                         f"Fix: use compute_mode='bf16' for this length")
    return True


def sage_launches(args, plan, bufs: dict, out_c) -> tuple[list[Launch], Optional[Any]]:
    """The attention launches of a Sage call that :func:`sage_refusal` accepted, and what runs
    after them on the stream (a function, or None).

    One launch with the fixed count ``topk`` (in 64-key blocks: a 128-key plan counts 2 x topk),
    reading the prepared index (every id valid: no input reads out of bounds); one per batch
    element where :func:`_batches` says so. The kernel writes a contiguous ``[B,H,Sq,128]`` output,
    as the wrapper allocates it: the caller's ``out`` itself when its BHSD view is contiguous, else
    a temporary copied into it afterwards (one read and one write of the output, 512 bytes a row
    and head).

    A caller's plan whose first ``topk`` entries of a row hold an out-of-range or repeated id has
    fewer blocks in that row once prepared, which one count cannot express: those rows'
    ``prepared counts != count`` ([B, H, Gq], on the GPU, no host read) and their output rows are
    written NaN by the step after the launch (the contract's repair is impossible here;
    ``check_plan=True`` raises on out-of-range ids before the launch). A routed plan's rows hold
    ``topk`` valid distinct ids by construction: nothing to poison."""
    import torch

    spec = args.spec
    count = spec.topk * (spec.block_size_k // BLOCK)
    out_bhsd = out_c.permute(0, 2, 1, 3)
    if spec.empty or count == 0:
        out_c.zero_()
        return [Launch(SAGE_KERNEL, {}, {}, out_c, zero_output=True)], None
    B, H, Sq, _ = bufs["q_fp8"].shape
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=out_c.device)
    direct = out_bhsd.is_contiguous()
    target = out_bhsd if direct else torch.empty((B, H, Sq, HEAD_DIM), dtype=out_c.dtype, device=out_c.device)
    values = cudnn_sage_values(bufs, plan.index, count, args.scale, target, lse)
    params = {"use_clc_scheduler": False, "short_tile_opt": sage_short_tile(plan.capacity, plan.seqlen_k)}
    if _batches(bufs):
        per = [{n: (t[b:b + 1] if hasattr(t, "dim") and n != "v_scale" else t) for n, t in values.items()}
               for b in range(B)]
    else:
        per = [values]
    launches = [Launch(SAGE_KERNEL, params, vals, out_c, scratch=[lse, target]) for vals in per]
    bad = None if args.plan is None else plan.counts != count
    if direct and bad is None:
        return launches, None

    def finish() -> None:
        """The temporary into ``out`` and/or NaN into the rows ``bad``: one device op each way."""
        rows = out_c.unflatten(1, (Sq // BLOCK, BLOCK))  # [B, Gq, 64, H, 128]
        if bad is None:
            out_c.copy_(target.permute(0, 2, 1, 3))
            return
        mask = bad.permute(0, 2, 1)[:, :, None, :, None]
        if direct:
            rows.masked_fill_(mask, float("nan"))
        else:
            src = target.permute(0, 2, 1, 3).unflatten(1, (Sq // BLOCK, BLOCK))
            nan = torch.full((), float("nan"), dtype=out_c.dtype, device=out_c.device)  # a fill, no copy
            torch.where(mask, nan, src, out=rows)

    return launches, finish


class SM100Backend(Backend):
    """FlashInfer SM100 blk64 bf16 class and cuDNN's SM100 Sage FP8 kernel (sm_100a / sm_100f
    library)."""

    target_family = FAMILY
    kernels = KERNELS
    fixed_count_modes = (SAGE_FP8.name,)  # one count per launch (sage_refusal); the self-test plans so

    def modes(self, lib) -> tuple[str, ...]:
        """Sage needs cuDNN's quantizer next to its kernel (``contract.modes_served``)."""
        return tuple(m for m in super().modes(lib) if m != SAGE_FP8.name or lib.has_kernel(SAGE_QUANT))

    def can_implement(self, lib, compute_mode: str, block_size_k: int) -> None:
        super().can_implement(lib, compute_mode, block_size_k)
        why = UNVALIDATED.get(lib.target, {}).get(compute_mode, {}).get("why")
        if why and not unvalidated.allowed():
            raise ValueError(unvalidated.refusal(f"{lib.target}", compute_mode, why, lib.target))

    def check_call(self, lib, args) -> None:
        if args.compute_mode == SAGE_FP8.name and (why := sage_refusal(args)):
            raise ValueError(why)

    def fuses_plan(self, lib, compute_mode: str) -> bool:
        return False  # cuDNN's quantizer has no plan role; bf16 has no quantizer

    def plan_block_size_k(self, block_size_k: int) -> int:
        return BLOCK  # 128-key plans are split into 64-key block pairs by the plan kernel

    def prepare(self, args, lib, plan_values=None):
        """Sage: cuDNN's quantizer on contiguous bf16 BHSD copies of q, k, v (a copy only where
        the caller's tensor is not BHSD already: 4 bytes moved per element, a read and a write of
        bf16; the quantizer then reads 2 and writes 1 per element plus the scales)."""
        if args.compute_mode != SAGE_FP8.name:
            return None
        q, k, v = (t.permute(0, 2, 1, 3).contiguous() for t in (args.q, args.k, args.v))
        B, H, Sq, _ = q.shape
        bufs = cudnn_sage_buffers(B, H, Sq, k.shape[2], q.device)
        abi.launch(SAGE_QUANT, SAGE_QUANT_PARAMS, cudnn_quant_values(q, k, v, bufs), library=lib)
        return bufs

    def launch(self, args, plan, operands, out_c) -> Launch:
        q, k, v = (t.permute(0, 2, 1, 3) for t in (args.q, args.k, args.v))
        return sm100_bf16_launch(q, k, v, plan, out_c.permute(0, 2, 1, 3), out_c, softmax_scale=args.scale)

    def pack(self, lib, args, plan, operands, out_c):
        if args.compute_mode != SAGE_FP8.name:
            return super().pack(lib, args, plan, operands, out_c)
        launches, finish = sage_launches(args, plan, operands, out_c)
        gos = [abi.prepare(L.kernel, L.params, L.values, library=lib) for L in launches if not L.zero_output]

        def go() -> None:
            for g in gos:
                g()
            if finish is not None:
                finish()

        return go


BACKEND = SM100Backend()
