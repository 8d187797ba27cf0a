"""Recall before/after, interleaved: `memory_core.recall.recall` of a base revision against this tree.

    python bench/recall_ab.py [--base main] [--entries 10000] [--queries 200] --json

The base revision's `memory_core/recall.py` is loaded beside the current one (as `memory_core._base_recall`,
so its relative imports resolve to this tree's other modules), and both score the same 10,000 entries for
the same queries, alternating which goes first, so both see the same machine load. Lexical and hybrid
(random unit vectors, 384 dimensions, query vector given: the embedder's cost is bench/recall.py's), wall
and thread-CPU time per call. Every query's top 5 must be the same ids in both, or the run stops.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.recall import NOW, SUBJECTS, VERBS, pct, sentence  # noqa: E402
from memory_core import recall as current  # noqa: E402
from memory_core.entry import Entry  # noqa: E402
from workers.embedding import limit_blas_threads  # noqa: E402


def base_module(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:memory_core/recall.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="lucid-recall-ab-")) / "_base_recall.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("memory_core._base_recall", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="main")
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    limit_blas_threads()
    rng = random.Random(5)
    types = ["fact"] * 8 + ["preference", "context", "instruction"]
    entries = [
        Entry(
            id=f"{i:016x}",
            text=sentence(rng),
            type=rng.choice(types),
            at=NOW - timedelta(days=rng.randint(0, 400)),
            hits=rng.randint(0, 4),
        )
        for i in range(args.entries)
    ]
    queries = [
        f"{rng.choice(['我', 'I'])}{rng.choice(VERBS)}{rng.choice(SUBJECTS)}吗" for _ in range(args.queries)
    ]
    vectors = np.random.default_rng(5).standard_normal((args.entries + args.queries, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    matrix, qvecs = vectors[: args.entries], vectors[args.entries :]
    ids = [e.id for e in entries]
    sides: dict[str, tuple[Any, Any, Any]] = {}
    for name, mod in (("base", base_module(args.base)), ("this", current)):
        index, table = mod.RelevanceIndex(), mod.VectorTable(ids, matrix)
        mod.recall(entries, queries[0], NOW, index=index)  # warm: index built, caches filled
        sides[name] = (mod, index, table)
    wall: dict[str, list[float]] = {f"{s}_{m}": [] for s in sides for m in ("lexical", "hybrid")}
    cpu: dict[str, list[float]] = {key: [] for key in wall}
    for n, q in enumerate(queries):
        got: dict[str, list[list[str]]] = {}
        for name in list(sides)[:: 1 if n % 2 else -1]:
            mod, index, table = sides[name]
            got[name] = []
            for mode, extra in (("lexical", {}), ("hybrid", {"query_vector": qvecs[n], "vectors": table})):
                w, c = time.perf_counter(), time.thread_time()
                top = mod.recall(entries, q, NOW, index=index, dense_floor=0.0, **extra)
                cpu[f"{name}_{mode}"].append(time.thread_time() - c)
                wall[f"{name}_{mode}"].append(time.perf_counter() - w)
                got[name].append([s.entry.id for s in top])
        if got["base"] != got["this"]:
            raise SystemExit(f"the two recalls disagree on {q!r}: {got}")
    out: dict[str, Any] = {
        "load_average_1m": round(os.getloadavg()[0], 1),
        "base": args.base,
        "entries": args.entries,
        "queries": args.queries,
    }
    for key in wall:
        out[f"{key}_p50_ms"] = pct(wall[key], 0.5)
        out[f"{key}_p95_ms"] = pct(wall[key], 0.95)
        out[f"{key}_cpu_p50_ms"] = pct(cpu[key], 0.5)
        out[f"{key}_cpu_p95_ms"] = pct(cpu[key], 0.95)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
