"""Repository growth: `.git` bytes against raw-archive bytes after N long messages from one person.

    python bench/growth.py [--messages 30] [--chars 1500] [--json]

Each turn writes what a chat turn writes through the writer, one batch each: the person's message as a
raw record, the memory it used (a hit bump), the reply's record, and every third turn a remembered fact.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memory_core.lineformat import format_time
from memory_core.namespace import Namespace
from memory_core.ops import Record, Remember, Touch
from memory_core.store import Store
from memory_core.writer import Writer


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def run(messages: int, chars: int, data: Path) -> dict[str, object]:
    rng = random.Random(5)
    start = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
    clock = [start]
    writer = Writer(Store(data), clock=lambda: clock[0])
    ns = Namespace.of("bench", "growth", "default")
    fact = None
    for i in range(messages):
        clock[0] = start + timedelta(minutes=3 * i)
        ts = format_time(clock[0])
        text = "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(chars))
        writer.submit(ns, [Record(message={"id": f"u{i}", "ts": ts, "speaker": "user", "text": text})])
        if fact is not None:
            writer.submit(ns, [Touch(ids=(fact,), at=ts)])
        reply = "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(chars // 5))
        writer.submit(ns, [Record(message={"id": f"b{i}", "ts": ts, "speaker": "bot", "text": reply})])
        if i % 3 == 0:
            fact = writer.submit(ns, [Remember(text=f"我的第{i}个习惯是{text[:12]}")])[0].id
    root = ns.path(data)
    git_bytes, raw_bytes = _bytes(root / ".git"), _bytes(root / "raw")
    commits = subprocess.run(
        ["git", "-C", str(root), "rev-list", "--count", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {
        "messages": messages,
        "chars": chars,
        "git_bytes": git_bytes,
        "raw_bytes": raw_bytes,
        "ratio": round(git_bytes / raw_bytes, 2),
        "commits": int(commits),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=30)
    ap.add_argument("--chars", type=int, default=1500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(args.messages, args.chars, Path(tempfile.mkdtemp(prefix="lucid-growth-")))
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
