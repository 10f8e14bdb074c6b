"""Print the directory holding cudart's static library (libcudart_static.a) of this Python env.

Only cudart: nvidia-cutlass-dsl's libcuda_dialect_runtime_static.a is not linked (its license
forbids redistribution; aot/toolchain/dsl_entry_points.c provides what the libraries need)."""

import importlib.util
from pathlib import Path


def static_lib_dirs() -> list[str]:
    cudart = Path(importlib.util.find_spec("nvidia").submodule_search_locations[0])
    return [str(cudart / "cu13" / "lib")]


if __name__ == "__main__":
    print(";".join(static_lib_dirs()))
