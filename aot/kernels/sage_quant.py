"""Sage quantizer kernels (CuTe-DSL): bf16 Q/K/V -> the operands of FlashInfer's SM120 Sage kernel.

Numerics and layouts follow FlashInfer 0.7.2.post1 ``cute_dsl/sparse/bsa_utils/sage_quant_sm120.py``
(the Triton quantizer whose output ``BlockSparseAttnForwardSageSm120Blk64`` consumes):

* Q: symmetric INT8, one scale per 32 rows. ``scale = max(amax, 1e-7) / 127``,
  ``code = clamp(rint(q / scale), -127, 127)``. ``q_scale`` has ``ceil(Sq/128)*4`` groups per
  (b, h); groups that lie wholly past Sq (pad groups) get ``1e-7 / 127``. Q is not smoothed.
* K: smoothed by the per-channel mean of K over all Sk keys (per b, h), then INT8 with one scale
  per 64 keys; the amax is taken over the *centred* values of the valid rows only.
* V: FP8-E4M3 (round to nearest even, satfinite), per-channel scale ``max(amax|V|, 1e-7) / 2.25``
  (amax over all keys), stored transposed ``[B, H, 128, round_up(Sk, 64)]`` with FlashInfer's
  16-token row permutation: token ``t = 64*blk + 16*g + i`` lands at column
  ``64*blk + 16*g + PERM16[i]``, ``PERM16[i] = (i%16//8)*2 + (i//2%4)*4 + i%2``.
  Columns of tokens >= Sk are written as exact zeros (+0.0, byte 0x00).

Deviation from FlashInfer, on purpose: FlashInfer stores the K mean in bf16 before subtracting it;
we keep it in fp32 (more accurate; softmax is invariant to the mean, so the attention result is
unaffected). Codes use ``x * (1/scale)`` instead of ``x / scale`` (differs by at most one INT8 /
E4M3 step at exact rounding ties).

Kernels (all: head dim static 128 with stride 1; every other extent and stride symbolic).
Tensors are passed in *canonical mode order*; a BHSD tensor is passed as its ``(B,S,H,D)`` view
(``x.permute(0,2,1,3)``), outputs likewise:

``sage_quant_q``          (q, q_int8, q_scale, stream)                      grid (ceil(Sq/128), H, B)
``sage_quant_kv_stats``   (k, v, k_part, v_part, stream)                    grid (C, H, B)
``sage_quant_kv_finalize``(k_part, v_part, k_mean, v_scale, seqlen_k, stream) grid (H, B)
``sage_quant_kv``         (k, v, k_mean, v_scale, k_int8, k_scale, v_fp8, stream) grid (NB, H, B)

Launch order: stats -> finalize -> kv (q is independent). K and V need the mean / amax over
all keys before any block can be quantized, so they are read twice (a stats pass and a quantize
pass); the partial-reduction workspace makes the stats pass fully parallel and deterministic
(fixed summation order, no atomics, no zero-initialised buffers), and the tiny finalize kernel
keeps the reduction of the C partials out of every quantize CTA.

Shapes (B batch, H heads, Sq/Sk lengths; C = ceil(Sk/512) = STATS_CHUNK rows; NB = ceil(Sk/64)):
  q        bf16 (B, Sq, H, 128)      strides (sym/8, sym/8, sym/8, 1)   16-byte aligned
  q_int8   int8 (B, Sq, H, 128)      strides (sym/8, sym/8, sym/8, 1)   (runtime: BHSD contiguous)
  q_scale  f32  (B, H, ceil(Sq/128)*4) strides (sym, sym, 1)
  k, v     bf16 (B, Sk, H, 128)      strides (sym/8, sym/8, sym/8, 1)
  k_part   f32  (B, H, C, 128)       workspace, strides (sym/4, sym/4, sym/4, 1)
  v_part   f32  (B, H, C, 128)       workspace, same
  k_mean   f32  (B, H, 128)          strides (sym/4, sym/4, 1)
  v_scale  f32  (B, H, 128)          strides (sym/4, sym/4, 1)
  k_int8   int8 (B, Sk, H, 128)      strides (sym/8, sym/8, sym/8, 1)   (runtime: BHSD contiguous)
  k_scale  f32  (B, H, NB)           strides (sym, sym, 1)
  v_fp8    fp8e4m3 (B, H, 128, NB*64) strides (sym/16, sym/16, sym/16, 1)
  seqlen_k int32 scalar (== Sk)

The public ``subblock_sage.quantize_sage(q, k, v, layout)`` returns a dict with keys
``q_int8`` (int8 [B,H,Sq,128] contiguous), ``q_scale`` (f32 [B,H,ceil(Sq/128)*4]),
``k_int8`` (int8 [B,H,Sk,128] contiguous), ``k_scale`` (f32 [B,H,ceil(Sk/64)]),
``v_fp8`` (float8_e4m3fn [B,H,128,ceil(Sk/64)*64] contiguous), ``v_scale`` (f32 [B,H,128]),
``k_mean`` (f32 [B,H,128]).
"""

