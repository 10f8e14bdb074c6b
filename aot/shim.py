"""C shim generator: the stable, versioned C ABI of every kernel library.

One generic launch entry driven by argument descriptors (the layouts in ``exports.json``, which
the library also embeds so the runtime can check that what it marshals is what was compiled);
``<prefix>`` is ``SYMBOL_PREFIX`` of the contract (python/subblock_sage/contract.py):

    int32_t <prefix>abi_version(void);
    const char *<prefix>target(void);            // "sm_90a", ...
    const char *<prefix>exports_json(void);      // argument layouts of every kernel
    int32_t <prefix>num_kernels(void);
    const char *<prefix>kernel_name(int32_t i);  // "kernel/variant"
    int32_t <prefix>status(int32_t *driver, int32_t *runtime, int32_t *devices);
    int32_t <prefix>device_capability(int32_t device, int32_t *major, int32_t *minor);
    int32_t <prefix>preload(int32_t device);     // load every kernel (before graph capture)
    int32_t <prefix>launch(int32_t kernel, int32_t device, void **args, int32_t n);
    int32_t <prefix>run_steps(const sbs_step_t *steps, int32_t n, int32_t device,
                              const int64_t *roots, int32_t n_roots);  // launch replay
    const char *<prefix>last_error(void);        // this thread's last error text

``run_steps`` launches a recorded sequence (the runtime's ``replay.py``): each step is a kernel, a
template of its argument block and the pointer fields to patch (``roots[root] + delta``, with the
alignment the kernel was compiled for); the stream is a root too. It checks every step first
(kernel index, argument count, offsets, root indices, alignment) and launches nothing if one
fails; a misaligned pointer returns ``SBS_MISALIGNED`` (-2) so that the caller can take its slow
path, which names the argument. One call per ``sparse_attention`` call replaces per-launch
packing in Python, which cost ~10 us of host time per launch on the H200 host.

Return values are cudaError_t codes (0 = success). Why our own loader: the header's
``*_Kernel_Module_Load`` loads onto every visible GPU without a lock; this one initialises each
kernel once and loads it per device lazily under a mutex, with a lock-free fast path.
"""

from __future__ import annotations

import json
from pathlib import Path

from aot.contract import SYMBOL_PREFIX

# The C source, with __LIB__, __TARGET__, __ABI__, __PREFIX__, __DECLS__, __TABLE__ and __JSON__
# filled in by :func:`generate`.
TEMPLATE = Path(__file__).resolve().parent / "toolchain" / "shim.c.in"


def _c_string(text: str) -> str:
    lines = []
    for chunk in [text[i : i + 100] for i in range(0, len(text), 100)] or [""]:
        esc = chunk.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(f'    "{esc}"')
    return "\n".join(lines)


def generate(exports: dict) -> str:
    decls, table = [], []
    for e in exports["kernels"]:
        p = e["prefix"]
        decls.append(
            f"extern void _mlir_{p}_cuda_init(void **);\n"
            f"extern void _mlir_{p}_cuda_load_to_device(void **);\n"
            f"extern void {e['ciface']}(void **, int32_t);"
        )
        table.append(
            f'    {{"{e["kernel"]}/{e["variant"]}", _mlir_{p}_cuda_init, '
            f"_mlir_{p}_cuda_load_to_device, {e['ciface']}, {len(e['args'])}, 0, 0, {{0}}}},"
        )
    return (
        TEMPLATE.read_text(encoding="utf-8").replace("__LIB__", exports["library"])
        .replace("__TARGET__", exports["target"])
        .replace("__ABI__", str(exports["abi_version"]))
        .replace("__PREFIX__", SYMBOL_PREFIX)
        .replace("__DECLS__", "\n".join(decls))
        .replace("__TABLE__", "\n".join(table))
        .replace("__JSON__", _c_string(json.dumps(exports, sort_keys=True)) + ";")
    )
