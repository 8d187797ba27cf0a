"""The relevance floor (issue 16): its cost on dev recall, chosen by k-fold cross-validation, and its
false-recall rate on unrelated requests.

    python bench/relevance_floor.py --locomo /work/shared/data/locomo-dev.json \
        --madial /work/shared/data/madial-bench/MADial-Bench-zh-dialogue-dev.json \
                 /work/shared/data/madial-bench/MADial-Bench-zh-memory.json \
        --unrelated tests/data/unrelated_requests.json --embed none,local,hashed

Everything is ranked by the product's own `memory_core.recall.recall` (the function chat, `lucid recall`
and the viewer use). LoCoMo: observations as facts (`eval_locomo.py --mode facts`), leave-one-conversation-
out; MADial: 5 folds over dialogues. For each embedder, each fold picks the largest `DenseFloor` margin
whose R@10 on the training folds is at most 0.5 points below no floor; the held-out folds' cost of that
choice is what is reported, and the smallest choice over all folds is what `memory_core.floor` ships. `hashed` is the test suite's fake Ollama embedder (hashed character bigrams).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.eval_locomo import normalise_evidence, observation_facts, session_numbers
from bench.eval_madial import dialogue_query, load_memories, read_jsonl
from memory_core.entry import Entry
from memory_core.floor import REFERENCE, DenseFloor
from memory_core.recall import RelevanceIndex, recall

MARGINS = (None, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)  # None: no dense floor
NOW = datetime(2030, 1, 1, tzinfo=UTC)
Embed = Callable[[list[str], str], np.ndarray]


def embedder(name: str) -> Embed | None:
    if name == "none":
        return None
    if name == "local":
        from workers.local_embedder import local_embedder

        local = local_embedder()
        return lambda texts, kind: np.asarray(local(texts, kind))  # type: ignore[arg-type]
    if name == "hashed":
        from tests.fakes.ollama import embed_text

        def hashed(texts: list[str], kind: str) -> np.ndarray:
            m = np.asarray([embed_text(t) for t in texts], dtype=np.float64)
            return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)

        return hashed
    raise SystemExit(f"unknown embedder {name!r}")


class Pool:
    """One memory (a LoCoMo conversation's facts, or a MADial user's memories) ranked by the product."""

    def __init__(self, texts: Sequence[str], embed: Embed | None, reference: DenseFloor | None) -> None:
        self.entries = [Entry(id=f"m{i}", text=t) for i, t in enumerate(texts)]
        self.index = RelevanceIndex()
        self.embed = embed
        self.reference = reference
        self.vectors: dict[str, Any] | None = None
        if embed is not None:
            mat = embed(list(texts), "passage")
            self.vectors = {e.id: mat[i] for i, e in enumerate(self.entries)}

    def ranks(self, query: str, depth: int) -> dict[float | None, list[int]]:
        qvec = self.embed([query], "query")[0] if self.embed is not None else None
        out: dict[float | None, list[int]] = {}
        for margin in MARGINS if qvec is not None else (None,):
            floor = None
            if margin is not None and self.reference is not None and qvec is not None:
                floor = DenseFloor(self.reference.reference, margin).floor(qvec)
            got = recall(
                self.entries, query, NOW, k=depth, index=self.index, gate=False,
                query_vector=qvec, vectors=self.vectors, dense_floor=floor,
            )  # fmt: skip
            out[margin] = [int(s.entry.id[1:]) for s in got]
        return out


def locomo_rows(
    path: Path, embed: Embed | None, ref: DenseFloor | None
) -> list[tuple[str, dict[Any, float]]]:
    rows = []
    for sample in json.loads(path.read_text(encoding="utf-8")):
        facts = [(t, ids) for t, ids in observation_facts(sample) if t.strip()]
        pool = Pool([t for t, _ in facts], embed, ref)
        known = {
            t["dia_id"]
            for n in session_numbers(sample["conversation"])
            for t in sample["conversation"][f"session_{n}"]
        }
        for qa in sample["qa"]:
            if int(qa["category"]) not in (1, 2, 3, 4):
                continue
            gold = normalise_evidence(qa.get("evidence", []), known)
            if not gold:
                continue
            scores = {}
            for margin, ranked in pool.ranks(qa["question"], 10).items():
                dia: list[str] = []
                for i in ranked:
                    dia.extend(d for d in facts[i][1] if d not in dia)
                scores[margin] = len(set(gold) & set(dia[:10])) / len(gold)
            rows.append((sample["sample_id"], scores))
    return rows


def madial_rows(
    dialogues: Path, memories: Path, embed: Embed | None, ref: DenseFloor | None
) -> list[tuple[str, dict[Any, float]]]:
    pools_text = load_memories(memories)
    pools = {user: (pool, Pool([t for _, t in pool], embed, ref)) for user, pool in pools_text.items()}
    rows = []
    for n, dia in enumerate(read_jsonl(dialogues)):
        ids, pool = pools[int(dia["user-id"])]
        gold = set(dia["relevant-id"])
        scores = {
            margin: len(gold & {ids[i][0] for i in ranked[:10]}) / len(gold)
            for margin, ranked in pool.ranks(dialogue_query(dia), 10).items()
        }
        rows.append((f"fold{n % 5}", scores))
    return rows


def r10(rows: Sequence[tuple[str, dict[Any, float]]], margin: float | None) -> float:
    return 100 * sum(s[margin] for _, s in rows) / len(rows) if rows else 0.0


def cross_validate(rows: list[tuple[str, dict[Any, float]]]) -> dict[str, Any]:
    margins = [m for m in MARGINS if rows and m in rows[0][1]]
    folds = sorted({f for f, _ in rows})
    out: dict[str, Any] = {"no_floor_R@10": round(r10(rows, None), 1), "folds": {}}
    costs = []
    for fold in folds:
        train = [r for r in rows if r[0] != fold]
        held = [r for r in rows if r[0] == fold]
        base = r10(train, None)
        ok = [m for m in margins if m is not None and base - r10(train, m) <= 0.5]
        choice = max(ok) if ok else None
        cost = r10(held, None) - r10(held, choice)
        costs.append(cost)
        out["folds"][fold] = {"margin": choice, "held_out_cost": round(cost, 2)}
    chosen = [f["margin"] for f in out["folds"].values() if f["margin"] is not None]
    out["smallest_fold_choice"] = min(chosen) if chosen else None  # what memory_core.floor ships
    out["held_out_cost_mean"] = round(statistics.mean(costs), 2) if costs else 0.0
    out["held_out_cost_spread"] = round(statistics.pstdev(costs), 2) if costs else 0.0
    out["by_margin_R@10"] = {str(m): round(r10(rows, m), 1) for m in margins}
    return out


def false_recall(path: Path, embed: Embed | None, ref: DenseFloor | None, margin: float) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    pool = Pool(data["memory"], embed, ref)
    leaks = []
    for query in data["unrelated"]:
        got = pool.ranks(query, 5)
        hit = got.get(margin if embed is not None else None, [])
        if hit:
            leaks.append({"request": query, "recalled": [data["memory"][i] for i in hit]})
    found = 0
    for query, want in data["related"]:
        got = pool.ranks(query, 5).get(margin if embed is not None else None, [])
        found += want in [data["memory"][i] for i in got]
    return {
        "unrelated": len(data["unrelated"]),
        "false_recalls": len(leaks),
        "leaks": leaks[:10],
        "related_found@5": f"{found}/{len(data['related'])}",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--locomo", type=Path)
    ap.add_argument("--madial", type=Path, nargs=2, metavar=("DIALOGUES", "MEMORIES"))
    ap.add_argument("--unrelated", type=Path, required=True)
    ap.add_argument("--embed", default="none,local,hashed")
    ap.add_argument(
        "--margin", type=float, help="the margin to check false recall at (default: the shipped one)"
    )
    args = ap.parse_args(argv)
    from memory_core.floor import DENSE_MARGIN

    margin = DENSE_MARGIN if args.margin is None else args.margin
    report: dict[str, Any] = {}
    for name in args.embed.split(","):
        embed = embedder(name)
        ref = DenseFloor.of(embed(list(REFERENCE), "passage")) if embed is not None else None
        part: dict[str, Any] = {}
        if args.locomo:
            part["locomo_facts"] = cross_validate(locomo_rows(args.locomo, embed, ref))
        if args.madial:
            part["madial"] = cross_validate(madial_rows(args.madial[0], args.madial[1], embed, ref))
        part["unrelated"] = false_recall(args.unrelated, embed, ref, margin)
        report[name] = part
        print(json.dumps({name: part}, ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
