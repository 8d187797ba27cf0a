"""No dead code in the product (issue 13): nothing in memory_core/, bot/ and workers/ goes unused beyond the
names tests/vulture_whitelist.py explains."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memory_core", "bot", "workers")
WHITELIST = ROOT / "tests" / "vulture_whitelist.py"
ARGS = [*PACKAGES, str(WHITELIST.relative_to(ROOT)), "--min-confidence", "60"]


def test_vulture_finds_no_unused_code_in_the_product() -> None:
    pytest.importorskip("vulture", reason="vulture is a dev dependency: pip install -e '.[dev]'")
    out = subprocess.run(
        [sys.executable, "-m", "vulture", *ARGS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, (
        "unused code (delete it; if something outside the product uses it, say so in "
        f"tests/vulture_whitelist.py):\n{out.stdout}{out.stderr}"
    )


def _modules() -> dict[str, ast.Module]:
    return {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): ast.parse(p.read_text("utf-8"))
        for d in PACKAGES
        for p in sorted((ROOT / d).glob("*.py"))
    }


def _uses(tree: ast.Module, package: str, modules: set[str]) -> set[tuple[str, str]]:
    """(module, name) pairs `tree` takes from our modules: `from m import name`, or `m.name` on an imported m."""
    alias: dict[str, str] = {}
    used: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            alias |= {a.asname or a.name.split(".")[-1]: a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = f"{package}.{base}" if base else package
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    alias[a.asname or a.name] = f"{base}.{a.name}"
                else:
                    used.add((base, a.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in alias:
            used.add((alias[node.value.id], node.attr))
    return used


def _defined(statement: ast.stmt) -> list[str]:
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [statement.name]
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    if isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    return [t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("__")]


def test_every_top_level_definition_is_used_from_where_it_lives() -> None:
    # vulture matches by name, so a function is "used" when anything of that name is; this check follows
    # each use to the module it comes from (meaning.slot_of went unseen beside the indexes' slot_of).
    modules = _modules()
    used = set().union(*(_uses(t, name.split(".")[0], set(modules)) for name, t in modules.items()))
    used |= _uses(ast.parse(WHITELIST.read_text("utf-8")), "tests", set(modules))
    unused = []
    for name, tree in modules.items():
        loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        exported = {
            e.value
            for d in tree.body
            if isinstance(d, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in d.targets)
            for e in ast.walk(d.value)
            if isinstance(e, ast.Constant)
        }
        unused += [
            f"{name}.{n}"
            for d in tree.body
            for n in _defined(d)
            if n not in loaded and n not in exported and (name, n) not in used
        ]
    assert unused == [], "unused (delete it, or say in tests/vulture_whitelist.py who uses it)"
