"""Entry ids as people type them (the 8-character prefixes `lucid show` and `/memory` print): one resolver
for every command, an ambiguous prefix refused with its candidates; a superseded entry cannot be pinned."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from .entry import Entry
from .errors import InvalidInput, NotFound

MIN_PREFIX = 4


def resolve_id(entries: Iterable[Entry], given: str) -> Entry:
    """The one entry whose id is `given` or starts with it (at least 4 characters)."""
    want = given.strip().lower()
    pool = list(entries)
    exact = [e for e in pool if e.id == want]
    if exact:
        return exact[0]
    if len(want) < MIN_PREFIX:
        raise InvalidInput(f"id {given!r} is too short: give at least {MIN_PREFIX} characters of it")
    found = {e.id: e for e in pool if e.id.startswith(want)}
    if not found:
        raise NotFound(f"no entry with id {given!r} (lucid show lists them)")
    if len(found) > 1:
        shown = ", ".join(sorted(i[: len(want) + 4] for i in found)[:5])
        raise InvalidInput(
            f"id prefix {given!r} is ambiguous: it matches {len(found)} entries ({shown}); give more characters"
        )
    return next(iter(found.values()))


def pin_refusal(entry: Entry, now: datetime, successor: Entry | None = None) -> str | None:
    """Why `entry` cannot be pinned (it is no longer current), or None. Pinning history would put a
    superseded value back into every prompt."""
    if entry.current(now):
        return None
    if successor is not None:
        return f"{entry.id[:8]} was superseded by {successor.id[:8]} ({successor.text}); pin that one instead"
    return f"{entry.id[:8]} is no longer current (superseded or expired); only a current entry can be pinned"


def successor_of(entries: Iterable[Entry], ident: str) -> Entry | None:
    """The entry that superseded `ident`, if any."""
    return next((e for e in entries if ident in e.supersedes), None)
