"""`lucid import`: JSON Lines of messages and facts → ops per namespace (DESIGN §10; `parse_import`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .entry import MAX_SUBJECT_CHARS, MAX_TEXT_CHARS, TYPES, new_id
from .errors import ImportFormatError
from .lineformat import parse_time
from .namespace import Namespace
from .ops import Op, Put, Record, Remember

MAX_SUPERSEDES = 20  # ids a fact may end: more would make its line longer than a line may be
MAX_ID_CHARS = 64
MAX_HITS = 10**9
_SURROGATE = re.compile("[\ud800-\udfff]")
_FACT_FIELDS = {
    "kind",
    "id",
    "text",
    "type",
    "subject",
    "valid_from",
    "valid_to",
    "supersedes",
    "hits",
    "pinned",
    "confidence",
    "at",
    "last",
    "from",
    "scope",
    "user",
    "persona",
    "tenant",
    "source",
}
_MESSAGE_FIELDS = {
    "kind",
    "id",
    "ts",
    "speaker",
    "text",
    "chat",
    "chat_type",
    "role",
    "session",
    "user",
    "persona",
    "tenant",
}


@dataclass(frozen=True)
class ImportPlan:
    ops: dict[Namespace, list[Op]]
    messages: int
    facts: int

    @property
    def total(self) -> int:
        return self.messages + self.facts


def parse_import(data: bytes, default: Namespace, upsert: bool = False) -> ImportPlan:
    """Validate every line of a JSON Lines import and turn it into ops, grouped by namespace."""
    ops: dict[Namespace, list[Op]] = {}
    ids: dict[tuple[Namespace, str], int] = {}  # a fact's id → its line: one id is one fact
    messages = facts = 0
    for line_no, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ImportFormatError(line_no, f"not valid UTF-8 (byte {exc.start})") from exc
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ImportFormatError(line_no, f"not valid JSON: {exc.msg} (column {exc.colno})") from exc
        except (ValueError, RecursionError) as exc:  # a 5,000-digit number, arrays nested 100,000 deep
            raise ImportFormatError(line_no, f"not JSON this importer reads: {exc}") from None
        if not isinstance(obj, dict):
            raise ImportFormatError(line_no, "each line must be a JSON object")
        try:
            ns = _namespace(obj, default)
            kind = obj.get("kind")
            if kind == "message":
                op: Op = _message(obj)
                messages += 1
            elif kind == "fact":
                op = _fact(obj, upsert)
                facts += 1
            else:
                raise ValueError(f"kind must be 'message' or 'fact', got {kind!r}")
            ident = _fact_id(op)
            if ident is not None and (ns, ident) in ids:
                raise ValueError(f"duplicate id {ident!r} (also on line {ids[ns, ident]})")
        except (ValueError, TypeError) as exc:
            raise ImportFormatError(line_no, str(exc)) from exc
        if ident is not None:
            ids[ns, ident] = line_no
        ops.setdefault(ns, []).append(op)
    return ImportPlan({ns: _superseded_first(batch) for ns, batch in ops.items()}, messages, facts)


def _superseded_first(ops: list[Op]) -> list[Op]:
    """The ops with every fact after the facts of this file it supersedes (stable otherwise), so that an
    entry the file ends exists by the time its successor is written."""
    ids = {_fact_id(op): i for i, op in enumerate(ops) if _fact_id(op)}
    below = {
        i: [ids[s] for s in op.entry.get("supersedes", []) if s in ids and ids[s] != i]
        for i, op in enumerate(ops)
        if isinstance(op, Put)
    }
    depth: dict[int, int] = {}
    for start in range(len(ops)):  # iterative depth-first: a chain 100,000 long is no deeper a stack
        stack, path = [start], set()
        while stack:
            i = stack[-1]
            if i in depth:
                stack.pop()
                continue
            path.add(i)
            todo = [j for j in below.get(i, ()) if j not in depth and j not in path]  # a cycle: cut
            if todo:
                stack.extend(todo)
                continue
            depth[i] = 1 + max((depth.get(j, -1) for j in below.get(i, ())), default=-1)
            path.discard(i)
            stack.pop()
    return [ops[i] for i in sorted(range(len(ops)), key=lambda i: (depth[i], i))]


def _fact_id(op: Op) -> str | None:
    if isinstance(op, Put):
        return str(op.entry.get("id") or "") or None
    if isinstance(op, Remember):
        return op.entry_id
    return None


def _namespace(obj: dict[str, Any], default: Namespace) -> Namespace:
    parts = []
    for name, fallback in (("tenant", default.tenant), ("user", default.user), ("persona", default.persona)):
        value = obj.get(name, fallback)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string")
        parts.append(value)
    return Namespace.of(*parts)


def _str(obj: dict[str, Any], key: str, required: bool = False, limit: int = 500) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise ValueError(f"missing {key!r}")
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key!r} must be a string")
    if len(value) > limit:
        raise ValueError(f"{key!r} is longer than {limit} characters")
    if _SURROGATE.search(value):
        raise ValueError(f"{key!r} holds a lone surrogate (\\ud800-\\udfff), which is no character")
    return value


def _time(obj: dict[str, Any], key: str) -> str | None:
    value = _str(obj, key)
    if value is None:
        return None
    try:
        parse_time(value)
    except ValueError as exc:
        raise ValueError(f"{key!r} is not an ISO time: {value!r}") from exc
    return value


def _unknown(obj: dict[str, Any], allowed: set[str]) -> None:
    extra = set(obj) - allowed
    if extra:
        raise ValueError(f"unknown field(s): {', '.join(sorted(extra))}")


def _message(obj: dict[str, Any]) -> Record:
    _unknown(obj, _MESSAGE_FIELDS)
    ident = _str(obj, "id", required=True, limit=200)
    ts = _time(obj, "ts")
    if ts is None:
        raise ValueError("missing 'ts'")
    text = _str(obj, "text", required=True, limit=100_000) or ""
    chat_type = _str(obj, "chat_type") or "p2p"
    if chat_type not in ("p2p", "group"):
        raise ValueError("chat_type must be 'p2p' or 'group'")
    return Record(
        message={
            "id": ident,
            "ts": ts,
            "speaker": _str(obj, "speaker") or "",
            "text": text,
            "chat": _str(obj, "chat") or "",
            "chat_type": chat_type,
            "role": _str(obj, "role") or "user",
            "session": _str(obj, "session") or "",
        }
    )


def _fact(obj: dict[str, Any], upsert: bool) -> Op:
    _unknown(obj, _FACT_FIELDS)
    text = _str(obj, "text", required=True, limit=MAX_TEXT_CHARS) or ""
    if not text.strip():
        raise ValueError("'text' is empty")
    kind = _str(obj, "type") or "fact"
    if kind not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}")
    confidence = obj.get("confidence")
    if confidence is not None and (
        not isinstance(confidence, int | float) or isinstance(confidence, bool) or not 0 <= confidence <= 1
    ):
        raise ValueError("confidence must be a number within 0..1")
    hits = obj.get("hits", 0)
    if not isinstance(hits, int) or isinstance(hits, bool) or not 0 <= hits <= MAX_HITS:
        raise ValueError(f"hits must be a whole number from 0 to {MAX_HITS}")
    pinned = obj.get("pinned", False)
    if not isinstance(pinned, bool):
        raise ValueError("pinned must be true or false")
    supersedes = obj.get("supersedes") or []
    if not isinstance(supersedes, list) or not all(isinstance(s, str) for s in supersedes):
        raise ValueError("supersedes must be a list of ids")
    if len(supersedes) > MAX_SUPERSEDES or any(len(s) > MAX_ID_CHARS for s in supersedes):
        raise ValueError(
            f"supersedes may list at most {MAX_SUPERSEDES} ids of at most {MAX_ID_CHARS} characters"
        )
    scope = _str(obj, "scope")
    ident = _str(obj, "id", limit=MAX_ID_CHARS)
    if ident is not None and not all(ch.isalnum() or ch in "_.:-" for ch in ident):
        raise ValueError("id may hold letters, digits and _.:- only")
    if upsert and not supersedes and _time(obj, "valid_to") is None:
        return Remember(
            text=text,
            type=kind,
            subject=_str(obj, "subject", limit=MAX_SUBJECT_CHARS),
            source=_str(obj, "source") or "import",
            origin=_str(obj, "from"),
            scope=scope,
            confidence=confidence,
            pinned=pinned,
            valid_from=_time(obj, "valid_from"),
            at=_time(obj, "at"),
            entry_id=ident,
        )
    entry = {
        "id": ident or new_id(),
        "text": text,
        "type": kind,
        "subject": _str(obj, "subject", limit=MAX_SUBJECT_CHARS),
        "valid_from": _time(obj, "valid_from"),
        "valid_to": _time(obj, "valid_to"),
        "at": _time(obj, "at"),
        "last": _time(obj, "last"),
        "supersedes": supersedes,
        "confidence": confidence,
        "hits": hits,
        "pinned": pinned,
        "source": _str(obj, "source") or "import",
        "from": _str(obj, "from"),
        "scope": scope,
    }
    return Put(entry=entry)
