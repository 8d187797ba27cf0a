"""Single-writer throughput: one hot namespace of 5,000 entries with 8 writer processes, and 1,000 namespaces
(first written, then written again: `namespaces_warm_*`, the common case of people who write again).

    python bench/writer.py [--entries 5000] [--procs 8] [--ops 100] [--namespaces 1000] --json
    python bench/writer.py --one [--batches 30]   # one process: wall and CPU ms per 8-op batch, no contention
                                                 # and `cold_batch_cpu_ms`: a fresh process's first batch
                                                 # (with the keys the last leader saved, and without);
                                                 # `spread_op_cpu_ms`: a many-namespace op, local vs Redis

Compared in the same run:
- `batched`: the product's writer (Redis lease + fencing + shared op queue: whoever holds the lease applies
  every pending op of the namespace as one batch, one git commit);
- `baseline`: the same writer with a host-local lock and no queue, i.e. one lock / read / write / commit per op;
- `perop_lease` (many-namespace rows): the same writer with the product's Redis lease and no queue, one lease /
  read / write / commit per op: the per-op writer with the same lock, so that the product's row against it is
  what batching and the shared queue cost, and `baseline` against it what a lock across hosts costs.
Each op is one `remember` of a fresh text; latency is measured per op in the submitting process, the wall
from a common start once every process is ready to its last answer. The hot rows also give the namespace's
commits (group commit: fewer than batches).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memory_core.namespace import Namespace  # noqa: E402
from memory_core.ops import Put, Remember  # noqa: E402
from memory_core.store import Store  # noqa: E402
from memory_core.writer import Writer  # noqa: E402


def _text(rng: random.Random) -> str:
    return "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(14))


PEROP = "perop+"  # a url so prefixed: the Redis lease without the queue (`perop_lease`)


def _writer(data: Path, url: str | None) -> Writer:
    store = Store(data)
    if url is None:
        return Writer(store)
    import redis

    from workers.redis_backend import RedisLocker, RedisOpQueue

    client = redis.Redis.from_url(url.removeprefix(PEROP))
    return Writer(store, RedisLocker(client), None if url.startswith(PEROP) else RedisOpQueue(client))


def child(data: Path, url: str | None, seed: int, ops: int, namespaces: list[str]) -> None:
    """Says `ready` once imported and wired, then waits for the start time on stdin: process start-up
    (seconds at a load of 10) is not counted in anyone's wall."""
    rng = random.Random(seed)
    writer = _writer(data, url)
    print("ready", flush=True)
    go = float(sys.stdin.readline())
    while time.time() < go:
        time.sleep(0.001)
    lat = []
    cpu = time.process_time()
    for i in range(ops):
        ns = Namespace.parse(namespaces[i % len(namespaces)])
        t = time.perf_counter()
        out = writer.submit(ns, [Remember(text=_text(rng))])[0]
        lat.append(time.perf_counter() - t)
        assert out.ok, out
    print(json.dumps({"lat": lat, "end": time.time(), "cpu": time.process_time() - cpu}), flush=True)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def _race(data: Path, url: str | None, ops: int, lists: list[list[str]], first: int = 0) -> dict[str, float]:
    """One child per list of namespaces, `ops` ops each, started together once every child is ready; the
    wall runs from the start to the last op's answer (not the processes' exit). Child i's texts come from
    seed `first + i`: a second race with other seeds writes new memories, not the same ones again (which
    the writer answers as already known, without writing)."""
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", str(data), url or "-", str(seed), str(ops), ",".join(nss)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed, nss in enumerate(lists, first)
    ]
    for c in children:
        assert c.stdout is not None and c.stdout.readline().strip() == "ready"
    go = time.time() + 0.2
    for c in children:
        assert c.stdin is not None
        c.stdin.write(f"{go}\n")
        c.stdin.flush()
    lat: list[float] = []
    end = go
    cpu = 0.0
    for c in children:
        out = json.loads(c.communicate()[0])
        lat.extend(out["lat"])
        end = max(end, out["end"])
        cpu += out["cpu"]
    wall = end - go
    return {
        "ops": len(lat),
        "ops_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(_pct(lat, 0.5), 1),
        "p95_ms": round(_pct(lat, 0.95), 1),
        "cpu_ms_per_op": round(cpu / len(lat) * 1000, 2),  # the writers' own (not Redis's), all threads
    }


def run(data: Path, url: str | None, procs: int, ops: int, namespaces: list[str]) -> dict[str, float]:
    return _race(data, url, ops, [namespaces] * procs)


def spread(
    data: Path, url: str | None, procs: int, per: int, many: list[str], first: int = 0
) -> dict[str, float]:
    """`procs` processes, each writing one op to each of its `per` namespaces."""
    return _race(data, url, per, [many[s * per : (s + 1) * per] for s in range(procs)], first)


def _commits(data: Path, ns: Namespace) -> int:
    return len(Store(data).history(ns, limit=1_000_000))


def seed(data: Path, ns: Namespace, n: int) -> None:
    rng = random.Random(99)
    ops = [Put(entry={"id": f"{i:016x}", "text": _text(rng), "at": "2026-01-01T00:00:00Z"}) for i in range(n)]
    Writer(Store(data)).submit(ns, ops)


def cold(data: Path) -> None:
    """In a fresh process (nothing parsed or cached yet): CPU ms of one batch of 8 on the hot namespace, the
    cost a leader that has never read the namespace pays while the other writers wait."""
    rng = random.Random(os.getpid())
    writer = Writer(Store(data))
    hot = Namespace.of("bench", "hot", "default")
    cpu = time.process_time()
    writer.submit(hot, [Remember(text=_text(rng)) for _ in range(8)])
    print(round((time.process_time() - cpu) * 1000, 1), flush=True)


