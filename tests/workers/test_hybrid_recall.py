"""Hybrid recall in the memory service (issue 17): entries are embedded after the write, off the turn, and
a recall then finds an entry by its vector alone while embedding nothing but the query."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memory_core.namespace import Namespace
from memory_core.ops import Remember
from tests.memory_core.test_rawindex import CharEmbedder
from workers.embedding import Embeddings
from workers.memory_service import MemoryService
from workers.runtime import build
from workers.settings import Settings

NS = Namespace.of("t1", "alice", "default")
NOW = datetime(2026, 6, 26, 12, 0, tzinfo=UTC)


def test_entries_are_embedded_after_the_write_and_a_recall_embeds_only_its_query(data_dir: Path) -> None:
    calls: list[tuple[str, int]] = []
    chars = CharEmbedder()

    def embed(texts: list[str], kind: Any) -> Any:
        calls.append((kind, len(texts)))
        return chars(texts, kind)

    rt = build(Settings(data_dir=data_dir, now=NOW, config_path=data_dir / "none.toml"), git=False)
    svc = MemoryService(rt, embeddings=Embeddings(embed))
    svc.apply(NS, [Remember(text="weekend hike in the hills"), Remember(text="oolong tea every morning")])
    svc.wait_for_embeddings()
    assert sorted(calls) == [("passage", 2)]  # both entries, in the background, after the write

    calls.clear()
    got = svc.recall(NS, "hikers", NOW)  # no shared word (hikers ≠ hike): only the vector can find it
    assert got and got[0].entry.text == "weekend hike in the hills"
    assert calls == [("query", 1)]  # the turn embedded its query and nothing else
