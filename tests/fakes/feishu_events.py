"""Build Feishu webhook deliveries exactly as Feishu sends them (research/feishu.md §1, §4.3).

    event = message_event("你好", sender=ALICE)                       # p2p text message
    event = group_mention_event("记住我喜欢咖啡", bot_open_id=BOT, sender=BOB)  # "@_user_1 记住…"
    delivery = deliver(event, encrypt_key="k")                        # encrypted + signed
    await client.post("/feishu/default/events", data=delivery.body, headers=delivery.headers)

`deliver` wraps a payload as plain JSON (no encrypt key) or as `{"encrypt": base64(iv ‖ AES-256-CBC)}`
with the key sha256(encrypt_key), plus the X-Lark-Request-Timestamp / -Nonce / -Signature headers,
signature = sha256(timestamp + nonce + encrypt_key + raw body) hex. The verification token goes in
`header.token` (events) or top-level `token` (the URL-verification challenge). AES comes from
pycryptodome, the library lark-oapi itself decrypts with.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import lark_oapi as lark
from Crypto.Cipher import AES

__all__ = [
    "ALICE",
    "APP_ID",
    "BOB",
    "GROUP_CHAT_ID",
    "TENANT_KEY",
    "VERIFICATION_TOKEN",
    "Delivery",
    "User",
    "decrypt",
    "deliver",
    "encrypt",
    "group_mention_event",
    "message_event",
    "p2p_chat_id",
    "sign",
    "url_verification",
    "user",
]

APP_ID = "cli_fakeapp00000001"
TENANT_KEY = "736588c9260f175e"
VERIFICATION_TOKEN = "fake-verification-token"


def _hex(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class User:
    """A Feishu identity as events carry it. `open_id` is per app; `union_id` per developer."""

    name: str
    open_id: str
    union_id: str
    user_id: str = ""

    def id_dict(self) -> dict[str, str]:
        return {"union_id": self.union_id, "user_id": self.user_id, "open_id": self.open_id}


def user(name: str, open_id: str | None = None) -> User:
    """A user with ids derived stably from `name` (so tests can refer to the same person twice)."""
    return User(
        name=name,
        open_id=open_id or "ou_" + _hex("open", name),
        union_id="on_" + _hex("union", name),
        user_id=_hex("user", name)[:8],
    )


ALICE = user("Alice")
BOB = user("Bob")
GROUP_CHAT_ID = "oc_" + _hex("chat", "group")


def p2p_chat_id(sender: User) -> str:
    """The stable `oc_…` id of the one-to-one chat between `sender` and the bot."""
    return "oc_" + _hex("chat", "p2p", sender.open_id)


def message_event(
    text: str,
    *,
    sender: User = ALICE,
    chat_type: str = "p2p",
    chat_id: str | None = None,
    mentions: Sequence[User] = (),
    message_id: str | None = None,
    event_id: str | None = None,
    create_time_ms: int | None = None,
    root_id: str | None = None,
    parent_id: str | None = None,
    thread_id: str | None = None,
    message_type: str = "text",
    content: dict[str, Any] | None = None,
    app_id: str = APP_ID,
    tenant_key: str = TENANT_KEY,
    token: str = VERIFICATION_TOKEN,
) -> dict[str, Any]:
    """A v2.0 `im.message.receive_v1` event.

    `text` is the message text as Feishu delivers it: each @ is a placeholder `@_user_N`, and
    `mentions[N-1]` is the person (or bot) it stands for. `content` overrides the `{"text": text}`
    body for other message types. Ids default to fresh random ones; `chat_id` defaults to
    `p2p_chat_id(sender)` or `GROUP_CHAT_ID`.
    """
    now_ms = create_time_ms if create_time_ms is not None else int(time.time() * 1000)
    if chat_id is None:
        chat_id = p2p_chat_id(sender) if chat_type == "p2p" else GROUP_CHAT_ID
    message: dict[str, Any] = {
        "message_id": message_id or "om_" + uuid.uuid4().hex,
        "create_time": str(now_ms),
        "update_time": str(now_ms),
        "chat_id": chat_id,
        "chat_type": chat_type,
        "message_type": message_type,
        "content": json.dumps(content if content is not None else {"text": text}, ensure_ascii=False),
    }
    if mentions:
        message["mentions"] = [
            {"key": f"@_user_{i}", "id": m.id_dict(), "name": m.name, "tenant_key": tenant_key}
            for i, m in enumerate(mentions, start=1)
        ]
    for key, value in (("root_id", root_id), ("parent_id", parent_id), ("thread_id", thread_id)):
        if value:
            message[key] = value
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id or uuid.uuid4().hex,
            "event_type": "im.message.receive_v1",
            "create_time": str(now_ms),
            "token": token,
            "app_id": app_id,
            "tenant_key": tenant_key,
        },
        "event": {
            "sender": {"sender_id": sender.id_dict(), "sender_type": "user", "tenant_key": tenant_key},
            "message": message,
        },
    }


def group_mention_event(
    text: str, *, bot_open_id: str, bot_name: str = "Lucid", sender: User = ALICE, **kwargs: Any
) -> dict[str, Any]:
    """A group message that @mentions the bot first: content text "@_user_1 <text>".

    Any further `mentions=[...]` stand for @_user_2, @_user_3, … in `text`.
    """
    bot = User(name=bot_name, open_id=bot_open_id, union_id="on_" + _hex("union", bot_open_id))
    mentions = [bot, *kwargs.pop("mentions", ())]
    return message_event(f"@_user_1 {text}", sender=sender, chat_type="group", mentions=mentions, **kwargs)


def url_verification(challenge: str = "ajls384kdjx98XX", token: str = VERIFICATION_TOKEN) -> dict[str, Any]:
    """The body Feishu POSTs when the request URL is saved; the answer is `{"challenge": ...}`."""
    return {"challenge": challenge, "token": token, "type": "url_verification"}


def encrypt(plaintext: str, encrypt_key: str) -> str:
    """base64(iv ‖ AES-256-CBC(PKCS#7(plaintext))), key = sha256(encrypt_key), random iv."""
    key, iv = hashlib.sha256(encrypt_key.encode()).digest(), os.urandom(16)
    raw = plaintext.encode()
    pad = 16 - len(raw) % 16
    raw += bytes([pad]) * pad
    return base64.b64encode(iv + AES.new(key, AES.MODE_CBC, iv).encrypt(raw)).decode()


def decrypt(blob: str, encrypt_key: str) -> str:
    """The inverse of `encrypt` (checks the padding)."""
    data = base64.b64decode(blob)
    key = hashlib.sha256(encrypt_key.encode()).digest()
    raw = AES.new(key, AES.MODE_CBC, data[:16]).decrypt(data[16:])
    pad = raw[-1] if raw else 0
    if not 1 <= pad <= 16 or raw[-pad:] != bytes([pad]) * pad:
        raise ValueError("bad PKCS#7 padding")
    return raw[:-pad].decode()


def sign(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """X-Lark-Signature: plain sha256 (not HMAC) over timestamp + nonce + key + the raw body."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


@dataclass(frozen=True)
class Delivery:
    """One webhook POST: the raw `body` bytes and the `headers` (canonical header-name case)."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)

    def raw_request(self, uri: str = "/webhook/event") -> lark.RawRequest:
        """The same delivery as a lark-oapi `RawRequest`, for feeding `EventDispatcherHandler.do`."""
        req = lark.RawRequest()
        req.uri, req.headers, req.body = uri, dict(self.headers), self.body
        return req


def deliver(
    payload: dict[str, Any],
    *,
    encrypt_key: str = "",
    timestamp: str | None = None,
    nonce: str | None = None,
    signed: bool = True,
) -> Delivery:
    """Wrap `payload` as Feishu POSTs it: encrypted and signed when `encrypt_key` is set, else plain.

    `signed=False` leaves out X-Lark-Signature (whether Feishu signs the URL-verification challenge
    is undocumented, so a webhook should accept it either way).
    """
    plaintext = json.dumps(payload, ensure_ascii=False)
    if encrypt_key:
        body = json.dumps({"encrypt": encrypt(plaintext, encrypt_key)}).encode()
    else:
        body = plaintext.encode()
    ts = timestamp if timestamp is not None else str(int(time.time()))
    nonce = nonce if nonce is not None else uuid.uuid4().hex[:16]
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "X-Lark-Request-Timestamp": ts,
        "X-Lark-Request-Nonce": nonce,
        "X-Request-Id": uuid.uuid4().hex,
    }
    if encrypt_key and signed:
        headers["X-Lark-Signature"] = sign(ts, nonce, encrypt_key, body)
    return Delivery(body=body, headers=headers)
