"""`subblock-sage bench` (bench.py) and its clock and power sampling (power.py, with the ``[bench]``
extra). Other libraries' kernels as contenders are the project's lab: benchmark/lab, never shipped."""
