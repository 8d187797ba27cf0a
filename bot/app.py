"""The webhook (`POST /feishu/{persona}/events`, `/healthz`, `/admin/…`): verify, decrypt, dedupe, enqueue,
answer 200 well inside Feishu's 3 seconds (the checks and why: docs/ARCHITECTURE.md)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hashlib
import hmac
import ipaddress
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis
from aiohttp import web
from lark_oapi.core.utils import AESCipher

from bot import admin, viewer
from bot.headers import text_header
from bot.longconn import LongConnections
from bot.routing import Ignored, event_time, loads_event, route
from memory_core.errors import LucidError
from memory_core.secretscan import redact
from workers.errors import BadHeader, Rejected
from workers.feishu_send import FeishuSender, Retry
from workers.inbound import Inbound
from workers.mailbox import Intake
from workers.memory_card import enqueue_action, parse_action
from workers.metrics import Buffered, label_text, queue_depths
from workers.runtime import QUEUES, Runtime
from workers.settings import Persona

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
CARD_ACTION = "card.action.trigger"


@dataclass(frozen=True)
class WebhookConfig:
    max_body: int = MAX_BODY
    stale_after: float = 30 * 60  # seconds; the SDK's own FeishuChannel default
    threads: int = 8


def _printable(text: str) -> str:
    """Strangers choose the persona path and event types: keep them from forging log lines."""
    return _UNPRINTABLE.sub("?", text)[:96]


_UNPRINTABLE = re.compile(r"[^\w .:/@()-]")


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))


def open_event(
    headers: Mapping[str, str], body: bytes, persona: Persona, cipher: AESCipher | None
) -> dict[str, Any]:
    """Verify and decode one delivery into the event (or challenge) it carries. Raises Rejected."""
    if not persona.verification_token:
        raise Rejected(403, "persona has no verification_token configured")
    try:
        ts = text_header(headers, "X-Lark-Request-Timestamp")
        nonce = text_header(headers, "X-Lark-Request-Nonce")
        signature = text_header(headers, "X-Lark-Signature")
    except BadHeader as exc:
        raise Rejected(400, str(exc)) from exc
    signed = bool(persona.encrypt_key and ts and nonce and signature)
    if signed:  # over the raw body, before anything is parsed
        expected = hashlib.sha256((ts + nonce + persona.encrypt_key).encode() + body).hexdigest()
        if not _same(expected, signature):
            raise Rejected(401, "bad signature")
    outer = loads_event(body)
    if "encrypt" in outer:
        if cipher is None:
            raise Rejected(400, "encrypted body but no encrypt_key configured")
        blob = outer["encrypt"]
        if not isinstance(blob, str):
            raise Rejected(400, "encrypt is not a string")
        try:
            plaintext = cipher.decrypt_str(blob)
        except (ValueError, TypeError) as exc:  # bad base64, length, padding or UTF-8
            raise Rejected(400, "undecryptable body") from exc
        event = loads_event(plaintext)
    elif cipher is not None:
        raise Rejected(401, "plaintext body but an encrypt_key is configured")
    else:
        event = outer
    header = event.get("header")
    if header is not None and not isinstance(header, dict):
        raise Rejected(400, "event header is not an object")
    token = (header.get("token") if isinstance(header, dict) else None) or event.get("token")
    if not isinstance(token, str) or not _same(token, persona.verification_token):
        raise Rejected(401, "verification token mismatch")
    if event.get("type") == "url_verification":
        return event
    if persona.encrypt_key and not signed:
        raise Rejected(401, "missing signature headers")
    return event


class Batcher:
    """Hands accepted messages to Redis in batches: under load, one round trip serves many requests."""

    def __init__(self, intake: Intake, max_batch: int = 64, lanes: int = 2) -> None:
        self.intake = intake
        self.max_batch = max_batch
        self.lanes = lanes
        self.pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[Inbound, asyncio.Future[bool]]] = []
        self._running = 0

    async def accept(self, inbound: Inbound) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((inbound, future))
        if self._running < self.lanes:
            self._running += 1
            asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                try:
                    fresh = await loop.run_in_executor(
                        self.pool, self.intake.accept_many, [i for i, _ in batch]
                    )
                except Exception as exc:  # every request of the batch answers 503 (Feishu retries)
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, future), ok in zip(batch, fresh, strict=True):
                        if future.done():
                            continue
                        if isinstance(ok, bool):
                            future.set_result(ok)
                        else:  # Redis refused this one event: it alone answers 503
                            future.set_exception(ok)
        finally:
            self._running -= 1


RUNTIME = web.AppKey("runtime", Runtime)


@dataclass
class Webhook:
    runtime: Runtime
    config: WebhookConfig
    intake: Intake
    batcher: Batcher
    bot_ids: dict[str, str] = field(default_factory=dict)
    ciphers: dict[str, AESCipher | None] = field(default_factory=dict)
    pool: ThreadPoolExecutor | None = None
    learning: asyncio.Task[None] | None = None
    metrics: Buffered = field(default_factory=lambda: Buffered(None))
    links: LongConnections | None = None

    async def from_long_connection(self, name: str, event: dict[str, Any]) -> int:
        """An event the long connection received (plaintext, authenticated by the handshake)."""
        return (await self.accept_event(name, event, time.perf_counter())).status

    async def handle(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        name = request.match_info["persona"]
        persona = self.runtime.settings.personas.get(name)
        if persona is None:
            return self._done(404, "unknown persona", name[:64], started)
        try:
            if request.content_length is not None and request.content_length > self.config.max_body:
                raise Rejected(413, "body too large")
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge as exc:
                raise Rejected(413, "body too large") from exc
            event = open_event(request.headers, body, persona, self.ciphers.get(name))
        except Rejected as exc:
            return self._done(exc.status, exc.reason, name, started)
        if event.get("type") == "url_verification":
            self._log(200, "challenge answered", name, started)
            return web.json_response({"challenge": event.get("challenge")})
        return await self.accept_event(name, event, started)

    async def accept_event(self, name: str, event: dict[str, Any], started: float) -> web.Response:
        """Route, redact and enqueue one verified event, from the webhook or the long connection."""
        header = event.get("header") or {}
        event_id = str(header.get("event_id") or event.get("uuid") or "")[:128]
        now_ms = int(time.time() * 1000)
        stale_ms = int(self.config.stale_after * 1000)
        if header.get("event_type") == CARD_ACTION:
            _, late = event_time(header.get("create_time"), now_ms, stale_ms)
            if late:  # a replayed press acts no more than a replayed message
                return self._done(200, f"ignored: {late}", name, started, event_id)
            return await self.accept_card_action(name, event, started, event_id)
        inbound = route(event, name, self.bot_ids.get(name, ""), now_ms=now_ms, stale_ms=stale_ms)
        if isinstance(inbound, Ignored):
            status = 503 if inbound.retry else 200
            if inbound.retry:
                self.learn_soon()
            return self._done(
                status, f"ignored: {inbound.reason}", name, started, event_id, inbound.message_id
            )
        # Secrets never reach Redis (the inbox and its AOF): the turn sees the redacted text.
        inbound = dataclasses.replace(inbound, text=redact(inbound.text))
        try:
            fresh = await self.batcher.accept(inbound)
        except redis.RedisError as exc:
            reason = f"redis unavailable ({type(exc).__name__})"
            return self._done(503, reason, name, started, event_id, inbound.message_id)
        outcome = "queued" if fresh else "duplicate"
        return self._done(200, outcome, name, started, event_id, inbound.message_id, inbound.chat_type)

    async def accept_card_action(
        self, name: str, event: dict[str, Any], started: float, event_id: str
    ) -> web.Response:
        """A button on a /memory card: queued for a worker (the bot never writes memory); Feishu shows the
        toast at once and the worker updates the card in place."""
        action = parse_action(event, name)
        if action is None:
            return self._done(200, "ignored: not a lucid card action", name, started, event_id)
        loop = asyncio.get_running_loop()
        try:
            fresh = await loop.run_in_executor(self.pool, enqueue_action, self.runtime, action)
        except redis.RedisError as exc:
            return self._done(503, f"redis unavailable ({type(exc).__name__})", name, started, event_id)
        self._log(
            200, "card action queued" if fresh else "duplicate", name, started, event_id, action.message_id
        )
        self._count(200, "queued" if fresh else "duplicate", name)
        return web.json_response({"toast": {"type": "info", "content": "收到，正在更新… / Updating…"}})

    def _done(self, status: int, outcome: str, persona: str, started: float, *ids: str) -> web.Response:
        self._log(status, outcome, persona, started, *ids)
        self._count(status, outcome, persona)
        return web.json_response({"msg": outcome if status < 500 else "retry later"}, status=status)

    def _count(self, status: int, outcome: str, persona: str) -> None:
        labels = {"persona": persona if persona in self.runtime.settings.personas else "unknown"}
        self.metrics.inc("lucid_events_received_total", labels)
        if outcome == "duplicate":
            self.metrics.inc("lucid_events_deduplicated_total", labels)
        elif outcome.startswith("ignored: "):
            self.metrics.inc("lucid_events_ignored_total", {**labels, "reason": outcome[9:]})
        elif status >= 400:
            reason = outcome.split(" (")[0] if status >= 500 else outcome
            self.metrics.inc("lucid_events_rejected_total", {**labels, "reason": reason})

    @staticmethod
    def _log(status: int, outcome: str, persona: str, started: float, *ids: str) -> None:
        event_id, message_id, chat_type = (*ids, "", "", "")[:3]
        level = logging.INFO if status < 400 else logging.WARNING
        log.log(
            level,
            "event persona=%s event_id=%s message_id=%s chat_type=%s status=%d outcome=%s ms=%.1f",
            *(_printable(v or "-") for v in (persona, event_id, message_id, chat_type)), status,
            _printable(outcome), (time.perf_counter() - started) * 1000,
        )  # fmt: skip

    async def learn_bot_ids(self) -> None:
        """Fetch each persona's bot open_id once (GET /bot/v3/info), retrying with backoff until known."""
        delay = 1.0
        domain = self.runtime.settings.feishu_domain
        loop = asyncio.get_running_loop()
        while True:
            missing = [p for p in self.runtime.settings.personas.values() if p.name not in self.bot_ids]
            missing = [p for p in missing if p.app_id and p.app_secret]
            if not missing:
                return
            for persona in missing:
                try:
                    sender = FeishuSender(
                        persona, persona.api_domain(domain), None, retry=Retry(attempts=2, backoff=0.2)
                    )
                    self.bot_ids[persona.name] = await loop.run_in_executor(self.pool, sender.bot_open_id)
                    log.info("persona %s: bot open_id learned", persona.name)
                except LucidError as exc:
                    log.warning("persona %s: bot identity not known yet (%s)", persona.name, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)

    def learn_soon(self) -> None:
        """A group message arrived before the bot knew itself: make sure a fetch is running."""
        if self.learning is None or self.learning.done():
            self.learning = asyncio.get_running_loop().create_task(self.learn_bot_ids())


