"""`lucid serve`, `lucid bot`, `lucid worker`, `lucid cron`: the long-running processes (`serve`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
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
    p = sub.add_parser("healthcheck", help="exit 0 if this host's bot, worker or cron is alive (docker)")
    p.add_argument("role", choices=("bot", "worker", "cron"))
    p.add_argument("--data", help="data directory")


def _banner(settings: Settings, host: str) -> str:
    base = f"http://{host}:{settings.port}"
    lines = [f"Lucid is listening on {base}  (data: {settings.data_dir.resolve()})"]
    for name, persona in settings.personas.items():
        if persona.mode == "ws":
            lines.append(f"  persona {name!r}: Feishu long connection (no public URL needed)")
        elif not persona.app_id:
            lines.append(f"  persona {name!r}: no Feishu app configured (see lucid.toml.example)")
        elif host in ("127.0.0.1", "localhost", "::1"):
            lines.append(
                f"  persona {name!r}: webhook at {base}/feishu/{name}/events is reachable from this machine"
                " only; Feishu needs a public HTTPS URL: run with --host 0.0.0.0 behind an HTTPS proxy,"
                ' or set mode = "ws" for the long connection'
            )
        else:
            lines.append(
                f"  persona {name!r}: point Feishu at https://<your public host>/feishu/{name}/events"
                f" (proxied to {base})"
            )
    lines.append(f"  health: {base}/healthz   metrics: {base}/metrics")
    if not (settings.chat_model or any(p.chat_model for p in settings.personas.values())):
        lines.append("  no chat model configured (LUCID_CHAT_MODEL): the bot runs in memory-only mode")
    lines.append(
        f"  try it without Feishu:  {shlex.join([*_lucid(), 'chat', '--data', str(settings.data_dir)])}"
    )
    lines.append("Ctrl-C to stop.")
    return "\n".join(lines)


def _lucid() -> list[str]:
    """How this very `lucid` was started, so the hint runs as printed (often .venv/bin/lucid)."""
    exe = Path(sys.argv[0])
    if exe.name == "lucid":
        try:
            return [str(exe.resolve().relative_to(Path.cwd()))]
        except ValueError:
            return [str(exe) if exe.parent != Path() else "lucid"]
    return [sys.executable, "-m", "bot.cli"]


def listen(host: str, port: int) -> socket.socket:
    """Take the webhook port first, so a busy port is one clear error before anything else starts."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise LucidError(f"cannot listen on {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise LucidError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): another process holds the port; "
            "stop it or set LUCID_PORT"
        ) from exc
    sock.setblocking(False)
    return sock


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal was closed


