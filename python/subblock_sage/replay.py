"""Launch replay: the per-signature fast path of ``sparse_attention``, ``subblock_attention`` and
``route`` (``calls.py`` asks it; all three record and replay the same way, one list of launches per
signature).

Why: the full path of a call (validation, backend, plan, variant selection, packing every
argument block in Python) costs 140-280 us of host time per call on the H200 host
(MEASUREMENTS.md), more than the kernels at small per-GPU shapes. Everything it decides depends only
on the call's *signature*: shapes, strides, dtypes and devices of the tensors, the scalar
arguments, and which inputs share an allocation (and at what offset). Only the data pointers and
the stream change from call to call. So:

* the first call of a signature runs the full path with a :class:`Recorder` attached to ``abi``;
  it keeps, per launch, the packed argument block and where each pointer field came from (an
  input plus a byte offset, the result, or a temporary);
* later calls of that signature read the pointers, take the stream's workspace for the
  temporaries and the stream's quantizer buffer (``workspace.py``), launch the
  steps that do not write the result through the library's ``run_steps`` (``aot/shim.py``, which
  patches the pointers in C and launches), allocate the result (torch's caching allocator,
  current stream) and launch the rest.

What keeps a replay exactly the full path:

* A recording is kept only if the full path did nothing on the GPU but allocate (``empty``),
  take views and launch through ``abi``: a ``TorchDispatchMode`` watches it, and any other
  operator on a CUDA tensor (a copy of a non-contiguous plan or of non-contiguous counts, the
  PyTorch plan fallback past ``MAX_KEY_BLOCKS``) marks the signature as not replayable; it then
  always takes the full path. Failed calls (bad input) record nothing.
* Per call, what depends on pointers is checked again: the alignment of every patched pointer
  (in C, before the first launch; a miss takes the full path, which names the argument) and
  ``out``'s overlap with the inputs (``validation.check_out_aliasing``).
* Temporaries freed and reused inside one full-path call share a workspace slot, as they shared
  memory in the full path; every slot starts on a 256-byte boundary.

``route`` returns a :class:`~subblock_sage.plan.Plan`, two results (index and counts), not one
tensor: a full path that returns a Plan is replayed by :class:`PlanReplay`, whose second result
is one more root (``RESULT2``, an eleventh root that only it passes), and which allocates both and
rebuilds the Plan from the recorded host facts (topk, key-block size, Sk). Its temporaries (the
pooled cells, the score buffer) take workspace slots as the attention calls' do. It keeps no spare
result and takes no early launch: the attention replay's path (``Replay.launch``) is unchanged and
pays nothing for it.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from . import abi
from . import workspace as _ws
from .contract import SAGE_SYNC_ARG
from .plan import Plan

# roots: the pointers a replay patches in (indices into the per-call int64 array); a routed call
# (subblock_attention) has no INDEX / COUNTS input: its plan is a temporary of the call. A route
# call's inputs are q, k and its int32 dense rows in the first three (Q, K, V); its two results
# are RESULT (index) and RESULT2 (counts), which only a PlanReplay passes (N_ROOTS + 1 roots)
Q, K, V, INDEX, COUNTS, OUT, STREAM, RESULT, WORKSPACE, SYNC, RESULT2 = range(11)
N_ROOTS = 10
INPUT_NAMES = ("q", "k", "v", "q2k_block_index", "block_counts", "out")
SLOT_ALIGN = 256
MAX_SIGNATURES = 256  # cache bound: a serving process sees a handful of shapes
SBS_MISALIGNED = -2  # run_steps' return code for a misaligned pointer (aot/shim.py)

# The operators a recordable full path may run on CUDA tensors: allocations and views.
_ALLOWED_OPS = frozenset({
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "view", "_unsafe_view",
    "permute", "as_strided", "alias", "detach", "slice", "select", "transpose", "unsqueeze",
    "squeeze", "expand", "t", "_reshape_alias", "unbind", "split", "narrow",
})


class _Patch(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_int32), ("root", ctypes.c_int32), ("delta", ctypes.c_int64),
                ("align", ctypes.c_int64)]


class _Step(ctypes.Structure):
    _fields_ = [("kernel", ctypes.c_int32), ("nargs", ctypes.c_int32), ("size", ctypes.c_int32),
                ("npatch", ctypes.c_int32), ("block", ctypes.c_void_p),
                ("arg_offsets", ctypes.c_void_p), ("patches", ctypes.c_void_p)]


_Roots = ctypes.c_int64 * N_ROOTS
_pack_roots = struct.Struct(f"<{N_ROOTS}q").pack  # bytes: ~5x cheaper than a ctypes array
_pack_plan_roots = struct.Struct(f"<{N_ROOTS + 1}q").pack  # PlanReplay's: RESULT2 last


def _base(t) -> int:
    """Address of the start of ``t``'s allocation (its storage)."""
    return t.data_ptr() - t.storage_offset() * t.element_size()


