"""Torch-facing operators: thin wrappers that validate, allocate and launch AOT kernels."""
