"""`/memory` as an interactive card: the entries with 忘记 / 置顶 / 取消置顶 / 历史 buttons, updated in place."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from memory_core.entry import Entry
from memory_core.errors import LucidError
from memory_core.history import iter_rows
from memory_core.namespace import Namespace
from memory_core.ops import Forget, Pin
from memory_core.policy import subject_key
from memory_core.recall import visible_in
from memory_core.timeline import subject_timelines

from .errors import FeishuError
from .inbound import Inbound
from .markup import neutralize
from .redis_keys import Keys
from .runtime import Runtime, current

log = logging.getLogger(__name__)

CARD_TTL = 14 * 24 * 3600  # Feishu keeps a card updatable for 14 days
SEEN_TTL = 12 * 3600
SHOWN = 10  # entries on one card (a card holds 30 KB)
OPS = ("forget", "pin", "unpin", "history", "undo")
_ENTRY_ID = re.compile(r"[0-9a-f]{4,32}\Z")
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z")


@dataclass(frozen=True)
class CardAction:
    """A button press, as routing made it from `card.action.trigger` (JSON-safe: it rides an RQ job; the flow:
    docs/ARCHITECTURE.md, "The /memory card")."""

    persona: str
    tenant: str
    open_id: str  # the operator
    user: str  # union_id when present, else open_id
    message_id: str  # the card's message
    op: str
    entry_id: str
    event_id: str = ""


def parse_action(event: dict[str, Any], persona: str) -> CardAction | None:
    """The action of a v2.0 `card.action.trigger` event, or None when it is not one of ours."""
    header, body = event.get("header") or {}, event.get("event") or {}
    if not isinstance(header, dict) or not isinstance(body, dict):
        return None
    operator, action, context = (
        body.get("operator") or {},
        body.get("action") or {},
        body.get("context") or {},
    )
    if not all(isinstance(x, dict) for x in (operator, action, context)):
        return None
    value = action.get("value") or {}
    if not isinstance(value, dict) or value.get("lucid") != "memory" or value.get("op") not in OPS:
        return None
    entry_id, open_id = str(value.get("id") or ""), str(operator.get("open_id") or "")
    message_id = str(context.get("open_message_id") or "")
    if not (_ENTRY_ID.match(entry_id) and _ID.match(open_id) and _ID.match(message_id)):
        return None
    union_id = str(operator.get("union_id") or "")
    tenant = str(header.get("tenant_key") or operator.get("tenant_key") or "default")
    return CardAction(
        persona=persona,
        tenant=tenant if _ID.match(tenant) else "default",
        open_id=open_id,
        user=union_id if _ID.match(union_id) else open_id,
        message_id=message_id,
        op=str(value["op"]),
        entry_id=entry_id,
        event_id=str(header.get("event_id") or "")[:128],
    )


_WORDS = {
    "title": ("我记得关于你的 {n} 件事", "What I remember about you ({n})"),
    "empty": ("我还没有记住关于你的事。", "I don't remember anything about you yet."),
    "group": ("（群聊里只显示在本群学到的）", "(in a group, only what was learned in this group)"),
    "more": ("还有 {n} 条，私聊发 /memory 查看全部。", "{n} more: send /memory in a private chat."),
    "forget": ("忘记", "Forget"),
    "pin": ("置顶", "Pin"),
    "unpin": ("取消置顶", "Unpin"),
    "history": ("历史", "History"),
    "was": ("以前", "before"),
    "dream": ("上次做梦：{what}", "Last dream: {what}"),
    "undo": ("撤销", "Undo"),
}


def _t(lang: str, key: str, **values: Any) -> str:
    zh, en = _WORDS[key]
    return (en if lang == "en" else zh).format(**values)


def _button(lang: str, op: str, ident: str, kind: str = "default") -> dict[str, Any]:
    """A button whose press comes back as `card.action.trigger` with only the action and an id."""
    return {
        "tag": "button",
        "text": {"tag": "plain_text", "content": _t(lang, op)},
        "type": kind,
        "size": "small",
        "behaviors": [{"type": "callback", "value": {"lucid": "memory", "op": op, "id": ident}}],
    }


@dataclass(frozen=True)
class Dream:
    """The namespace's last dream commit, offered to admins with an undo button."""

    rev: str
    message: str