def keyed(q, k, v, index, counts, out, topk, block_size_k, softmax_scale, compute_mode, layout):
    """``(key, pointers)`` of a call, or None when the call cannot be keyed (unusual scalar types:
    the full path validates them). ``key`` is the replay cache key: every tensor's (shape,
    stride, dtype, device), the scalars, and which inputs have the same data pointer (k is v,
    say: the recording resolves a pointer to the first input that has it, so a replay needs the
    same pattern). ``pointers`` are the six inputs' data pointers (-5 / -6 for a None
    ``counts`` / ``out``: no patch reads them), the first roots of :meth:`Replay.launch`.

    One flat tuple, written out tensor by tensor, and the pointers taken once for both uses:
    building and hashing the key is most of a replayed call's Python (2.5 us against 4.1 for a
    nested tuple of per-tensor tuples, build machine; the H200 host takes several times that
    right after a host wait)."""
    if not (type(topk) is int or topk is None) or type(block_size_k) is not int:
        return None
    if not (softmax_scale is None or type(softmax_scale) is float) or type(compute_mode) is not str \
            or type(layout) is not str or q is None or k is None or v is None or index is None:
        return None
    key = (topk, block_size_k, softmax_scale, compute_mode, layout,
           q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
           v.shape, v.stride(), v.dtype, v.get_device(),
           index.shape, index.stride(), index.dtype, index.get_device(),
           None if counts is None else (counts.shape, counts.stride(), counts.dtype, counts.get_device()),
           None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()))
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), index.data_ptr(),
            -5 if counts is None else counts.data_ptr(), -6 if out is None else out.data_ptr())
    if len(set(ptrs)) != 6:
        key += (tuple(ptrs.index(p) for p in ptrs),)
    return key, ptrs


def keyed_subblock(q, k, v, out, sparsity, compute_mode, n_q, n_k, softmax_scale, layout):
    """:func:`keyed` for a ``subblock_attention`` call: its tensors' (shape, stride, dtype,
    device), its scalars and the pattern of shared pointers, behind a tag no ``sparse_attention``
    key starts with; the pointers have no plan (-4 / -5: no patch reads them). The device is in the
    key, and with it the target's router geometry, which the full path derives from it."""
    if not (type(sparsity) is float or type(sparsity) is int) or type(n_q) is not int \
            or not (n_k is None or type(n_k) is int) or not (softmax_scale is None or type(softmax_scale) is float) \
            or type(compute_mode) is not str or type(layout) is not str or q is None or k is None or v is None:
        return None
    key = ("subblock", sparsity, compute_mode, n_q, n_k, softmax_scale, layout,
           q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
           v.shape, v.stride(), v.dtype, v.get_device(),
           None if out is None else (out.shape, out.stride(), out.dtype, out.get_device()))
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), -4, -5, -6 if out is None else out.data_ptr())
    if len(set(ptrs)) != 6:
        key += (tuple(ptrs.index(p) for p in ptrs),)
    return key, ptrs


