"""A module docstring says what the module is for in one or two lines (issue 13); explanations live in docs/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_product_module_docstring_has_one_or_two_lines() -> None:
    long = {}
    for path in sorted(p for d in ("memory_core", "bot", "workers") for p in (ROOT / d).glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text("utf-8")))
        if doc is not None and len(doc.splitlines()) > 2:
            long[str(path.relative_to(ROOT))] = len(doc.splitlines())
    assert long == {}, "move the explanation to docs/ (ARCHITECTURE.md, MEMORY.md, RELIABILITY.md …)"
