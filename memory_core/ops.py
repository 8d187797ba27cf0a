"""The operations a writer applies, and what each one reports back: plain JSON-safe values any process can
queue for a namespace's single writer, each with the `op_id` its submitter minted."""

from __future__ import annotations

import secrets as _random
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from .entry import Entry
from .errors import InvalidInput
from .lineformat import USED_IDS, USED_KEY, RawMessage, format_time, parse_time


def new_op_id() -> str:
    return _random.token_hex(8)


@dataclass(frozen=True)
class Remember:
    """Add a memory through the upsert rules (duplicate → update, same subject → supersede)."""

    kind: ClassVar[str] = "remember"
    text: str
    type: str = "fact"
    subject: str | None = None
    source: str = "user"
    origin: str | None = None
    scope: str | None = None
    confidence: float | None = None
    pinned: bool = False
    #: When it became true (ISO; replay: the message's time, import: the file's `valid_from`); what it
    #: supersedes ends then. None: the write time.
    valid_from: str | None = None
    at: str | None = None  # when it was first recorded (import keeps the file's); None: the write time
    entry_id: str | None = None  # the id a new entry takes if it is free (import keeps the file's ids)
    op_id: str = field(default_factory=new_op_id)


@dataclass(frozen=True)
class Forget:
    """The user's explicit delete: the entry leaves MEMORY.md and ARCHIVE.md (git history keeps it).
    An automatic `source` (the model's tool) may not delete a protected entry (`policy.protected`)."""

    kind: ClassVar[str] = "forget"
    id: str
    source: str = "user"
    op_id: str = field(default_factory=new_op_id)


@dataclass(frozen=True)
class Pin:
    kind: ClassVar[str] = "pin"
    id: str
    pinned: bool = True
    op_id: str = field(default_factory=new_op_id)


@dataclass(frozen=True)
class Edit:
    """The user's (or the model tool's) explicit rewrite of one entry's text, keeping its metadata. A rewrite
    that changes the meaning supersedes instead: the old line stays as history. `scope`: the chat it is rewritten in (None: anywhere, the CLI); another place's entry takes it."""

    kind: ClassVar[str] = "edit"
    id: str
    text: str
    source: str = "user"
    op_id: str = field(default_factory=new_op_id)
    scope: str | None = None


@dataclass(frozen=True)
class Touch:
    """Hit feedback: each id recalled at `at` gets hits + 1 and last = at."""

    kind: ClassVar[str] = "touch"
    ids: tuple[str, ...]
    at: str  # ISO time, kept as text so the op stays JSON-safe
    op_id: str = field(default_factory=new_op_id)


@dataclass(frozen=True)
class Put:
    """Write an entry exactly as given (import without upsert). Its id is kept."""

    kind: ClassVar[str] = "put"
    entry: dict[str, Any]
    op_id: str = field(default_factory=new_op_id)


@dataclass(frozen=True)
class Record:
    """Append one message to the raw archive (redacted on the way in). Idempotent by message id."""

    kind: ClassVar[str] = "record"
    message: dict[str, Any]
    op_id: str = field(default_factory=new_op_id)


@dataclass(frozen=True)
class Share:
    """Show a private entry in the person's groups too (`shared=False` takes it back). `source` "user"
    is the person's own act; any other source is automatic and may never share a sensitive entry."""

    kind: ClassVar[str] = "share"
    id: str
    shared: bool = True
    source: str = "user"
    op_id: str = field(default_factory=new_op_id)


Op = Remember | Forget | Pin | Edit | Touch | Put | Record | Share
_KINDS: dict[str, type[Any]] = {c.kind: c for c in (Remember, Forget, Pin, Edit, Touch, Put, Record, Share)}


_FIELDS = {c: tuple(f.name for f in fields(c)) for c in _KINDS.values()}


def op_to_json(op: Op) -> dict[str, Any]:
    """Its fields as they are (not `asdict`, whose deep copy of each value cost more than the JSON)."""
    data = {name: getattr(op, name) for name in _FIELDS[type(op)]}
    data["kind"] = op.kind
    return data


