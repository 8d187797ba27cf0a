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


def _embeddings(calls: list[tuple[str, int]], name: str = "") -> Embeddings:
    """`topic_vectors` as an embedder called `name`, logging each call (kind, how many texts)."""

    def embed(texts: list[str], kind: Any) -> Any:
        calls.append((kind, len(texts)))
        return topic_vectors(texts)

    return Embeddings(embed, name=name)


def _service(data_dir: Path, calls: list[tuple[str, int]]) -> MemoryService:
    """A memory service on `topic_vectors` that logs each embedding call, and two entries written."""
    rt = build(Settings(data_dir=data_dir, now=NOW, config_path=data_dir / "none.toml"), git=False)
    svc = MemoryService(rt, embeddings=_embeddings(calls))
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


def _said(svc: MemoryService, texts: list[str]) -> None:
    """`texts` as messages of one private chat, recorded in the raw archive through the writer."""
    from datetime import timedelta

    from memory_core.lineformat import RawMessage
    from memory_core.ops import Record, message_to_json

    msgs = [
        RawMessage(f"m{i}", NOW - timedelta(hours=9 - i), "alice", t, "c1", "p2p")
        for i, t in enumerate(texts)
    ]
    svc.apply(NS, [Record(message=message_to_json(m)) for m in msgs])


def test_raw_search_turns_hybrid_once_the_archive_is_embedded_and_keeps_the_vectors(data_dir: Path) -> None:
    """Past messages are embedded in the background after a search finds them missing; from then on a
    search finds a message by meaning (hikers → hike), and the vectors are saved with the search index:
    another process embeds only its query. Another embedder's vectors are not used."""
    calls: list[tuple[str, int]] = []
    svc = _service(data_dir, calls)
    _said(svc, ["weekend hike in the hills", "the printer on floor three jams", "oolong tea every morning"])
    assert svc.search(NS, "hikers") == []  # nothing embedded yet: lexical, and no shared word
    svc.wait_for_embeddings()
    assert [h.text for h in svc.search(NS, "hikers")][:1] == ["weekend hike in the hills"]
    svc.close()  # saves what it embedded

    calls.clear()
    again = MemoryService(svc.runtime, embeddings=_embeddings(calls))  # another process, the same embedder
    again.embed_soon(NS)
    again.wait_for_embeddings()  # the floor's reference set and the entries, not the archive
    calls.clear()
    assert [h.text for h in again.search(NS, "hikers")][:1] == ["weekend hike in the hills"]
    assert calls == [("query", 1)]

    other = MemoryService(svc.runtime, embeddings=_embeddings([], name="another"))
    other.embed_soon(NS)
    other.wait_for_embeddings()
    assert other.search(NS, "hikers") == []  # the saved vectors are not this embedder's: lexical for now


def test_a_vector_alone_must_clear_the_floor_in_raw_search_too(data_dir: Path) -> None:
    """A message that shares no word with the query is found by its vector only above the relevance floor:
    an unrelated question gets nothing back, not the nearest of unrelated lines."""
    svc = _service(data_dir, [])
    _said(svc, ["weekend hike in the hills", "oolong tea every morning"])
    svc.search(NS, "hikers")
    svc.wait_for_embeddings()
    assert svc.search(NS, "quarterly budget spreadsheet") == []


def test_a_forget_leaves_no_saved_search_index_holding_the_forgotten_words(data_dir: Path) -> None:
    """The raw search index is saved with the messages' words and vectors; a forget that rewrites a line
    deletes it in the same batch, and an index built before the forget is never saved again."""
    from memory_core.ops import Forget

    svc = _service(data_dir, [])
    secret = "the spare key hides under the blue mat"
    _said(svc, [f"remember that {secret}", "weekend hike in the hills"])
    svc.apply(NS, [Remember(text=secret)])
    svc.search(NS, "spare key")
    svc.wait_for_embeddings()  # the background pass saves the index, vectors and words
    index_dir = svc.runtime.store.path(NS) / ".index"

    def saved() -> str:
        return "".join(p.read_bytes().decode("latin-1") for p in index_dir.rglob("*") if p.is_file())

    assert "spare key" in saved()  # the positive control: the words are in the saved index
    held = [e for e in svc.book(NS).entries() if e.text == secret]
    stale = MemoryService(svc.runtime, embeddings=_embeddings([]))  # another process, loaded before
    stale.search(NS, "spare key")
    svc.apply(NS, [Forget(id=held[0].id)])
    assert "spare key" not in saved()
    stale.embed_raw_soon(NS)  # its background pass ends by saving what it holds: the old lines
    stale.wait_for_embeddings()
    assert "spare key" not in saved()
    assert all("spare key" not in h.text for h in svc.search(NS, "spare key"))


def _passages(calls: list[tuple[str, int]]) -> int:
    return sum(n for kind, n in calls if kind == "passage")


