"""What a loaded namespace costs Python's cycle collector: the objects it tracks, and one full collection.

    .venv/bin/python bench/gc_cost.py [--entries 10000] [--messages 50000] [--repeat 5] [--baseline REV]

A worker freezes what its imports made (`gc.freeze()` at start-up), so a full collection walks what the
namespaces it serves hold: every one it has read stays parsed and indexed between turns. This bench writes a
namespace of `--entries` memories and `--messages` raw messages, then in a fresh process (imports frozen, as
in the worker) reads it as a turn does (recall, raw search, a turn's assembly) and reports the objects the
collector tracks, the most common types, the process's resident memory, and the median ms of `--repeat` full collections — the pause every
thread of the process takes when Python runs one. With `--baseline REV`, the same namespace is read by the
`memory_core` and `workers` of another revision (extracted with `git archive`) in the same run.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write(data: Path, entries: int, messages: int) -> None:
    """The namespace `bench/recall.py` reads, written with this tree."""
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from recall import write_namespace

    from memory_core.namespace import Namespace

    write_namespace(data, Namespace.of("bench", "u1", "default"), entries, messages, random.Random(5))


def inner(data: Path, repeat: int) -> None:
    """In a fresh process whose `sys.path` starts with the tree to measure."""
    from datetime import UTC, datetime

    from memory_core.namespace import Namespace
    from workers.memory_service import MemoryService
    from workers.runtime import build
    from workers.settings import Settings

    now = datetime(2026, 6, 26, 12, 0, tzinfo=UTC)  # bench/recall.py NOW
    gc.collect()
    gc.freeze()  # what the worker does at start-up
    ns = Namespace.of("bench", "u1", "default")
    svc = MemoryService(build(Settings(data_dir=data, now=now)))
    query = "我上次说喜欢什么咖啡"
    svc.recall(ns, query, now)
    svc.search(ns, query, k=10)
    svc.assemble(ns, query, chat_type="p2p", chat="c1", session="current", now=now)
    gc.collect()
    tracked = len(gc.get_objects())
    types = collections.Counter(type(o).__name__ for o in gc.get_objects()).most_common(6)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t) * 1000)
    rss = next(
        line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS")
    )
    print(
        json.dumps(
            {
                "rss_mb": round(int(rss.split()[1]) / 1024, 1),
                "tracked_objects": tracked,
                "full_collection_ms": round(statistics.median(times), 1),
                "full_collection_ms_range": [round(min(times), 1), round(max(times), 1)],
                "most_common": types,
                "memory_core": str(Path(sys.modules["memory_core"].__file__ or "").parent.parent),
            }
        )
    )


def measure(tree: Path, data: Path, repeat: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--inner", str(data), "--repeat", str(repeat)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", help="also read the namespace with this revision's memory_core and workers")
    ap.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args.inner, args.repeat)
        return
    with tempfile.TemporaryDirectory(prefix="lucid-bench-gc-") as tmp:
        data = Path(tmp) / "data"
        write(data, args.entries, args.messages)
        result: dict[str, object] = {"entries": args.entries, "messages": args.messages}
        runs: dict[str, list[dict[str, object]]] = {}
        trees = {"this tree": ROOT}
        if args.baseline:
            old = Path(tmp) / "baseline"
            old.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline, "memory_core", "workers", "bot"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
            trees[f"baseline {args.baseline}"] = old
        for _round in range(3):  # alternated, so both see the same load
            for name, tree in trees.items():
                runs.setdefault(name, []).append(measure(tree, data, args.repeat))
        result.update(runs)
        result["load_average_1m"] = round(os.getloadavg()[0], 1)
        print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
