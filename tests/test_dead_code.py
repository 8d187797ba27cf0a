"""No dead code in the product (issue 13): vulture finds nothing in memory_core/, bot/ and workers/ beyond
the names tests/vulture_whitelist.py explains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["memory_core", "bot", "workers", "tests/vulture_whitelist.py", "--min-confidence", "60"]


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
