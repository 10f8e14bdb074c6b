"""IMPORT-ONLY STAND-IN for Triton: CPU runs of tests/sglang only (the GPU harness uses the real
Triton, so this lives apart from ../stubs); see ../stubs/_import_only.py."""
from _import_only import make_package

make_package(globals(), __name__, "3.5.0")
