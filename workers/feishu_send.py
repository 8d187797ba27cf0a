"""Outbound Feishu through the real, synchronous lark-oapi client: replies, reactions, pacing and retries;
only `FeishuError` leaves the module (docs/ARCHITECTURE.md, "Delivery")."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lark_oapi as lark
import redis
import requests
from lark_oapi.api.im.v1 import (
    CreateMessageReactionRequest,
    CreateMessageReactionRequestBody,
    CreateMessageRequest,
    CreateMessageRequestBody,
    DeleteMessageReactionRequest,
    Emoji,
    PatchMessageRequest,
    PatchMessageRequestBody,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
)
from lark_oapi.core.exception import ObtainAccessTokenException
from lark_oapi.core.token import TokenManager

from .errors import FeishuError
from .markup import attr, neutralize
from .redis_backend import PACE
from .redis_keys import Keys
from .settings import SEND_RATE, Persona

log = logging.getLogger(__name__)

APP_QPS = 40.0  # replies per second per app at Feishu's default quota (documented: 50/s with 1000/min)

TOKEN_INVALID = frozenset({99991663, 99991664, 99991665})
RATE_LIMITED = frozenset({99991400, 230020, 11232, 230049})
CONTENT_REFUSED = frozenset({230001, 230025, 99992402})
CHUNK_CHARS = 3000
THINKING = "THINKING"
_MARKDOWN = re.compile(r"(\*\*|__|`|^#{1,6} |^\s*[-*+] |^\s*\d+\. |\[[^\]]+\]\([^)]+\)|^> )", re.M)


@dataclass(frozen=True)
class Retry:
    """How hard a sender tries: attempts per request and the backoff between them (seconds)."""

    attempts: int = 4
    backoff: float = 0.5
    max_wait: float = 10.0


_asleep = threading.local()


def paced_seconds() -> float:
    """Seconds this thread has slept in send pacing so far (a turn's time minus this is its own work)."""
    return float(getattr(_asleep, "seconds", 0.0))


HORIZON_MS = 10.0  # a chat slot further off than this is taken alone; the app's when the send goes


class Pacer:
    """Hands out send slots under Feishu's limits, per chat and per app, across every process (GCRA cells in
    Redis, or in process without it; docs/ARCHITECTURE.md, "Delivery")."""

    def __init__(
        self,
        client: redis.Redis | None,
        chat_qps: float = 4.0,
        app_qps: float | None = None,
        app_limit: tuple[int, float] = (1000, 60.0),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        count, seconds = app_limit
        self.chat_ms = 1000 / chat_qps
        self.app_ms = 1000 / (app_qps or max(APP_QPS, APP_QPS * count / seconds / (SEND_RATE / 60)))
        burst = max(1, count // 30)
        self.window_ms = seconds * 1000 / max(1, count - burst)
        self.window_tolerance = (burst - 1) * self.window_ms
        self._script = client.register_script(PACE) if client is not None else None
        self._sleep = sleep
        self._local: dict[str, float] = {}
        self._lock = threading.Lock()

    def wait(self, app_id: str, chat_id: str | None) -> float:
        """Sleep until this send's slot; returns the seconds slept."""
        delay, taken = self._take(app_id, chat_id, held=False)
        slept = 0.0
        if not taken:  # the chat's slot is ahead: sleep until it, then take the app's
            self._sleep(delay)
            slept = delay
            delay, _ = self._take(app_id, chat_id, held=True)
        if delay > 0:
            self._sleep(delay)
        _asleep.seconds = getattr(_asleep, "seconds", 0.0) + slept + max(0.0, delay)
        return slept + delay

    def ahead(self, chat_id: str) -> float:
        """Seconds until `chat_id`'s next free send slot, without taking it (0: it could be sent to now)."""
        key = Keys.pace("chat", chat_id)
        if self.client is None:
            with self._lock:
                return max(0.0, self._local.get(key, 0.0) - time.monotonic() * 1000) / 1000
        pipe = self.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.time()
        tat, (seconds, micros) = pipe.execute()
        return max(0.0, float(tat or 0) - (int(seconds) * 1000 + int(micros) / 1000)) / 1000

    def reserve(self, app_id: str, chat_id: str | None) -> float:
        """Take the next slot of one send without sleeping; returns the seconds until it. With a chat paced
        beyond the horizon that is the chat's slot only: `wait` takes the app's when it comes."""
        return self._take(app_id, chat_id, held=False)[0]

    def _take(self, app_id: str, chat_id: str | None, held: bool) -> tuple[float, bool]:
        buckets = [
            (Keys.pace("app", app_id), self.app_ms, 0.0),
            (Keys.pace("appmin", app_id), self.window_ms, self.window_tolerance),
        ]
        if chat_id:
            buckets.append((Keys.pace("chat", chat_id), self.chat_ms, 0.0))
        if self._script is not None:
            try:
                args = [v for _, interval, tolerance in buckets for v in (interval, tolerance)]
                args += [HORIZON_MS, int(held), int(bool(chat_id))]
                ms, taken = self._script(keys=[k for k, _, _ in buckets], args=args)
                return float(ms) / 1000, bool(int(taken))
            except redis.RedisError as exc:  # pacing is a courtesy: never fail a send over it
                log.warning("send pacing unavailable (%s); sending unpaced", type(exc).__name__)
                return 0.0, True
        with self._lock:
            ms, taken = _take_local(self._local, buckets, time.monotonic() * 1000, held, bool(chat_id))
            return ms / 1000, taken


def _take_local(
    tats: dict[str, float], buckets: list[tuple[str, float, float]], now: float, held: bool, has_chat: bool
) -> tuple[float, bool]:
    """The Lua script above, in process (same rules)."""
    apps = buckets[:-1] if has_chat else buckets
    app_tats = [max(now, tats.get(k, 0.0)) for k, _, _ in apps]
    slot = max([now] + [tat - tol for tat, (_, _, tol) in zip(app_tats, apps, strict=True)])
    chat_tat = now
    if has_chat:
        key, interval, _ = buckets[-1]
        chat_tat = max(now, tats.get(key, 0.0))
        if not held:
            if chat_tat - now > HORIZON_MS:
                tats[key] = chat_tat + interval
                return chat_tat - now, False
            slot = max(slot, chat_tat)
    for tat, (key, interval, _) in zip(app_tats, apps, strict=True):
        tats[key] = max(tat, slot) + interval
    if has_chat:
        key, interval, _ = buckets[-1]
        tats[key] = max(slot + interval, chat_tat) if held else slot + interval
    return slot - now, True


def split(text: str, limit: int = CHUNK_CHARS) -> list[str]:
    """Cut `text` into chunks of at most `limit` characters, at paragraph, then line, then hard boundaries."""
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    chunks: list[str] = []
    rest = text
    reopen = ""
    while rest:
        rest = reopen + rest
        if len(rest) <= limit:
            chunks.append(rest)
            break
        window = rest[: limit - 4]
        cut = max(window.rfind("\n\n"), 0) or max(window.rfind("\n"), 0) or len(window)
        if cut < limit // 4:
            cut = len(window)
        chunk, rest = rest[:cut].rstrip(), rest[cut:].lstrip("\n")
        fences = chunk.count("```")
        if fences % 2:
            fence_line = chunk[chunk.rfind("```") :].split("\n", 1)[0]
            chunk += "\n```"
            reopen = fence_line + "\n"
        else:
            reopen = ""
        chunks.append(chunk)
    return chunks


def render(chunk: str) -> tuple[str, str]:
    """(msg_type, content JSON) for one chunk: Markdown as a `post` with one `md` node, else plain `text`."""
    if _MARKDOWN.search(chunk):
        post = {"zh_cn": {"title": "", "content": [[{"tag": "md", "text": chunk}]]}}
        return "post", json.dumps(post, ensure_ascii=False)
    return "text", plain(chunk)


def plain(chunk: str) -> str:
    return json.dumps({"text": chunk}, ensure_ascii=False)


class FeishuSender:
    """One persona's Feishu app, as seen from a worker."""

    def __init__(
        self,
        persona: Persona,
        domain: str,
        redis_client: redis.Redis | None = None,
        *,
        timeout: float = 10.0,
        retry: Retry | None = None,
        pacer: Pacer | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not persona.app_id or not persona.app_secret:
            raise FeishuError(f"persona {persona.name} has no Feishu app_id/app_secret configured")
        self.persona = persona
        self.app_id = persona.app_id
        self.retry = retry or Retry()
        self.pacer = pacer or Pacer(redis_client)
        self._sleep = sleep
        self.client = (
            lark.Client.builder()
            .app_id(persona.app_id)
            .app_secret(persona.app_secret)
            .domain(domain)
            .timeout(timeout)
            .log_level(lark.LogLevel.WARNING)
            .build()
        )

    def reply(
        self,
        message_id: str,
        text: str,
        *,
        chat_id: str | None = None,
        attempts: int = 0,
        start: int = 0,
        in_thread: bool = False,
    ) -> list[str]:
        """Reply to `message_id` with `text` (split as needed); returns the ids of the messages posted."""
        sent: list[str] = []
        for i, chunk in enumerate(split(neutralize(text))):  # never a sender's mention or link (markup.py)
            if i < start:
                continue
            uuid = message_id if i == 0 else f"{message_id}:{i}"
            try:
                sent.append(self._reply_chunk(message_id, chunk, uuid, chat_id, attempts, in_thread))
            except FeishuError as exc:
                exc.chunks_sent = i
                raise
        return sent

    def _reply_chunk(
        self,
        message_id: str,
        chunk: str,
        uuid: str,
        chat_id: str | None,
        attempts: int,
        in_thread: bool = False,
    ) -> str:
        msg_type, content = render(chunk)
        try:
            return self._reply_once(message_id, msg_type, content, uuid, chat_id, attempts, in_thread)
        except FeishuError as exc:
            if msg_type == "text" or exc.code not in CONTENT_REFUSED:
                raise
            log.warning(
                "post refused (code %s, log %s) for %s; resending as text", exc.code, exc.log_id, message_id
            )
            return self._reply_once(message_id, "text", plain(chunk), uuid, chat_id, attempts, in_thread)

    def post(self, chat_id: str, text: str, uuid: str, mention: str | None = None) -> str:
        """A new message (not a reply) in `chat_id`, plain text, @mentioning `mention` (an open_id) first."""
        content = neutralize(text)
        if mention:
            content = f'<at user_id="{attr(mention)}"></at> {content}'
        body = (
            CreateMessageRequestBody.builder()
            .receive_id(chat_id)
            .msg_type("text")
            .content(plain(content))
            .uuid(uuid)
            .build()
        )
        req = CreateMessageRequest.builder().receive_id_type("chat_id").request_body(body).build()
        resp = self._call(self.client.im.v1.message.create, req, "post", chat_id)
        return str(resp.data.message_id) if resp.data is not None else ""

    def react(self, message_id: str, emoji: str = THINKING) -> str | None:
        """Add a reaction; best effort (a missing "thinking" sign must never cost the answer)."""
        body = CreateMessageReactionRequestBody.builder().reaction_type(
            Emoji.builder().emoji_type(emoji).build()
        )
        req = CreateMessageReactionRequest.builder().message_id(message_id).request_body(body.build()).build()
        try:
            resp = self._call(self.client.im.v1.message_reaction.create, req, "react", None, attempts=2)
        except FeishuError as exc:
            log.info("reaction on %s not added (code %s)", message_id, exc.code)
            return None
        return str(resp.data.reaction_id) if resp.data is not None else None

    def unreact(self, message_id: str, reaction_id: str | None) -> None:
        if not reaction_id:
            return
        req = DeleteMessageReactionRequest.builder().message_id(message_id).reaction_id(reaction_id).build()
        try:
            self._call(self.client.im.v1.message_reaction.delete, req, "unreact", None, attempts=2)
        except FeishuError as exc:
            log.info("reaction on %s not removed (code %s)", message_id, exc.code)

    def bot_open_id(self) -> str:
        """The bot's own open_id (GET /open-apis/bot/v3/info), used to tell an @mention of the bot."""
        req = (
            lark.BaseRequest.builder()
            .http_method(lark.HttpMethod.GET)
            .uri("/open-apis/bot/v3/info")
            .token_types({lark.AccessTokenType.TENANT})
            .build()
        )
        resp = self._call(self.client.request, req, "bot_info", None)
        try:
            data = json.loads(resp.raw.content)
            bot = data.get("bot") or (data.get("data") or {}).get("bot") or {}
            open_id = str(bot.get("open_id") or "")
        except (ValueError, AttributeError) as exc:
            raise FeishuError("bot info: unreadable answer", retryable=True) from exc
        if not open_id:
            raise FeishuError("bot info: no open_id in the answer")
        return open_id

    def _reply_once(
        self,
        message_id: str,
        msg_type: str,
        content: str,
        uuid: str,
        chat_id: str | None,
        attempts: int = 0,
        in_thread: bool = False,
    ) -> str:
        body = (
            ReplyMessageRequestBody.builder()
            .msg_type(msg_type)
            .content(content)
            .uuid(uuid)
            .reply_in_thread(in_thread)
            .build()
        )
        req = ReplyMessageRequest.builder().message_id(message_id).request_body(body).build()
        resp = self._call(self.client.im.v1.message.reply, req, "reply", chat_id or message_id, attempts)
        return str(resp.data.message_id) if resp.data is not None else ""

    def reply_content(
        self,
        message_id: str,
        msg_type: str,
        content: str,
        *,
        chat_id: str | None = None,
        in_thread: bool = False,
    ) -> str:
        """Reply once with ready-made content (a card), uuid = the message id, like a plain reply's first part."""
        return self._reply_once(message_id, msg_type, content, message_id, chat_id, in_thread=in_thread)

    def patch_card(self, message_id: str, card: str) -> None:
        """Replace the card of a message the bot sent (the card needs `update_multi`)."""
        body = PatchMessageRequestBody.builder().content(card).build()
        req = PatchMessageRequest.builder().message_id(message_id).request_body(body).build()
        self._call(self.client.im.v1.message.patch, req, "card patch", None)

    def call(self, fn: Callable[[Any], Any], req: Any, what: str, attempts: int = 0) -> Any:
        """Any other SDK call (CardKit) under the same retry policy, unpaced (not a message send)."""
        return self._call(fn, req, what, None, attempts)

    def _call(
        self, fn: Callable[[Any], Any], req: Any, what: str, pace: str | None, attempts: int = 0
    ) -> Any:
        """Run one SDK call with the retry policy above; the same `req` (and so the same uuid) every time."""
        attempts = attempts or self.retry.attempts
        token_dropped = False
        last: FeishuError | None = None
        attempt = 0
        while attempt < attempts:
            attempt += 1
            if pace is not None:
                self.pacer.wait(self.app_id, pace)
            wait = self.retry.backoff * 2 ** (attempt - 1)
            try:
                resp = fn(req)
            except requests.RequestException as exc:  # timeout, refused, reset
                last = FeishuError(f"{what}: {type(exc).__name__}", retryable=True)
            except ObtainAccessTokenException as exc:
                last = FeishuError(f"{what}: tenant token refused (code {exc.code})", code=int(exc.code or 0))
                if exc.code in (10003, 10014):  # wrong app id or secret: no retry helps
                    raise last from exc
                last.retryable = True  # the token service limiting or failing: time cures it
            except ValueError as exc:  # a non-JSON body (an HTML 502 from a proxy)
                last = FeishuError(f"{what}: unreadable answer ({type(exc).__name__})", retryable=True)
            else:
                if resp.success():
                    return resp
                code = int(resp.code or 0)
                status = resp.raw.status_code if resp.raw is not None else 0
                log_id = resp.get_log_id()
                last = FeishuError(f"{what}: code {code} ({resp.msg})", code=code, log_id=log_id)
                if code in TOKEN_INVALID:
                    forget_token(self.app_id)
                    last.retryable = True
                    if not token_dropped:
                        token_dropped = True
                        attempts += 1  # the retry after a token refresh is free
                        log.info(
                            "%s: tenant token rejected (log %s); dropped it, retrying once", what, log_id
                        )
                        continue
                elif code in RATE_LIMITED or status == 429:
                    last.retryable = True
                    wait = max(wait, _reset_after(resp))
                elif status >= 500:
                    last.retryable = True
                else:
                    raise last
            if attempt < attempts:
                log.info("%s failed (%s); retry %d/%d in %.2fs", what, last, attempt, attempts - 1, wait)
                self._sleep(min(wait, self.retry.max_wait))
        assert last is not None
        raise last


def _reset_after(resp: Any) -> float:
    headers = getattr(resp.raw, "headers", None) or {}
    value = headers.get("x-ogw-ratelimit-reset") or headers.get("X-Ogw-Ratelimit-Reset")
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


def forget_token(app_id: str) -> None:
    """Drop the SDK's cached tenant token for `app_id`: the SDK keeps an invalid one until it expires."""
    TokenManager.cache.set(f"self_tenant_token:{app_id}", "", 0)