from typing import Callable

from aot.registry import CompileSpec, Kernel, ScalarArg, StreamArg, Sym, TensorArg, Variant

HEAD_DIM = 128
Q_GROUP = 32  # rows per Q scale
Q_TILE = 128  # rows per Q CTA (4 groups, one warp each)
K_BLOCK = 64  # keys per K scale / per KV-quantize CTA
STATS_CHUNK = 512  # keys per stats CTA (one partial row of k_part / v_part)
V_SCALE_MAX = 2.25
AMAX_FLOOR = 1.0e-7

TARGETS = ("sm_90a", "sm_100a", "sm_120a", "sm_100f", "sm_120f")


def perm16(i: int) -> int:
    """Physical column (within a 16-token group) of token i of that group (FlashInfer's layout)."""
    m = i % 16
    return (m // 8) * 2 + ((m // 2) % 4) * 4 + m % 2


# ---------------------------------------------------------------------------------------------
# CuTe-DSL kernels. The DSL is imported lazily so that the registry can be listed without it.


def _build():
    import cuda.bindings.driver as cuda

    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Float8E4M3FN, Int8, Int16, Int32

    VEC = 8  # bf16 elements per 16-byte load
    NCC = HEAD_DIM // VEC  # 16 column chunks per row

    def _row(g2d, r, cc):
        # 16-byte (bf16) / 8-byte (int8) vector: elements [cc*VEC, cc*VEC+VEC) of row r
        return cute.local_tile(g2d[r, None], (VEC,), (cc,))

    def _thread_coords():
        """Thread and block index, warp, lane and the lane's 16-byte column chunk (traced in this
        order, as the kernels did inline)."""
        tidx, _, _ = cute.arch.thread_idx()
        bid = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        return tidx, bid, warp, lane, lane % NCC

    def _rows_valid(r, n):
        return cute.full((VEC,), r, Int32) < n

    # ---------------------------------------------------------------- Q
    class SageQuantQ:
        @cute.jit
        def __call__(self, q: cute.Tensor, q_int8: cute.Tensor, q_scale: cute.Tensor, stream: cuda.CUstream):
            B = q.shape[0]
            S = q.shape[1]
            H = q.shape[2]
            self.kernel(q, q_int8, q_scale).launch(
                grid=[(S + Q_TILE - 1) // Q_TILE, H, B], block=[128, 1, 1], stream=stream
            )

        @cute.kernel
        def kernel(self, mQ: cute.Tensor, mQ8: cute.Tensor, mQS: cute.Tensor):
            tidx, (bx, h, b), warp, lane, cc = _thread_coords()
            half = lane // NCC
            S = mQ.shape[1]
            gQ = mQ[b, None, h, None]
            gQ8 = mQ8[b, None, h, None]
            group = bx * (Q_TILE // Q_GROUP) + warp
            row0 = group * Q_GROUP + half

            vals = []
            # amax on the bf16 bit patterns (|x| = bits & 0x7fff; for non-negative floats the
            # integer order is the float order), so only the bf16 values stay live in registers
            bmax = cute.full((VEC,), 0, Int32)
            for i in cutlass.range_constexpr(Q_GROUP // 2):
                r = cutlass.min(row0 + 2 * i, S - 1)  # duplicate a valid row past Sq: amax unchanged
                x = _row(gQ, r, cc).load()
                vals.append(x)
                a = x.bitcast(Int16).to(Int32) & 0x7FFF
                bmax = cute.where(a > bmax, a, bmax)
            amax_bits = bmax[0]
            for j in cutlass.range_constexpr(1, VEC):
                amax_bits = cutlass.max(amax_bits, bmax[j])
            amax_bits = cute.arch.warp_reduction_max(amax_bits)
            amax = cute.full((1,), amax_bits << 16, Int32).bitcast(Float32)[0]
            if group * Q_GROUP >= S:
                amax = Float32(0.0)  # pad group: FlashInfer's scale is 1e-7/127
            amax = cute.arch.fmax(amax, Float32(AMAX_FLOOR))
            scale = amax / Float32(127.0)
            inv = Float32(1.0) / scale
            if lane == 0:
                if group < mQS.shape[2]:
                    mQS[b, h, group] = scale
            for i in cutlass.range_constexpr(Q_GROUP // 2):
                r = row0 + 2 * i
                y = cute.math.roundeven(vals[i].to(Float32) * inv)
                if r < S:
                    _row(gQ8, r, cc).store(y.to(Int8))

    # ---------------------------------------------------------------- KV stats
    STATS_THREADS = 256
    STATS_RG = STATS_THREADS // NCC  # 16 row groups
    STATS_ITERS = STATS_CHUNK // STATS_RG  # 32 rows per thread

    class SageQuantKVStats:
        @cute.jit
        def __call__(
            self, k: cute.Tensor, v: cute.Tensor, k_part: cute.Tensor, v_part: cute.Tensor, stream: cuda.CUstream
        ):
            B = k.shape[0]
            S = k.shape[1]
            H = k.shape[2]
            self.kernel(k, v, k_part, v_part).launch(
                grid=[(S + STATS_CHUNK - 1) // STATS_CHUNK, H, B], block=[STATS_THREADS, 1, 1], stream=stream
            )

        @cute.kernel
        def kernel(self, mK: cute.Tensor, mV: cute.Tensor, mKP: cute.Tensor, mVP: cute.Tensor):
            tidx, (c, h, b), warp, lane, cc = _thread_coords()
            rg = tidx // NCC
            S = mK.shape[1]
            gK = mK[b, None, h, None]
            gV = mV[b, None, h, None]

            smem = cutlass.utils.SmemAllocator()
            sSum = smem.allocate_tensor(Float32, cute.make_layout((STATS_THREADS // 32, HEAD_DIM), stride=(HEAD_DIM, 1)), 16)
            sMax = smem.allocate_tensor(Float32, cute.make_layout((STATS_THREADS // 32, HEAD_DIM), stride=(HEAD_DIM, 1)), 16)

            ksum = cute.full((VEC,), 0.0, Float32)
            vmax = cute.full((VEC,), 0.0, Float32)
            row0 = c * STATS_CHUNK + rg
            for i in cutlass.range_constexpr(STATS_ITERS):
                r = row0 + i * STATS_RG
                rc = cutlass.min(r, S - 1)
                kx = _row(gK, rc, cc).load().to(Float32)
                vx = _row(gV, rc, cc).load().to(Float32)
                ksum = ksum + cute.where(_rows_valid(r, S), kx, cute.full((VEC,), 0.0, Float32))
                vmax = cute.math.max(vmax, cute.math.abs(vx))  # duplicated valid row: amax unchanged
            # combine the two row groups of each warp (lanes l and l^16 share channels)
            ks = []
            vm = []
            for j in cutlass.range_constexpr(VEC):
                a = ksum[j]
                m = vmax[j]
                a = a + cute.arch.shuffle_sync_bfly(a, offset=16)
                m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=16))
                ks.append(a)
                vm.append(m)
            if lane < NCC:
                for j in cutlass.range_constexpr(VEC):
                    sSum[warp, cc * VEC + j] = ks[j]
                    sMax[warp, cc * VEC + j] = vm[j]
            cute.arch.sync_threads()
            ch = tidx % HEAD_DIM
            if tidx < HEAD_DIM:
                acc = Float32(0.0)
                for w in cutlass.range_constexpr(STATS_THREADS // 32):
                    acc = acc + sSum[w, ch]
                mKP[b, h, c, ch] = acc
            else:
                acc = Float32(0.0)
                for w in cutlass.range_constexpr(STATS_THREADS // 32):
                    acc = cute.arch.fmax(acc, sMax[w, ch])
                mVP[b, h, c, ch] = acc

    # ---------------------------------------------------------------- KV finalize
    FIN_SLICES = 4

    class SageQuantKVFinalize:
        @cute.jit
        def __call__(
            self,
            k_part: cute.Tensor,
            v_part: cute.Tensor,
            k_mean: cute.Tensor,
            v_scale: cute.Tensor,
            seqlen_k: Int32,
            stream: cuda.CUstream,
        ):
            B = k_part.shape[0]
            H = k_part.shape[1]
            self.kernel(k_part, v_part, k_mean, v_scale, seqlen_k).launch(
                grid=[H, B, 1], block=[HEAD_DIM * FIN_SLICES, 1, 1], stream=stream
            )

        @cute.kernel
        def kernel(self, mKP: cute.Tensor, mVP: cute.Tensor, mKMean: cute.Tensor, mVScale: cute.Tensor, seqlen_k: Int32):
            tidx, _, _ = cute.arch.thread_idx()
            h, b, _ = cute.arch.block_idx()
            ch = tidx % HEAD_DIM
            sl = tidx // HEAD_DIM
            C = mKP.shape[2]
            smem = cutlass.utils.SmemAllocator()
            sSum = smem.allocate_tensor(Float32, cute.make_layout((FIN_SLICES, HEAD_DIM), stride=(HEAD_DIM, 1)), 16)
            sMax = smem.allocate_tensor(Float32, cute.make_layout((FIN_SLICES, HEAD_DIM), stride=(HEAD_DIM, 1)), 16)
            acc = Float32(0.0)
            mx = Float32(0.0)
            for c in cutlass.range(sl, C, FIN_SLICES, unroll=4):
                acc = acc + mKP[b, h, c, ch]
                mx = cute.arch.fmax(mx, mVP[b, h, c, ch])
            sSum[sl, ch] = acc
            sMax[sl, ch] = mx
            cute.arch.sync_threads()
            if tidx < HEAD_DIM:
                tot = Float32(0.0)
                vm = Float32(0.0)
                for s in cutlass.range_constexpr(FIN_SLICES):
                    tot = tot + sSum[s, ch]
                    vm = cute.arch.fmax(vm, sMax[s, ch])
                mKMean[b, h, ch] = tot / Float32(seqlen_k)
                mVScale[b, h, ch] = cute.arch.fmax(vm, Float32(AMAX_FLOOR)) / Float32(V_SCALE_MAX)

    # ---------------------------------------------------------------- KV quantize
    class SageQuantKV:
        @cute.jit
        def __call__(
            self,
            k: cute.Tensor,
            v: cute.Tensor,
            k_mean: cute.Tensor,
            v_scale: cute.Tensor,
            k_int8: cute.Tensor,
            k_scale: cute.Tensor,
            v_fp8: cute.Tensor,
            stream: cuda.CUstream,
        ):
            B = k.shape[0]
            S = k.shape[1]
            H = k.shape[2]
            self.kernel(k, v, k_mean, v_scale, k_int8, k_scale, v_fp8).launch(
                grid=[(S + K_BLOCK - 1) // K_BLOCK, H, B], block=[128, 1, 1], stream=stream
            )

        @cute.kernel
        def kernel(
            self,
            mK: cute.Tensor,
            mV: cute.Tensor,
            mKMean: cute.Tensor,
            mVScale: cute.Tensor,
            mK8: cute.Tensor,
            mKS: cute.Tensor,
            mV8: cute.Tensor,
        ):
            tidx, _, _ = cute.arch.thread_idx()
            blk, h, b = cute.arch.block_idx()
            warp = tidx // 32
            lane = tidx % 32
            t = tidx % 64  # index within the K half (warps 0-1) or the V half (warps 2-3)
            cc = t % NCC
            g = t // NCC  # 16-token group within the 64-key block
            S = mK.shape[1]
            row0 = blk * K_BLOCK + g * 16

            smem = cutlass.utils.SmemAllocator()
            sAmax = smem.allocate_tensor(Float32, cute.make_layout(4), 16)

            if warp < 2:
                # ---- K: centre, block amax, INT8
                gK = mK[b, None, h, None]
                gK8 = mK8[b, None, h, None]
                mean = cute.local_tile(mKMean[b, h, None], (VEC,), (cc,)).load()
                kc = []
                amax = Float32(0.0)
                for i in cutlass.range_constexpr(16):
                    rc = cutlass.min(row0 + i, S - 1)
                    x = _row(gK, rc, cc).load().to(Float32) - mean
                    kc.append(x)
                    amax = cute.arch.fmax(amax, cute.math.abs(x).reduce(cute.ReductionOp.MAX, Float32(0.0), 0))
                amax = cute.arch.warp_reduction_max(amax)
                if lane == 0:
                    sAmax[warp] = amax
                cute.arch.barrier(barrier_id=1, number_of_threads=64)
                amax = cute.arch.fmax(cute.arch.fmax(sAmax[0], sAmax[1]), Float32(AMAX_FLOOR))
                scale = amax / Float32(127.0)
                inv = Float32(1.0) / scale
                if tidx == 0:
                    if blk < mKS.shape[2]:
                        mKS[b, h, blk] = scale
                for i in cutlass.range_constexpr(16):
                    r = row0 + i
                    if r < S:
                        y = cute.math.roundeven(kc[i] * inv)
                        _row(gK8, r, cc).store(y.to(Int8))
            else:
                # ---- V: per-channel scale, FP8, transpose + 16-token permutation
                gV = mV[b, None, h, None]
                gV8 = mV8[b, h, None, None]
                vs = cute.local_tile(mVScale[b, h, None], (VEC,), (cc,)).load()
                inv = cute.full((VEC,), 1.0, Float32) / vs
                buf = cute.make_rmem_tensor(cute.make_layout((16, VEC), stride=(1, 16)), Float32)
                zero = cute.full((VEC,), 0.0, Float32)
                for i in cutlass.range_constexpr(16):
                    r = row0 + i
                    rc = cutlass.min(r, S - 1)
                    x = _row(gV, rc, cc).load().to(Float32) * inv
                    x = cute.where(_rows_valid(r, S), x, zero)
                    buf[perm16(i), None].store(x)
                if (blk + 1) * K_BLOCK <= mV8.shape[3]:
                    for j in cutlass.range_constexpr(VEC):
                        col = buf[None, j].load().to(Float8E4M3FN)
                        cute.local_tile(gV8[cc * VEC + j, None], (16,), (blk * 4 + g,)).store(col)

    return SageQuantQ, SageQuantKVStats, SageQuantKVFinalize, SageQuantKV


_CLASSES = None


def _classes():
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _build()
    return _CLASSES


# ---------------------------------------------------------------------------------------------
# Argument specs


def _s(key: str, div: int = 1) -> Sym:
    return Sym(key, div=div, width=64)


B = Sym("B")
H = Sym("H")
SQ = Sym("Sq")
SK = Sym("Sk")


def _bshd(name: str, dtype: str, seq: Sym, div: int) -> TensorArg:
    return TensorArg(
        name,
        dtype,
        (B, seq, H, HEAD_DIM),
        (_s(f"{name}.stride_b", div), _s(f"{name}.stride_s", div), _s(f"{name}.stride_h", div), 1),
        align=16,
    )


def _bhx(name: str, last: int | Sym, div: int = 1, align: int = 4) -> TensorArg:
    return TensorArg(
        name, "float32", (B, H, last), (_s(f"{name}.stride_b", div), _s(f"{name}.stride_h", div), 1), align=align
    )


def _part(name: str) -> TensorArg:
    return TensorArg(
        name,
        "float32",
        (B, H, Sym("C"), HEAD_DIM),
        (_s(f"{name}.stride_b", 4), _s(f"{name}.stride_h", 4), _s(f"{name}.stride_c", 4), 1),
        align=16,
    )


def _args_q() -> list:
    return [_bshd("q", "bfloat16", SQ, 8), _bshd("q_int8", "int8", SQ, 8), _bhx("q_scale", Sym("Gq")), StreamArg()]


def _args_stats() -> list:
    return [_bshd("k", "bfloat16", SK, 8), _bshd("v", "bfloat16", SK, 8), _part("k_part"), _part("v_part"), StreamArg()]


def _args_finalize() -> list:
    return [
        _part("k_part"),
        _part("v_part"),
        _bhx("k_mean", HEAD_DIM, 4, 16),
        _bhx("v_scale", HEAD_DIM, 4, 16),
        ScalarArg("seqlen_k", "int32", 1),
        StreamArg(),
    ]


def _args_kv() -> list:
    return [
        _bshd("k", "bfloat16", SK, 8),
        _bshd("v", "bfloat16", SK, 8),
        _bhx("k_mean", HEAD_DIM, 4, 16),
        _bhx("v_scale", HEAD_DIM, 4, 16),
        _bshd("k_int8", "int8", SK, 8),
        _bhx("k_scale", Sym("NBk")),
        TensorArg(
            "v_fp8",
            "float8_e4m3fn",
            (B, H, HEAD_DIM, Sym("Skp", div=K_BLOCK)),
            (_s("v_fp8.stride_b", 16), _s("v_fp8.stride_h", 16), _s("v_fp8.stride_d", 16), 1),
            align=16,
        ),
        StreamArg(),
    ]


def _spec(index: int, args: Callable[[], list]) -> Callable[[str, Variant], CompileSpec]:
    """compile_spec of the index-th class of ``_classes()``: its ``__call__`` with ``args()``."""

    def compile_spec(target: str, variant: Variant) -> CompileSpec:
        return CompileSpec(_classes()[index]().__call__, args())

    return compile_spec


_DEFAULT = (Variant("default"),)

# (name, doc, argument specs), in the order of the classes that _classes() returns
_KERNELS = (
    ("sage_quant_q", "bf16 Q (B,Sq,H,128) -> INT8 Q + one fp32 scale per 32 rows (SM120 Sage layout)", _args_q),
    ("sage_quant_kv_stats", "per-512-key partial sums of K and partial amax |V| per channel (workspace)",
     _args_stats),
    ("sage_quant_kv_finalize", "reduce the stats partials: fp32 K channel mean, V channel scale amax/2.25",
     _args_finalize),
    ("sage_quant_kv",
     "K smoothing + INT8 per 64 keys; V FP8-E4M3 per channel, transposed HDS with 16-token permutation", _args_kv),
)
KERNELS: list[Kernel] = [
    Kernel(name, doc, TARGETS, _DEFAULT, _spec(i, args)) for i, (name, doc, args) in enumerate(_KERNELS)
]
