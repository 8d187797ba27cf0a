"""History per subject, drawn from the supersede chain: 余杭区 → 西湖区 → 余杭区, with dates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from .entry import Entry
from .policy import canonical_subject

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Step:
    entry: Entry
    start: datetime | None
    end: datetime | None
    archived: bool


def subject_timelines(current: Iterable[Entry], archived: Iterable[Entry] = ()) -> dict[str, list[Step]]:
    """subject → its values in order, oldest first. Subjects with one value are included too."""
    groups: dict[str, list[Step]] = {}
    for entries, is_archived in ((current, False), (archived, True)):
        for e in entries:
            if not e.subject:
                continue
            key = canonical_subject(e.subject)
            groups.setdefault(key, []).append(Step(e, e.valid_from or e.at, e.valid_to, is_archived))
    for steps in groups.values():
        steps.sort(key=lambda s: (s.start or _EPOCH, s.entry.id))
    return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))
