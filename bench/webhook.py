"""Webhook benchmark: signed, encrypted Feishu events against the real bot, next to a bare aiohttp handler.

    .venv/bin/python bench/webhook.py [--events 5000] [--concurrency 64] [--rate 500] [--seconds 10]

Each server runs in its own process (real aiohttp, real Redis: a private embedded redis-server unless
--redis is given); this process is the load generator. Two measurements per server:

- throughput: `--events` distinct events sent closed-loop with `--concurrency` in flight → events/s;
- latency: an open-loop schedule of `--rate` events/s for `--seconds` → ack latency p50/p99/max.

The server's own CPU time per event (from /proc) is reported too: on a shared machine it is the figure
other people's load does not move.

The bot does its whole job per event — signature, AES decrypt, token, routing, dedupe + inbox (one Lua call),
RQ enqueue — and nothing is answered (no worker runs). The bare handler reads the body and answers 200.
Prints one JSON object. Goals (DESIGN, 2 cores): ≥ 2,000 events/s; p99 ≤ 25 ms at 500 events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import ClientSession, TCPConnector, web

KEY = "bench-encrypt-key"
TOKEN = "bench-verification-token"


# ---------------------------------------------------------------------------------------------- servers


def serve(kind: str, redis_url: str, data: str) -> None:
    """Run one server on a free port, print the port, serve until killed."""
    logging.basicConfig(level=logging.WARNING)

    async def bare(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"msg": "ok"})

    if kind == "bot":
        from bot.app import create_app
        from workers.runtime import build
        from workers.settings import Persona, Settings

        persona = Persona("bench", verification_token=TOKEN, encrypt_key=KEY, bot_open_id="ou_bench_bot")
        settings = Settings(data_dir=Path(data), personas={"bench": persona})
        app = create_app(build(settings, redis_url, git=False))
    else:
        app = web.Application()
        app.router.add_post("/feishu/{persona}/events", bare)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        print(port, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def start_server(kind: str, redis_url: str, data: str) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, __file__, "--serve", kind, "--redis", redis_url, "--data", data]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    if not port:
        raise SystemExit(f"{kind} server did not start")
    return proc, f"http://127.0.0.1:{port}/feishu/bench/events"


# ---------------------------------------------------------------------------------------------- load


def deliveries(n: int) -> list[tuple[bytes, dict[str, str]]]:
    from tests.fakes.feishu_events import deliver, message_event, user

    people = [user(f"bench-user-{i}") for i in range(200)]
    out = []
    for i in range(n):
        event = message_event(f"第 {i} 条消息：我住在余杭区", sender=people[i % len(people)], token=TOKEN)
        d = deliver(event, encrypt_key=KEY, nonce=uuid.uuid4().hex[:16])
        out.append((d.body, d.headers))
    return out


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process so far (Linux /proc): the server's cost, whoever else runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def throughput(url: str, items: list[tuple[bytes, dict[str, str]]], concurrency: int) -> dict[str, Any]:
    statuses: dict[int, int] = {}
    queue = list(reversed(items))

    async def worker(session: ClientSession) -> None:
        while queue:
            body, headers = queue.pop()
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1

    async with ClientSession(connector=TCPConnector(limit=concurrency)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "events": len(items),
        "seconds": round(elapsed, 3),
        "events_per_s": round(len(items) / elapsed),
        "statuses": statuses,
    }


async def latency(url: str, items: list[tuple[bytes, dict[str, str]]], rate: float) -> dict[str, Any]:
    """Open loop: event i is sent at start + i/rate whatever happened to the others."""
    lat: list[float] = []
    statuses: dict[int, int] = {}

    async def one(session: ClientSession, at: float, body: bytes, headers: dict[str, str]) -> None:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        t = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as resp:
            await resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
        lat.append((time.perf_counter() - t) * 1000)

    async with ClientSession(connector=TCPConnector(limit=256)) as session:
        start = time.perf_counter() + 0.2
        await asyncio.gather(*(one(session, start + i / rate, b, h) for i, (b, h) in enumerate(items)))
    return {
        "rate": rate,
        "events": len(items),
        "p50_ms": round(percentile(lat, 50), 2),
        "p99_ms": round(percentile(lat, 99), 2),
        "max_ms": round(max(lat), 2),
        "statuses": statuses,
    }


async def measure(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    warm = deliveries(300)
    await throughput(url, warm, 16)
    items = deliveries(args.events)
    cpu = cpu_seconds(pid)
    result = {"throughput": await throughput(url, items, args.concurrency)}
    result["throughput"]["server_cpu_us_per_event"] = round((cpu_seconds(pid) - cpu) / len(items) * 1e6)
    result["latency"] = await latency(url, deliveries(int(args.rate * args.seconds)), args.rate)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--redis", help="Redis URL (default: a private embedded redis-server)")
    parser.add_argument("--serve", choices=("bot", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.redis, args.data)
        return

    from workers import embedded_redis

    tmp = Path(tempfile.mkdtemp(prefix="lucid-bench-"))
    server = None if args.redis else embedded_redis.start(tmp / "redis", persist=False)
    redis_url = args.redis or server.url  # type: ignore[union-attr]
    report: dict[str, Any] = {
        "bench": "webhook",
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg()[0],
        "params": {k: getattr(args, k) for k in ("events", "concurrency", "rate", "seconds")},
    }
    try:
        for kind in ("bare", "bot"):
            proc, url = start_server(kind, redis_url, str(tmp / "data"))
            try:
                report[kind] = asyncio.run(measure(url, proc.pid, args))
            finally:
                proc.terminate()
                proc.wait(timeout=10)
    finally:
        if server is not None:
            server.stop()
    report["bot_vs_bare_throughput"] = round(
        report["bot"]["throughput"]["events_per_s"] / report["bare"]["throughput"]["events_per_s"], 3
    )
    print(json.dumps(report, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