def _cold_runs(data: Path, runs: int, saved: bool) -> list[float]:
    """`saved`: with the dedup index's keys as the last leader saved them; else with none on disk."""
    cmd = [sys.executable, __file__, "--cold", str(data)]
    cache = Store(data).path(Namespace.of("bench", "hot", "default")) / ".index" / "dedup"
    out = []
    for _ in range(runs):
        if not saved:
            shutil.rmtree(cache, ignore_errors=True)
        out.append(float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    return sorted(out)


def one(entries: int, batches: int) -> dict[str, object]:
    """One process, local lock: what a batch of 8 new memories costs on the hot namespace (wall and CPU),
    and the first op of a fresh namespace. CPU time is what a loaded machine's neighbours do not inflate."""
    data = Path(tempfile.mkdtemp(prefix="lucid-bench-one-"))
    hot = Namespace.of("bench", "hot", "default")
    seed(data, hot, entries)
    rng = random.Random(7)
    writer = Writer(Store(data))
    for _ in range(2):
        writer.submit(hot, [Remember(text=_text(rng)) for _ in range(8)])
    out: dict[str, object] = {}
    for name in ("hot_batch", "fresh_op"):
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(batches):
            if name == "hot_batch":
                writer.submit(hot, [Remember(text=_text(rng)) for _ in range(8)])
            else:
                writer.submit(Namespace.of("b", f"u{i}", "d"), [Remember(text=_text(rng))])
        out[f"{name}_ms"] = round((time.perf_counter() - wall) / batches * 1000, 1)
        out[f"{name}_cpu_ms"] = round((time.process_time() - cpu) / batches * 1000, 1)
    for key, saved in (("cold_batch_cpu_ms", True), ("cold_batch_nocache_cpu_ms", False)):
        runs = _cold_runs(data, 7, saved)
        out[key] = runs[len(runs) // 2]  # the median of 7 fresh processes
        out[key + "_range"] = [runs[0], runs[-1]]
    out["spread_op_cpu_ms"] = spread_cpu(SPREAD_ONE)
    out["load"] = round(os.getloadavg()[0], 1)
    return out


SPREAD_ONE = 300  # namespaces of `spread_cpu`


def spread_cpu(n: int) -> dict[str, dict[str, float]]:
    """The many-namespace race's op in one process, no contention: CPU ms an op (user + system) of the first
    write of each of `n` namespaces, then of writing each again with a new writer (as the race's new
    processes do, nothing cached), through the host-local lock (`local`, the baseline) and the Redis lease
    (`redis`, the product): their difference is the lease's own cost."""
    from workers import embedded_redis

    tmp = Path(tempfile.mkdtemp(prefix="lucid-bench-spread-"))
    server = embedded_redis.start(tmp / "redis", persist=False)
    rng = random.Random(11)
    out: dict[str, dict[str, float]] = {}
    try:
        for mode, url in (("local", None), ("redis", server.url)):
            row = out[mode] = {}
            for name in ("first", "again"):
                writer = _writer(tmp / mode, url)
                cpu = time.process_time()
                for i in range(n):
                    writer.submit(Namespace.of("b", f"u{i}", "d"), [Remember(text=_text(rng))])
                row[name] = round((time.process_time() - cpu) / n * 1000, 2)
    finally:
        server.stop()
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, data, url, seed_s, ops, nss = sys.argv
        child(Path(data), None if url == "-" else url, int(seed_s), int(ops), nss.split(","))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--cold":
        cold(Path(sys.argv[2]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=5000)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--ops", type=int, default=100, help="ops per process")
    ap.add_argument("--namespaces", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", action="store_true", help="one process: ms and CPU ms per batch")
    ap.add_argument("--batches", type=int, default=30)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.entries, args.batches)))
        return

    from workers import embedded_redis

    tmp = Path(tempfile.mkdtemp(prefix="lucid-bench-"))
    server = embedded_redis.start(tmp / "redis", persist=False)
    try:
        results: dict[str, object] = {
            "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
            "entries": args.entries,
            "procs": args.procs,
        }
        hot = str(Namespace.of("bench", "hot", "default"))
        for mode, url in (("batched", server.url), ("baseline", None)):
            data = tmp / mode
            seed(data, Namespace.parse(hot), args.entries)
            results[f"hot_{mode}"] = {
                **run(data, url, args.procs, args.ops, [hot]),
                "commits": _commits(data, Namespace.parse(hot)),
            }
        many = [str(Namespace.of("bench", f"u{i}", "default")) for i in range(args.namespaces)]
        per = args.namespaces // args.procs
        spreads = (("batched", server.url), ("baseline", None), ("perop_lease", PEROP + server.url))
        for mode, url in spreads:
            data = tmp / f"many-{mode}"
            results[f"namespaces_{mode}"] = spread(data, url, args.procs, per, many)
        for mode, url in spreads:  # the same namespaces, a new memory each
            results[f"namespaces_warm_{mode}"] = spread(
                tmp / f"many-{mode}", url, args.procs, per, many, first=args.procs
            )
        hb, hl = results["hot_batched"], results["hot_baseline"]
        assert isinstance(hb, dict) and isinstance(hl, dict)
        results["hot_speedup"] = round(hb["ops_per_s"] / hl["ops_per_s"], 2)
        for row in ("namespaces", "namespaces_warm"):  # the product's ops/s over each per-op arm's
            for arm in ("baseline", "perop_lease"):
                ours, theirs = results[f"{row}_batched"], results[f"{row}_{arm}"]
                assert isinstance(ours, dict) and isinstance(theirs, dict)
                results[f"{row}_vs_{arm}"] = round(ours["ops_per_s"] / theirs["ops_per_s"], 2)
        print(json.dumps(results, indent=None if args.json else 2))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
