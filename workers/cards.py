"""A reply that streams into a CardKit card while the model writes it, one card per message however often
the turn is redone (docs/ARCHITECTURE.md, "Delivery")."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable

import redis
from lark_oapi.api.cardkit.v1 import (
    ContentCardElementRequest,
    ContentCardElementRequestBody,
    CreateCardRequest,
    CreateCardRequestBody,
    SettingsCardRequest,
    SettingsCardRequestBody,
)

from memory_core.reasoning import strip_partial

from .errors import FeishuError
from .feishu_send import FeishuSender
from .inbound import Inbound
from .markup import neutralize
from .redis_keys import Keys

log = logging.getLogger(__name__)

ELEMENT = "answer"
MIN_INTERVAL = 0.2  # seconds between content updates: 5/s, half of CardKit's per-card limit
CARD_TEXT_LIMIT = 9000  # characters; a card holds 30 KB of JSON in all
STATE_TTL = 24 * 3600
REFUSAL_TTL = 600  # an app refused CardKit (scope missing): plain replies for 10 minutes, then ask again


def visible(text: str) -> str:
    """What a person may see of a model's text so far: no reasoning, also while a <think> is still open, and
    no mention or link it echoed (`markup.neutralize`, as for every plain reply)."""
    return neutralize(strip_partial(text))


def card_json(text: str, streaming: bool) -> str:
    return json.dumps(
        {
            "schema": "2.0",
            "config": {"streaming_mode": streaming, "update_multi": True, "summary": {"content": text[:40]}},
            "body": {"elements": [{"tag": "markdown", "element_id": ELEMENT, "content": text}]},
        },
        ensure_ascii=False,
    )


class CardStream:
    """One reply's streaming card; `partial` and `finish` are called from the turn's thread."""

    def __init__(
        self,
        sender: FeishuSender,
        inbound: Inbound,
        client: redis.Redis | None,
        clock: Callable[[], float] = time.monotonic,
        min_interval: float = MIN_INTERVAL,
    ) -> None:
        self.sender, self.inbound, self.redis = sender, inbound, client
        self.clock, self.min_interval = clock, min_interval
        self.card_id: str | None = None
        self.shown = False  # the card message was posted
        self.off = False  # streaming refused: the caller replies plainly
        self._last = -1e9
        self._text = ""
        self._local_seq = 0

    @property
    def _key(self) -> str:
        return Keys.card(self.inbound.persona, self.inbound.message_id)

    def partial(self, text: str) -> None:
        shown = visible(text)[:CARD_TEXT_LIMIT]
        if self.off or not shown or shown == self._text:
            return
        if not self.shown and self._refused_lately():
            self.off = True
            return
        if not self.shown:
            self._start(shown)
            return
        if self.clock() - self._last >= self.min_interval:
            self._update(shown)

    def finish(self, text: str) -> bool:
        """Put the final text in the card and end streaming; False if no card was shown (reply plainly)."""
        if not self.shown:
            return False
        final = visible(text)
        if len(final) > CARD_TEXT_LIMIT:
            final = final[: CARD_TEXT_LIMIT - 1] + "…"
        try:
            if final != self._text:
                self._update(final, force=True)
            self._settings()
        except FeishuError as exc:
            log.error("card %s of message=%s not finished: %s", self.card_id, self.inbound.message_id, exc)
        return True  # the card state stays until its TTL: a redone turn finishes the same card again

    def _start(self, text: str) -> None:
        try:
            existing = self._existing()
            self.card_id = existing or self._create(text)
            if existing:  # a redone turn: the card may have been finished; it streams again
                self._settings(streaming=True)
            content = json.dumps({"type": "card", "data": {"card_id": self.card_id}})
            self.sender.reply_content(
                self.inbound.message_id,
                "interactive",
                content,
                chat_id=self.inbound.chat_id,
                in_thread=bool(self.inbound.thread_id),
            )
        except FeishuError as exc:
            log.info(
                "message=%s: streaming card refused (%s); replying plainly", self.inbound.message_id, exc
            )
            self.off = True
            if self.card_id is None and self.redis is not None:  # the app cannot create cards: stop asking
                with contextlib.suppress(redis.RedisError):
                    self.redis.set(self._refusal_key, "1", ex=REFUSAL_TTL)
            return
        self.shown, self._text, self._last = True, text, self.clock()

    @property
    def _refusal_key(self) -> str:
        return Keys.flag(f"cards-refused:{self.sender.app_id}")

    def _refused_lately(self) -> bool:
        if self.redis is None:
            return False
        try:
            return bool(self.redis.exists(self._refusal_key))
        except redis.RedisError:
            return False

    def _existing(self) -> str | None:
        if self.redis is None:
            return None
        try:
            value = self.redis.get(self._key)
        except redis.RedisError:
            return None
        return value.decode() if isinstance(value, bytes) else value

    def _create(self, text: str) -> str:
        body = CreateCardRequestBody.builder().type("card_json").data(card_json(text, True)).build()
        resp = self.sender.call(
            self.sender.client.cardkit.v1.card.create,
            CreateCardRequest.builder().request_body(body).build(),
            "card create",
            attempts=1,
        )
        card_id = str(getattr(resp.data, "card_id", "") or "")
        if not card_id:
            raise FeishuError("card create: no card_id in the answer")
        if self.redis is not None:
            with contextlib.suppress(redis.RedisError):
                self.redis.set(self._key, card_id, ex=STATE_TTL)
        return card_id

    def _sequence(self) -> int:
        """Strictly increasing per card, across attempts of the same turn (kept in Redis)."""
        if self.redis is not None and self.card_id:
            try:
                key = Keys.card_seq(self.card_id)
                pipe = self.redis.pipeline()
                pipe.incr(key)
                pipe.expire(key, STATE_TTL)
                return int(pipe.execute()[0])
            except redis.RedisError:
                self._settings(streaming=True)
        self._local_seq += 1
        return self._local_seq

    def _update(self, text: str, force: bool = False) -> None:
        assert self.card_id is not None
        body = ContentCardElementRequestBody.builder().content(text).sequence(self._sequence()).build()
        req = (
            ContentCardElementRequest.builder()
            .card_id(self.card_id)
            .element_id(ELEMENT)
            .request_body(body)
            .build()
        )
        try:
            self.sender.call(self.sender.client.cardkit.v1.card_element.content, req, "card update")
        except FeishuError as exc:
            if force:
                raise
            log.info("card %s: an update was refused (%s); the next one carries the text", self.card_id, exc)
            self._last = self.clock()  # a refusal counts against the card's rate too
            return
        self._text, self._last = text, self.clock()

    def _settings(self, streaming: bool = False) -> None:
        assert self.card_id is not None
        config = {"streaming_mode": streaming, "summary": {"content": self._text[:40]}}
        settings = json.dumps({"config": config}, ensure_ascii=False)
        body = SettingsCardRequestBody.builder().settings(settings).sequence(self._sequence()).build()
        req = SettingsCardRequest.builder().card_id(self.card_id).request_body(body).build()
        self.sender.call(self.sender.client.cardkit.v1.card.settings, req, "card settings")
