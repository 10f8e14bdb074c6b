"""Shared test helpers (importable as ``tests.helpers.*``; not collected as tests; test modules never
import each other)."""
