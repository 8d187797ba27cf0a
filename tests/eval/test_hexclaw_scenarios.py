"""HexClaw's recall scenarios (data nobody here wrote): every want id in, every must-not id out.

The data is a copy in tests/data/ (source and licence in tests/data/SOURCE.md).

Seeds are loaded through `lucid import`'s path (facts as given), per user namespace, and queried through
the product's recall with the scenario's clock.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_core.lineformat import parse_time
from memory_core.namespace import Namespace
from memory_core.ops import Put
from memory_core.recall import recall
from memory_core.store import Store
from memory_core.writer import Writer
from workers.memory_service import MemoryService
from workers.runtime import build
from workers.settings import Settings

DATA = Path(__file__).resolve().parents[1] / "data" / "hexclaw-eval-scenarios.json"
SCENARIOS = json.loads(DATA.read_text("utf-8"))


def _seed_entry(seed: dict) -> dict:
    return {
        "id": seed["id"],
        "text": seed["content_zh"],
        "type": seed["type"],
        "subject": seed.get("subject_zh"),
        "valid_from": seed.get("valid_from"),
        "valid_to": seed.get("valid_to"),
        "supersedes": [seed["supersedes"]] if seed.get("supersedes") else [],
        "hits": seed.get("recall_count") or 0,
        "pinned": bool(seed.get("pinned")),
        "confidence": seed.get("confidence") or None,
        "at": seed.get("accessed_at"),
        "last": seed.get("accessed_at"),
    }


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if "seeds" in s], ids=lambda s: s["id"])
def test_seeded_scenario(scenario: dict, data_dir: Path) -> None:
    store = Store(data_dir)
    writer = Writer(store)
    for seed in scenario["seeds"]:
        writer.submit(Namespace.of("t", seed["user_id"], "default"), [Put(entry=_seed_entry(seed))])
    now = parse_time(scenario["clock"])
    rt = build(Settings(data_dir=data_dir, now=now))
    ns = Namespace.of("t", scenario["user_id"], "default")
    got = [s.entry.id for s in MemoryService(rt).recall(ns, scenario["query_zh"], now, k=scenario["top_k"])]
    for want in scenario["want_ids"]:
        assert want in got, (scenario["id"], got)
    for bad in scenario["must_not_ids"]:
        assert bad not in got, (scenario["id"], got)


@pytest.mark.parametrize("case", [s for s in SCENARIOS if s["id"] in ("D1", "D2")], ids=lambda s: s["id"])
def test_zero_evidence_is_never_returned(case: dict) -> None:
    from memory_core.entry import Entry

    now = parse_time(case["clock"])
    entries = [
        Entry(id=c["id"], text=c["content_zh"], type=c["type"], at=now)
        for c in case["candidates_precomputed"]
    ]
    got = [s.entry.id for s in recall(entries, case["query_zh"], now, k=case["top_k"])]
    assert got == case["want_ids"]


def test_relevance_with_vectors_needs_vector_evidence() -> None:
    """D3: with vectors, an unrelated candidate (lowest cosine, no lexical evidence) is cut."""
    from memory_core.entry import Entry

    case = next(s for s in SCENARIOS if s["id"] == "D3")
    now = parse_time(case["clock"])
    cands = case["candidates_precomputed"]
    entries = [Entry(id=c["id"], text=c["content_zh"], at=now) for c in cands]
    # Unit vectors whose dot product with the query vector is exactly the scenario's cosine.
    vectors = {c["id"]: [c["vector_score"], (1 - c["vector_score"] ** 2) ** 0.5] for c in cands}
    got = [
        s.entry.id for s in recall(entries, "孩子能吃花生吗", now, query_vector=[1.0, 0.0], vectors=vectors)
    ]
    assert "related" in got and got[0] == "related"
