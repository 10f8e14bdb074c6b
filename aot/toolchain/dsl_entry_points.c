/* The CUDA entry points that CuTe-DSL's exported host code calls, as thin wrappers over the public
 * CUDA runtime (libcudart_static.a, redistributable under the CUDA Toolkit EULA). Compiled into
 * every kernel library instead of linking nvidia-cutlass-dsl's libcuda_dialect_runtime_static.a,
 * whose license does not allow redistributing it.
 *
 * Where the signatures come from: only our own generated code. `CUTE_DSL_KEEP=ir` /
 * `compiled.ir_module` of an exported kernel (the lowered LLVM-dialect module that export_to_c
 * turns into the .o) declares each callee, e.g.
 *     llvm.func @_cudaLibraryLoadData(!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, i32,
 *                                     !llvm.ptr, !llvm.ptr, i32) -> i32
 * and its call sites show the semantics: every call returns an i32 status that is compared with 0
 * and, when non-zero, returned unchanged by the generated function (into the `cudaError_t *ret`
 * of the exported header's init/load/launch structs); results are written through the first
 * pointer argument; the launch config is an alloca'd
 * {dim3 grid; dim3 block; i64 smem; ptr stream; ptr attrs; i32 nattrs} = cudaLaunchConfig_t with
 * cudaLaunchAttribute {i32 id; pad; 64-byte value} entries; the kernel handle passed to
 * _cudaFuncSetAttribute / _cudaLaunchKernelEx is the cudaKernel_t that _cudaLibraryGetKernel
 * stored. Argument for argument these are the public functions of the same name (without the
 * leading underscore) documented in the CUDA Runtime / Driver API references, so each wrapper
 * forwards unchanged and returns the runtime's cudaError_t. The machine code of the archive was
 * never looked at (its license forbids it); docs/design/build.md ("Own DSL entry points") has more.
 *
 * The one driver-API call, cuKernelGetAttribute, is reached through the runtime's
 * cudaGetDriverEntryPointByVersion, so the libraries still need no libcuda at link time (the
 * runtime dlopens the driver, as before). Its CUresult is returned as is: for the codes it can
 * return (CUDA_ERROR_INVALID_VALUE 1, _NOT_INITIALIZED 3, _DEINITIALIZED 4, _INVALID_DEVICE 101,
 * _INVALID_HANDLE 400, _INVALID_CONTEXT 201) the numeric value names the same condition as the
 * cudaError_t of that number, which is how the shim prints it.
 *
 * Hidden visibility: these names stay inside each library (the version script exports only
 * subblock_sage_v1_*), so two libraries in one process never interpose each other's copies. */
#include <pthread.h>
#include <stddef.h>

#define SBS_HIDDEN __attribute__((visibility("hidden")))

typedef int cudaError_t;      /* enum cudaError */
typedef int CUresult;         /* enum cudaError_enum */
typedef struct CUlib_st *cudaLibrary_t;
typedef struct CUkern_st *cudaKernel_t; /* == CUkernel (cuda.h: typedef struct CUkern_st *CUkernel) */

/* Public CUDA runtime API (cuda_runtime_api.h of the nvidia-cuda-runtime wheel; declared here
 * because that wheel ships the header without its crt/ includes). Enum parameters are int-sized;
 * the launch config is only passed through, so it stays an opaque pointer. */
extern cudaError_t cudaGetDevice(int *device);
extern cudaError_t cudaDeviceGetAttribute(int *value, int attr, int device);
extern cudaError_t cudaFuncSetAttribute(const void *func, int attr, int value);
extern cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel, int attr, int value, int device);
extern cudaError_t cudaLaunchKernelExC(const void *config, const void *func, void **args);
extern cudaError_t cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name);
extern cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code, void *jit_options,
                                       void **jit_option_values, unsigned num_jit_options,
                                       void *library_options, void **library_option_values,
                                       unsigned num_library_options);
extern cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **func, unsigned cuda_version,
                                                    unsigned long long flags, int *driver_status);

enum { sbs_cudaErrorNotSupported = 801, sbs_cudaErrorSymbolNotFound = 500 };

SBS_HIDDEN cudaError_t _cudaGetDevice(int *device) { return cudaGetDevice(device); }

SBS_HIDDEN cudaError_t _cudaDeviceGetAttribute(int *value, int attr, int device) {
    return cudaDeviceGetAttribute(value, attr, device);
}

SBS_HIDDEN cudaError_t _cudaFuncSetAttribute(const void *func, int attr, int value) {
    return cudaFuncSetAttribute(func, attr, value);
}

SBS_HIDDEN cudaError_t _cudaKernelSetAttributeForDevice(cudaKernel_t kernel, int attr, int value, int device) {
    return cudaKernelSetAttributeForDevice(kernel, attr, value, device);
}

SBS_HIDDEN cudaError_t _cudaLaunchKernelEx(const void *config, const void *func, void **args) {
    return cudaLaunchKernelExC(config, func, args);
}

SBS_HIDDEN cudaError_t _cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name) {
    return cudaLibraryGetKernel(kernel, library, name);
}

SBS_HIDDEN cudaError_t _cudaLibraryLoadData(cudaLibrary_t *library, const void *code, void *jit_options,
                                            void **jit_option_values, unsigned num_jit_options,
                                            void *library_options, void **library_option_values,
                                            unsigned num_library_options) {
    return cudaLibraryLoadData(library, code, jit_options, jit_option_values, num_jit_options,
                               library_options, library_option_values, num_library_options);
}

/* cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev),
 * introduced in CUDA 12.0: resolved once per process from the driver the runtime loaded. */
typedef CUresult (*sbs_cuKernelGetAttribute_t)(int *, int, cudaKernel_t, int);
static sbs_cuKernelGetAttribute_t g_cuKernelGetAttribute;
static cudaError_t g_resolve_error;
static pthread_once_t g_resolve_once = PTHREAD_ONCE_INIT;

static void sbs_resolve_driver(void) {
    void *fn = NULL;
    int status = 0;
    g_resolve_error = cudaGetDriverEntryPointByVersion("cuKernelGetAttribute", &fn, 12000, 0ULL, &status);
    if (g_resolve_error == 0 && (fn == NULL || status != 0))
        g_resolve_error = sbs_cudaErrorSymbolNotFound; /* driver older than CUDA 12.0 */
    if (g_resolve_error == 0) g_cuKernelGetAttribute = (sbs_cuKernelGetAttribute_t)fn;
}

SBS_HIDDEN CUresult _cuKernelGetAttribute(int *value, int attr, cudaKernel_t kernel, int device) {
    pthread_once(&g_resolve_once, sbs_resolve_driver);
    if (!g_cuKernelGetAttribute) return g_resolve_error ? g_resolve_error : sbs_cudaErrorNotSupported;
    return g_cuKernelGetAttribute(value, attr, kernel, device);
}
