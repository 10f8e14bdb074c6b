"""The project's lab: what only the project's own measurements use, kept out of the runtime wheel
(which ships what serves a call). Importable as ``benchmark.lab`` from the repository root.

- bench.py: `subblock-sage bench` with the contenders below (``python -m benchmark.lab.bench``)
- contenders.py: the block-sparse contenders (FlexAttention, cuDNN's block-sparse attention,
  SGLang's and cuDNN's SM90 kernels from the test library) and their checks
- cudnn_fp8.py: cuDNN's FP8 SDPA (nvidia-cudnn-frontend) as a dense contender
- sglang_sm90.py, cudnn_sm90.py: launchers of the kernels compiled ahead of time into the
  never-shipped sm_90a test library (``SBS_TEST_LIBS=ON ./wheels/build.sh``)
- test_library.py: where those launchers find the test library, and how they open it

The lab imports the runtime (subblock_sage), never the reverse (tests/cpu/test_layering.py).
"""
