"""Hybrid recall in the memory service (issue 17): entries are embedded after the write, off the turn, and
a recall then finds an entry by its vector alone while embedding nothing but the query."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from memory_core.namespace import Namespace
from memory_core.ops import Remember
from workers.embedding import Embeddings
from workers.memory_service import MemoryService
from workers.runtime import build
from workers.settings import Settings

NS = Namespace.of("t1", "alice", "default")
NOW = datetime(2026, 6, 26, 12, 0, tzinfo=UTC)
TOPICS = {"hike": 0, "hikers": 0, "hills": 0, "tea": 1, "oolong": 1}


def topic_vectors(texts: list[str]) -> Any:
    """A deterministic stand-in embedder: hiking words share one axis, tea words another, any other word
    or character is hashed into the remaining 62 (test code only)."""
    out = np.zeros((len(texts), 64), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in text.lower().split():
            for token in [word] if word.isascii() else list(word):
                out[i, TOPICS.get(token, 2 + sum(map(ord, token)) % 62)] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def _service(data_dir: Path, calls: list[tuple[str, int]]) -> MemoryService:
    """A memory service on `topic_vectors` that logs each embedding call, and two entries written."""

    def embed(texts: list[str], kind: Any) -> Any:
        calls.append((kind, len(texts)))
        return topic_vectors(texts)

    rt = build(Settings(data_dir=data_dir, now=NOW, config_path=data_dir / "none.toml"), git=False)
    svc = MemoryService(rt, embeddings=Embeddings(embed))
    svc.apply(NS, [Remember(text="weekend hike in the hills"), Remember(text="oolong tea every morning")])
    return svc


def test_entries_are_embedded_after_the_write_and_a_recall_embeds_only_its_query(data_dir: Path) -> None:
    calls: list[tuple[str, int]] = []
    svc = _service(data_dir, calls)
    svc.wait_for_embeddings()
    # In the background, after the write: the relevance floor's reference set, then both entries.
    assert ("passage", 2) in calls and {kind for kind, _ in calls} == {"passage"}

    calls.clear()
    got = svc.recall(NS, "hikers", NOW)  # no shared word (hikers ≠ hike): only the vector can find it
    assert got and got[0].entry.text == "weekend hike in the hills"
    assert calls == [("query", 1)]  # the turn embedded its query and nothing else


def test_the_same_question_again_embeds_nothing(data_dir: Path) -> None:
    """A retried turn (or `/recall` of the same words) reuses the query's vector and finds the same."""
    calls: list[tuple[str, int]] = []
    svc = _service(data_dir, calls)
    svc.wait_for_embeddings()
    first = [s.entry.text for s in svc.recall(NS, "hikers", NOW)]
    calls.clear()
    again = [s.entry.text for s in svc.recall(NS, "hikers", NOW)]
    assert again == first and again[0] == "weekend hike in the hills" and calls == []
    assert svc.recall(NS, "oolong", NOW)[0].entry.text == "oolong tea every morning"
    assert calls == [("query", 1)]  # a new question is embedded
