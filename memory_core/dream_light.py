"""Light dreaming: mechanical tidying of one namespace, no model, as a list of named rules (DESIGN §6;
the rules: `plan_light`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol

from . import meaning
from .book import Book
from .dream_pairs import similar_pairs
from .entry import DEMOTED, PROMOTED, Entry
from .injection import carries_instruction
from .policy import protected, scope_key, subject_key
from .recall import importance, recency
from .similarity import DUPLICATE, bigrams

Action = Literal["merge", "supersede", "archive", "promote", "demote", "unpromote"]
PROMOTE_HITS = 3
COLD_RECENCY = 0.05
COLD_IMPORTANCE = 0.55
STALE_RECENCY = 0.02
UNUSED_DAYS = 90  # a promotion lapses after this long without a recall, and is not granted after it
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def stamp(e: Entry) -> datetime:
    """When the entry's statement became true, for "which is newer": vf, else at."""
    return e.valid_from or e.at or _EPOCH


@dataclass(frozen=True)
class LightOp:
    """One planned change: `target` is the entry changed most, `into` the survivor or the newer one."""

    rule: str
    action: Action
    target: str
    into: str | None = None


class Target(Protocol):
    """What the effects need of a book; `Book` and the planner's working copy both provide it."""

    def current_entry(self, entry_id: str) -> Entry | None: ...

    def replace_entry(self, entry: Entry) -> None: ...

    def archive(self, entry_id: str) -> None: ...


def union(survivor: Entry, loser: Entry) -> Entry:
    """The survivor with the loser's metadata folded in (the loser's own line is kept, marked)."""
    sup = tuple(dict.fromkeys((*survivor.supersedes, *loser.supersedes, loser.id)))
    ats = [t for t in (survivor.at, loser.at) if t is not None]
    lasts = [t for t in (survivor.last, loser.last) if t is not None]
    confs = [c for c in (survivor.confidence, loser.confidence) if c is not None]
    vf = (
        None
        if survivor.valid_from is None or loser.valid_from is None
        else min(survivor.valid_from, loser.valid_from)
    )
    promos = sorted(p for p in (survivor.mark(PROMOTED), loser.mark(PROMOTED)) if p)
    survivor = survivor.with_mark(PROMOTED, promos[0] if promos else None)
    return survivor.with_changes(
        hits=max(survivor.hits, loser.hits),
        pinned=survivor.pinned or loser.pinned,
        at=min(ats) if ats else None,
        last=max(lasts) if lasts else None,
        confidence=max(confs) if confs else None,
        valid_from=vf,
        subject=survivor.subject or loser.subject,
        supersedes=sup,
    )


def apply_op(book: Target, op: LightOp, now: datetime) -> bool:
    """Apply one op if its rule still holds for the entry; False = skipped. The one implementation of
    each effect, used by the planner's working copy and by the Book alike."""
    e = book.current_entry(op.target)
    if e is None or protected(e):
        return False
    if op.action in ("archive", "promote", "demote", "unpromote"):
        if not SINGLE_RULES[op.rule](e, now):
            return False
        if op.action == "archive":
            book.archive(e.id)
        elif op.action == "promote":
            book.replace_entry(e.with_mark(PROMOTED, f"{now:%Y-%m-%d}"))
        elif op.action == "demote":
            book.replace_entry(e.with_changes(type="context").with_mark(DEMOTED, f"{now:%Y-%m-%d}"))
        else:
            book.replace_entry(e.with_mark(PROMOTED, None))
        return True
    other = book.current_entry(op.into) if op.into else None
    if other is None or other.id == e.id or protected(other) or not (e.current(now) and other.current(now)):
        return False
    book.replace_entry(e.with_changes(valid_to=now))
    if op.action == "merge":
        book.replace_entry(union(other, e))
    else:
        sup = other.supersedes if e.id in other.supersedes else (*other.supersedes, e.id)
        book.replace_entry(other.with_changes(supersedes=sup))
    return True


Rule = Callable[[Sequence[Entry], datetime], list[LightOp]]


