"""Shared test helpers (importable as ``tests.helpers.*``; not collected as tests)."""