def last_dream(runtime: Runtime, ns: Namespace) -> Dream | None:
    """The newest dream that changed memory, in `lucid history`'s words; None if it is undone already, or
    if history cannot be read now (the card shows the memory without the undo button)."""
    try:
        runtime.writer.mend(ns)
        for row in iter_rows(runtime.store, ns, scan=50, kinds=("dream",)):
            return None if row.undone_by else Dream(row.rev, row.summary)
    except LucidError as exc:
        log.warning("the last dream of %s is not offered: %s", ns.key, exc)
    return None


def build(
    entries: Sequence[Entry],
    lang: str,
    group: bool,
    history: Sequence[Entry] = (),
    dream: Dream | None = None,
) -> dict[str, Any]:
    """Card JSON 2.0 (`update_multi`, so it can be updated in place) listing `entries`; with `dream` (for
    admins), the last dream run and an undo button."""
    elements: list[dict[str, Any]] = []
    if group:
        elements.append({"tag": "markdown", "content": _t(lang, "group"), "text_size": "notation"})
    if not entries:
        elements.append({"tag": "markdown", "content": _t(lang, "empty")})
    for e in entries[:SHOWN]:
        buttons = [
            _button(lang, "forget", e.id, "danger"),
            _button(lang, "unpin" if e.pinned else "pin", e.id),
        ]
        if e.subject:
            buttons.append(_button(lang, "history", e.id))
        elements.append(_row(_plain(e.text) + (" 📌" if e.pinned else ""), buttons))
        before = [h for h in history if h.id != e.id]
        if before and any(h.id == e.id for h in history):
            was = "  →  ".join(_plain(h.text) for h in before)
            elements.append(
                {"tag": "markdown", "content": f"{_t(lang, 'was')}: {was}", "text_size": "notation"}
            )
    if len(entries) > SHOWN:
        elements.append({"tag": "markdown", "content": _t(lang, "more", n=len(entries) - SHOWN)})
    if dream is not None:
        elements.append({"tag": "hr"})
        elements.append(
            _row(_t(lang, "dream", what=_plain(dream.message)), [_button(lang, "undo", dream.rev[:16])])
        )
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "header": {"title": {"tag": "plain_text", "content": _t(lang, "title", n=len(entries))}},
        "body": {"elements": elements},
    }


def _row(text: str, buttons: list[dict[str, Any]]) -> dict[str, Any]:
    """A line of the card: its text, and its buttons on the right."""
    text_column = {
        "tag": "column",
        "width": "weighted",
        "weight": 3,
        "elements": [{"tag": "markdown", "content": text}],
    }
    return {
        "tag": "column_set",
        "columns": [text_column, {"tag": "column", "width": "auto", "elements": buttons}],
    }


def _plain(text: str) -> str:
    """Memory text shown in a markdown element: no link, mention or markup of its own (mentions and links
    become plain words first, as in every reply: `markup.neutralize`)."""
    return re.sub(r"([\\`*_\[\]()<>#~|])", r"\\\1", neutralize(text))


@dataclass(frozen=True)
class Registration:
    owner: str  # open_id the card was made for
    tenant: str
    user: str
    persona: str
    chat_id: str
    chat_type: str
    lang: str

    @property
    def ns(self) -> Namespace:
        return Namespace.of(self.tenant, self.user, self.persona)


def _key(persona: str, message_id: str) -> str:
    return Keys.memory_card(persona, message_id)


def register(client: redis.Redis | None, card_message_id: str, inbound: Inbound, lang: str) -> None:
    if client is None or not card_message_id:
        return
    reg = Registration(inbound.open_id, inbound.tenant, inbound.user, inbound.persona, inbound.chat_id,
                       inbound.chat_type, lang)  # fmt: skip
    client.set(_key(inbound.persona, card_message_id), json.dumps(asdict(reg)), ex=CARD_TTL)


def _registration(client: redis.Redis, persona: str, message_id: str) -> Registration | None:
    raw = client.get(_key(persona, message_id))
    if not raw:
        return None
    return Registration(**json.loads(raw))


