"""Build-time only: kernel registry, CuTe-DSL kernels, upstream adapters, export, C shim codegen.

Never shipped in a wheel. Data flows one way: registry -> export -> shim -> link (CMake) -> wheel.
"""