def _saved_vectors(svc: MemoryService) -> bytes:
    """Every byte saved under the namespace's entry-vector cache ('' when there is none)."""
    folder = svc.runtime.store.path(NS) / ".index" / "vectors"
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_another_process_takes_the_saved_entry_vectors_instead_of_embedding_them_again(
    data_dir: Path,
) -> None:
    """A restart or `lucid serve --workers N`: the entries' vectors are saved beside them (by digest, no
    text), the floor's reference vectors with them, so another process embeds nothing and finds by meaning at
    once."""
    from memory_core.floor import REFERENCE

    calls: list[tuple[str, int]] = []
    svc = _service(data_dir, calls)
    svc.wait_for_embeddings()
    assert _passages(calls) == len(REFERENCE) + 2  # the positive control: this one embedded both entries
    assert b"oolong" not in _saved_vectors(svc) and _saved_vectors(svc)

    again_calls: list[tuple[str, int]] = []
    again = MemoryService(svc.runtime, embeddings=_embeddings(again_calls))
    again.embed_soon(NS)
    again.wait_for_embeddings()
    assert _passages(again_calls) == 0
    assert again.embeddings is not None and again.embeddings.dense_floor(embed=False) is not None
    assert again.recall(NS, "hikers", NOW)[0].entry.text == "weekend hike in the hills"
    assert again_calls == [("query", 1)]

    other_calls: list[tuple[str, int]] = []  # another embedder: those vectors are not its own
    other = MemoryService(svc.runtime, embeddings=_embeddings(other_calls, name="another"))
    other.embed_soon(NS)
    other.wait_for_embeddings()
    assert _passages(other_calls) == len(REFERENCE) + 2


def test_a_vectors_file_without_the_floor_gains_it_once(data_dir: Path) -> None:
    """A file saved before the floor's reference vectors were kept in it (every entry there, no floor): the
    next process embeds the floor alone and saves it, so the one after embeds nothing."""
    from memory_core.floor import REFERENCE
    from memory_core.writer import VECTOR_CACHE
    from workers.embedding import VECTORS_FILE

    svc = _service(data_dir, [])
    svc.wait_for_embeddings()
    assert svc.embeddings is not None
    texts = [e.text for e in svc.book(NS).entries()]
    data, n = svc.embeddings.dump(texts)  # the entries' vectors only, as the former file held them
    assert n == len(texts) == 2
    svc.runtime.store.save_cache(NS, VECTOR_CACHE, {VECTORS_FILE: data}, {"embedder": ""})

    for expected in (len(REFERENCE), 0):
        calls: list[tuple[str, int]] = []
        again = MemoryService(svc.runtime, embeddings=_embeddings(calls))
        again.embed_soon(NS)
        again.wait_for_embeddings()
        assert _passages(calls) == expected
        assert again.embeddings is not None and again.embeddings.dense_floor(embed=False) is not None


def test_a_damaged_vectors_file_is_embedded_around(data_dir: Path) -> None:
    """A hand-edited or truncated vectors file is a cache: the entries are embedded again, recall works."""
    from memory_core.floor import REFERENCE

    svc = _service(data_dir, [])
    svc.wait_for_embeddings()
    for npz in (svc.runtime.store.path(NS) / ".index" / "vectors").rglob("vectors.npz"):
        npz.write_bytes(b"PK\x03\x04 not a zip at all")
    calls: list[tuple[str, int]] = []
    again = MemoryService(svc.runtime, embeddings=_embeddings(calls))
    again.embed_soon(NS)
    again.wait_for_embeddings()
    assert _passages(calls) == len(REFERENCE) + 2
    assert again.recall(NS, "hikers", NOW)[0].entry.text == "weekend hike in the hills"


def test_a_forget_leaves_no_saved_vector_of_the_forgotten_text(data_dir: Path) -> None:
    """The forget drops the saved vectors, and a process that was embedding while it happened (here: the
    forget lands inside its embedding call) does not save the forgotten text's vector again."""
    from memory_core.ops import Forget
    from workers.embedding import digest

    svc = _service(data_dir, [])
    svc.wait_for_embeddings()
    tea = next(e for e in svc.book(NS).entries() if e.text == "oolong tea every morning")
    assert digest(tea.text) in _saved_vectors(svc)  # the positive control
    fired: list[bool] = []

    def forget_midway(texts: list[str], kind: Any) -> Any:
        if kind == "passage" and "weekend hike in the hills" in texts and not fired:
            fired.append(True)
            svc.apply(NS, [Forget(id=tea.id)])
            assert _saved_vectors(svc) == b""  # the writer dropped the saved vectors
        return topic_vectors(texts)

    stale = MemoryService(svc.runtime, embeddings=Embeddings(forget_midway, name="another"))
    stale.embed_soon(NS)
    stale.wait_for_embeddings()
    assert fired
    assert digest(tea.text) not in _saved_vectors(svc)
    stale.close()  # saves what is unsaved, from the entries as they are now
    saved = _saved_vectors(svc)
    assert digest("weekend hike in the hills") in saved and digest(tea.text) not in saved


def test_saved_vectors_that_are_not_numbers_are_embedded_again(data_dir: Path) -> None:
    """A vectors file with the right digests but NaN or zero vectors (a hand edit, a bad disk) is not
    taken: such a vector would rank every entry by nothing."""
    import io

    from memory_core.floor import REFERENCE

    svc = _service(data_dir, [])
    svc.wait_for_embeddings()
    for npz in (svc.runtime.store.path(NS) / ".index" / "vectors").rglob("vectors.npz"):
        with np.load(io.BytesIO(npz.read_bytes()), allow_pickle=False) as held:
            digests, vectors = held["digests"], held["vectors"].copy()
        vectors[0], vectors[1:] = np.nan, 0.0
        out = io.BytesIO()
        np.savez(out, digests=digests, vectors=vectors)
        npz.write_bytes(out.getvalue())
    calls: list[tuple[str, int]] = []
    again = MemoryService(svc.runtime, embeddings=_embeddings(calls))
    again.embed_soon(NS)
    again.wait_for_embeddings()
    assert _passages(calls) == len(REFERENCE) + 2
    assert again.recall(NS, "hikers", NOW)[0].entry.text == "weekend hike in the hills"
