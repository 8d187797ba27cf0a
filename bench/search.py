"""Speed of raw-archive search at scale, against a naive rank_bm25 baseline, on a synthetic archive.

    python bench/search.py --json                 # 200,000 messages, 200 queries, 200 single adds

The archive is synthetic and mixed: Chinese messages built from a Zipf-distributed vocabulary of 1-3 character
words (with the usual function characters mixed in), English ones from Zipf pseudo-words plus stop words, and
some mixed messages; lengths are log-normal (median 12 characters / 9 words), sessions of ~30 messages between
two speakers (a tenth are group chats). Timings are wall clock on whatever machine runs this; nothing here is
asserted (DESIGN §11). The naive baseline rebuilds `rank_bm25.BM25Okapi` per query, on a subsample because at
full size one query takes many seconds; the same subsample is indexed by RawIndex for the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import resource
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rank_bm25 import BM25Okapi

from memory_core.lineformat import RawMessage
from memory_core.namespace import Namespace
from memory_core.rawindex import RawIndex
from memory_core.store import Store
from memory_core.textindex import STOPWORDS, tokenize

FUNCTION_CHARS = "的了是我你他在吗呢啊吧也都就和有这那个一不没要会能可以还"
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou", "er")]


def zipf_weights(n: int, s: float = 1.1) -> npt.NDArray[np.float64]:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return np.asarray(w / w.sum(), dtype=np.float64)


class Corpus:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        chars = [chr(c) for c in self.rng.choice(np.arange(0x4E00, 0x9FA6), size=3000, replace=False)]
        lengths = self.rng.choice([1, 2, 3], size=8000, p=[0.35, 0.55, 0.10])
        self.zh = ["".join(self.rng.choice(chars, size=n)) for n in lengths]
        self.en = [
            "".join(self.rng.choice(SYLLABLES, size=int(n))) for n in self.rng.integers(1, 4, size=8000)
        ]
        self.stop = sorted(STOPWORDS)
        self.pw = zipf_weights(8000)
        self._draws = iter(())

    def word(self) -> int:
        """A Zipf-distributed vocabulary index (drawn in bulk: per-call `choice(p=…)` is 1,000× slower)."""
        try:
            return next(self._draws)
        except StopIteration:
            self._draws = iter(self.rng.choice(8000, size=1_000_000, p=self.pw).tolist())
            return next(self._draws)

    def chinese(self, n_chars: int) -> str:
        out: list[str] = []
        while sum(map(len, out)) < n_chars:
            out.append(
                FUNCTION_CHARS[self.word() % len(FUNCTION_CHARS)]
                if self.rng.random() < 0.2
                else self.zh[self.word()]
            )
        return "".join(out)

    def english(self, n_words: int) -> str:
        words = [
            self.stop[self.word() % len(self.stop)] if self.rng.random() < 0.4 else self.en[self.word()]
            for _ in range(n_words)
        ]
        return " ".join(words).capitalize() + str(self.rng.choice([".", "?", "!", ""]))

    def text(self) -> str:
        kind = self.rng.random()
        if kind < 0.45:
            return self.chinese(int(np.clip(self.rng.lognormal(np.log(12), 0.7), 1, 200)))
        if kind < 0.90:
            return self.english(int(np.clip(self.rng.lognormal(np.log(9), 0.7), 1, 80)))
        return self.chinese(int(self.rng.integers(4, 20))) + " " + self.english(int(self.rng.integers(1, 3)))

    def messages(self, n: int, start: int = 0) -> list[RawMessage]:
        out: list[RawMessage] = []
        ts = datetime(2023, 1, 1, tzinfo=UTC) + timedelta(minutes=7 * start)
        session, left, speakers = 0, 0, ["user", "Lucid"]
        for i in range(start, start + n):
            if left == 0:
                session, left = i, int(self.rng.geometric(1 / 30))
                group = self.rng.random() < 0.1
                speakers = [f"p{int(x)}" for x in self.rng.integers(0, 50, 5)] if group else ["user", "Lucid"]
                ts += timedelta(hours=float(self.rng.exponential(8)))
            left -= 1
            ts += timedelta(seconds=float(self.rng.exponential(120)))
            out.append(
                RawMessage(
                    id=f"m{i}",
                    ts=ts,
                    speaker=speakers[i % len(speakers)],
                    text=self.text(),
                    chat="g1" if len(speakers) > 2 else "c1",
                    session=f"s{session}",
                )
            )
        return out

    def queries(self, msgs: list[RawMessage], n: int) -> list[str]:
        """Fragments of real messages (what a person half-remembers), some single words, some whole lines."""
        out: list[str] = []
        for _ in range(n):
            text = msgs[int(self.rng.integers(len(msgs)))].text
            r = self.rng.random()
            if r < 0.1:
                out.append(text)
            elif r < 0.3:
                out.append(self.en[self.word()] if r < 0.2 else self.zh[self.word()])
            else:
                lo = int(self.rng.integers(max(1, len(text) - 6)))
                out.append(text[lo : lo + int(self.rng.integers(2, 12))])
        return out


def ms(values: list[tuple[float, float]]) -> dict[str, float]:
    """Percentiles in ms of wall clock and of this thread's CPU time: on a shared 2-core machine the wall tail
    is mostly time spent preempted; the CPU figures show what the code itself costs."""
    wall = np.asarray([w for w, _ in values]) * 1000
    cpu = np.asarray([c for _, c in values]) * 1000
    out = {
        "p50": round(float(np.percentile(wall, 50)), 3),
        "p95": round(float(np.percentile(wall, 95)), 3),
        "max": round(float(wall.max()), 3),
        "cpu_p50": round(float(np.percentile(cpu, 50)), 3),
        "cpu_p95": round(float(np.percentile(cpu, 95)), 3),
        "n": len(values),
    }
    return out


def timed(fn: Any, items: list[Any]) -> list[tuple[float, float]]:
    out = []
    for item in items:
        w0, c0 = time.perf_counter(), time.thread_time()
        fn(item)
        out.append((time.perf_counter() - w0, time.thread_time() - c0))
    return out


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def trimmed_rss_mb() -> float:
    """RSS after handing freed heap back to the OS (glibc only): the index's footprint without the build's
    temporaries, which the allocator otherwise keeps for reuse."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="messages in the archive")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--adds", type=int, default=200)
    ap.add_argument("--naive-n", type=int, default=20_000, help="subsample for the rank_bm25 baseline")
    ap.add_argument("--naive-queries", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = ap.parse_args(argv)
    corpus = Corpus(args.seed)
    t0 = time.perf_counter()
    msgs = corpus.messages(args.n)
    extra = corpus.messages(args.adds, start=args.n)
    queries = corpus.queries(msgs, args.queries)
    report: dict[str, Any] = {
        "config": vars(args),
        "generate_s": round(time.perf_counter() - t0, 1),
        "load_average_at_start": os.getloadavg()[0],
    }
    rss0 = trimmed_rss_mb()

    index = RawIndex()
    t0 = time.perf_counter()
    index.add_many(msgs)
    report["build"] = {
        "messages": len(index),
        "seconds": round(time.perf_counter() - t0, 2),
        "rss_mb_growth": round(rss_mb() - rss0, 1),
        "rss_mb_growth_trimmed": round(trimmed_rss_mb() - rss0, 1),
    }
    for q in queries[:5]:
        index.search(q)  # warm the per-term postings mirror, as a running worker would be
    report["query"] = ms(timed(index.search, queries))
    report["query"]["mean_hits"] = round(float(np.mean([len(index.search(q)) for q in queries[:50]])), 1)
    report["add_one"] = ms(timed(index.add, extra))
    # Adds invalidate cached postings of the terms they touch: a query right after an add is the worst case.
    more = corpus.messages(args.queries, start=args.n + args.adds)
    after: list[tuple[float, float]] = []
    for m, q in zip(more, queries, strict=True):
        index.add(m)
        after.extend(timed(index.search, [q]))
    report["query_right_after_an_add"] = ms(after)

    with tempfile.TemporaryDirectory() as tmp:
        store, ns = Store(Path(tmp), git=False), Namespace.of("bench", "u", "p")
        t0 = time.perf_counter()
        store.save_cache(ns, "raw", index.dump(), index.manifest())
        saved = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
        t0 = time.perf_counter()
        held = store.load_cache(ns, "raw")
        assert held is not None
        loaded = RawIndex.restore(*held)
        report["persistence"] = {
            "save_s": round(saved, 2),
            "load_s": round(time.perf_counter() - t0, 2),
            "size_mb": round(size / 2**20, 1),
            "same_results": loaded.search(queries[0]) == index.search(queries[0]),
        }
    del loaded

    sub = msgs[: args.naive_n]
    docs = [tokenize(m.text) + tokenize(m.speaker) or ["<empty>"] for m in sub]
    nq = queries[: args.naive_queries]

    def naive(q: str) -> None:
        scores = BM25Okapi(docs, k1=0.9, b=0.5).get_scores(tokenize(q))
        np.argsort(-scores, kind="stable")[:10]

    built_once = BM25Okapi(docs, k1=0.9, b=0.5)
    small = RawIndex()
    small.add_many(sub)
    for q in nq[:3]:
        small.search(q)
    ours = ms(timed(small.search, nq))
    rebuilt = ms(timed(naive, nq))
    scored = ms(timed(lambda q: built_once.get_scores(tokenize(q)), nq))
    report["naive_baseline"] = {
        "messages": len(sub),
        "note": "rank_bm25 over own tokens only; RawIndex also carries neighbour context and the speaker boost",
        "rank_bm25_rebuilt_per_query": rebuilt,
        "rank_bm25_built_once_get_scores": scored,
        "rawindex_same_subsample": ours,
        "ratio_rebuilt_vs_rawindex_p50": round(rebuilt["p50"] / max(ours["p50"], 1e-9), 1),
        "ratio_get_scores_vs_rawindex_p50": round(scored["p50"] / max(ours["p50"], 1e-9), 1),
    }
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
