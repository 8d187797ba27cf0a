"""Issue 15 (1): a message's cost to the raw-archive index is linear in its own length, in any order.

A burst makes every message older than the reply recorded before it, so each is inserted out of order and
its neighbours' documents lose whole messages' worth of terms. Each lost posting is swapped with its term's
last one, whose document must then learn the posting's new place. That used to be a search of the moved
document's term list — thousands of terms for a long message, once per lost posting: quadratic, 11–19 s
for one 8,000-character message. Now every posting carries a back pointer and the swap is O(1); these tests
pin that structure (no timing: `bench/index_cost.py` measures it).
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_core.lineformat import RawMessage
from memory_core.rawindex import RawIndex
from memory_core.textindex import BM25Index

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def _cjk(rng: random.Random, n: int) -> str:
    return "".join(chr(0x4E00 + rng.randrange(2500) * 7) for _ in range(n))


def _burst(rng: random.Random, length: int) -> list[RawMessage]:
    """The order a worker records a burst in: message i (sent at T0+i), then its reply (later than all)."""
    out = []
    for i in range(8):
        out.append(RawMessage(f"m{i}", T0 + timedelta(seconds=i), "u", _cjk(rng, length), "oc", session="s"))
        reply = T0 + timedelta(seconds=20 + i)
        out.append(RawMessage(f"r{i}", reply, "bot", "好的，记下了。", "oc", role="assistant", session="s"))
    return out


def test_a_long_burst_out_of_order_keeps_every_posting_linked_to_its_place() -> None:
    rng = random.Random(15)
    live = RawIndex()
    msgs = _burst(rng, 600)
    for msg in msgs:
        live.add(msg)
    # O(1) removal rests on this: every posting knows its place in its document, every session its links.
    assert live.problems() == []
    # And the result is the one an in-order build gives: the same documents, the same ranking.
    ordered = RawIndex()
    ordered.add_many(sorted(msgs, key=lambda m: m.ts))
    query = msgs[6].text[100:140]
    assert [(h.id, round(h.score, 6)) for h in live.search(query, k=5)] == [
        (h.id, round(h.score, 6)) for h in ordered.search(query, k=5)
    ]
    live.remove("m3")
    assert live.problems() == []
    assert "m3" not in {h.id for h in live.search(msgs[6].text[:40], k=20)}


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "update", "remove"]),
            st.integers(0, 9),
            st.lists(st.sampled_from("abcdefghijklmnop"), min_size=0, max_size=30),
        ),
        max_size=40,
    )
)
def test_any_sequence_of_writes_keeps_the_back_pointers_sound(ops: list[tuple[str, int, list[str]]]) -> None:
    index = BM25Index()
    live: set[int] = set()
    for op, key, words in ops:
        if op == "add" and key not in live:
            index.add(key, Counter(words))
            live.add(key)
        elif op == "update" and key in live:
            index.update(key, Counter(words))
        elif op == "remove" and key in live:
            index.remove(key)
            live.discard(key)
        assert index.problems() == []
