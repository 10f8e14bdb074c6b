// Launch shim for the peer comparison in compare.py: builds SpargeAttn's SM90 Sage attention
// kernel (thu-ml/SpargeAttn, csrc/qattn/qk_int_sv_f8_cuda_sm90.cuh) from a checkout the user
// supplies (build.sh), so that it runs on the same GPU, shapes and plans as ours in one process.
// Nothing of SpargeAttn is in this repository: the header is included from that checkout.
#include <cassert>  // the SpargeAttn header uses assert without including it
#include <cuda.h>
#include <cuda_runtime.h>
static CUresult my_encode(CUtensorMap* m, CUtensorMapDataType t, cuuint32_t r, void* g, const cuuint64_t* s,
                          const cuuint64_t* st, const cuuint32_t* b, const cuuint32_t* es, CUtensorMapInterleave i,
                          CUtensorMapSwizzle sw, CUtensorMapL2promotion p, CUtensorMapFloatOOBfill f) {
  typedef CUresult (*fn_t)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                           const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                           CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static fn_t fn = nullptr;
  if (!fn) {
    cudaDriverEntryPointQueryResult q;
    cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", (void**)&fn, cudaEnableDefault, &q);
  }
  return fn(m, t, r, g, s, st, b, es, i, sw, p, f);
}
// the header calls the driver API by name; resolve it through the runtime (no libcuda link)
#define cuTensorMapEncodeTiled my_encode
#include "qk_int_sv_f8_cuda_sm90.cuh"

// mode 0: no PV threshold; mode 1: per-block PV threshold (pvt: one float per head), the
// variant spas_sage_attn's Python API calls. HND layouts, Q per-warp (16-row) scales, K per
// 128-key block scales, V^T FP8 [B, H, 128, padded_kv] with per-channel scales (fused).
extern "C" int sparge_run(void* q, void* k, void* v, void* o, void* lut, void* valid, void* qs, void* ks, void* vs,
                          int B, int qo, int kv, int padded, int H, float sm_scale, int mode, void* pvt) {
  uint32_t sbq = H * qo * 128, shq = qo * 128, ssq = 128;
  uint32_t sbk = H * kv * 128, shk = kv * 128, ssk = 128;
  uint32_t sbv = H * 128 * padded, shv = 128 * padded, sdv = padded;
  if (mode == 0)
    SpargeAttentionSM90Dispatched<64, 128, 128, 128, 2, 0, nv_bfloat16, false, true, false>(
        (int8_t*)q, (int8_t*)k, (__nv_fp8_e4m3*)v, (nv_bfloat16*)o, nullptr, (int32_t*)lut, (int32_t*)valid, nullptr,
        (float*)qs, (float*)ks, (float*)vs, B, qo, kv, padded, H, H, sbq, ssq, shq, sbk, ssk, shk, sbv, shv, sdv,
        sbq, ssq, shq, sm_scale);
  else
    SpargeAttentionSM90Dispatched<64, 128, 128, 128, 2, 1, nv_bfloat16, false, true, false>(
        (int8_t*)q, (int8_t*)k, (__nv_fp8_e4m3*)v, (nv_bfloat16*)o, nullptr, (int32_t*)lut, (int32_t*)valid,
        (float*)pvt, (float*)qs, (float*)ks, (float*)vs, B, qo, kv, padded, H, H,
        sbq, ssq, shq, sbk, ssk, shk, sbv, shv, sdv, sbq, ssq, shq, sm_scale);
  return (int)cudaGetLastError();
}
