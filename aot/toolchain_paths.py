"""Print the directories holding the DSL's and cudart's static libraries of this Python env."""

import importlib.util
from pathlib import Path


def static_lib_dirs() -> list[str]:
    dsl = Path(importlib.util.find_spec("nvidia_cutlass_dsl").submodule_search_locations[0])
    cudart = Path(importlib.util.find_spec("nvidia").submodule_search_locations[0])
    return [str(dsl / "cu13" / "lib"), str(cudart / "cu13" / "lib")]


if __name__ == "__main__":
    print(";".join(static_lib_dirs()))
