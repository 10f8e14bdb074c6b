"""PyTorch references (float32 / float64 math, any device) for checking the compiled kernels.

Sage quantizer reference: :func:`reference_quantize_sage` produces exactly the tensors the
``sage_quant_*`` kernels produce (the operand layout of FlashInfer's SM120 Sage block-sparse
kernel), :func:`dequantize_sage` maps them back to float. See ``aot/kernels/sage_quant/`` and
``docs/design/quantizer.md`` for the contract. Only torch is needed.
"""

import torch

from .contract import HEAD_DIM, MODES, SAGE_V_BOUND_MARGIN, SAGE_V_BOUND_MAX, ceil_div, sage_k_mean_rows

SAGE_Q_GROUP = 32  # query rows per q_scale entry
SAGE_Q_TILE = 128  # q_scale is padded to 4 groups per 128-row tile
SAGE_K_BLOCK = 64  # keys per k_scale entry; V is padded to a multiple of this
SAGE_V_SCALE_MAX = 2.25  # v_scale = amax / 2.25 (FlashInfer's FP16 PV-accumulator bound)
SAGE_AMAX_FLOOR = 1.0e-7


def sage_perm16(i: int) -> int:
    """Column (within its 16-token group) at which token ``i`` of the group is stored in ``v_fp8``."""
    m = i % 16
    return (m // 8) * 2 + ((m // 2) % 4) * 4 + m % 2


SAGE_PERM16 = tuple(sage_perm16(i) for i in range(16))  # (0,1,4,5,8,9,12,13,2,3,6,7,10,11,14,15)


def _to_bhsd(x: torch.Tensor, layout: str, name: str) -> torch.Tensor:
    if x.dim() != 4:
        raise ValueError(f"{name} must be rank 4, got shape {tuple(x.shape)}")
    if layout == "BSHD":
        x = x.permute(0, 2, 1, 3)
    elif layout != "BHSD":
        raise ValueError(f"layout must be 'BSHD' or 'BHSD', got {layout!r}")
    if x.shape[-1] != HEAD_DIM:
        raise ValueError(f"{name} must have head dim {HEAD_DIM}, got {x.shape[-1]}")
    return x


def reference_k_mean(kh: torch.Tensor) -> torch.Tensor:
    """The Sage K mean of BHSD ``kh`` ``[B,H,Sk,128]``: float64 mean of the sampled keys
    (``contract.sage_k_mean_rows``), as float32 ``[B,H,128]``."""
    n, stride = sage_k_mean_rows(kh.shape[2])
    return kh[:, :, : n * stride : stride].double().mean(dim=2).float()


def reference_v_bound(vh: torch.Tensor) -> torch.Tensor:
    """V's per-channel scale bound of BHSD ``vh`` ``[B,H,Sk,128]``: ``min(SAGE_V_BOUND_MARGIN *
    amax|V| over the sampled keys, SAGE_V_BOUND_MAX)`` (the K mean's sample,
    ``contract.sage_k_mean_rows``), float32 ``[B,H,128]``. ``v_scale = max(bound, amax,
    1e-7) / 2.25``: the quantizer knows the bound before it reads V (contract.py)."""
    n, stride = sage_k_mean_rows(vh.shape[2])
    amax = vh[:, :, : n * stride : stride].float().abs().amax(dim=2)
    return (amax * SAGE_V_BOUND_MARGIN).clamp_max(SAGE_V_BOUND_MAX)


def _int8_codes(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """clamp(rint(x / scale), -127, 127) in float32 (rint = round half to even)."""
    return torch.clamp(torch.round(x / scale), -127.0, 127.0).to(torch.int8)


def reference_quantize_sage(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: str = "BSHD",
    k_mean: torch.Tensor = None,
) -> dict:
    """Reference Sage quantization of bf16 (or float) Q/K/V with head dim 128.

    ``layout`` is ``"BSHD"`` (``[B,S,H,128]``) or ``"BHSD"`` (``[B,H,S,128]``); any strides.
    ``k_mean`` (float32 ``[B,H,128]``) overrides the K channel mean (to check the quantize step
    of a kernel against exactly the mean that kernel subtracted).

    Returns a dict (all on the input device):

    * ``q_int8``  int8 ``[B,H,Sq,128]`` contiguous
    * ``q_scale`` float32 ``[B,H,ceil(Sq/128)*4]``: ``max(amax,1e-7)/127`` per 32 rows; groups
      wholly past Sq hold ``1e-7/127``
    * ``k_int8``  int8 ``[B,H,Sk,128]``: ``K - k_mean`` quantized per 64 keys
    * ``k_scale`` float32 ``[B,H,ceil(Sk/64)]``: ``max(amax(K - mean), 1e-7)/127`` over valid rows
    * ``k_mean``  float32 ``[B,H,128]``: mean of K over the sampled keys ``0, stride, ...,
      (n-1)*stride`` (:func:`sage_k_mean_rows`: all keys up to 512, else 512 evenly strided;
      float64 sum, rounded to fp32). Softmax is invariant to it: it only centres K's INT8 blocks
    * ``v_fp8``   float8_e4m3fn ``[B,H,128,ceil(Sk/64)*64]``: ``V / v_scale`` (round to nearest
      even), transposed, 16-token groups permuted by :data:`SAGE_PERM16`, pad columns +0
    * ``v_scale`` float32 ``[B,H,128]``: ``max(amax|V| over keys, bound, 1e-7)/2.25``, the bound
      :func:`reference_v_bound` (4x the amax over the K mean's sample keys): FP8 keeps its
      relative precision at any scale, and a scale known before V is read lets the quantizer
      read V once
    """
    qh = _to_bhsd(q, layout, "q").float()
    kh = _to_bhsd(k, layout, "k").float()
    vh = _to_bhsd(v, layout, "v").float()
    B, H, Sq, D = qh.shape
    if kh.shape[:2] != (B, H) or vh.shape != kh.shape:
        raise ValueError("q, k, v must share B and H, and k, v must have the same shape")
    Sk = kh.shape[2]
    if Sq < 1 or Sk < 1:
        raise ValueError("sequence lengths must be positive")
    dev = qh.device

    # ---- Q: one scale per 32 rows, padded to 4 groups per 128-row tile
    nq = ceil_div(Sq, SAGE_Q_TILE) * (SAGE_Q_TILE // SAGE_Q_GROUP)
    qp = torch.zeros(B, H, nq * SAGE_Q_GROUP, D, dtype=torch.float32, device=dev)
    qp[:, :, :Sq] = qh
    qg = qp.view(B, H, nq, SAGE_Q_GROUP, D)
    q_amax = qg.abs().amax(dim=(3, 4)).clamp_min(SAGE_AMAX_FLOOR)
    q_scale = q_amax / 127.0
    q_int8 = _int8_codes(qg, q_scale[..., None, None]).view(B, H, -1, D)[:, :, :Sq].contiguous()

    # ---- K: smooth by the channel mean, one scale per 64 keys
    if k_mean is None:
        k_mean = reference_k_mean(kh)
    else:
        k_mean = k_mean.to(device=dev, dtype=torch.float32).reshape(B, H, D)
    nk = ceil_div(Sk, SAGE_K_BLOCK)
    kp = torch.zeros(B, H, nk * SAGE_K_BLOCK, D, dtype=torch.float32, device=dev)
    kp[:, :, :Sk] = kh - k_mean[:, :, None, :]
    kg = kp.view(B, H, nk, SAGE_K_BLOCK, D)
    k_amax = kg.abs().amax(dim=(3, 4)).clamp_min(SAGE_AMAX_FLOOR)
    k_scale = k_amax / 127.0
    k_int8 = _int8_codes(kg, k_scale[..., None, None]).view(B, H, -1, D)[:, :, :Sk].contiguous()

    # ---- V: per-channel scale, FP8 E4M3, HDS with the 16-token permutation
    v_amax = torch.maximum(vh.abs().amax(dim=2), reference_v_bound(vh))
    v_scale = v_amax.clamp_min(SAGE_AMAX_FLOOR) / SAGE_V_SCALE_MAX
    vp = torch.zeros(B, H, nk * SAGE_K_BLOCK, D, dtype=torch.float32, device=dev)
    vp[:, :, :Sk] = vh / v_scale[:, :, None, :]
    perm = torch.tensor(SAGE_PERM16, device=dev)
    vperm = torch.empty_like(vp).view(B, H, -1, 16, D)
    vperm[:, :, :, perm] = vp.view(B, H, -1, 16, D)  # token i of a group -> column perm[i]
    v_fp8 = vperm.view(B, H, -1, D).transpose(2, 3).contiguous().to(torch.float8_e4m3fn)

    return {
        "q_int8": q_int8,
        "q_scale": q_scale.contiguous(),
        "k_int8": k_int8,
        "k_scale": k_scale.contiguous(),
        "k_mean": k_mean.contiguous(),
        "v_fp8": v_fp8,
        "v_scale": v_scale.contiguous(),
    }


def dequantize_sage(quant: dict, seqlen_k: int = None) -> dict:
    """Map the quantized tensors back to float32 BHSD ``q``, ``k`` (mean added back),
    ``k_centered`` and ``v`` (``[B,H,S,128]``). ``seqlen_k`` defaults to ``k_int8.shape[2]``."""
    q8 = quant["q_int8"]
    B, H, Sq, D = q8.shape
    qs = quant["q_scale"].float()
    q = q8.float() * torch.repeat_interleave(qs, SAGE_Q_GROUP, dim=2)[:, :, :Sq, None]

    k8 = quant["k_int8"]
    Sk = k8.shape[2] if seqlen_k is None else seqlen_k
    ks = quant["k_scale"].float()
    kc = k8.float() * torch.repeat_interleave(ks, SAGE_K_BLOCK, dim=2)[:, :, :Sk, None]
    k = kc + quant["k_mean"].float()[:, :, None, :]

    v8 = quant["v_fp8"].float()  # [B,H,D,Sp]
    Sp = v8.shape[3]
    perm = torch.tensor(SAGE_PERM16, device=v8.device)
    vt = v8.transpose(2, 3).reshape(B, H, Sp // 16, 16, D)[:, :, :, perm]  # column perm[i] -> token i
    v = vt.reshape(B, H, Sp, D)[:, :, :Sk] * quant["v_scale"].float()[:, :, None, :]
    return {"q": q, "k": k, "k_centered": kc, "v": v}


def sage_quant_shapes(B: int, H: int, Sq: int, Sk: int) -> dict:
    """Output shapes of the Sage quantizer (what the runtime allocates)."""
    nk = ceil_div(Sk, SAGE_K_BLOCK)
    return {
        "q_int8": (B, H, Sq, HEAD_DIM),
        "q_scale": (B, H, ceil_div(Sq, SAGE_Q_TILE) * (SAGE_Q_TILE // SAGE_Q_GROUP)),
        "k_int8": (B, H, Sk, HEAD_DIM),
        "k_scale": (B, H, nk),
        "k_mean": (B, H, HEAD_DIM),
        "v_fp8": (B, H, HEAD_DIM, nk * SAGE_K_BLOCK),
        "v_scale": (B, H, HEAD_DIM),
    }



# ---------------------------------------------------------------------------------------------
# Block-sparse attention reference


def reference_sparse_attention(q, k, v, q2k_block_index, block_counts=None, *, topk=None,
                               block_size_k=64, softmax_scale=None, layout="BSHD",
                               dtype=torch.float64):
    """Float64 (or ``dtype``) block-sparse attention with the routing-plan contract of
    ``subblock_sage.sparse_attention``: 64-row query blocks; each attends to the first
    ``block_counts[b,h,i]`` key blocks of its index row (ids outside ``[0, ceil(Sk/bk))`` and
    repeats are ignored); keys at or past Sk never contribute; a row with no valid block gives
    exact zeros. Returns a tensor in q's layout, in ``dtype``, on q's device.
    """
    if layout == "BSHD":
        qh, kh, vh = (x.permute(0, 2, 1, 3) for x in (q, k, v))
    elif layout == "BHSD":
        qh, kh, vh = q, k, v
    else:
        raise ValueError(f"layout must be 'BSHD' or 'BHSD', got {layout!r}")
    B, H, Sq, D = qh.shape
    Sk = kh.shape[2]
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    gq, gk = ceil_div(Sq, 64), ceil_div(Sk, block_size_k)
    idx = q2k_block_index.to(torch.int64)
    cap = idx.shape[-1]
    if block_counts is None:
        counts = torch.full((B, H, gq), cap if topk is None else topk, dtype=torch.int64, device=idx.device)
    else:
        counts = block_counts.to(torch.int64)
    # key-block mask per (b, h, query block): union of the listed valid blocks
    live = torch.arange(cap, device=idx.device).view(1, 1, 1, -1) < counts.unsqueeze(-1)
    valid = live & (idx >= 0) & (idx < gk)
    blk_mask = torch.zeros(B, H, gq, gk + 1, dtype=torch.bool, device=idx.device)
    blk_mask.scatter_(3, torch.where(valid, idx, gk), True)
    blk_mask = blk_mask[..., :gk]
    key_mask = blk_mask.repeat_interleave(block_size_k, dim=3)[..., :Sk]  # (B,H,gq,Sk)
    row_mask = key_mask.repeat_interleave(64, dim=2)[:, :, :Sq]  # (B,H,Sq,Sk)
    qf, kf, vf = (x.to(dtype) for x in (qh, kh, vh))
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    s = s.masked_fill(~row_mask.to(s.device), float("-inf"))
    any_key = row_mask.any(dim=-1, keepdim=True).to(s.device)
    p = torch.softmax(torch.where(any_key, s, torch.zeros_like(s)), dim=-1)
    p = torch.where(any_key, p, torch.zeros_like(p))
    o = torch.matmul(p, vf)
    return o.permute(0, 2, 1, 3) if layout == "BSHD" else o


# ---------------------------------------------------------------------------------------------
# Verdicts of the launch self-tests (`subblock-sage check`): pure functions of the tensors, so
# that their thresholds are tested on CPU with real numbers (tests/cpu/test_self_test_verdicts.py)
# and not only through hooks.

# (largest relative L1, smallest cosine) of a kernel's output against the float64 reference on a
# small ragged problem, per mode (``ComputeMode.self_test_limits``: the numbers and why).
SELF_TEST_LIMITS = {m.name: m.self_test_limits for m in MODES.values()}
# Quantizer: INT8 codes within one step (float rounding of the scale near .5), scales within 1e-5.
SELF_TEST_QUANT_CODE_STEPS = 1
SELF_TEST_QUANT_SCALE_RTOL = 1e-5


def attention_verdict(got: torch.Tensor, ref: torch.Tensor, compute_mode: str) -> str:
    """Judge an attention self-test: raise RuntimeError (naming the numbers) unless ``got`` is
    finite and within :data:`SELF_TEST_LIMITS` of ``ref`` in relative L1 *and* cosine (an error
    concentrated in a few elements barely moves L1 but drops the cosine); return the one-line
    result otherwise."""
    max_rel, min_cos = SELF_TEST_LIMITS[compute_mode]
    g = got.double().flatten()
    r = ref.double().to(g.device).flatten()
    finite = bool(torch.isfinite(g).all())
    rel = float((g - r).abs().sum() / r.abs().sum().clamp_min(1e-300))
    cos = float(torch.nn.functional.cosine_similarity(g, r, dim=0))
    line = f"cosine {cos:.5f}, relative L1 {rel:.4f} vs float64 reference"
    if not finite or not rel <= max_rel or not cos >= min_cos:
        what = "non-finite values" if not finite else f"limits: relative L1 <= {max_rel}, cosine >= {min_cos}"
        raise RuntimeError(f"output differs from the reference: {line} ({what})")
    return line


def quantizer_verdict(got: dict, ref: dict) -> str:
    """Judge the quantizer self-test: INT8 codes within :data:`SELF_TEST_QUANT_CODE_STEPS` of the
    reference, scales within :data:`SELF_TEST_QUANT_SCALE_RTOL` relative, V's FP8 codes within one
    E4M3 step; raise RuntimeError otherwise."""
    worst = 0
    for key in ("q_int8", "k_int8"):
        worst = max(worst, int((got[key].int() - ref[key].to(got[key].device).int()).abs().max()))
    if worst > SELF_TEST_QUANT_CODE_STEPS:
        raise RuntimeError(f"INT8 codes differ from the reference by {worst} steps")
    for key in ("q_scale", "k_scale", "v_scale"):
        r = ref[key].to(got[key].device).float()
        rel = float(((got[key].float() - r).abs() / r.abs().clamp_min(1e-30)).max())
        if not rel <= SELF_TEST_QUANT_SCALE_RTOL:
            raise RuntimeError(f"{key} differs from the reference by {rel:.2e} relative")
    g8, r8 = got["v_fp8"].float(), ref["v_fp8"].to(got["v_fp8"].device).float()
    if g8.shape != r8.shape or not bool(torch.isfinite(g8).all()):
        raise RuntimeError("v_fp8 has the wrong shape or non-finite values")
    # one E4M3 step is 2^-3 of the larger magnitude's binade (codes of |x| < 2^-6 are subnormal)
    step = torch.exp2(torch.floor(torch.log2(torch.maximum(g8.abs(), r8.abs()).clamp_min(2.0 ** -6))) - 3)
    if not bool(((g8 - r8).abs() <= step).all()):
        bad = int(((g8 - r8).abs() > step).sum())
        raise RuntimeError(f"v_fp8 differs from the reference by more than one E4M3 step in {bad} values")
    return f"quantizer matches the reference (codes within {worst} step)"


# ---------------------------------------------------------------------------------------------
# SubBlock router reference (the method and the pooled-cell layout: ``router_spec.py``)

# "The same blocks" (:func:`router_plan_differences`): two plans of a row may differ only in
# blocks whose float64 reference score lies within ``ROUTER_TIE_ATOL + ROUTER_TIE_RTOL * |T|`` of
# the row's threshold ``T`` (the score of its ``count``-th best block). A kernel's score differs
# from the float64 one by: float32 accumulation over 128 channels (~1e-6 of sum |q_d k_d|),
# exp2/log2 approximations (2^-21 relative), and the occasional pooled element whose float32 sum
# lands on the other side of a bf16 rounding midpoint than the float64 mean (one element in
# ~2e4: that channel's product moves by 2^-8 of itself, ~4e-4 of a typical score of random
# data). 2e-3 absolute (natural-log units; the scores of activations are O(1)-O(10)) plus 1e-4
# relative covers all three with margin; a real selection bug (a wrong cell, a dropped tail,
# a wrong LSE) moves scores by O(0.1) and more, far outside it.
ROUTER_TIE_ATOL = 2e-3
ROUTER_TIE_RTOL = 1e-4


def _router_bhsd(x: torch.Tensor, layout: str, name: str) -> torch.Tensor:
    if x.dim() != 4:
        raise ValueError(f"{name} must be rank 4, got shape {tuple(x.shape)}")
    if layout == "BSHD":
        return x.permute(0, 2, 1, 3)
    if layout != "BHSD":
        raise ValueError(f"layout must be 'BSHD' or 'BHSD', got {layout!r}")
    return x


def reference_router_pool(x: torch.Tensor, sub: int, *, block: int, scale: float = 1.0,
                          layout: str = "BSHD", pooled_dtype=torch.bfloat16) -> torch.Tensor:
    """Pooled cells of ``x`` (``router_spec``): float64 mean of the real tokens of each ``sub``-token
    cell times ``scale``, every cell of ``ceil(S / block)`` blocks (cells wholly past S are 0),
    rounded to ``pooled_dtype`` (bf16: the method's cells; None: exact) and returned as float64
    ``[B, H, cells, D]``."""
    xh = _router_bhsd(x, layout, "x")
    B, H, S, D = xh.shape
    if S < 1:
        raise ValueError("sequence length must be positive")
    if block % sub:
        raise ValueError(f"cell size {sub} must divide the block size {block}")
    cells = ceil_div(S, block) * (block // sub)
    pad = torch.zeros(B, H, cells * sub, D, dtype=torch.float64, device=xh.device)
    pad[:, :, :S] = xh.double()
    cnt = (torch.arange(cells * sub, device=xh.device) < S).view(cells, sub).sum(-1).double()
    mean = pad.view(B, H, cells, sub, D).sum(3) / cnt.clamp_min(1.0).view(1, 1, cells, 1)
    out = mean * scale
    if pooled_dtype is not None:
        out = out.to(pooled_dtype).double()
    return out


def reference_block_scores(q: torch.Tensor, k: torch.Tensor, *, n_q: int = 4, n_k: int = None,
                           block_size_k: int = 64, softmax_scale: float = None, layout: str = "BSHD",
                           pooled_dtype=torch.bfloat16) -> torch.Tensor:
    """Float64 block scores ``[B, H, ceil(Sq/64), ceil(Sk/block_size_k)]`` in natural-log units:
    the log-sum-exp over the valid (query cell, key cell) pairs of each block pair
    (``router_spec``), pooled cells rounded to ``pooled_dtype`` as the method does."""
    from .router_spec import LOG2E, Q_BLOCK, default_n_k, valid_cells

    n_k = default_n_k(block_size_k) if n_k is None else n_k
    D = q.shape[-1]
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    sq, sk = Q_BLOCK // n_q, block_size_k // n_k
    qp = reference_router_pool(q, sq, block=Q_BLOCK, scale=scale * LOG2E, layout=layout,
                               pooled_dtype=pooled_dtype)
    kp = reference_router_pool(k, sk, block=block_size_k, layout=layout, pooled_dtype=pooled_dtype)
    Sq, Sk = _router_bhsd(q, layout, "q").shape[2], _router_bhsd(k, layout, "k").shape[2]
    return reference_scores_from_cells(qp, kp, n_q=n_q, n_k=n_k, q_valid=valid_cells(Sq, sq),
                                       k_valid=valid_cells(Sk, sk))


def reference_scores_from_cells(qp: torch.Tensor, kp: torch.Tensor, *, n_q: int, n_k: int, q_valid: int,
                                k_valid: int) -> torch.Tensor:
    """Float64 block scores (natural-log units) of pooled cells ``[B, H, cells, D]`` (any float
    dtype; Q cells carrying ``softmax_scale * log2(e)``): the log-sum-exp over each block pair's
    valid cell pairs; cells at or past ``q_valid`` / ``k_valid`` are left out."""
    from .router_spec import LN2

    qp, kp = qp.double(), kp.double()
    B, H, cq, _ = qp.shape
    ck = kp.shape[2]
    dots = torch.matmul(qp, kp.transpose(-1, -2))  # log2 units
    valid = ((torch.arange(cq, device=qp.device) < q_valid).view(-1, 1)
             & (torch.arange(ck, device=qp.device) < k_valid).view(1, -1))
    dots = dots.masked_fill(~valid, float("-inf"))
    pairs = dots.view(B, H, cq // n_q, n_q, ck // n_k, n_k).permute(0, 1, 2, 4, 3, 5)
    pairs = pairs.reshape(B, H, cq // n_q, ck // n_k, n_q * n_k)
    m = pairs.amax(-1, keepdim=True)  # every block has a valid pair: its first cell is real
    return (m.squeeze(-1) + torch.log2(torch.exp2(pairs - m).sum(-1))) * LN2


def reference_router_select(scores: torch.Tensor, topk: int, dense_rows=None):
    """Exact selection: each routed row keeps its ``topk`` best key blocks, ties to the lower id;
    dense rows (bool ``[B, H, Gq]``, broadcastable) keep all. Returns ``(index, counts)``: int32
    ``[B, H, Gq, cap]`` with each row's ids ascending then zeros, ``cap = Gk`` with dense rows
    else ``topk``; int32 ``[B, H, Gq]``."""
    B, H, gq, gk = scores.shape
    if not 1 <= topk <= gk:
        raise ValueError(f"topk must be in 1..{gk}, got {topk}")
    cols = torch.arange(gk, device=scores.device)
    # sort by (-score, id): a stable sort on -score keeps ids ascending among equal scores
    order = torch.sort(-scores.double(), dim=-1, stable=True).indices
    keep = torch.zeros_like(scores, dtype=torch.bool)
    keep.scatter_(-1, order[..., :topk], True)
    counts = torch.full((B, H, gq), topk, dtype=torch.int32, device=scores.device)
    cap = topk
    if dense_rows is not None:
        dense = torch.as_tensor(dense_rows, device=scores.device).bool().expand(B, H, gq)
        keep = keep | dense.unsqueeze(-1)
        counts = torch.where(dense, gk, counts).to(torch.int32)
        cap = gk
    ids = torch.where(keep, cols.expand_as(keep), gk)
    ids = torch.sort(ids, dim=-1).values[..., :cap]
    return torch.where(ids < gk, ids, 0).to(torch.int32), counts


def reference_route(q, k, *, sparsity: float, softmax_scale: float = None, n_q: int = 4, n_k: int = None,
                    block_size_k: int = 64, budget_granularity: int = None, dense_rows=None,
                    layout: str = "BSHD", pooled_dtype=torch.bfloat16):
    """The router in float64: ``(index, counts, scores, topk)`` (see the functions above)."""
    from .router_spec import DEFAULT_GRANULARITY, router_budget

    scores = reference_block_scores(q, k, n_q=n_q, n_k=n_k, block_size_k=block_size_k,
                                     softmax_scale=softmax_scale, layout=layout, pooled_dtype=pooled_dtype)
    g = DEFAULT_GRANULARITY[block_size_k] if budget_granularity is None else budget_granularity
    topk = router_budget(scores.shape[-1], sparsity, g)
    index, counts = reference_router_select(scores, topk, dense_rows)
    return index, counts, scores, topk


def router_plan_differences(index_a, counts_a, index_b, counts_b, scores, *,
                            atol: float = ROUTER_TIE_ATOL, rtol: float = ROUTER_TIE_RTOL) -> dict:
    """Compare two plans of the same scores (``[B, H, Gq, Gk]``, float64 reference) row by row.

    A row is *the same* when its counts agree and every block in one plan's set but not the
    other's scores within ``atol + rtol * |T|`` of the row's threshold ``T`` (the ``count``-th
    best reference score): such blocks are exact or near ties, which float32 rounding may order
    either way. Returns ``{"rows": rows compared, "differing_rows": rows whose sets differ,
    "bad": [(b, h, i, block, score - T), ...] for differences outside the tolerance (and
    ``(b, h, i, None, None)`` for count mismatches), "worst_margin": the largest |score - T|
    among the differences}``; the plans are the same blocks iff ``bad`` is empty."""
    B, H, gq, gk = scores.shape
    s = scores.double().cpu()

    def sets(index, counts):
        index, counts = index.long().cpu(), counts.long().cpu()
        live = torch.arange(index.shape[-1]).view(1, 1, 1, -1) < counts.unsqueeze(-1)
        m = torch.zeros(B, H, gq, gk + 1, dtype=torch.bool)
        m.scatter_(-1, torch.where(live & (index >= 0) & (index < gk), index, gk), True)
        return m[..., :gk]

    ma, mb = sets(index_a, counts_a), sets(index_b, counts_b)
    ca, cb = counts_a.long().cpu(), counts_b.long().cpu()
    bad = [(b, h, i, None, None) for b, h, i in (ca != cb).nonzero().tolist()]
    kth = torch.sort(s, dim=-1, descending=True).values
    thr = kth.gather(-1, (ca.clamp(1, gk) - 1).unsqueeze(-1)).squeeze(-1)
    diff = ma ^ mb
    rows = diff.any(-1) & (ca == cb)
    margin = (s - thr.unsqueeze(-1)).abs()
    tol = atol + rtol * thr.abs()
    out_of_tol = diff & (margin > tol.unsqueeze(-1)) & (ca == cb).unsqueeze(-1)
    for b, h, i, j in out_of_tol.nonzero().tolist():
        bad.append((b, h, i, j, float(s[b, h, i, j] - thr[b, h, i])))
    worst = float(margin[diff].max()) if bool(diff.any()) else 0.0
    return {"rows": B * H * gq, "differing_rows": int(rows.sum()), "bad": bad, "worst_margin": worst}


def router_verdict(index, counts, ref_index, ref_counts, scores) -> str:
    """The router self-test's verdict: a plan against the float64 reference's plan of the same
    inputs (``scores``: the reference's float64 scores). Raises AssertionError naming the first
    differences when they are not the same blocks (:func:`router_plan_differences`); returns a
    one-line summary otherwise."""
    d = router_plan_differences(index, counts, ref_index, ref_counts, scores)
    if d["bad"]:
        shown = ", ".join("row (%d, %d, %d): counts differ" % b[:3] if b[3] is None else
                          "row (%d, %d, %d) block %d, %.3g from the threshold" % b for b in d["bad"][:3])
        raise AssertionError(f"the router's plan is not the float64 reference's: {len(d['bad'])} "
                             f"difference(s) outside the tie tolerance ({shown})")
    return (f"same blocks as the float64 reference on {d['rows']} rows ({d['differing_rows']} differ "
            f"only among ties, worst margin {d['worst_margin']:.2g})")
