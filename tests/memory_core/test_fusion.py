"""Rank fusion of lexical and vector relevance (issue 17): RRF needs no scaling, and recall reads vectors
from one matrix while still honouring eligibility."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from memory_core.entry import Entry
from memory_core.rawindex import RawIndex
from memory_core.recall import VectorTable, fuse, recall
from memory_core.textindex import rrf
from tests.memory_core.test_rawindex import CHAT, CharEmbedder

NOW = datetime(2026, 6, 26, 12, 0, tzinfo=UTC)


def test_rrf_counts_ranks_not_scales() -> None:
    cos = np.array([0.81, 0.86, 0.79])
    lex = np.array([2.0, -np.inf, 9.0])
    fused = rrf([cos, lex], [0.5, 0.5])
    # Stretching one list's scale (e5 cosines live in a narrow band) changes nothing.
    assert fused.tolist() == rrf([cos * 40 - 30, lex / 3], [0.5, 0.5]).tolist()
    assert np.argmax(fused) == 2 and fused[1] > 0  # no lexical evidence: still found by its vector
    assert rrf([np.array([3.0, 1.0]), np.array([5.0, 4.0])], [0.5, 0.5])[0] == pytest.approx(1.0)
    assert rrf([np.array([-np.inf]), np.array([-np.inf])], [0.5, 0.5]).tolist() == [0.0]


def test_rrf_leaves_a_tie_to_the_other_list() -> None:
    """Equal scores share the best of their places, whatever the candidates' order: the words match the
    first three alike, so the vectors choose among them."""
    lex = np.array([1.0, 1.0, 1.0, 0.5])
    cos = np.array([0.2, 0.1, 0.9, 0.95])
    fused = rrf([cos, lex], [0.3, 0.7])
    assert np.argsort(-fused).tolist() == [2, 0, 1, 3]
    assert rrf([lex], [1.0]).tolist()[:3] == [1.0, 1.0, 1.0]


def test_fuse_gives_a_vector_only_match_relevance_under_both_methods() -> None:
    for method in ("minmax", "rrf"):
        rel = fuse({"a": 1.0}, {"a": 0.80, "b": 0.88}, method, 0.5)  # type: ignore[arg-type]
        assert set(rel) == {"a", "b"} and all(0 < v <= 1 for v in rel.values())


def _entries() -> list[Entry]:
    return [
        Entry(id="e1", text="我喜欢喝乌龙茶"),
        Entry(id="e2", text="周末常去爬山"),
        Entry(id="e3", text="以前养过一只猫", valid_to=datetime(2026, 1, 1, tzinfo=UTC)),  # no longer true
    ]


def test_recall_with_a_vector_matrix_finds_by_vector_and_skips_what_is_not_current() -> None:
    entries = _entries()
    table = VectorTable(["e1", "e2", "e3"], np.eye(3, dtype=np.float32))
    for method in ("minmax", "rrf"):
        got = recall(entries, "hiking plans", NOW, query_vector=[0.1, 0.9, 0.9], vectors=table, fusion=method)
        assert got[0].entry.id == "e2"  # found by its vector alone
        assert "e3" not in {s.entry.id for s in got}  # the best cosine, but no longer current
        same = recall(
            entries,
            "hiking plans",
            NOW,
            query_vector=[0.1, 0.9, 0.9],
            vectors={"e1": [1.0, 0, 0], "e2": [0, 1.0, 0], "e3": [0, 0, 1.0]},
            fusion=method,
        )
        assert [s.entry.id for s in same] == [s.entry.id for s in got]


def test_raw_index_rrf_finds_the_same_best_message_and_keeps_exclusions() -> None:
    index = RawIndex(CharEmbedder(), fusion="rrf", dense_weight=0.5)
    index.add_many(CHAT)
    index.embed_pending()
    hits = index.search("乌龙茶", exclude_session="s2")
    assert hits[0].id == "m3" and all(h.session != "s2" for h in hits)
    assert all(0.0 < h.score <= 1.0 for h in hits)