def visible_entries(runtime: Runtime, ns: Namespace, chat_type: str, chat_id: str) -> list[Entry]:
    """What a memory listing shows in this chat, in the order it shows it (pinned, resident, oldest)."""
    epoch = datetime.min.replace(tzinfo=UTC)
    entries = runtime.memory.book(ns).current(runtime.clock())
    shown = [e for e in entries if visible_in(e, chat_type, chat_id)]
    return sorted(shown, key=lambda e: (not e.pinned, not e.resident, e.at or epoch))


def enqueue_action(runtime: Runtime, action: CardAction) -> bool:
    """From the bot: claim the event (replicas and re-pushes act once) and queue the job; False = repeat."""
    assert runtime.redis is not None
    seen = Keys.seen_card(action.persona, action.event_id)
    if action.event_id and not runtime.redis.set(seen, "1", nx=True, ex=SEEN_TTL):
        return False
    try:
        runtime.queue("chat").enqueue(handle_action, asdict(action), result_ttl=600, failure_ttl=86400)
    except Exception:  # not queued: Feishu's retry must not be taken for a repeat
        if action.event_id:
            with contextlib.suppress(redis.RedisError):
                runtime.redis.delete(seen)
        raise
    return True


def handle_action(data: dict[str, Any]) -> str:
    """RQ job: one button press, through the single writer, then the card updated in place."""
    return run_action(current(), CardAction(**data))


def run_action(runtime: Runtime, action: CardAction) -> str:
    assert runtime.redis is not None
    reg = _registration(runtime.redis, action.persona, action.message_id)
    if reg is None:
        log.info("card action on message=%s: unknown or expired card", action.message_id)
        return "unknown card"
    if action.open_id != reg.owner or action.tenant != reg.tenant:
        log.warning("card action on message=%s refused: operator is not the card's owner", action.message_id)
        return "not the owner"
    persona = runtime.settings.personas.get(reg.persona)
    admin = persona is not None and action.open_id in persona.admins
    entries = visible_entries(runtime, reg.ns, reg.chat_type, reg.chat_id)
    target = next((e for e in entries if e.id == action.entry_id), None)
    history: list[Entry] = []
    if action.op == "undo":
        outcome = _undo(runtime, reg, action, admin)
        entries = visible_entries(runtime, reg.ns, reg.chat_type, reg.chat_id)
    elif target is None:
        outcome = "no such entry"
    elif action.op == "history":
        book = runtime.memory.book(reg.ns)
        steps = subject_timelines(book.entries(), book.archived()).get(subject_key(target.subject) or "", [])
        history = [s.entry for s in steps if visible_in(s.entry, reg.chat_type, reg.chat_id)]
        outcome = "history"
    else:
        op = Forget(id=target.id) if action.op == "forget" else Pin(id=target.id, pinned=action.op == "pin")
        outcome = runtime.memory.apply(reg.ns, [op])[0].status
        entries = visible_entries(runtime, reg.ns, reg.chat_type, reg.chat_id)
    if persona is None:
        return outcome
    dream = last_dream(runtime, reg.ns) if admin and reg.chat_type == "p2p" else None
    card = build(entries, reg.lang, reg.chat_type != "p2p", history, dream)
    try:
        sender = runtime.sender(persona)
        sender.patch_card(action.message_id, json.dumps(card, ensure_ascii=False))
    except FeishuError as exc:
        log.error("card on message=%s not updated: %s", action.message_id, exc)
    return outcome


def _undo(runtime: Runtime, reg: Registration, action: CardAction, admin: bool) -> str:
    """Admins only, in a private chat, and only the dream the card offered (still the last one)."""
    dream = last_dream(runtime, reg.ns)
    if not admin or reg.chat_type != "p2p" or dream is None or not dream.rev.startswith(action.entry_id):
        log.warning("card undo on message=%s refused (admin=%s)", action.message_id, admin)
        return "undo refused"
    try:
        done = runtime.memory.undo(reg.ns, dream.rev)
    except LucidError as exc:  # a later change touched the same entries
        log.info("card undo of %s refused: %s", dream.rev[:10], exc)
        return "undo refused"
    return f"undone {done.entries}"