def keyed_route(q, k, dense_rows, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, layout):
    """:func:`keyed` for a ``route`` call: q's, k's and ``dense_rows``' (shape, stride, dtype,
    device), the scalars as given (the full path derives the rest from them and the device) and
    the pattern of shared pointers, behind a tag no attention key starts with. The pointers are
    q's, k's and ``dense_rows``' (-3 for None), the rest unused (-4 .. -6). ``dense_rows`` of
    another dtype than int32 is keyed as given: the replay converts it as the full path does
    (``calls.route``) and patches the converted tensor's pointer in."""
    if not (type(sparsity) is float or type(sparsity) is int) or type(n_q) is not int \
            or not (n_k is None or type(n_k) is int) or not (softmax_scale is None or type(softmax_scale) is float) \
            or type(block_size_k) is not int or not (budget_granularity is None or type(budget_granularity) is int) \
            or type(layout) is not str or q is None or k is None:
        return None
    key = ("route", sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, layout,
           q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, k.get_device(),
           None if dense_rows is None else (dense_rows.shape, dense_rows.stride(), dense_rows.dtype,
                                            dense_rows.get_device()))
    ptrs = (q.data_ptr(), k.data_ptr(), -3 if dense_rows is None else dense_rows.data_ptr(), -4, -5, -6)
    if len(set(ptrs)) != 6:
        key += (tuple(ptrs.index(p) for p in ptrs),)
    return key, ptrs


def signature(q, k, v, index, counts, out, topk, block_size_k, softmax_scale, compute_mode, layout):
    """The replay cache key of a call (:func:`keyed`), or None when the call cannot be keyed."""
    got = keyed(q, k, v, index, counts, out, topk, block_size_k, softmax_scale, compute_mode, layout)
    return None if got is None else got[0]


def signature_subblock(q, k, v, out, sparsity, compute_mode, n_q, n_k, softmax_scale, layout):
    """The replay cache key of a ``subblock_attention`` call (:func:`keyed_subblock`), or None."""
    got = keyed_subblock(q, k, v, out, sparsity, compute_mode, n_q, n_k, softmax_scale, layout)
    return None if got is None else got[0]


def signature_route(q, k, dense_rows, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, layout):
    """The replay cache key of a ``route`` call (:func:`keyed_route`), or None."""
    got = keyed_route(q, k, dense_rows, sparsity, softmax_scale, n_q, n_k, block_size_k, budget_granularity, layout)
    return None if got is None else got[0]


def pointers(q, k, v, index, counts, out) -> tuple:
    """The pointers :func:`keyed` hands to :meth:`Replay.launch` (tests, benchmarks)."""
    return keyed(q, k, v, index, counts, out, None, 64, None, "", "")[1]


# ---------------------------------------------------------------------------------------------
# Recording


