"""Kernel experiments: builds that the release never compiles and the runtime never names.

Each module here (``sm90``: the SM90a attention kernels' timing experiments) exposes ``KERNELS``
like a kernel module of ``aot/kernels``: kernels of the same name as registered ones, with the
shipped variants plus its own. They are compiled only on request (CMake ``-DSBS_EXPERIMENTS=ON``,
``python -m aot.export plan --experiments``): ``registry.all_kernels(experiments=True)`` then takes
them in place of the registered kernels of the same name, and the plan exports every variant they
define (aot/serving.py filters only what ships). Some are wrong on purpose (ablations that skip
loads, to time what the loads cost), and one measured slower than what ships: so they live outside
``aot/kernels``, which holds only what a release compiles.

How a benchmark runs one: each experiment export records a ``label`` among its params; a
``SelectionPolicy(label=...)`` (``BACKEND.with_policy(label=...)``) asks for the export of that
label in place of the default selection, through the runtime's ordinary call path. A release
library has no labelled export, so such a policy fails there with a LookupError.
"""
