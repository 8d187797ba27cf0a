"""`lucid history` on a large namespace: rows in words, reading only the lines each commit changed, against
a full parse of every version (how `entry_changes` read a commit before), in the same run.

    python bench/history.py [--entries 5000] [--commits 50] [--json]

One namespace: an import of `--entries` facts (one commit), then `--commits` writes of one fact each.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memory_core import history
from memory_core.lineformat import parse_file
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from memory_core.store import ARCHIVE, MEMORY, Store
from memory_core.writer import Writer


def _full_parse(store: Store, ns: Namespace, limit: int) -> int:
    """The baseline: `entry_changes` as it was — every version parsed whole and every entry compared
    without its usage counters — for each commit `lucid history` shows."""
    changed = 0
    for row in store.history(ns, limit=limit):
        versions = [store.files_at(ns, f"{row['rev']}^"), store.files_at(ns, row["rev"])]
        old, new = (
            {
                e.id: (where, e)
                for name, where in ((ARCHIVE, "archive"), (MEMORY, "memory"))
                for e in parse_file(v.get(name) or "").entries()
            }
            for v in versions
        )
        essence = history._essence
        changed += sum(essence(old.get(i)) != essence(new.get(i)) for i in set(old) | set(new))  # type: ignore[arg-type]
    return changed


def run(entries: int, commits: int, data: Path) -> dict[str, object]:
    store = Store(data)
    writer = Writer(store)
    ns = Namespace.of("bench", "history", "default")
    writer.submit(ns, [Remember(f"fact {i} about topic {i * 7919 % 10007}") for i in range(entries)], 600)
    for i in range(commits):
        writer.submit(ns, [Remember(f"a new thing {i}: zz{i * 31}")])
    limit = commits + 1
    history._states.cache_clear()
    started = time.perf_counter()
    rows = history.rows(store, ns, limit=limit)
    ours = time.perf_counter() - started
    history._states.cache_clear()
    started = time.perf_counter()
    _full_parse(store, ns, limit)
    baseline = time.perf_counter() - started
    started = time.perf_counter()
    history.last_meaningful(writer, ns)
    bare = time.perf_counter() - started
    return {
        "entries": entries,
        "rows": len(rows),
        "history_s": round(ours, 3),
        "full_parse_s": round(baseline, 3),
        "bare_undo_target_s": round(bare, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--commits", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.entries, args.commits, Path(tmp))
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