def _serve_webhook(
    runtime: Runtime,
    sock: socket.socket,
    started: Callable[[], list[subprocess.Popen[bytes]]],
    banner: str,
    tend: Callable[[], None] = lambda: None,
) -> int:
    """Serve on the bound `sock`: start the children, print the banner once requests are answered, and
    run until a stop signal (exit code 0) or a child dies (1, so a supervisor restarts the whole set)."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    children: list[subprocess.Popen[bytes]] = []
    died: list[subprocess.Popen[bytes]] = []
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)

    async def watch() -> None:
        # A child that dies on its own is a fault worth stopping for: say so rather than limp on.
        while not stop.is_set():
            for child in children:
                if child.poll() is not None:
                    log.error("child process %s exited with %s; stopping", child.args, child.returncode)
                    died.append(child)
                    stop.set()
            await loop.run_in_executor(None, tend)
            await asyncio.sleep(0.5)

    async def run() -> None:
        from .app import create_app

        runner = web.AppRunner(create_app(runtime), access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        try:
            children.extend(started())
            print(banner, flush=True)
            await watch()
        finally:
            await runner.cleanup()

    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    return 1 if died else 0


def _child(role: str, settings: Settings, url: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, REDIS_URL=url, LUCID_DATA=str(settings.data_dir))
    if settings.config_path.is_file():
        env["LUCID_CONFIG"] = str(settings.config_path.resolve())
    else:  # no personas file: the children use the same built-in default persona (a named one must exist)
        env.pop("LUCID_CONFIG", None)
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
    """The one-command laptop setup: embedded Redis, one worker and the scheduler as children, the webhook
    here; Ctrl-C or SIGTERM stops the webhook, the children, then the Redis it started (no orphans)."""
    server, runtime = None, None
    url = settings.redis_url
    # Closing the terminal must not leave the embedded Redis behind: SIGHUP stops like Ctrl-C, also
    # while Redis is still starting (before the event loop's handlers exist).
    signal.signal(signal.SIGHUP, _raise_interrupt)
    children: list[subprocess.Popen[bytes]] = []
    sock = listen(args.host, settings.port)
    try:
        if url is None:
            server = embedded_redis.start(settings.data_dir)
            url = server.url
        runtime = build(settings, redis_url=url)
        redis_url = url

        def start_children() -> list[subprocess.Popen[bytes]]:
            started = [_child("worker", settings, redis_url) for _ in range(max(1, args.workers))]
            if not args.no_cron:
                started.append(_child("cron", settings, redis_url))
            children.extend(started)
            return started

        def tend() -> None:  # an OOM-killed Redis comes back on the URL every child holds
            nonlocal server
            if server is not None and server.process is not None and server.process.poll() is not None:
                log.error(
                    "the embedded redis-server exited with %s; starting it again", server.process.returncode
                )
                server = embedded_redis.start(settings.data_dir)

        code = _serve_webhook(runtime, sock, start_children, _banner(settings, args.host), tend)
    finally:
        sock.close()
        _stop_children(children)
        if runtime is not None:
            runtime.close()
        if server is not None:
            server.stop()
    return code


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def bot_only(args: argparse.Namespace, settings: Settings) -> int:
    if settings.redis_url is None:
        raise LucidError("`lucid bot` needs REDIS_URL (use `lucid serve` for the all-in-one default)")
    sock = listen(args.host, settings.port)
    try:
        with build(settings) as runtime:
            return _serve_webhook(runtime, sock, list, _banner(settings, args.host))
    finally:
        sock.close()


def worker(args: argparse.Namespace, settings: Settings) -> int:
    from workers.worker import run_worker

    return _on_redis(settings, "worker", lambda runtime: run_worker(runtime, burst=args.burst))


def cron(args: argparse.Namespace, settings: Settings) -> int:
    from workers.scheduler import run_cron

    return _on_redis(settings, "cron", run_cron)


def _on_redis(settings: Settings, command: str, run: Callable[[Runtime], object]) -> int:
    """Run `lucid <command>` on REDIS_URL, else on the embedded server `lucid serve` started."""
    url = settings.redis_url or embedded_redis.running_url(settings.data_dir)
    if url is None:
        raise LucidError(f"`lucid {command}` needs Redis: set REDIS_URL, or start `lucid serve`")
    with build(settings, redis_url=url) as runtime:
        run(runtime)
    return 0


def healthcheck(args: argparse.Namespace, settings: Settings) -> int:
    """`lucid healthcheck ROLE`: one line and exit 0 when alive, 1 when not."""
    if args.role == "bot":
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{settings.port}/healthz", timeout=3) as resp:
                problem = None if resp.status == 200 else f"/healthz answered {resp.status}"
        except OSError as exc:
            problem = f"/healthz unreachable ({exc})"
    else:
        import redis

        from workers.health import check

        url = settings.redis_url or embedded_redis.running_url(settings.data_dir)
        if url is None:
            raise LucidError("no Redis to ask: set REDIS_URL")
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        problem = check(client, args.role)
    print(f"{args.role}: {problem or 'alive'}")
    return 1 if problem else 0


ROLES = {"serve": serve, "bot": bot_only, "worker": worker, "cron": cron, "healthcheck": healthcheck}
