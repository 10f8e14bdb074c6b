"""SGLang 0.5.23's own SM90 bf16 SubBlock kernel as a bench contender (H100/H200).

SGLang runs its bf16 SubBlock attention on Hopper through its vendored FlashAttention CuTe forward
(``flash_attn_func`` with block-sparse tensors), JIT-compiled by the CuTe DSL. The H200 has no room
for the DSL, so the build compiles that class ahead of time into the never-shipped test library
(``aot/kernels/sglang_sm90.py``; ``SBS_TEST_LIBS=ON ./wheels/build.sh`` installs it under
``wheels/test-libs/<cpu>/test_libs/test_sm90a/``), and this module launches it through our C ABI
with the arguments SGLang's runner passes: no LSE (SGLang asks for none), mask counts
``block_counts`` and mask index ``q2k_block_index``, no full-block tensors, ``num_splits=1``.

Constraints (SGLang's ``interface.py``, checked here before the launch):
- q, k, v, out: bf16 ``[B, S, H, 128]`` (BSHD), unit stride on the head dim, the same H for q and
  k/v (the export is compiled for one query head per K/V head), 16-byte aligned data and strides
  (the kernel loads and stores them with TMA); Sq and Sk any length >= 1 (the partial last
  64-row / 64-key block is masked by the kernel).
- ``block_counts`` int32 ``[B, H, ceil(Sq/64)]``, ``q2k_block_index`` int32
  ``[B, H, ceil(Sq/64), cap]`` with ``cap <= ceil(Sk/64)`` (SGLang refuses a wider index), both
  with a unit last stride. Each row's first ``block_counts`` entries are distinct key blocks in
  ``[0, ceil(Sk/64))`` (nothing checks them on the GPU). The kernel walks a row's list from its
  last entry backwards and masks keys past Sk only in the first block it processes, so the list
  must be ascending (the partial last key block last): :meth:`SGLangSM90.run` sorts each active
  prefix as SGLang's backend does for SM90 (once per plan, see there). A row with count 0 writes
  zeros.
"""

from __future__ import annotations

import os

from subblock_sage.contract import Q_BLOCK

from . import test_library

KERNEL = "sglang_sm90_bf16"
BLOCK = Q_BLOCK  # SGLang's sparse blocks: 64 query rows by 64 keys

load_failure = ""  # why the last load() returned None (one line)


def load(test_libs_dir: str | os.PathLike | None = None) -> SGLangSM90 | None:
    """The contender from the test library in ``test_libs_dir`` (default: ``$SUBBLOCK_SAGE_TEST_LIBS``,
    then ``$SUBBLOCK_SAGE_TEST_LIB_DIR``: ``test_library.find``), or None with the reason in
    :data:`load_failure`."""
    global load_failure
    lib, load_failure = test_library.open_library("SGLang's SM90 kernel", (KERNEL,), test_libs_dir)
    return None if lib is None else SGLangSM90(lib)


class SGLangSM90:
    """Launches SGLang's SM90 bf16 SubBlock kernel from a loaded test library."""

    KEPT_PLANS = 16  # sorted plans kept (a bench times a handful of plans, each many times)

    def __init__(self, library) -> None:
        self.library = library
        self._sorted: dict[tuple, object] = {}  # plan identity -> its sorted index (kept)

    def sorted_index(self, q2k_block_index, block_counts):
        """``q2k_block_index`` with each row's active prefix (its first ``block_counts`` entries)
        in ascending order, as SGLang's backend hands it to this kernel; entries past the count
        are kept (the kernel never reads them). Computed once per plan and kept: the key is the
        two tensors' storage, shape and version counter, so an in-place edit of either recomputes."""
        import torch

        key = tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t._version)
                    for t in (q2k_block_index, block_counts))
        got = self._sorted.get(key)
        if got is None:
            cap = q2k_block_index.shape[-1]
            active = torch.arange(cap, device=q2k_block_index.device) < block_counts.unsqueeze(-1)
            big = torch.iinfo(torch.int32).max
            ordered = torch.where(active, q2k_block_index, big).sort(dim=-1).values
            got = torch.where(active, ordered, q2k_block_index).contiguous()
            if len(self._sorted) >= self.KEPT_PLANS:
                self._sorted.pop(next(iter(self._sorted)))
            self._sorted[key] = got
        return got

    def run(self, q, k, v, q2k_block_index, block_counts, softmax_scale, out=None):
        """SGLang's ``flash_attn_func(q, k, v, softmax_scale=..., causal=False, num_splits=1,
        block_sparse_tensors=<counts, index, 64x64>)`` on the current stream; returns ``out``."""
        import torch

        from subblock_sage import abi

        self._check(q, k, v, q2k_block_index, block_counts, out)
        if out is None:
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if q.shape[1] == 0 or k.shape[1] == 0:  # interface.py: zero output, no launch
            return out.zero_()
        index = self.sorted_index(q2k_block_index, block_counts)
        abi.launch(KERNEL, {}, {"q": q, "k": k, "v": v, "out": out, "block_counts": block_counts,
                                "q2k_block_index": index, "softmax_scale": float(softmax_scale)},
                   device=q.device, library=self.library)
        return out

    @staticmethod
    def _check(q, k, v, q2k_block_index, block_counts, out) -> None:
        import torch

        def bad(what: str, fix: str) -> ValueError:
            return ValueError(f"SGLang SM90 contender: {what}. Fix: {fix}")

        test_library.check_bshd({"q": q, "k": k, "v": v, "out": out}, 16, bad)
        B, Sq, H, _ = q.shape
        if tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or k.shape[2] != H:
            raise bad(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [B={B}, Sk, H={H}, 128]",
                      "the export has one query head per K/V head (no GQA)")
        if out is not None and tuple(out.shape) != tuple(q.shape):
            raise bad(f"out {tuple(out.shape)} must have q's shape {tuple(q.shape)}", "pass out like q")
        gq, gk = -(-Sq // BLOCK), -(-k.shape[1] // BLOCK)
        for name, t, rank in (("q2k_block_index", q2k_block_index, 4), ("block_counts", block_counts, 3)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != rank \
                    or tuple(t.shape[:3]) != (B, H, gq) or t.stride(-1) != 1:
                raise bad(f"{name} must be int32 [{B}, {H}, {gq}{', cap' if rank == 4 else ''}] with a unit "
                          f"last stride, got {getattr(t, 'dtype', type(t).__name__)} "
                          f"{tuple(getattr(t, 'shape', ()))}", "pass the plan of 64-row query blocks")
        if q2k_block_index.shape[-1] > gk:
            raise bad(f"q2k_block_index has capacity {q2k_block_index.shape[-1]} > ceil(Sk/64) = {gk} "
                      "(SGLang's interface refuses a wider index)", f"slice it to [..., :{gk}]")
        if any(t.device != q.device for t in (k, v, q2k_block_index, block_counts)):
            raise bad("all tensors must be on one CUDA device", "move them to q's device")
