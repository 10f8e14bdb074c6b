"""Shared fixtures. Tests marked `aot` need the build environment (CuTe-DSL); the others need the
runtime installed (tests/run.sh runs each group in its own environment)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "wheels" / "dist"
sys.path.insert(0, str(ROOT))  # `aot` and `tests.cpu.fixtures` importable


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_ignore_collect(collection_path, config):
    """In the build environment (`-m aot`, no torch, no installed runtime) collect only the
    modules that hold build-time tests, so runtime-only modules are not even imported."""
    if config.getoption("markexpr") == "aot" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_"):
        return "mark.aot" not in collection_path.read_text()
    return None


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    gpu = _has_gpu()
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.gpu)
            if not gpu:
                item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def dist_dir() -> Path:
    if not any(DIST.glob("subblock_sage_kernels_cu13-*.whl")):
        pytest.skip("wheels/dist is empty: run ./wheels/build.sh first (tests/run.sh does)")
    return DIST


@pytest.fixture
def kdir(dist_dir, tmp_path, monkeypatch):
    """A private copy of the built kernels package, selected through SUBBLOCK_SAGE_LIBRARY_DIR."""
    import platform
    import zipfile

    from subblock_sage import loader

    whl = sorted(dist_dir.glob(f"subblock_sage_kernels_cu13-*{platform.machine()}.whl"))[-1]
    with zipfile.ZipFile(whl) as z:
        z.extractall(tmp_path / "unpacked")
    path = tmp_path / "unpacked" / "subblock_sage_kernels"
    monkeypatch.setenv(loader.ENV_LIBRARY_DIR, str(path))
    loader.reset_cache()
    yield path
    loader.reset_cache()
