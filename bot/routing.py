"""Routing: a verified Feishu event → the `Inbound` message a turn answers, or the reason it is ignored
(`route`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from workers.errors import Rejected
from workers.inbound import Inbound, Mention

MESSAGE_EVENT = "im.message.receive_v1"
MAX_TEXT = 8000  # characters handed to a turn; Feishu allows far more, a chat turn needs no more
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z")
_PLACEHOLDER = re.compile(r"@_user_\d+|@_all")


@dataclass(frozen=True)
class Ignored:
    """An event that gets a 200 and no turn; `reason` goes to the log line."""

    reason: str
    message_id: str = ""
    retry: bool = False  # answer 503 so Feishu delivers it again later (we could not decide yet)


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _id(value: Any) -> str:
    return value if isinstance(value, str) and _ID.match(value) else ""


MAX_DEPTH = 32
MAX_NODES = 20_000
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def loads_event(raw: bytes | str) -> dict[str, Any]:
    """An event's JSON, webhook or long connection, with a depth and node budget (a 1 MiB body can hold a
    million-deep nest or 250 k nodes) and every string valid text (`_valid_text`)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Rejected(400, "malformed JSON") from exc
    if not isinstance(data, dict):
        raise Rejected(400, "JSON body is not an object")
    cleaned: dict[str, Any] = _valid_text(data, budget=True)
    return cleaned


