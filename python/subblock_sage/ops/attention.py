"""`sparse_attention`: SubBlock block-sparse attention, Sage (INT8 Q·Kᵀ, FP8 P·V) or bf16.

The path of one call: ``validation.check_attention_args`` (every check, once) -> :func:`run`:
the backend of the device's target (``backends/``) says whether it can implement the call, the
plan is prepared (``plan.prepare_plan``: the plan kernel, or for Sage the plan role of the
quantizer's first launch), and the backend packs its launch, reads the plan's verdict when
``check_plan=True`` (bad plan values raise there; ``out`` is never written on that path) and
launches. A plain eager call replays this path's launches after its first call of a signature
(``replay.py``, from ``torch_ops.sparse_attention``).
"""

from __future__ import annotations

from .. import deadline, loader
from ..backends import backend_for
from ..contract import ceil_div
from ..plan import prepare_plan
from ..validation import AttentionArgs, capturing, check_attention_args, cuda_device_index


def sparse_attention(q, k, v, q2k_block_index, block_counts=None, *, topk=None, block_size_k=64,
                     softmax_scale=None, compute_mode="sage_fp8", layout="BSHD", out=None,
                     check_plan=False, library=None, backend=None):
    """Validate, then :func:`run` (the custom operator's real implementation; the public
    ``subblock_sage.sparse_attention`` in ``torch_ops`` documents the arguments).
    ``library``, ``backend``: override the loaded library / backend (tests of test-only builds)."""
    args = check_attention_args(q, k, v, q2k_block_index, block_counts, topk=topk,
                                block_size_k=block_size_k, softmax_scale=softmax_scale,
                                compute_mode=compute_mode, layout=layout, out=out, check_plan=check_plan)
    return run(args, library=library, backend=backend)


def resolve(args: AttentionArgs, library=None, backend=None):
    """(library, backend) serving the call's device, after the backend's ``can_implement``."""
    lib = library or loader.library_for_device(cuda_device_index(args.q.device))
    be = backend or backend_for(lib.target)
    be.can_implement(lib, args.compute_mode, args.plan.block_size_k)
    return lib, be


def stage(args: AttentionArgs, lib, be):
    """Everything before the attention launch: the input conversion and the plan. Sage: the
    quantizer's launch also prepares the plan (its plan role), so the call is two launches (each
    launch costs host time and a GPU gap, which dominate at small shapes); bf16: the plan kernel.
    Returns (operands, prepared plan); bad plan values raise in ``plan.verify()``."""
    box: dict = {}
    fuse = None
    if be.fuses_plan(lib, args.compute_mode):
        def fuse(values):
            box["operands"] = be.prepare(args, lib, plan_values=values)
    plan = prepare_plan(args.plan, block_size_k_out=be.plan_block_size_k(args.plan.block_size_k),
                        check_index=args.check_plan, capturing=capturing(), library=lib, fuse=fuse)
    operands = box["operands"] if "operands" in box else be.prepare(args, lib)  # PyTorch plan fallback
    return operands, plan


def run(args: AttentionArgs, *, library=None, backend=None):
    """Run a validated call; returns the output in the caller's layout."""
    import torch

    lib, be = resolve(args, library, backend)
    out = args.out
    if out is None:
        out = torch.empty_like(args.q if args.layout == "BSHD" else args.q.permute(0, 2, 1, 3),
                               memory_format=torch.contiguous_format)
    with torch.cuda.device(args.q.device):
        operands, plan = stage(args, lib, be)
        be.run(lib, args, plan, operands, args.canonical(out))  # packs, plan.verify(), launches
    return out


def _self_test(device: int, compute_mode: str) -> str:
    """Small launch on a ragged shape with empty, dense and random rows vs the float64 reference."""
    import torch

    from ..reference import attention_verdict, reference_sparse_attention

    g = torch.Generator(device="cpu").manual_seed(7)
    B, H, Sq, Sk, bk = 1, 2, 150, 200, 64
    dev = f"cuda:{device}"
    q, k, v = (torch.randn(B, S, H, 128, generator=g).to(torch.bfloat16).to(dev) for S in (Sq, Sk, Sk))
    gq, gk = ceil_div(Sq, 64), ceil_div(Sk, bk)
    index = torch.stack([torch.randperm(gk, generator=g) for _ in range(B * H * gq)]).view(B, H, gq, gk)
    counts = torch.randint(0, gk + 1, (B, H, gq), generator=g)
    counts[0, 0, 0], counts[0, 1, 1] = 0, gk  # one empty row, one dense row
    index, counts = index.int().to(dev), counts.int().to(dev)
    got = sparse_attention(q, k, v, index, counts, compute_mode=compute_mode, block_size_k=bk)
    deadline.wait_stream(device, f"GPU {device} {compute_mode} self-test")  # polls an event: never hangs (deadline.py)
    ref = reference_sparse_attention(q, k, v, index, counts, block_size_k=bk).to(got.device)
    return attention_verdict(got, ref, compute_mode)  # thresholds: reference.SELF_TEST_LIMITS


def self_test_sage_fp8(device: int) -> str:
    return _self_test(device, "sage_fp8")


def self_test_bf16(device: int) -> str:
    return _self_test(device, "bf16")


self_test_sage_fp8.supported = lambda lib: "sage_fp8" in lib.compute_modes
self_test_bf16.supported = lambda lib: "bf16" in lib.compute_modes
