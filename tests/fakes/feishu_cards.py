"""FakeFeishu plus CardKit (cardkit.v1): card entities, streaming text updates, settings, card callbacks.

    with FakeFeishuCards(bot_open_id=BOT) as fake:
        ...                                        # the product streams a reply into a card
        (card,) = fake.cards.values()
        assert card.text == "the final answer" and not card.streaming

As the documented API does (open.feishu.cn cardkit-v1: card/create, card-element/content, card/settings):
- `POST /open-apis/cardkit/v1/cards` takes `{"type": "card_json", "data": "<card JSON 2.0>"}`; streaming
  needs `config.update_multi` true (300302); answers `{"card_id": …}`;
- `PUT …/cards/:card_id/elements/:element_id/content` takes the FULL text and a `sequence`;
  `PATCH …/cards/:card_id/settings` takes `settings` (a JSON string) and a `sequence`; the sequence must
  strictly increase per card (300317); an unknown card is 200740, an unknown element 300309;
- at most 10 operations per second per card (the gateway limit, 99991400 with HTTP 429);
- a card is sent in at most one message (an `interactive` message with `{"type": "card", "data":
  {"card_id": …}}`); a message naming an unknown card is refused (230099).
`refuse_cards()` answers every CardKit call with 99991672 (the app lacks the `cardkit:card:write` scope).
"""

from __future__ import annotations

import collections
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.feishu import ApiCall, FakeFeishu

NO_SCOPE = 99991672
CARD_NOT_FOUND = 200740
ELEMENT_NOT_FOUND = 300309
SEQUENCE_NOT_INCREASING = 300317
UPDATE_MULTI_FALSE = 300302
CARD_CONTENT_FAILED = 230099
PER_CARD_QPS = 10


@dataclass
class Card:
    card_id: str
    data: dict[str, Any]
    streaming: bool
    elements: dict[str, str]
    sequence: int = 0
    message_id: str | None = None
    updates: list[tuple[float, int, str]] = field(default_factory=list)  # (time, sequence, text)
    created_at: float = field(default_factory=time.time)
    ops: collections.deque[float] = field(default_factory=collections.deque)

    @property
    def text(self) -> str:
        return "\n".join(self.elements.values())


