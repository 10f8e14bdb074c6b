"""The Sage quantizer's launch: bf16 Q/K/V (validated canonical views) -> the Sage operands, with
the plan role when given a plan. The backends call it as the input conversion of a Sage call
(``backends/base.py``); ``ops/quantize.py`` is the public operator over it.

Kernel: ``aot/kernels/sage_quant.py`` (contract, layouts and sizes in its docstring). One launch
on the caller's stream, ``sage_quant_kv``. The outputs are ``torch.empty``; the workspace is the
stream's own buffer, zeroed once and never refilled (``workspace.sync_buffer``: each launch tags
what it writes), so no torch op runs per call and a call is exactly its launch.
"""

from __future__ import annotations

from .. import abi, workspace
from ..contract import SAGE_QUANT_KERNEL, SAGE_SYNC_ARG, ceil_div, sage_sync_words
from ..validation import cuda_device_index

Q_TILE = 128  # q_scale holds 4 groups (of 32 rows) per 128 query rows
K_BLOCK = 64
PLAN_PARAMS = {True: "counts", False: "topk"}  # sage_quant_kv's "plan" parameter, by counts given
POOL_PARAMS = {"plan": "none", "pool": True}  # the pooling variant (ops/quantize_route.py)


def output_specs(B: int, H: int, Sq: int, Sk: int, D: int = 128) -> dict:
    """The quantizer's outputs, in the order :func:`quantize_canonical` returns them: name ->
    (shape, torch dtype name)."""
    nbk = ceil_div(Sk, K_BLOCK)
    return {
        "q_int8": ((B, H, Sq, D), "int8"),
        "q_scale": ((B, H, ceil_div(Sq, Q_TILE) * 4), "float32"),
        "k_int8": ((B, H, Sk, D), "int8"),
        "k_scale": ((B, H, nbk), "float32"),
        "v_fp8": ((B, H, D, nbk * K_BLOCK), "float8_e4m3fn"),
        "v_scale": ((B, H, D), "float32"),
        "k_mean": ((B, H, D), "float32"),
    }


def quantize_canonical(qc, kc, vc, plan_values=None, plan_counts=None, with_q: bool = True, pool=None,
                       library=None) -> dict:
    """quantize_sage on already validated canonical (B, S, H, 128) views (the attention
    backends call this: their inputs were checked once by sparse_attention).

    ``plan_values``: the values the ``plan_prepare`` launch takes (``plan.prepare_plan``:
    ``q2k_block_index``, ``block_counts`` or ``topk``, ``out_index``, ``out_counts``, ``summary``
    (zeroed by the caller when it is read), ``num_key_blocks``, ``split``, ``num_out_blocks``); its
    B and H must be q's. Given, the launch also prepares the plan (the plan role of
    ``sage_quant_kv``, the same contract as ``plan_prepare``) and the plan kernel must not be
    launched. ``plan_counts``: whether ``block_counts`` is given (default: read off the dict).
    The quantizer outputs are the same with and without a plan.
    ``with_q=False``: K and V only (no ``q_int8`` / ``q_scale``; the launch gets zero Q rows, so it
    has no Q tiles): for an attention kernel that quantizes its own Q tile (sm_90a ``k*_qf_cnt``).
    ``pool``: ``{"pooled_q", "pooled_k", "q_pool_scale"}`` (``ops/quantize_route.py``): the
    variant that also writes the router's pooled cells (no plan role); with ``with_q=False`` its
    Q tiles still read Q, to pool it, and write no codes. ``library``: the kernel library to
    launch from (default: the device's).
    """
    import torch

    B, Sq, H, D = qc.shape
    Sk = kc.shape[1]
    dev = qc.device
    nbk = ceil_div(Sk, K_BLOCK)
    words = sage_sync_words(B, H, nbk)
    if words >= 2**31:
        raise ValueError(f"B*H={B * H} heads of {Sk} keys need {words} words of quantizer workspace, more "
                         f"than its 32-bit index reaches. Fix: quantize fewer heads per call (split B or H)")
    if pool is not None and plan_values is not None:
        raise ValueError("the pooling quantizer has no plan role (the plan comes from the pooled cells). "
                         "Fix: pass pool or plan_values, not both")
    if not with_q:
        Sq = 0
        if pool is None:
            qc = qc[:, :0]  # no Q tiles (a view: nothing is read)
    res = {name: torch.empty(shape, dtype=getattr(torch, dtype), device=dev)
           for name, (shape, dtype) in output_specs(B, H, Sq, Sk, D).items()}
    canon = lambda t: t.permute(0, 2, 1, 3)  # noqa: E731  (B,H,S,D) storage as (B,S,H,D) view
    values = {"q": qc, "q_int8": canon(res["q_int8"]), "q_scale": res["q_scale"], "k": kc, "v": vc,
              "k_mean": res["k_mean"], "v_scale": res["v_scale"], "k_int8": canon(res["k_int8"]),
              "k_scale": res["k_scale"], "v_fp8": res["v_fp8"]}
    params = {"plan": "none"}
    if pool is not None:
        params["pool"] = True
        values.update(pool)
    if plan_values is not None:
        has_counts = "block_counts" in plan_values
        if plan_counts is not None and bool(plan_counts) != has_counts:
            raise ValueError(f"plan_counts={plan_counts} but plan_values "
                             f"{'has' if has_counts else 'lacks'} block_counts. Fix: pass the plan "
                             f"kernel's values unchanged and leave plan_counts out")
        idx = plan_values["q2k_block_index"]
        if tuple(idx.shape[:2]) != (B, H):
            raise ValueError(f"plan_values['q2k_block_index'] has (B, H) = {tuple(idx.shape[:2])} but q has "
                             f"{(B, H)}. Fix: prepare the plan for q's batch and heads")
        params["plan"] = PLAN_PARAMS[has_counts]
        values.update(plan_values)
    index = cuda_device_index(dev)
    with torch.cuda.device(dev):
        values[SAGE_SYNC_ARG] = workspace.sync_buffer(index, words)  # the stream's own, after every check
        abi.launch(SAGE_QUANT_KERNEL, params, values, device=index, library=library)
    if not with_q:
        del res["q_int8"], res["q_scale"]
    return res
