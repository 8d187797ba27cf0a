"""Index cost benchmark (issue 15): what one message costs the raw-archive search index, by its length.

    .venv/bin/python bench/index_cost.py [--baseline REV] [--repeat 3]

Two measurements, each run against this tree and, with `--baseline`, against the `memory_core` of another
git revision (extracted with `git archive` into a temp dir and run in a subprocess, so old and new are
measured in the same run on the same machine load):

- per_message: the time `RawIndex.add` takes for one user message of 1,000 / 2,000 / 4,000 / 8,000 CJK
  characters after four such messages and two bot replies, in order (its create_time after everything
  recorded) and out of order (older than the replies, which is what every burst produces: the worker records
  reply i before it reaches message i+1, sent earlier);
- burst: 8 messages through the raw archive write path as a worker runs them (Writer + Store with git, a
  Record op for the message, the index caught up from the day file as the memory service does, a search for
  active recall, a Record op for the reply), 8 long (4,000 CJK characters) against 8 short ones.
  Goal: long burst ≤ 4 × short burst.
- hand_line (with `--hand-line N`): the write after a person pasted an N-character line into MEMORY.md,
  and the write after that (issue 15: 52 s and 450 MB at 20 million characters, every write); peak memory
  by tracemalloc.

Prints one JSON object; times are wall-clock seconds (median of `--repeat`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LENGTHS = (1000, 2000, 4000, 8000)
BURST = 8
LONG = 4000
T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def cjk_text(rng: random.Random, n: int) -> str:
    # A pool of 2,500 common-range Han characters: long messages then carry thousands of distinct bigrams,
    # as real long Chinese text does.
    pool = [chr(0x4E00 + i * 7) for i in range(2500)]
    return "".join(rng.choice(pool) for _ in range(n))


def per_message(repeat: int) -> dict[str, Any]:
    from memory_core.lineformat import RawMessage
    from memory_core.rawindex import RawIndex

    rng = random.Random(15)
    out: dict[str, Any] = {}
    for length in LENGTHS:
        for order in ("in_order", "out_of_order"):
            times = []
            for _ in range(repeat):
                index = RawIndex()
                # A burst so far: four long messages sent a second apart, two replies recorded after them.
                for i in range(4):
                    at = T0 + timedelta(seconds=i)
                    index.add(RawMessage(f"m{i}", at, "u", cjk_text(rng, length), "oc", "p2p", "user", "s"))
                for i in range(2):
                    at = T0 + timedelta(seconds=10 + 5 * i)
                    index.add(RawMessage(f"r{i}", at, "bot", "好的，记下了。", "oc", "p2p", "assistant", "s"))
                # The next message: after the last reply (in order) or sent before the replies (a burst).
                late = timedelta(seconds=20) if order == "in_order" else timedelta(seconds=4)
                msg = RawMessage("new", T0 + late, "u", cjk_text(rng, length), "oc", "p2p", "user", "s")
                started = time.perf_counter()
                index.add(msg)
                times.append(time.perf_counter() - started)
            out[f"{length}_{order}_s"] = round(statistics.median(times), 4)
    return out


def burst(length: int, repeat: int) -> float:
    from memory_core.lineformat import RawMessage
    from memory_core.namespace import Namespace
    from memory_core.ops import Record, message_to_json
    from memory_core.rawindex import RawIndex
    from memory_core.store import Store
    from memory_core.writer import LocalLocker, Writer

    rng = random.Random(length)
    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp))
            writer = Writer(store, LocalLocker(store))
            ns = Namespace.of("t", "u", "p")
            index, offsets = RawIndex(), dict[str, int]()

            texts = [cjk_text(rng, length) for _ in range(BURST)]
            started = time.perf_counter()
            for i, text in enumerate(texts):
                # Message i was sent at T0+i s; the worker reaches it only after replying to i-1 (later).
                user = RawMessage(f"m{i}", T0 + timedelta(seconds=i), "u", text, "oc", "p2p", "user", "s")
                writer.submit(ns, [Record(message_to_json(user))])
                catch_up(store, ns, index, offsets)
                index.search(text[:200], k=8, exclude_session="s")
                reply_at = T0 + timedelta(seconds=BURST + 5 * i)
                reply = RawMessage(
                    f"r{i}", reply_at, "bot", "好的，我记下了。", "oc", "p2p", "assistant", "s"
                )
                writer.submit(ns, [Record(message_to_json(reply))])
                catch_up(store, ns, index, offsets)
            times.append(time.perf_counter() - started)
    return round(statistics.median(times), 4)


def catch_up(store: Any, ns: Any, index: Any, offsets: dict[str, int]) -> None:
    """What MemoryService._raw_cache does: read the day files' new whole lines and index them."""
    from memory_core.lineformat import parse_raw

    for day in store.raw_days(ns):
        data = (store.path(ns) / "raw" / day).read_bytes()[offsets.get(day, 0) :]
        end = data.rfind(b"\n") + 1
        lines = data[:end].decode("utf-8", errors="surrogateescape").split("\n")
        index.add_many(parse_raw(line) for line in lines if line.startswith("- "))
        offsets[day] = offsets.get(day, 0) + end


def measure(repeat: int) -> dict[str, Any]:
    short, long_ = burst(20, repeat), burst(LONG, repeat)
    return {
        "per_message": per_message(repeat),
        "burst_8_short_s": short,
        f"burst_8_long_{LONG}_s": long_,
        "burst_ratio": round(long_ / short, 2),
    }


def hand_line(chars: int) -> dict[str, Any]:
    import tracemalloc

    from memory_core.namespace import Namespace
    from memory_core.ops import Remember
    from memory_core.store import Store
    from memory_core.writer import Writer

    with tempfile.TemporaryDirectory() as tmp:
        writer = Writer(Store(Path(tmp)))
        ns = Namespace.of("t", "u", "p")
        writer.submit(ns, [Remember("我住在杭州")])
        memory = ns.path(Path(tmp)) / "MEMORY.md"
        memory.write_text(memory.read_text() + "- " + "长" * chars + "\n")
        tracemalloc.start()
        started = time.perf_counter()
        writer.submit(ns, [Remember("我喜欢喝龙井")])
        first = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        started = time.perf_counter()
        writer.submit(ns, [Remember("我喜欢爬山")])
        second = time.perf_counter() - started
    return {"chars": chars, "first_write_s": round(first, 2), "next_write_s": round(second, 3),
            "first_write_peak_mb": round(peak / 2**20, 1)}  # fmt: skip


def baseline(rev: str, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "memory_core"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        done = subprocess.run(
            [sys.executable, __file__, "--inner", "--repeat", str(repeat)],
            env={**os.environ, "PYTHONPATH": tmp},
            capture_output=True,
            text=True,
            check=True,
        )
        return dict(json.loads(done.stdout), code=rev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="also measure memory_core at this git revision (e.g. 63fb861)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hand-line", type=int, help="also time the writes after an N-character hand edit")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:  # run by `baseline`: PYTHONPATH points at the old memory_core
        print(json.dumps(measure(args.repeat)))
        return
    sys.path.insert(0, str(ROOT))
    result: dict[str, Any] = {"current": measure(args.repeat)}
    if args.hand_line:
        result["hand_line"] = hand_line(args.hand_line)
    if args.baseline:
        result["baseline"] = baseline(args.baseline, args.repeat)
    result["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