WEBHOOK = web.AppKey("webhook", Webhook)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process is up and its event loop answers."""
    return web.json_response({"status": "ok"})


def _readiness(hook: Webhook) -> dict[str, Any]:
    from rq import Worker

    client = hook.intake.client
    try:
        client.ping()
        workers = [w for w in Worker.all(connection=client) if "chat" in w.queue_names()]
    except redis.RedisError:
        return {"redis": False, "workers": 0}
    return {"redis": True, "workers": len(workers)}


def _observer(request: web.Request, token: str | None) -> bool:
    """May this client see persona names (metrics labels, readiness detail)? With LUCID_METRICS_TOKEN: its
    bearer, compared in constant time. Without: a client on the loopback interface only."""
    if token:
        try:
            given = text_header(request.headers, "Authorization").encode()
        except BadHeader:
            return False
        return hmac.compare_digest(given, f"Bearer {token}".encode())
    try:
        return ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:
        return False


async def readyz(request: web.Request) -> web.Response:
    """Readiness: Redis answers and at least one worker serves the chat queue (else turns would pile up)."""
    hook = request.app[WEBHOOK]
    state = await asyncio.get_running_loop().run_in_executor(hook.pool, _readiness, hook)
    personas = hook.runtime.settings.personas
    links = hook.links.state() if hook.links is not None else {}
    if _observer(request, hook.runtime.settings.metrics_token):
        state["bot_identity"] = {name: bool(hook.bot_ids.get(name)) for name in personas}
        state["long_connection"] = links
    else:  # a stranger learns whether the bot is ready, not which personas it serves
        state["bot_identities_known"] = f"{sum(bool(hook.bot_ids.get(n)) for n in personas)}/{len(personas)}"
        state["long_connections_up"] = f"{sum(links.values())}/{len(links)}"
    ready = state["redis"] and state["workers"] > 0 and all(links.values())
    return web.json_response(
        {"status": "ready" if ready else "not ready", **state}, status=200 if ready else 503
    )


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text: counters from every process (aggregated in Redis) and queue depths."""
    hook = request.app[WEBHOOK]
    token = hook.runtime.settings.metrics_token
    if not _observer(request, token):
        if token:
            return web.Response(status=401, text="bearer LUCID_METRICS_TOKEN required\n",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return web.Response(status=403, text="set LUCID_METRICS_TOKEN to scrape from another host\n")

    def scrape() -> str:
        hook.metrics.flush()
        gauges = queue_depths(hook.intake.client, QUEUES)
        for persona, up in (hook.links.state() if hook.links is not None else {}).items():
            gauges["lucid_ws_connected" + label_text({"persona": persona})] = float(up)
        return hook.metrics.render(gauges)

    text = await asyncio.get_running_loop().run_in_executor(hook.pool, scrape)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def _flush_metrics(hook: Webhook) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(1.0)
        await loop.run_in_executor(hook.pool, hook.metrics.flush)


async def _resources(app: web.Application) -> AsyncIterator[None]:
    hook = app[WEBHOOK]
    # lark-oapi's import leaves ~400 k long-lived objects; a full collection over them stalls the loop for
    # ~250 ms (p99 ack latency 100 ms+ at 500 events/s). Everything alive at startup stays alive: freeze it.
    gc.freeze()
    hook.pool = hook.batcher.pool = ThreadPoolExecutor(
        max_workers=hook.config.threads, thread_name_prefix="webhook"
    )
    hook.learn_soon()
    flusher = asyncio.get_running_loop().create_task(_flush_metrics(hook))
    if hook.links is not None:
        hook.links.start(asyncio.get_running_loop())
    yield
    if hook.links is not None:
        await asyncio.get_running_loop().run_in_executor(None, hook.links.stop)
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher
    hook.metrics.flush()
    if hook.learning is not None:
        hook.learning.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hook.learning
    hook.pool.shutdown(wait=False, cancel_futures=True)


def create_app(runtime: Runtime, config: WebhookConfig | None = None) -> web.Application:
    """The bot's aiohttp application. Needs Redis (dedupe and the queue are shared by every replica)."""
    if runtime.redis is None:
        raise LucidError("the webhook needs Redis: set REDIS_URL or run `lucid serve`")
    config = config or WebhookConfig()
    intake = Intake(runtime.redis)
    hook = Webhook(runtime, config, intake, Batcher(intake), metrics=Buffered(runtime.redis))
    for name, persona in runtime.settings.personas.items():
        hook.ciphers[name] = AESCipher(persona.encrypt_key) if persona.encrypt_key else None
        if persona.bot_open_id:
            hook.bot_ids[name] = persona.bot_open_id
        if persona.mode != "ws" and not persona.verification_token:
            log.error("persona %s has no verification_token: its webhook refuses every request", name)
    ws = [p for p in runtime.settings.personas.values() if p.mode == "ws"]
    if ws:
        hook.links = LongConnections(
            ws,
            runtime.settings.feishu_domain,
            hook.from_long_connection,
            on_reconnect=lambda persona: hook.metrics.inc("lucid_ws_reconnects_total", {"persona": persona}),
        )
    app = web.Application(client_max_size=config.max_body)
    app[RUNTIME] = runtime
    app[WEBHOOK] = hook
    app.router.add_post("/feishu/{persona}/events", hook.handle)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    admin.setup(app, runtime)
    viewer.mount(app, runtime)
    app.cleanup_ctx.append(_resources)
    return app
