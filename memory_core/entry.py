"""One memory: the `Entry` value, its types and tier, and its validity window."""

from __future__ import annotations

import secrets as _random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from .policy import RESIDENT_TYPES

TYPES = ("rule", "identity", "instruction", "preference", "fact", "context")

#: Light dreaming's marks (extra keys, value = the date): `promo` lifts a much-recalled entry into the
#: resident tier (not a pin; taken back when unused); `demo` moved a stale preference to the recall tier.
PROMOTED = "promo"
DEMOTED = "demo"

#: An entry's text may not be longer than this (characters); longer input is rejected, not cut.
MAX_TEXT_CHARS = 2000
MAX_SUBJECT_CHARS = 64  # an attribute's name (所在地), not a statement


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def as_utc(when: datetime) -> datetime:
    """Normalise a datetime to aware UTC with whole seconds (naive input is taken as UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).replace(microsecond=0)


def new_id() -> str:
    """A fresh entry id: 16 lowercase hex characters (64 random bits), never reused."""
    return _random.token_hex(8)


@dataclass(frozen=True)
class Entry:
    """A memory line. `extra` keeps metadata keys this version does not know, in file order."""

    id: str
    text: str
    type: str = "fact"
    subject: str | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    at: datetime | None = None
    supersedes: tuple[str, ...] = ()
    confidence: float | None = None
    hits: int = 0
    last: datetime | None = None
    pinned: bool = False
    source: str | None = None
    origin: str | None = None  # `from`: the raw message id it was learned from
    scope: str | None = None  # "p2p" or "g:<chat_id>"
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def resident(self) -> bool:
        """Tier is derived, never stored: pinned, promoted by light dreaming, or a resident type."""
        return self.pinned or self.type in RESIDENT_TYPES or (bool(self.extra) and self.promoted)

    def mark(self, key: str) -> str | None:
        """The value of an extra metadata key (e.g. PROMOTED), or None."""
        return next((v for k, v in self.extra if k == key), None)

    def with_mark(self, key: str, value: str | None) -> Entry:
        """This entry with the extra key set to `value` (None removes it)."""
        rest = tuple((k, v) for k, v in self.extra if k != key)
        return replace(self, extra=rest if value is None else (*rest, (key, value)))

    @property
    def promoted(self) -> bool:
        return self.mark(PROMOTED) is not None

    def current(self, now: datetime) -> bool:
        """Valid at `now`: valid_from <= now < valid_to, missing bounds open."""
        if self.valid_from is not None and now < self.valid_from:
            return False
        return not (self.valid_to is not None and now >= self.valid_to)

    @property
    def superseded(self) -> bool:
        return self.valid_to is not None

    def with_changes(self, **changes: object) -> Entry:
        return replace(self, **changes)  # type: ignore[arg-type]