def _valid_text(value: Any, budget: bool = False) -> Any:
    """`value` with lone surrogates (valid in JSON escapes, not in UTF-8) made U+FFFD in every string value,
    in place and in one walk, so no field can fail a Redis write or a batch of other people's; with `budget`,
    raises Rejected past MAX_DEPTH or MAX_NODES."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    stack: list[tuple[Any, int]] = [(value, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if budget and (depth > MAX_DEPTH or nodes > MAX_NODES):
            raise Rejected(400, "JSON too deep or too large")
        if isinstance(node, dict):  # keys are never passed on, only values
            slots: Any = list(node)
        elif isinstance(node, list):
            slots = range(len(node))
        else:
            continue
        for slot in slots:
            child = node[slot]
            if isinstance(child, str) and _LONE_SURROGATE.search(child):
                node[slot] = _LONE_SURROGATE.sub("\ufffd", child)
            stack.append((child, depth + 1))
    return value


#: A create_time past this is no Feishu timestamp (epoch ms, year 2286): the event is ignored, not queued.
MAX_CREATE_TIME_MS = 10**13


def event_time(raw_time: Any, now_ms: int, stale_ms: int) -> tuple[int, str | None]:
    """An event's `create_time` (epoch ms, 0: none) and why it makes the event one to ignore (malformed,
    stale), if it does."""
    try:
        created = int(raw_time or 0) if len(str(raw_time)) <= 20 else -1  # int() of 4,300+ digits raises
    except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON number like 1e999 is infinity
        return 0, "malformed create_time"
    if not 0 <= created < MAX_CREATE_TIME_MS:  # epoch milliseconds, before the year 2286
        return 0, "malformed create_time"
    if created and now_ms - created > stale_ms:
        return created, "stale"
    return created, None


def route(
    event: dict[str, Any], persona: str, bot_open_id: str, *, now_ms: int, stale_ms: int
) -> Inbound | Ignored:
    """Decide what `event` (decrypted, verified, v2.0) means for `persona`. Pure: no I/O, no clock of its own
    (what gets through and how it is read: docs/ARCHITECTURE.md, "Routing")."""
    header = event.get("header")
    if event.get("schema") != "2.0" or not isinstance(header, dict):
        return Ignored("not a v2.0 event")
    if header.get("event_type") != MESSAGE_EVENT:
        return Ignored(f"unsupported event type {str(header.get('event_type'))[:64]}")
    message = _get(event, "event", "message")
    sender = _get(event, "event", "sender")
    if not isinstance(message, dict) or not isinstance(sender, dict):
        return Ignored("malformed message event")
    message_id = _id(message.get("message_id"))
    if not message_id:
        return Ignored("malformed message id")
    if sender.get("sender_type") not in (None, "user"):
        return Ignored("not sent by a person", message_id)
    open_id = _id(_get(sender, "sender_id", "open_id"))
    union_id = _id(_get(sender, "sender_id", "union_id"))
    chat_id = _id(message.get("chat_id"))
    tenant = _id(header.get("tenant_key") or sender.get("tenant_key")) or "default"
    if not open_id or not chat_id:
        return Ignored("malformed sender or chat", message_id)
    created, late = event_time(message.get("create_time") or header.get("create_time"), now_ms, stale_ms)
    if late:
        return Ignored(late, message_id)
    chat_type = "p2p" if message.get("chat_type") == "p2p" else "group"
    kind = "text"
    raw_text = _text(message)  # a post's images are skipped: its text is what is read
    if raw_text is None or (message.get("message_type") == "post" and not raw_text.strip()):
        kind = _kind(message)
        raw_text = placeholder(message)
    if chat_type == "group" and not bot_open_id:
        return Ignored("bot identity not known yet", message_id, retry=True)
    text, mentioned_bot, mentions = resolve_mentions(raw_text, message.get("mentions"), bot_open_id)
    if chat_type == "group" and not mentioned_bot:
        return Ignored("group message without an @mention of the bot", message_id)
    if not text and kind == "text":
        return Ignored("empty text", message_id)
    return Inbound(
        tenant=tenant,
        user=union_id or open_id,
        open_id=open_id,
        persona=persona,
        chat_id=chat_id,
        chat_type=chat_type,
        message_id=message_id,
        text=text[:MAX_TEXT],
        cut_from=len(text) if len(text) > MAX_TEXT else 0,
        mentioned_bot=mentioned_bot,
        create_time=created,
        event_id=_id(header.get("event_id")),
        mentions=mentions,
        kind=kind,
        thread_id=_id(message.get("thread_id")),
    )


def _text(message: dict[str, Any]) -> str | None:
    """The text of a `text` or `post` message (`content` is a JSON string); None for anything else."""
    kind = message.get("message_type")
    if kind not in ("text", "post"):
        return None
    content = _content(message)
    if content is None:
        return None
    if kind == "text":
        text = content.get("text") if isinstance(content, dict) else None
        return text if isinstance(text, str) else None
    return _post_text(content)


def _content(message: dict[str, Any]) -> Any:
    """A message's `content` (a JSON string inside the event's JSON: its escapes are read only here, so
    its lone surrogates are made valid here too); None if it is not JSON."""
    try:
        return _valid_text(json.loads(message.get("content") or ""))
    except (ValueError, TypeError, RecursionError):
        return None


# What each message type carries worth keeping in the raw archive (research/feishu.md §1.4).
ATTACHMENT_KEYS = {
    "image": ("image_key",),
    "file": ("file_key", "file_name"),
    "folder": ("file_key", "file_name"),
    "audio": ("file_key", "duration"),
    "media": ("file_key", "image_key", "file_name", "duration"),
    "sticker": ("file_key",),
    "share_chat": ("chat_id",),
    "share_user": ("user_id",),
    "location": ("name", "latitude", "longitude"),
    "merge_forward": (),
}
_KIND = re.compile(r"[a-z_]{1,32}\Z")
_UNSAFE_VALUE = re.compile(r"[\[\]\s<>]+")


def _kind(message: dict[str, Any]) -> str:
    kind = str(message.get("message_type") or "")
    if kind == "post":
        return "image"  # a rich text of images only
    return kind if _KIND.match(kind) else "unknown"


def placeholder(message: dict[str, Any]) -> str:
    """`[image image_key=img_…]`: the type and its keys, values squeezed to safe one-word tokens."""
    kind = _kind(message)
    content = _content(message) or {}
    parts = [kind]
    for key in ATTACHMENT_KEYS.get(kind, ()):
        value = content.get(key) if isinstance(content, dict) else None
        if isinstance(value, str | int | float) and str(value).strip():
            parts.append(f"{key}={_UNSAFE_VALUE.sub('_', str(value).strip())[:80]}")
    return "[" + " ".join(parts) + "]"


def _post_text(content: Any) -> str | None:
    """Rich text, in any of the shapes seen: direct, locale-wrapped, or under `post`."""
    if isinstance(content, dict) and isinstance(content.get("post"), dict):
        content = content["post"]
    if isinstance(content, dict) and "content" not in content:
        content = next((v for v in content.values() if isinstance(v, dict) and "content" in v), None)
    if not isinstance(content, dict) or not isinstance(content.get("content"), list):
        return None
    lines = [str(content["title"])] if content.get("title") else []
    for paragraph in content["content"]:
        parts = []
        for node in paragraph if isinstance(paragraph, list) else ():
            if not isinstance(node, dict):
                continue
            if node.get("tag") == "at":
                parts.append(str(node.get("user_id") or ""))

            elif isinstance(node.get("text"), str):
                parts.append(node["text"])
        lines.append("".join(parts))
    return "\n".join(lines)


def resolve_mentions(text: str, mentions: Any, bot_open_id: str) -> tuple[str, bool, tuple[Mention, ...]]:
    """Replace `@_user_N` by `@Name` (the bot's own mention by nothing) and report who was mentioned."""
    by_key: dict[str, dict[str, Any]] = {}
    for m in mentions if isinstance(mentions, list) else ():
        if isinstance(m, dict) and isinstance(m.get("key"), str):
            by_key[m["key"]] = m
    mentioned_bot = False
    others: list[Mention] = []

    def swap(match: re.Match[str]) -> str:
        nonlocal mentioned_bot
        key = match.group()
        if key == "@_all":
            return "@所有人"
        m = by_key.get(key)
        if m is None:
            return ""
        open_id = _id(_get(m, "id", "open_id"))
        if bot_open_id and open_id == bot_open_id:
            mentioned_bot = True
            return ""
        name = str(m.get("name") or "").strip()
        if open_id and all(o.open_id != open_id for o in others):
            others.append(Mention(name=name, open_id=open_id, union_id=_id(_get(m, "id", "union_id"))))
        return f"@{name}" if name else ""

    resolved = _PLACEHOLDER.sub(swap, text)
    lines = (" ".join(line.split()) for line in resolved.splitlines())
    return "\n".join(line for line in lines if line), mentioned_bot, tuple(others)
