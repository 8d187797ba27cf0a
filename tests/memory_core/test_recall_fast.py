"""Recall's array path (issue 17) returns exactly what scoring every entry one by one returns.

`recall` scores its candidates in numpy over per-slot arrays kept by `RelevanceIndex` and builds `Scored`
only for the finalists. The oracle below is the plain definition (DESIGN §5): every entry, its eligibility,
its lexical evidence, its cosine, the fusion, the three terms, the tie rule. Random namespaces with
superseded, future, group, shared and subject-holding entries, random queries and vectors, p2p and group,
`as_of`, a dense floor, both fusions; then the same index kept across edits (hits, texts, removals).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from memory_core.entry import Entry
from memory_core.floor import evidence_query
from memory_core.policy import asked_subject, canonical_subject
from memory_core.recall import (
    DENSE_CANDIDATES,
    DENSE_WEIGHT,
    EVIDENCE_RULE_MAX_CHARS,
    SUBJECT_RELEVANCE,
    RelevanceIndex,
    VectorTable,
    expand,
    fuse,
    importance,
    recall,
    recency,
    strong_terms,
    visible_in,
)
from memory_core.textindex import ENTRY_B, ENTRY_DENSE_WEIGHT, ENTRY_K1, BM25Index, tokenize

NOW = datetime(2026, 6, 26, 12, 0, tzinfo=UTC)
WORDS = ["咖啡", "乌龙茶", "爬山", "跑步", "Python", "Redis", "周会", "项目", "女儿", "猫", "杭州", "piano"]
VERBS = ["喜欢", "讨厌", "最近在学", "计划去", "prefers", "is learning", "住在", "在"]
SUBJECTS = ["所在地", "雇主", "生日", None, None, None]
QUESTIONS = ["我在哪", "我在哪里工作", "我的生日是哪天", "喜欢什么", "Python 还是 Redis", "茶"]
DIM = 8


def _entries(rng: random.Random, n: int) -> list[Entry]:
    out = []
    for i in range(n):
        at = NOW - timedelta(days=rng.randint(0, 300), seconds=rng.randint(0, 86_399))
        vf = at if rng.random() < 0.5 else None
        vt = NOW + timedelta(days=rng.choice([-40, -1, 5])) if rng.random() < 0.2 else None
        if rng.random() < 0.05:
            vf = NOW + timedelta(days=3)  # not yet valid
        out.append(
            Entry(
                id=f"e{i:03d}",
                text=f"{rng.choice(['我', '用户', 'I'])}{rng.choice(VERBS)}{rng.choice(WORDS)}{rng.choice(['', '，周末', ' again'])}",
                type=rng.choice(["fact", "fact", "preference", "rule", "instruction", "context"]),
                at=at if rng.random() < 0.9 else None,
                valid_from=vf,
                valid_to=vt,
                last=NOW - timedelta(days=rng.randint(0, 20)) if rng.random() < 0.3 else None,
                hits=rng.randint(0, 6),
                subject=rng.choice(SUBJECTS),
                scope=rng.choice(["p2p", None, "g:g1", "g:g2"]),
                extra=(("share", "1"),) if rng.random() < 0.1 else (),
            )
        )
    return out


def oracle(
    entries: list[Entry],
    query: str,
    *,
    k: int,
    as_of: datetime | None,
    chat_type: str,
    chat: str | None,
    qvec: np.ndarray | None,
    vectors: dict[str, np.ndarray] | None,
    floor: float | None,
    fusion: str,
) -> list[tuple[str, float]]:
    when = as_of or NOW
    by_id = {e.id: e for e in entries}

    def eligible(e: Entry) -> bool:
        if as_of is not None and (e.valid_from or e.at or when) > when:
            return False
        return e.current(when) and visible_in(e, chat_type, chat)

    bm = BM25Index(k1=ENTRY_K1, b=ENTRY_B)
    for e in by_id.values():
        bm.add(e.id, {t: float(c) for t, c in _counts(e.text).items()})
    expanded = expand(evidence_query(query))
    tokens = tokenize(expanded)
    raw = {str(i): v for i, v in bm.scores(tokens).items() if v > 0} if tokens else {}
    wanted = strong_terms(expanded) if len(query) <= EVIDENCE_RULE_MAX_CHARS else frozenset()
    if wanted:
        raw = {i: v for i, v in raw.items() if not wanted.isdisjoint(strong_terms(by_id[i].text))}
    lexical: dict[str, float] = {}
    if raw:
        best = max(raw, key=lambda i: raw[i])
        strength = len(set(tokens) & set(tokenize(by_id[best].text))) / len(set(tokens))
        lexical = {i: strength * v / raw[best] for i, v in raw.items() if eligible(by_id[i])}
    rel = dict(lexical)
    if qvec is not None and vectors:
        product = np.stack(list(vectors.values())) @ qvec  # one mat-vec: the same float32 rounding
        cos = {i: float(c) for i, c in zip(vectors, product, strict=True)}
        ranked = sorted(cos, key=lambda i: (-cos[i], list(vectors).index(i)))
        dense: dict[str, float] = {}
        for i in ranked:
            if (cos[i] <= 0 if floor is None else cos[i] < floor) or len(dense) >= DENSE_CANDIDATES:
                break
            if i in by_id and eligible(by_id[i]):
                dense[i] = cos[i]
        vouched = bool(dense)  # a vector cleared the floor
        # a lexical candidate's vector ranks it whatever the floor (its words are its evidence)
        dense.update({i: cos[i] for i in lexical if i in cos and cos[i] > 0 and i not in dense})
        if dense:
            weight = DENSE_WEIGHT if fusion == "rrf" else ENTRY_DENSE_WEIGHT
            fused = fuse(lexical, dense, fusion, weight)  # type: ignore[arg-type]
            if vouched:
                rel = fused
            else:  # the fusion orders the lexical candidates; they keep the lexical strengths
                place = list(by_id)
                by_fusion = sorted(lexical, key=lambda i: (-fused[i], -lexical[i], place.index(i)))
                rel = dict(zip(by_fusion, sorted(lexical.values(), reverse=True), strict=True))
    subject = asked_subject(query)
    for e in by_id.values():
        if subject and e.subject and canonical_subject(e.subject) == subject and eligible(e):
            rel[e.id] = max(rel.get(e.id, 0.0), SUBJECT_RELEVANCE)
    scored = sorted(
        (
            (-(recency(by_id[i], NOW) + importance(by_id[i]) + r), -importance(by_id[i]), i, r)
            for i, r in rel.items()
            if r > 0
        )
    )
    return [(i, r) for _, _, i, r in scored[:k]]


def _counts(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tokenize(text) or ["\x00empty"]:
        out[t] = out.get(t, 0) + 1
    return out


def _vectors(rng: random.Random, entries: list[Entry]) -> dict[str, np.ndarray]:
    """Vectors for most entries (some are still waiting to be embedded), with some exact ties."""
    out: dict[str, np.ndarray] = {}
    for e in entries:
        if rng.random() < 0.85:
            v = np.array([rng.choice([-1.0, 0.0, 0.5, 1.0, 2.0]) for _ in range(DIM)], dtype=np.float32)
            out[e.id] = v / (np.linalg.norm(v) or 1.0)
    return out


def _query(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(QUESTIONS)
    n = rng.choice([1, 2, 12])  # 12 words: a long query, exempt from the evidence rule
    return "".join(rng.choice(WORDS + VERBS) for _ in range(n))


@pytest.mark.parametrize("seed", range(12))
def test_recall_equals_scoring_every_entry(seed: int) -> None:
    rng = random.Random(seed)
    entries = _entries(rng, rng.choice([30, 150]))
    vectors = _vectors(rng, entries)
    table = VectorTable.of(vectors)  # type: ignore[arg-type]
    index = RelevanceIndex()
    for _ in range(25):
        query = _query(rng)
        dense = rng.random() < 0.6
        qv = np.asarray(rng.choice(list(vectors.values())), dtype=np.float32) if dense else None
        case: dict[str, Any] = {
            "k": rng.choice([1, 5, 50]),
            "as_of": NOW - timedelta(days=rng.randint(0, 100)) if rng.random() < 0.2 else None,
            "chat_type": rng.choice(["p2p", "p2p", "group"]),
            "chat": rng.choice(["g1", "g2"]),
            "floor": rng.choice([None, 0.2, 0.6]),
            "fusion": rng.choice(["rrf", "minmax"]),
        }
        got = recall(
            entries,
            query,
            NOW,
            k=case["k"],
            as_of=case["as_of"],
            chat_type=case["chat_type"],
            chat=case["chat"],
            index=index,
            query_vector=qv,
            vectors=table if dense else None,
            dense_floor=case["floor"],
            fusion=case["fusion"],
            gate=False,
        )
        want = oracle(entries, query, qvec=qv, vectors=vectors if dense else None, **case)
        assert [(s.entry.id, s.relevance) for s in got] == want, (query, case)
        for s in got:
            assert s.recency == recency(s.entry, NOW) and s.importance == importance(s.entry)


def test_an_index_kept_across_edits_follows_hits_texts_and_removals() -> None:
    """The per-slot terms follow the entries: more hits raise an entry, a new text is found by its new
    words (and no longer by its old ones), and a removed entry is never recalled again."""
    rng = random.Random(7)
    entries = _entries(rng, 80)
    index = RelevanceIndex()
    for step in range(30):
        for query in ("喜欢咖啡", "我在哪", "piano again", "乌龙茶"):
            got = recall(entries, query, NOW, k=5, index=index, gate=False)
            want = oracle(
                entries,
                query,
                k=5,
                as_of=None,
                chat_type="p2p",
                chat=None,
                qvec=None,
                vectors=None,
                floor=None,
                fusion="rrf",
            )
            assert [(s.entry.id, s.relevance) for s in got] == want, (step, query)
        edited = list(entries)
        i = rng.randrange(len(edited))
        change = rng.choice(["hits", "text", "remove", "add"])
        if change == "hits":
            edited[i] = edited[i].with_changes(hits=edited[i].hits + 5)
        elif change == "text":
            edited[i] = edited[i].with_changes(text=f"我喜欢{rng.choice(WORDS)}和{rng.choice(WORDS)}")
        elif change == "remove":
            del edited[i]
        else:
            edited.append(Entry(id=f"n{step}", text=f"我在{rng.choice(WORDS)}", at=NOW, subject="所在地"))
        entries = edited  # a new list object, as the memory service hands over after a write