def _op_watch():
    """A TorchDispatchMode that records every operator touching a CUDA tensor outside
    ``_ALLOWED_OPS`` (in ``mode.bad``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Watch(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch (2.11, 2.14) wraps a mode's __torch_dispatch__ in torch._disable_dynamo
            # unless this says no; its first call imports torch._dynamo, and with it sympy,
            # torch.fx and torch.distributed.fsdp: 3.7 s on the build machine, 4-5 s of a fresh
            # process's first call on an H100 host (MEASUREMENTS.md). A recording runs only in
            # eager calls, never under dynamo, so there is nothing to skip.
            return False

        def __init__(self):
            super().__init__()
            self.bad: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            res = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name not in _ALLOWED_OPS:
                flat, _ = tree_flatten((args, kwargs, res))
                dev = (kwargs or {}).get("device")
                if dev is not None and torch.device(dev).type == "cuda" or any(
                        isinstance(x, torch.Tensor) and x.is_cuda for x in flat):
                    self.bad.append(str(func))
            return res

    return Watch()


@dataclass
class _Seen:
    """One launch as the full path made it."""
    entry: Any
    offsets: tuple
    block: bytes
    tensors: list  # (arg index, data_ptr, storage base, storage nbytes, align)
    stream_args: list  # arg indices of stream arguments


@dataclass
class Recorder:
    """Collects the launches of one full-path call (``abi`` calls :meth:`add`)."""
    inputs: tuple  # (q, k, v, index, counts, out) as the caller passed them
    lib: Any = None
    device: Optional[int] = None
    seen: list = field(default_factory=list)
    bad: list = field(default_factory=list)
    sync: Optional[tuple] = None  # (storage base, words) of the quantizer buffer the call took

    def note_sync(self, t) -> None:
        """A launch took ``t`` as the stream's quantizer buffer (``workspace.sync_buffer``'s, its
        ``contract.SAGE_SYNC_ARG`` argument: :meth:`add`): a replay takes its stream's buffer instead."""
        if self.sync is not None and self.sync[0] != _base(t):
            self.bad.append("two quantizer buffers in one call")
        self.sync = (_base(t), max(int(t.numel()), 0 if self.sync is None else self.sync[1]))

    def add(self, entry, blk, lib, device, block: bytes, values: dict) -> None:
        if self.lib is None:
            self.lib, self.device = lib, device
        elif lib is not self.lib or device != self.device:
            self.bad.append("launches on two libraries or devices")
        tensors, streams = [], []
        for i, a in enumerate(entry.args):
            if a["kind"] == "tensor":
                t = values[a["name"]]
                if t.numel() == 0:
                    # nothing of it can be read or written (no index is in bounds), so its
                    # pointer needs no patch; torch gives such tensors data_ptr() 0, which would
                    # otherwise become a workspace slot the size of their storage (a zero-row
                    # view of q: all of q's bytes, per call)
                    continue
                tensors.append((i, t.data_ptr(), _base(t), t.untyped_storage().nbytes(), int(a["align"])))
                if a["name"] == SAGE_SYNC_ARG:
                    self.note_sync(t)
            elif a["kind"] == "stream":
                streams.append(i)
        self.seen.append(_Seen(entry, blk.offsets, block, tensors, streams))

    def build(self, result) -> "Replay":
        """The replay of the recorded call; ``result`` is what the full path returned: its output
        tensor (a :class:`Replay`) or a :class:`~subblock_sage.plan.Plan` (``route``: a
        :class:`PlanReplay`, index and counts its two results)."""
        if self.bad:
            raise _NotReplayable("; ".join(self.bad))
        if not self.seen:
            raise _NotReplayable("no kernel launch")
        plan = result if isinstance(result, Plan) else None
        if plan is not None:
            if plan.counts is None or self.inputs[OUT] is not None:
                raise _NotReplayable("a plan without counts, or an out argument with a plan")
            if self.sync is not None:  # route has no quantizer launch; PlanReplay takes no buffer
                raise _NotReplayable("a quantizer buffer in a call that returns a plan")
            results = ((plan.index, RESULT), (plan.counts, RESULT2))
        else:
            results = () if self.inputs[OUT] is not None else ((result, RESULT),)
        exact: dict[int, int] = {}  # data pointer -> first input that has it
        by_base: dict[int, list] = {}  # allocation -> inputs in it
        for i, t in enumerate(self.inputs):
            if t is not None:
                exact.setdefault(t.data_ptr(), i)
                by_base.setdefault(_base(t), []).append((i, t.data_ptr()))
        res_bases: dict[int, int] = {}  # result allocation -> its root
        for t, root in results:
            res_bases.setdefault(_base(t), root)
        sync_base = None if self.sync is None else self.sync[0]
        slots: dict[int, int] = {}  # temporary allocation base -> bytes needed
        for s in self.seen:
            for _, p, b, nbytes, _ in s.tensors:
                if p not in exact and b not in by_base and b not in res_bases and b != sync_base:
                    slots[b] = max(slots.get(b, 0), nbytes, p - b + 1)
        slot_off, ws = {}, 0
        for b, n in slots.items():
            slot_off[b] = ws
            ws += -(-n // SLOT_ALIGN) * SLOT_ALIGN
        steps = []
        for s in self.seen:
            patches = []
            for i, p, b, _, align in s.tensors:
                if p in exact:  # an input or a view of it at its data pointer (permutes)
                    root, delta = exact[p], 0
                elif b in by_base:  # a view at an offset into an input
                    if len(by_base[b]) > 1:  # the signature does not say which input it came from
                        raise _NotReplayable("a view at an offset into inputs that share an allocation")
                    root, delta = by_base[b][0][0], p - by_base[b][0][1]
                elif b in res_bases:
                    root, delta = res_bases[b], p - b
                elif b == sync_base:
                    root, delta = SYNC, p - b
                else:
                    root, delta = WORKSPACE, slot_off[b] + (p - b)
                patches.append((s.offsets[i], root, delta, align))  # the data pointer leads the struct
            patches += [(s.offsets[i], STREAM, 0, 0) for i in s.stream_args]
            steps.append((s.entry, s.offsets, s.block, patches))
        specs = [(tuple(t.shape), tuple(t.stride()), t.dtype) for t, _ in results]
        if plan is not None:
            return PlanReplay(self.lib, self.device, steps, ws, specs, (plan.topk, plan.block_size_k, plan.seqlen_k))
        return Replay(self.lib, self.device, steps, ws, specs[0] if specs else None,
                      0 if self.sync is None else self.sync[1])


class _NotReplayable(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Replay


class Replay:
    """The recorded launches of one signature, ready for ``Library.run_steps``."""

    def __init__(self, lib, device: int, steps: list, workspace_bytes: int, result, sync_words: int = 0):
        self.lib, self.device = lib, device
        self.alloc_device = device  # where result and workspace live (an int: that CUDA device)
        self.workspace_bytes = max(int(workspace_bytes), 1)
        self.sync_words = int(sync_words)  # the quantizer buffer's words (0: no quantizer launch)
        self.result = result  # (shape, stride, dtype) of the allocated output; None: out given
        self.kernels = [e.name for e, _, _, _ in steps]
        arr = (_Step * len(steps))()
        keep = []
        for st, (entry, offsets, block, patches) in zip(arr, steps):
            blk = ctypes.create_string_buffer(block, len(block))
            offs = (ctypes.c_int32 * len(offsets))(*offsets)
            pts = (_Patch * max(len(patches), 1))(*[_Patch(*p) for p in patches])
            keep += [blk, offs, pts]
            st.kernel, st.nargs, st.size, st.npatch = entry.index, len(offsets), len(block), len(patches)
            st.block, st.arg_offsets, st.patches = (ctypes.addressof(x) for x in (blk, offs, pts))
        self._steps, self._keep = arr, keep
        self._address, self._n = ctypes.addressof(arr), len(steps)
        # the launches before the first that writes the result go out before the result is
        # allocated (``launch``) when they run long enough to hide the allocation and a second
        # C call: the Sage quantizer's (17-150 us at the host shapes). The plan kernel alone (bf16:
        # 2.4-16 us) does not: the GPU then waits 11-16 us for the host between it and the
        # attention kernel (CUPTI on the H200 host, H=4 S=8192 and H=2 S=37760), so a call without
        # the quantizer allocates first and makes all its launches in one C call.
        first_result = next((i for i, (_, _, _, patches) in enumerate(steps) if any(p[1] == RESULT for p in patches)),
                            len(steps))
        self._early = first_result if self.sync_words else 0
        # the next call's result is allocated after this call's launches (``launch``) up to
        # SPARE_RESULT_MAX bytes of storage
        self._spare_ok = result is not None and _extent_bytes(result) <= SPARE_RESULT_MAX

    def __call__(self, q, k, v, index, counts, out):
        """:meth:`launch` with the pointers of these tensors (tests, benchmarks)."""
        return self.launch(pointers(q, k, v, index, counts, out), out)

    def launch(self, ptrs: tuple, out):
        """Launch on the current stream; ``ptrs``: the call's input pointers (:func:`keyed`),
        ``out``: the caller's output tensor or None. Returns the output, or None when a pointer
        is misaligned (the caller takes the full path, which names the argument; launches that
        went out before the misaligned one only wrote this call's workspace).

        Host time is what a call costs at small shapes, and right after the host waited for the
        GPU it runs several times slower than back to back (H200 host: 120 us for this path at
        H=2 S=37760 after a synchronize, ~30 us while the GPU is busy, 30-100 us from one call to
        the next; MEASUREMENTS.md). So nothing Python runs between a call's launches: the result
        is the one allocated after the previous call's launches on this stream (the stream's
        spare, allocated while the GPU is busy: ~2.5 us then, against 9-42 us right after a
        wait), and all launches go out in one C call. The workspace and the quantizer buffer are
        the stream's own (``workspace.PerStream``), not allocations per call.

        The steady state (an eager call on a stream whose workspace, quantizer buffer and spare
        fit this replay) reads them as plain ints from one ``workspace.PerStream``; everything
        else takes :meth:`_launch`. With the pointers ``keyed`` took for the key, the public call
        costs 7.5 us on the build machine against 8.7 with a tensor call per buffer
        (``benchmark/host_stub.py``)."""
        stream = _ws.current_stream(self.device)
        capture = _ws.capturing()
        if capture or self.workspace_bytes > _ws.WORKSPACE_KEEP_MAX:
            return self._launch(ptrs, out, stream, capture, fresh_ws=True)
        st = _streams.get((self.alloc_device, stream))
        if st is None or st.ws_bytes < self.workspace_bytes or (self.sync_words and (
                st.sync_words < self.sync_words or st.launches >= _ws.SAGE_SYNC_EPOCHS)) or (
                out is None and st.spare_spec != self.result):
            return self._launch(ptrs, out, stream, False, fresh_ws=False)
        if self.sync_words:
            st.launches += 1
        if out is None:
            res, st.spare, st.spare_spec = st.spare, None, None
        else:
            res = out
        rc = self.lib._run_steps(self._address, self._n, self.device,
                                 _pack_roots(*ptrs, stream, res.data_ptr(), st.ws_ptr, st.sync_ptr), N_ROOTS)
        if rc:
            return self._failed(rc)
        if out is None and self._spare_ok:
            st.spare, st.spare_spec = self._new_result(), self.result
        return res

    def _launch(self, ptrs: tuple, out, stream: int, capture: bool, fresh_ws: bool):
        """:meth:`launch` outside the steady state: a stream's first replay, a grown workspace
        or quantizer buffer, another result shape, a result over SPARE_RESULT_MAX, a CUDA-graph
        capture (a workspace and a quantizer buffer of its own from the graph's pool, no spare
        taken or left) or a workspace over WORKSPACE_KEEP_MAX (``fresh_ws``: the workspace is
        allocated for this call). Without a spare the launches that do not need the result (the
        quantizer's and the plan's after it) go out first and the result is allocated while they
        run (a call without the quantizer allocates first: ``__init__``). ``capture``: the
        stream is being captured into a CUDA graph (``launch`` asked)."""
        dev = self.device
        # the tensors stay referenced (these locals) until the launches are enqueued: a fresh
        # workspace or quantizer buffer dropped earlier returns to the allocator, and the next
        # allocation of this call (the quantizer buffer, the result) could take its memory (under
        # capture: the quantizer buffer inside the call's dropped workspace, a launch failure)
        ws_t = _ws.stream_workspace(self.alloc_device, stream, self.workspace_bytes, fresh_ws)
        sync_t = _ws.stream_sync(self.alloc_device, stream, self.sync_words, capture) if self.sync_words else None
        ws = ws_t.data_ptr()
        sync = 0 if sync_t is None else sync_t.data_ptr()
        first = 0
        if out is not None:
            res = out
        else:
            st = None if capture else _streams.get((self.alloc_device, stream))
            res = None
            if st is not None and st.spare_spec is not None:
                if st.spare_spec == self.result:
                    res = st.spare
                st.spare, st.spare_spec = None, None
            if res is None:
                if self._early:
                    rc = self.lib._run_steps(self._address, self._early, dev,
                                             _pack_roots(*ptrs, stream, 0, ws, sync), N_ROOTS)
                    if rc:
                        return self._failed(rc)
                    first = self._early
                res = self._new_result()
        address = self._address + first * ctypes.sizeof(_Step)
        rc = self.lib._run_steps(address, self._n - first, dev, _pack_roots(*ptrs, stream, res.data_ptr(), ws, sync),
                                 N_ROOTS)
        if rc:
            return self._failed(rc)
        if out is None and self._spare_ok and not capture:
            st = _ws.per_stream(self.alloc_device, stream)
            st.spare, st.spare_spec = self._new_result(), self.result
        return res

    def _new_result(self):
        import torch

        shape, stride, dtype = self.result
        return torch.empty_strided(shape, stride, dtype=dtype, device=self.alloc_device)

    def _failed(self, rc):
        """None for a misaligned pointer (the caller takes the full path); otherwise raises the
        library's error (its text names the kernel and the CUDA error)."""
        if rc == SBS_MISALIGNED:
            return None
        from .errors import LaunchError

        raise LaunchError(f"{self.lib.target} on cuda:{self.device}: {self.lib.last_error()}")


class PlanReplay(Replay):
    """The recorded launches of a call that returns a :class:`~subblock_sage.plan.Plan`
    (``route``): two results, index (root ``RESULT``) and counts (``RESULT2``), and the plan's
    host facts (topk, key-block size, Sk), as the full path made them.

    Simpler than :meth:`Replay.launch` on purpose: both results are allocated (torch's caching
    allocator, current stream) before one ``run_steps`` call launches every step, and no spare is
    kept (the stream's one spare slot is the attention calls', whose replay takes it by result
    spec: a route between two attention calls would throw it away every time). The workspace is
    the stream's (the attention calls' buffer, grown to the larger need; kernels on one stream run
    in order), a fresh one under CUDA-graph capture or past ``WORKSPACE_KEEP_MAX``."""

    def __init__(self, lib, device: int, steps: list, workspace_bytes: int, results, facts: tuple):
        super().__init__(lib, device, steps, workspace_bytes, None)
        self.results = tuple(results)  # ((shape, stride, dtype) of index, of counts)
        self.facts = tuple(facts)  # Plan(index, counts, *facts)

    def __call__(self, q, k, dense_rows=None):
        """:meth:`launch` with the pointers of these tensors (tests, benchmarks); ``dense_rows``:
        int32, as the full path launches it."""
        return self.launch(keyed_route(q, k, dense_rows, 0.0, None, 4, None, 64, None, "")[1])

    def launch(self, ptrs: tuple):
        """Launch on the current stream; ``ptrs``: q's, k's and the int32 dense rows' pointers
        (:func:`keyed_route`, the dense rows' converted by the caller). Returns the Plan, or None
        when a pointer is misaligned (nothing launched; the caller takes the full path, which names
        the argument)."""
        import torch

        stream = _ws.current_stream(self.device)
        # the workspace stays referenced (ws) until the launches are enqueued: a fresh one dropped
        # earlier returns to the allocator, and the results could take its memory
        ws = _ws.stream_workspace(self.alloc_device, stream, self.workspace_bytes, _ws.capturing())
        (ishape, istride, idtype), (cshape, cstride, cdtype) = self.results
        index = torch.empty_strided(ishape, istride, dtype=idtype, device=self.alloc_device)
        counts = torch.empty_strided(cshape, cstride, dtype=cdtype, device=self.alloc_device)
        rc = self.lib._run_steps(self._address, self._n, self.device,
                                 _pack_plan_roots(*ptrs, stream, index.data_ptr(), ws.data_ptr(), 0,
                                                  counts.data_ptr()), N_ROOTS + 1)
        if rc:
            return self._failed(rc)
        return Plan(index, counts, *self.facts)


# ---------------------------------------------------------------------------------------------
# The next call's result, kept in the stream's ``workspace.PerStream``

_streams = _ws.streams  # (device, raw stream) -> its PerStream (the same dict: cleared, never rebound)

# bytes of storage up to which a replay keeps its stream's next result allocated (``launch``):
# above it the kernels run long enough that the allocation is noise, and the process does not
# hold a large unused tensor (H=2 S=37760: 19 MB; H=14 S=37760: 135 MB)
SPARE_RESULT_MAX = 64 << 20


def _extent_bytes(result) -> int:
    """Bytes of storage a (shape, stride, dtype) result spans."""
    shape, stride, dtype = result
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(shape, stride))) * dtype.itemsize


