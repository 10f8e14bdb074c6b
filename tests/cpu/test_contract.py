"""The build/runtime contract (python/subblock_sage/contract.py) is its constants' only definition.

These tests read the source tree (not the installed runtime), so they fail when someone writes a
second definition of a contract constant or assembles a kernel variant name on the runtime side.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "python" / "subblock_sage" / "contract.py"
# Nothing is exempt (the sm90 kernel, once one long module, is split by concern: aot/kernels/sm90/).
EXEMPT: set = set()


def _sources():
    for top in ("python", "aot"):
        for p in sorted((ROOT / top).rglob("*.py")):
            if p not in EXEMPT:
                yield p


def _load_contract():
    import importlib.util

    spec = importlib.util.spec_from_file_location("contract_under_test", CONTRACT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up while they are defined)
    spec.loader.exec_module(mod)
    return mod


C = _load_contract()
# Patterns that would be a second definition (or a hard-coded copy) of a contract value.
DEFINITIONS = {
    "ABI_VERSION": re.compile(r"^\s*ABI_VERSION\s*=\s*\d|\"abi_version\":\s*\d"),
    "SYMBOL_PREFIX": re.compile(r"subblock_sage_v(\d|\{)"),
    "KERNELS_DIST": re.compile(re.escape(f'"{C.KERNELS_DIST}"')),
    "KERNELS_PACKAGE": re.compile(re.escape(f'"{C.KERNELS_PACKAGE}"')),
    "MAX_KEY_BLOCKS": re.compile(r"^\s*MAX_KEY_BLOCKS\s*=\s*\d|\b65536\b"),
    "SAGE_STATS_GROUP": re.compile(r"^\s*(SAGE_)?STATS_GROUP\s*=\s*\d"),
    "HEAD_DIM": re.compile(r"^\s*(\w+_)?HEAD_DIM\s*=\s*\d"),
    "Q_BLOCK": re.compile(r"^\s*(Q_)?BLOCK\s*=\s*\d"),  # 64 query rows (the FlashInfer tiles' BLOCK too)
    "BLOCK_SIZES_K": re.compile(r"^\s*BLOCK_SIZES_K\s*=|\(64,\s*128\)"),
    "LOG2E": re.compile(r"^\s*LOG2E\s*=|1\.44269504"),
}


@pytest.mark.parametrize("name", sorted(DEFINITIONS))
def test_contract_value_defined_once(name):
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in _sources()
            for i, line in enumerate(p.read_text().splitlines(), 1) if DEFINITIONS[name].search(line)]
    assert hits == [f"python/subblock_sage/contract.py:{_line_of(name)}"], hits


def _line_of(name: str) -> int:
    lines = CONTRACT.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if DEFINITIONS[name].search(line))


def test_detector_finds_a_second_definition(tmp_path):
    """The patterns above do match a duplicate (so the test above can fail)."""
    assert DEFINITIONS["MAX_KEY_BLOCKS"].search("MAX_KEY_BLOCKS = 65536  # copy")
    assert DEFINITIONS["ABI_VERSION"].search("ABI_VERSION = 1")
    assert DEFINITIONS["SYMBOL_PREFIX"].search('getattr(lib, f"subblock_sage_v1_{name}")')
    assert DEFINITIONS["HEAD_DIM"].search("SAGE_HEAD_DIM = 128")
    assert DEFINITIONS["Q_BLOCK"].search("BLOCK = 64") and not DEFINITIONS["Q_BLOCK"].search("BLOCK = Q_BLOCK")
    assert DEFINITIONS["BLOCK_SIZES_K"].search("        for bk in (64, 128):")
    assert DEFINITIONS["LOG2E"].search("LOG2E = 1.4426950408889634")


def test_version_script_exports_the_contract_prefix():
    """aot/toolchain/exports.map (read by the linker, not Python) keeps exactly the prefix."""
    text = (ROOT / "aot" / "toolchain" / "exports.map").read_text()
    assert re.search(rf"global:\s*{re.escape(C.SYMBOL_PREFIX)}\*;", text), text
    assert f"SUBBLOCK_SAGE_{C.ABI_VERSION} " in text


def test_no_variant_name_assembled_in_runtime():
    """The runtime selects kernels by parameters (Library.kernel), never by a built name."""
    bad = re.compile(r"f\"k\{|_cnt\"|\"(rows|topk)_bs|_(i64|i32)\"|(clc|static)_(rows|topk)|\"default\"\s*,\s*\{|"
                     r"\.entry\(")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for p in sorted((ROOT / "python" / "subblock_sage").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if bad.search(line)]
    assert not hits, hits


def test_select_variant():
    vs = [("k64_cnt", {"block_k": 64, "counts": True, "pair": True}),
          ("k64_flat_cnt", {"block_k": 64, "counts": True, "wgs": 0}),
          ("k64", {"block_k": 64, "counts": False, "pair": True}),
          ("k64_eager_cnt", {"block_k": 64, "counts": True, "pair": True, "refill": "eager"})]
    assert C.select_variant("x", vs, {"block_k": 64, "counts": True, "wgs": None}) == "k64_cnt"
    assert C.select_variant("x", vs, {"block_k": 64, "counts": True, "wgs": 0}) == "k64_flat_cnt"
    assert C.select_variant("x", vs, {"block_k": 64, "counts": False}) == "k64"
    with pytest.raises(LookupError, match="several variants"):
        C.select_variant("x", vs, {"block_k": 64, "counts": True})
    with pytest.raises(LookupError, match="no variant of x"):
        C.select_variant("x", vs, {"block_k": 128})


def test_modes_served():
    assert C.modes_served(["sm90_bsa_bf16", *C.SAGE_QUANT_KERNELS, "sm90_bsa_sage"]) == ("sage_fp8", "bf16")
    assert C.modes_served(["fi_sm100_bf16_fwd", *C.SAGE_QUANT_KERNELS]) == ("bf16",)
    assert C.modes_served(["fi_sm120_sage_fwd"]) == ()  # no quantizer, no Sage
