"""IMPORT-ONLY STAND-IN for sgl_kernel (see ../_import_only.py): the real wheel is ~370 MB of
CUDA code; the SubBlock path never calls it. Dense attention that would use its FlashAttention
is served by the harness's dense stand-in (tests/sglang/harness.py says so in the log)."""
from _import_only import make_package

make_package(globals(), __name__, "0.4.10+stand-in")