def _merge_order(e: Entry) -> tuple[bool, int, int, datetime, str]:
    """Survivor preference: a standing preference over a plain fact, then more hits, then more text
    (more detail), then older, then id."""
    return (not e.resident, -e.hits, -len(e.text), e.at or _EPOCH, e.id)


def merge_duplicates(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    """Near-duplicates (Jaccard ≥ DUPLICATE) fold into one survivor, strongest pairs first."""
    groups: dict[tuple[frozenset[str], str, str | None], list[Entry]] = defaultdict(list)
    for e in entries:
        if e.current(now) and not protected(e):
            groups[(bigrams(e.text), scope_key(e.scope), subject_key(e.subject))].append(e)
    ops: list[LightOp] = []
    pool: list[Entry] = []
    sets: list[frozenset[str]] = []
    for (grams, _, _), members in groups.items():
        members.sort(key=_merge_order)
        pool.append(members[0])
        sets.append(grams)
        ops.extend(LightOp("merge_duplicates", "merge", m.id, members[0].id) for m in members[1:])
    pairs = sorted(similar_pairs(sets, DUPLICATE), key=lambda p: (-p[2], pool[p[0]].id, pool[p[1]].id))
    subject: dict[str, str | None] = {e.id: subject_key(e.subject) for e in pool}
    dead: set[str] = set()
    for i, j, _score in pairs:
        a, b = pool[i], pool[j]
        if a.id in dead or b.id in dead or scope_key(a.scope) != scope_key(b.scope):
            continue
        sa, sb = subject[a.id], subject[b.id]
        if (sa and sb and sa != sb) or meaning.compare(a.text, b.text).kind not in meaning.REWORDING:
            continue  # what the upsert would not fold into one (another number, a swapped word) stays two
        survivor, loser = sorted((a, b), key=_merge_order)
        dead.add(loser.id)
        subject[survivor.id] = sa or sb  # the survivor takes the loser's subject: later pairs see it
        ops.append(LightOp("merge_duplicates", "merge", loser.id, survivor.id))
    return ops


def supersede_contradictions(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    """Several current holders of one attribute: the newest statement wins, the rest become history."""
    holders: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        key = subject_key(e.subject)
        if key and not key.startswith("person:") and e.current(now):
            holders[key].append(e)
    ops: list[LightOp] = []
    for key in sorted(holders):
        group = holders[key]
        if len(group) < 2 or any(protected(e) for e in group):
            continue
        newest = max(group, key=lambda e: (stamp(e), e.at or _EPOCH, e.id))
        ops.extend(
            LightOp("supersede_contradictions", "supersede", e.id, newest.id)
            for e in group
            if e is not newest
        )
    return ops


def is_stale_preference(e: Entry, now: datetime) -> bool:
    return e.type == "preference" and e.hits == 0 and e.current(now) and recency(e, now) < STALE_RECENCY


def _days_unused(e: Entry, now: datetime) -> float:
    """Days since the entry was last recalled (else promoted, else recorded); 0 with no date at all."""
    promo = e.mark(PROMOTED)
    try:
        promoted = datetime.strptime(promo, "%Y-%m-%d").replace(tzinfo=UTC) if promo else None
    except ValueError:
        promoted = None
    times = [t for t in (e.last, promoted, e.at, e.valid_from) if t is not None]
    return (now - max(times)).total_seconds() / 86400 if times else 0.0


def is_hot(e: Entry, now: datetime) -> bool:
    return (
        not e.resident
        and e.hits >= PROMOTE_HITS
        and e.current(now)
        and _days_unused(e, now) < UNUSED_DAYS
        and not carries_instruction(e.text)
    )


def is_unused_promotion(e: Entry, now: datetime) -> bool:
    return e.promoted and not e.pinned and _days_unused(e, now) >= UNUSED_DAYS


def is_cold(e: Entry, now: datetime) -> bool:
    return (
        not e.resident
        and e.valid_to is None
        and e.current(now)
        and e.mark(DEMOTED) is None  # a demoted preference is still true: it stays in the recall tier
        and recency(e, now) < COLD_RECENCY
        and importance(e) < COLD_IMPORTANCE
    )


def is_history(e: Entry, now: datetime) -> bool:
    return e.valid_to is not None and e.valid_to <= now


#: Rules that act on one entry at a time, by name, with the predicate that decides (re-checked on apply).
SINGLE_RULES: dict[str, Callable[[Entry, datetime], bool]] = {
    "demote_stale_preferences": is_stale_preference,
    "promote_recalled": is_hot,
    "return_unused_promotions": is_unused_promotion,
    "archive_cold": is_cold,
    "archive_history": is_history,
}


def _single(name: str) -> Rule:
    predicate = SINGLE_RULES[name]
    action: Action = (
        "demote"
        if name.startswith("demote")
        else "promote"
        if name.startswith("promote")
        else "unpromote"
        if name.startswith("return")
        else "archive"
    )

    def rule(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
        return [LightOp(name, action, e.id) for e in entries if not protected(e) and predicate(e, now)]

    rule.__name__ = name
    return rule


demote_stale_preferences = _single("demote_stale_preferences")
promote_recalled = _single("promote_recalled")
return_unused_promotions = _single("return_unused_promotions")
archive_cold = _single("archive_cold")
archive_history = _single("archive_history")


RULES: tuple[Rule, ...] = (
    merge_duplicates,
    supersede_contradictions,
    demote_stale_preferences,
    promote_recalled,
    return_unused_promotions,
    archive_cold,
    archive_history,
)


@dataclass
class _Working:
    """The planner's copy of MEMORY.md: id → entry, in file order."""

    memory: dict[str, Entry]

    def current_entry(self, entry_id: str) -> Entry | None:
        return self.memory.get(entry_id)

    def replace_entry(self, entry: Entry) -> None:
        self.memory[entry.id] = entry

    def archive(self, entry_id: str) -> None:
        self.memory.pop(entry_id, None)


def plan_light(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    """The ops of one light run over MEMORY.md's entries (pure; `now` is explicit)."""
    work = _Working({e.id: e for e in entries})
    plan: list[LightOp] = []
    for rule in RULES:
        for op in rule(list(work.memory.values()), now):
            if apply_op(work, op, now):
                plan.append(op)
    return plan


@dataclass
class LightResult:
    """What a light run did: counts per action, ids per action, and ops skipped because the book moved."""

    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("merged", "superseded", "archived", "promoted", "demoted", "unpromoted"), 0
        )
    )
    touched: dict[str, list[str]] = field(default_factory=dict)
    skipped: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())


_COUNT_KEY = {
    "merge": "merged",
    "supersede": "superseded",
    "archive": "archived",
    "promote": "promoted",
    "demote": "demoted",
    "unpromote": "unpromoted",
}


class _BookTarget(_Working):
    """A Book seen through the Target protocol; archive moves are batched (one pass over the file)."""

    def __init__(self, book: Book) -> None:
        super().__init__({e.id: e for e in book.entries()})
        self.book = book
        self.to_archive: list[str] = []

    def replace_entry(self, entry: Entry) -> None:
        super().replace_entry(entry)
        self.book.replace_entry(entry)

    def archive(self, entry_id: str) -> None:
        super().archive(entry_id)
        self.to_archive.append(entry_id)

    def flush(self) -> None:
        move_to_archive(self.book, self.to_archive)


def move_to_archive(book: Book, ids: Sequence[str]) -> None:
    """Move entries to ARCHIVE.md in one pass (see `Book.move_to_archive_many`)."""
    book.move_to_archive_many(ids)


def apply_light(book: Book, plan: Sequence[LightOp], now: datetime) -> LightResult:
    """Apply a light plan to `book` (mutating it); ops whose preconditions no longer hold are skipped."""
    target = _BookTarget(book)
    result = LightResult()
    for op in plan:
        if apply_op(target, op, now):
            key = _COUNT_KEY[op.action]
            result.counts[key] += 1
            result.touched.setdefault(key, []).append(
                op.target if op.into is None else f"{op.target}>{op.into}"
            )
        else:
            result.skipped += 1
    target.flush()
    return result
