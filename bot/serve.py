"""`lucid serve`, `lucid bot`, `lucid worker`, `lucid cron`: the long-running processes.

`serve` is the one-command laptop setup: the embedded Redis (a private `redis-server` on a unix socket
under the data dir, reused if already running), one worker and the scheduler as child processes, and the
webhook in this process. Ctrl-C or SIGTERM stops the webhook, then the children (RQ's warm shutdown), then
the Redis it started — no orphans. Docker compose runs the same roles as separate containers instead.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from aiohttp import web

from memory_core.errors import LucidError
from workers import embedded_redis
from workers.runtime import Runtime, build
from workers.settings import Settings

log = logging.getLogger(__name__)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve", help="webhook + worker + scheduler in one command (embedded Redis by default)"
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--no-cron", action="store_true", help="do not run the dream scheduler")
    p.add_argument("--data", help="data directory")
    p = sub.add_parser("bot", help="the webhook only (docker compose, scale-out)")
    p.add_argument("--host", default="127.0.0.1", help="listen address")
    p.add_argument("--data", help="data directory")
    p = sub.add_parser("worker", help="an RQ worker for chat turns, extraction and dreaming")
    p.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    p.add_argument("--data", help="data directory")
    p = sub.add_parser("cron", help="the dream scheduler (run exactly one)")
    p.add_argument("--data", help="data directory")


def _banner(settings: Settings, host: str) -> str:
    base = f"http://{host}:{settings.port}"
    lines = [f"Lucid is listening on {base}  (data: {settings.data_dir.resolve()})"]
    for name in settings.personas:
        lines.append(f"  Feishu event URL for persona {name!r}: {base}/feishu/{name}/events")
    lines.append(f"  health: {base}/healthz   metrics: {base}/metrics")
    if not (settings.chat_model or any(p.chat_model for p in settings.personas.values())):
        lines.append("  no chat model configured (LUCID_CHAT_MODEL): the bot runs in memory-only mode")
    lines.append(
        f"  try it without Feishu:  {shlex.join(['lucid', 'chat', '--data', str(settings.data_dir)])}"
    )
    lines.append("Ctrl-C to stop.")
    return "\n".join(lines)


async def _run_app(runtime: Runtime, host: str, stop: asyncio.Event) -> None:
    from .app import create_app

    app = create_app(runtime)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, runtime.settings.port)
    await site.start()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _serve_webhook(runtime: Runtime, host: str, children: list[subprocess.Popen[bytes]]) -> None:
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def watch() -> None:
        # A child that dies on its own is a fault worth stopping for: say so rather than limp on.
        while not stop.is_set():
            for child in children:
                if child.poll() is not None:
                    log.error("child process %s exited with %s; stopping", child.args, child.returncode)
                    stop.set()
            await asyncio.sleep(0.5)

    async def both() -> None:
        await asyncio.gather(_run_app(runtime, host, stop), watch())

    try:
        loop.run_until_complete(both())
    finally:
        loop.close()


def _child(role: str, settings: Settings, url: str) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, REDIS_URL=url, LUCID_DATA=str(settings.data_dir), LUCID_CONFIG=str(settings.config_path)
    )
    return subprocess.Popen([sys.executable, "-m", "bot.cli", role], env=env)


def _stop_children(children: list[subprocess.Popen[bytes]], grace: float = 20.0) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def serve(args: argparse.Namespace, settings: Settings) -> int:
    server = None
    url = settings.redis_url
    if url is None:
        server = embedded_redis.start(settings.data_dir)
        url = server.url
    children: list[subprocess.Popen[bytes]] = []
    try:
        runtime = build(settings, redis_url=url)
        children = [_child("worker", settings, url) for _ in range(max(1, args.workers))]
        if not args.no_cron:
            children.append(_child("cron", settings, url))
        print(_banner(settings, args.host), flush=True)
        _serve_webhook(runtime, args.host, children)
    finally:
        _stop_children(children)
        if server is not None:
            server.stop()
    return 0


def bot_only(args: argparse.Namespace, settings: Settings) -> int:
    if settings.redis_url is None:
        raise LucidError("`lucid bot` needs REDIS_URL (use `lucid serve` for the all-in-one default)")
    runtime = build(settings)
    print(_banner(settings, args.host), flush=True)
    _serve_webhook(runtime, args.host, [])
    return 0


def worker(args: argparse.Namespace, settings: Settings) -> int:
    from workers.worker import run_worker

    url = settings.redis_url or embedded_redis.running_url(settings.data_dir)
    if url is None:
        raise LucidError("`lucid worker` needs Redis: set REDIS_URL, or start `lucid serve`")
    run_worker(build(settings, redis_url=url), burst=args.burst)
    return 0


def cron(args: argparse.Namespace, settings: Settings) -> int:
    from workers.scheduler import run_cron

    url = settings.redis_url or embedded_redis.running_url(settings.data_dir)
    if url is None:
        raise LucidError("`lucid cron` needs Redis: set REDIS_URL, or start `lucid serve`")
    run_cron(build(settings, redis_url=url))
    return 0


ROLES = {"serve": serve, "bot": bot_only, "worker": worker, "cron": cron}


def data_override(args: argparse.Namespace) -> dict[str, Path]:
    return {"data_dir": Path(args.data)} if getattr(args, "data", None) else {}
