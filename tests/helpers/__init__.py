"""Shared test helpers (imported by test modules; test modules never import each other)."""