# ---------------------------------------------------------------------------------------------
# The cache and the entry point

_cache: dict[tuple, Any] = {}  # signature -> Replay, or the reason it is not replayable (str)
_lock = threading.Lock()


def lookup(key):
    return _cache.get(key)


def record(key, inputs: tuple, full_path):
    """Run ``full_path()`` (the validated full call) while recording; cache what it teaches about
    ``key``; return its result. An exception propagates and caches nothing."""
    rec = Recorder(inputs)
    watch = _op_watch()
    prev = abi.recorder()
    abi.set_recorder(rec)
    try:
        with watch:
            result = full_path()
    finally:
        abi.set_recorder(prev)
    try:
        if watch.bad:
            raise _NotReplayable("device work outside abi: " + ", ".join(sorted(set(watch.bad))))
        entry: Any = rec.build(result)
    except _NotReplayable as e:
        entry = str(e)
    with _lock:
        if len(_cache) >= MAX_SIGNATURES:
            _cache.clear()
        _cache[key] = entry
    return result


def clear() -> None:
    """Forget every recording and free the workspaces (tests; a process never needs it:
    libraries are not reloaded)."""
    with _lock:
        _cache.clear()
    _ws.release_workspaces()


__all__ = ["signature", "signature_subblock", "signature_route", "keyed", "keyed_subblock", "keyed_route", "lookup",
           "record", "clear", "Replay", "PlanReplay", "Recorder"]
