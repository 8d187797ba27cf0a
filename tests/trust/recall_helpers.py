"""Helpers for the honest-recall tests (issue 16, part 2), beside those in `turns.py`: an entry's hit count
as MEMORY.md shows it, and the unrelated requests the relevance floor is tested on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memory_core.lineformat import parse_file
from tests.trust.turns import memory_file, ns
from workers.runtime import Runtime

DATA = Path(__file__).resolve().parents[1] / "data"


def hits(runtime: Runtime, text: str, user: str = "alice") -> int:
    """The hit count MEMORY.md shows for the entry whose text is `text`."""
    runtime.writer.flush(ns(user))  # hit feedback rides the next batch: apply it now
    parsed = parse_file(memory_file(runtime, user))
    found = [e for e in parsed.entries() if e.text == text]
    assert found, f"{text!r} is not in MEMORY.md"
    return found[0].hits


def unrelated_set() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "unrelated_requests.json").read_text("utf-8"))
    return data
