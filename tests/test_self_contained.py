"""The suite carries its own data: no test reads a path outside the repository.

A fresh `git clone` with nothing beside it must collect and run (issue 14). Every `Path(__file__).parents[N]`
in tests/ must stay inside the clone, and no test names the workplace's notes or data folders.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()
TESTS = sorted(p for p in (ROOT / "tests").rglob("*.py") if p != HERE)
OUTSIDE = ("shared/research", "shared/data", "/work/", "../shared")


def _escapes(path: Path) -> list[str]:
    """Where `path` climbs out of the repository or names a folder that only exists beside it."""
    root = len(path.relative_to(ROOT).parts) - 1  # parents[root] is the repository root
    text = path.read_text("utf-8")
    found: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
            and node.slice.value > root
        ):
            found.append(f"line {node.lineno}: parents[{node.slice.value}] is above the repository")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and any(o in node.value for o in OUTSIDE)
        ):
            found.append(f"line {node.lineno}: {node.value!r}")
    # `Path(...) / "shared" / "research"` spells the same folder in pieces.
    if '/ "shared" / "research"' in text or '/ "shared" / "data"' in text:
        found.append('joins "shared" / "research" or "shared" / "data"')
    return found


@pytest.mark.parametrize("path", TESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_test_reads_outside_the_repository(path: Path) -> None:
    assert _escapes(path) == []


def test_the_scenario_data_is_in_the_repository_with_its_source() -> None:
    data = ROOT / "tests" / "data"
    assert (data / "hexclaw-eval-scenarios.json").is_file()
    note = (data / "SOURCE.md").read_text("utf-8")
    assert "hexclaw-eval-scenarios.json" in note and "Apache" in note
    assert (data / "LICENSE-hexclaw-Apache-2.0.txt").is_file()