class FakeFeishuCards(FakeFeishu):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cards: dict[str, Card] = {}
        self.card_errors: list[str] = []
        self.patches: dict[str, list[dict[str, Any]]] = {}
        self._refuse_cards = False
        self._card_ids = itertools.count(7_400_000_000_000_000_000)

    def refuse_cards(self, refuse: bool = True) -> None:
        """Answer every CardKit call with 99991672 (no `cardkit:card:write`), or stop doing so."""
        self._refuse_cards = refuse

    def card_of(self, message_id: str) -> Card | None:
        return next((c for c in self.cards.values() if c.message_id == message_id), None)

    # ------------------------------------------------------------------------------------ the app

    def build_app(self) -> web.Application:
        app = super().build_app()
        base = "/open-apis/cardkit/v1/cards"
        app.router.add_post(base, self._card_call(self._create_card))
        app.router.add_put(base + "/{card_id}/elements/{element_id}/content", self._card_call(self._content))
        app.router.add_patch(base + "/{card_id}/settings", self._card_call(self._settings))
        app.router.add_patch("/open-apis/im/v1/messages/{message_id}", self._card_call(self._patch))
        return app

    def _patch(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        """im.v1.message.patch: a card message the bot sent, whose card is shared (`update_multi`)."""
        message_id = request.match_info["message_id"]
        message = next((m for m in self.sent if m.message_id == message_id), None)
        if message is None:
            return _fail(230001, "message not found")
        if message.msg_type != "interactive":
            return _fail(230001, "only card messages can be updated")
        try:
            card = json.loads(body.get("content") or "")
        except ValueError:
            return _fail(230099, "invalid card content")
        if not isinstance(card, dict) or not (card.get("config") or {}).get("update_multi"):
            return _fail(230099, "the card is not shared (update_multi): it cannot be updated")
        self.patches.setdefault(message_id, []).append(card)
        return _ok({})

    def card_shown(self, message_id: str) -> dict[str, Any]:
        """The card a message shows now: its last patch, else what was sent."""
        with self.lock:
            if self.patches.get(message_id):
                return self.patches[message_id][-1]
            message = next(m for m in self.sent if m.message_id == message_id)
            return dict(json.loads(message.content))

    def _card_call(self, handler: Any) -> Any:
        async def wrapped(request: web.Request) -> web.Response:
            denied = self._check_token(request.headers.get("Authorization", ""))
            if denied is not None:
                return denied
            try:
                body = await request.json()
            except ValueError:
                return _fail(10002, "invalid request body")
            call = ApiCall("card", request.method, request.path, dict(request.query), dict(request.headers),
                           body, time.time())  # fmt: skip
            with self.lock:
                self.requests.append(call)
                if self._refuse_cards:
                    return _fail(
                        NO_SCOPE,
                        "Access denied. One of the following scopes is required: [cardkit:card:write]",
                    )
                return handler(request, body if isinstance(body, dict) else {})

        return wrapped

    def _create_card(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        if body.get("type") != "card_json" or not isinstance(body.get("data"), str):
            return _fail(10002, "type must be card_json and data a JSON string")
        try:
            data = json.loads(body["data"])
        except ValueError:
            return _fail(200220, "Failed to generate card content")
        config = data.get("config") or {}
        if data.get("schema") != "2.0":
            return _fail(200220, "only card JSON 2.0 is supported")
        if config.get("streaming_mode") and config.get("update_multi") is False:
            return _fail(UPDATE_MULTI_FALSE, "update_multi property is false")
        elements = {
            e["element_id"]: str(e.get("content", ""))
            for e in (data.get("body") or {}).get("elements", [])
            if isinstance(e, dict) and e.get("element_id")
        }
        card_id = str(next(self._card_ids))
        self.cards[card_id] = Card(card_id, data, bool(config.get("streaming_mode")), elements)
        return _ok({"card_id": card_id})

    def _card(self, request: web.Request, body: dict[str, Any]) -> Card | web.Response:
        card = self.cards.get(request.match_info["card_id"])
        if card is None:
            return _fail(CARD_NOT_FOUND, "The card entity does not exist")
        now = time.time()
        while card.ops and now - card.ops[0] >= 1.0:
            card.ops.popleft()
        if len(card.ops) >= PER_CARD_QPS:
            self.card_errors.append(f"card {card.card_id}: over {PER_CARD_QPS} operations per second")
            return web.json_response({"code": 99991400, "msg": "request trigger frequency limit"}, status=429)
        sequence = body.get("sequence")
        if not isinstance(sequence, int) or not 1 <= sequence <= 2**31 - 1 or sequence <= card.sequence:
            self.card_errors.append(f"card {card.card_id}: sequence {sequence} after {card.sequence}")
            return _fail(
                SEQUENCE_NOT_INCREASING, "The sequence number for operating on the card did not increment"
            )
        card.ops.append(now)
        card.sequence = sequence
        return card

    def _content(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        card = self._card(request, body)
        if isinstance(card, web.Response):
            return card
        element = request.match_info["element_id"]
        if element not in card.elements:
            return _fail(ELEMENT_NOT_FOUND, "element not found")
        if not card.streaming:
            self.card_errors.append(f"card {card.card_id}: text streamed while streaming_mode is off")
            return _fail(ELEMENT_NOT_FOUND, "the card is not in streaming mode")
        if not isinstance(body.get("content"), str):
            return _fail(10002, "content is required")
        card.elements[element] = body["content"]
        card.updates.append((time.time(), card.sequence, body["content"]))
        return _ok({})

    def _settings(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        card = self._card(request, body)
        if isinstance(card, web.Response):
            return card
        try:
            settings = json.loads(body.get("settings") or "")
        except ValueError:
            return _fail(10002, "settings must be a JSON string")
        config = settings.get("config") or {}
        if "streaming_mode" in config:
            card.streaming = bool(config["streaming_mode"])
        return _ok({})

    def _send(self, body: dict[str, Any], **kwargs: Any) -> web.Response:
        if body.get("msg_type") == "interactive":
            try:
                content = json.loads(body.get("content") or "")
                card_id = content["data"]["card_id"] if content.get("type") == "card" else None
            except (ValueError, KeyError, TypeError, AttributeError):
                card_id = None
            if card_id is not None:
                with self.lock:
                    card = self.cards.get(str(card_id))
                    first = self._by_uuid.get(body.get("uuid") or "")
                if card is None:
                    return _fail(CARD_CONTENT_FAILED, "card_id not found")
                if card.message_id is not None and (first is None or first.content != body.get("content")):
                    return _fail(CARD_CONTENT_FAILED, "a card entity can be sent only once")
                resp = super()._send(body, **kwargs)
                with self.lock:
                    sent = self._by_uuid.get(body.get("uuid") or "") or (self.sent[-1] if self.sent else None)
                    if card.message_id is None and sent is not None and resp.status == 200:
                        card.message_id = sent.message_id
                return resp
        return super()._send(body, **kwargs)


def _ok(data: dict[str, Any]) -> web.Response:
    return web.json_response({"code": 0, "msg": "success", "data": data})


def _fail(code: int, msg: str, status: int = 400) -> web.Response:
    return web.json_response({"code": code, "msg": msg}, status=status)


def card_action_event(
    value: dict[str, Any],
    *,
    operator: Any,
    message_id: str,
    chat_id: str,
    tenant_key: str = "736588c9260f175e",
    token: str = "fake-verification-token",
) -> dict[str, Any]:
    """A v2.0 `card.action.trigger` event, as Feishu sends a button press (webhook or long connection)."""
    import uuid as uuidlib

    return {
        "schema": "2.0",
        "header": {
            "event_id": uuidlib.uuid4().hex,
            "token": token,
            "create_time": str(int(time.time() * 1000)),
            "event_type": "card.action.trigger",
            "tenant_key": tenant_key,
            "app_id": "cli_fakeapp00000001",
        },
        "event": {
            "operator": {"tenant_key": tenant_key, **operator.id_dict()},
            "token": "c-" + uuidlib.uuid4().hex,
            "action": {"value": value, "tag": "button"},
            "host": "im_message",
            "context": {"open_message_id": message_id, "open_chat_id": chat_id},
        },
    }