def op_from_json(data: dict[str, Any]) -> Op:
    kind = data.get("kind")
    cls = _KINDS.get(str(kind))
    if cls is None:
        raise InvalidInput(f"unknown operation kind {kind!r}")
    names = _FIELDS[cls]
    args = {k: v for k, v in data.items() if k in names}
    if cls is Touch:
        args["ids"] = tuple(args.get("ids", ()))
    try:
        op: Op = cls(**args)
    except TypeError as exc:
        raise InvalidInput(f"bad {kind} operation: {exc}") from exc
    return op


class Kind(StrEnum):
    """What happened to an op. `rejected` and `superseded` come with a why (rejected:secret, superseded:subject)."""

    ADDED = "added"
    UPDATED = "updated"
    SUPERSEDED = "superseded"
    UNCHANGED = "unchanged"
    FORGOTTEN = "forgotten"
    RECORDED = "recorded"
    PURGED = "purged"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Outcome:
    """What happened to one op. `status` is the text logs, JSON and tests show (`rejected:secret`); `kind` and
    `why` are that text read once, here: a status of no known kind fails where it is made."""

    op_id: str
    status: str
    id: str | None = None
    superseded: tuple[str, ...] = ()
    detail: str | None = None
    kind: Kind = field(init=False, repr=False, compare=False)
    why: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind, _, why = self.status.partition(":")
        object.__setattr__(self, "kind", Kind(kind))
        object.__setattr__(self, "why", why or None)

    @property
    def ok(self) -> bool:
        return self.kind is not Kind.REJECTED

    def to_json(self) -> dict[str, Any]:
        return {
            "op_id": self.op_id,
            "status": self.status,
            "id": self.id,
            "superseded": list(self.superseded),
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            op_id=data["op_id"],
            status=data["status"],
            id=data.get("id"),
            superseded=tuple(data.get("superseded") or ()),
            detail=data.get("detail"),
        )


_TIME_FIELDS = ("valid_from", "valid_to", "at", "last")


def entry_to_json(e: Entry) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": e.id,
        "text": e.text,
        "type": e.type,
        "subject": e.subject,
        "supersedes": list(e.supersedes),
        "confidence": e.confidence,
        "hits": e.hits,
        "pinned": e.pinned,
        "source": e.source,
        "from": e.origin,
        "scope": e.scope,
        "tier": "resident" if e.resident else "recall",
    }
    for name in _TIME_FIELDS:
        value = getattr(e, name)
        data[name] = format_time(value) if value is not None else None
    if e.extra:
        data["extra"] = dict(e.extra)
    return data


def entry_from_json(data: dict[str, Any]) -> Entry:
    times: dict[str, datetime | None] = {}
    for name in _TIME_FIELDS:
        value = data.get(name)
        times[name] = parse_time(str(value)) if value else None
    conf = data.get("confidence")
    return Entry(
        id=str(data["id"]),
        text=str(data["text"]),
        type=str(data.get("type") or "fact"),
        subject=data.get("subject") or None,
        supersedes=tuple(str(s) for s in data.get("supersedes") or ()),
        confidence=round(float(conf), 2) if conf is not None else None,
        hits=int(data.get("hits") or 0),
        pinned=bool(data.get("pinned")),
        source=data.get("source") or None,
        origin=data.get("from") or None,
        scope=data.get("scope") or None,
        extra=tuple((str(k), str(v)) for k, v in (data.get("extra") or {}).items()),
        **times,
    )


def message_to_json(m: RawMessage) -> dict[str, Any]:
    return {
        "id": m.id,
        "ts": format_time(m.ts),
        "speaker": m.speaker,
        "text": m.text,
        "chat": m.chat,
        "chat_type": m.chat_type,
        "role": m.role,
        "session": m.session,
        **({USED_KEY: used} if (used := dict(m.extra).get(USED_KEY)) else {}),
    }


def message_from_json(data: dict[str, Any]) -> RawMessage:
    return RawMessage(
        id=str(data["id"]),
        ts=parse_time(str(data["ts"])),
        speaker=str(data.get("speaker") or ""),
        text=str(data.get("text") or ""),
        chat=str(data.get("chat") or ""),
        chat_type=str(data.get("chat_type") or "p2p"),
        role=str(data.get("role") or "user"),
        session=str(data.get("session") or ""),
        extra=((USED_KEY, used),)
        if isinstance(used := data.get(USED_KEY), str) and USED_IDS.fullmatch(used)
        else (),
    )
