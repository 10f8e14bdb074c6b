"""Rules the test suite itself must keep (issue 21: tests that can fail).

Every ``pytest.raises`` names the message it expects (``match=``): a bare ``pytest.raises(ValueError)``
is satisfied by *any* ValueError, including one from a different check than the test is about.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def _bare_raises(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "raises" and isinstance(f.value, ast.Name) \
                and f.value.id == "pytest":
            if not any(kw.arg == "match" for kw in node.keywords):
                where = path.relative_to(TESTS.parent) if path.is_relative_to(TESTS.parent) else path.name
                out.append(f"{where}:{node.lineno}")
    return out


def test_every_pytest_raises_names_its_message():
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 20  # the scan really sees the suite
    bare = [hit for p in files for hit in _bare_raises(p)]
    assert not bare, "pytest.raises without match= (name the expected message): " + ", ".join(bare)


def test_the_scan_finds_a_bare_raises(tmp_path):
    """The rule above can fail: a file with a bare pytest.raises is reported, one with match= not."""
    src = "import pytest\n\ndef test_x():\n    with pytest.raises(ValueError):\n        int('x')\n"
    bad, good = tmp_path / "probe_bad.py", tmp_path / "probe_good.py"
    bad.write_text(src)
    good.write_text(src.replace("(ValueError)", "(ValueError, match='invalid literal')"))
    assert _bare_raises(bad) == ["probe_bad.py:4"]
    assert _bare_raises(good) == []
