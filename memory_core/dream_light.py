"""Light dreaming: mechanical tidying of one namespace, no model, as a list of named rules (DESIGN §6).

Each rule is a small function with its threshold. `plan_light` runs them in order over a working copy,
each rule seeing what the earlier ones did, so one run reaches a fixed point: a second run right after
the first (same `now`) plans nothing. `apply_light` applies the plan to a Book through the same effect
functions, re-checking each precondition, so a plan applied to a moved book can only do less.

    merge_duplicates        bigram Jaccard ≥ 0.65, same tier and scope, compatible subjects: the loser gets
                            vt=now, the survivor sup+=loser and the union of metadata (max hits, pinned if
                            either, earliest at/vf, latest last, union of sup). Never a hard delete.
    supersede_contradictions  same subject, several current holders: the older get vt=now, the newest
                            sup+=them. `person:` subjects name who a fact is about, not an attribute: skipped.
    demote_stale_preferences  a preference never recalled (hits 0) with recency < 0.02 (~170 days) → context.
    promote_recalled        a recall-tier entry recalled ≥ 3 times → pinned (resident).
    archive_cold            a recall-tier entry with recency < 0.05 (~130 days) and importance < 0.55 → ARCHIVE.
    archive_history         an entry whose valid-to has passed (superseded, merged, expired) → ARCHIVE.

Protected (never touched, not even merged, moved or superseded): pinned entries, rules, identities and
instructions. A group with a protected member is left for the user. Ages come from the entries' own
timestamps (`last`, else `at`, else `vf`); an entry with none counts as new, so nothing is decided on a
missing date (the reference system's file-mtime dates made every entry look new or old at random).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol

from .book import Book
from .entry import Entry
from .recall import importance, recency
from .similarity import DUPLICATE, bigrams
from .subjects import canonical_subject

Action = Literal["merge", "supersede", "archive", "promote", "demote"]
DREAM_PROTECTED_TYPES = frozenset({"rule", "identity", "instruction"})
PROMOTE_HITS = 3
COLD_RECENCY = 0.05
COLD_IMPORTANCE = 0.55
STALE_RECENCY = 0.02
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def untouchable(e: Entry) -> bool:
    """No automatic path changes pinned entries, rules, identities or instructions."""
    return e.pinned or e.type in DREAM_PROTECTED_TYPES


def subject_key(e: Entry) -> str | None:
    return canonical_subject(e.subject) or None if e.subject else None


def scope_key(e: Entry) -> str:
    """Entries learned in a group never mix with private ones (p2p and unscoped are the same)."""
    return e.scope if e.scope and e.scope != "p2p" else "p2p"


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


# ------------------------------------------------------------------------------------------ candidates


def similar_pairs(sets: Sequence[frozenset[str]], threshold: float) -> Iterator[tuple[int, int, float]]:
    """Every pair (i, j, jaccard) with Jaccard ≥ threshold, without comparing all pairs.

    Prefix filtering (AllPairs): tokens are ordered rarest first; two sets with Jaccard ≥ t share at least
    ⌈t·max(|x|,|y|)⌉ tokens, so their prefixes of length |x| − ⌈t·|x|⌉ + 1 intersect. Only prefixes are
    indexed, sets are visited by size so the length filter |y| ≥ t·|x| prunes the rest, and every candidate
    is verified exactly. Same result as the O(n²) pass.
    """
    freq = Counter(tok for s in sets for tok in s)
    rank = {tok: r for r, tok in enumerate(sorted(freq, key=freq.__getitem__))}  # ties: first-seen order
    order = sorted(range(len(sets)), key=lambda i: len(sets[i]))
    index: dict[int, list[int]] = defaultdict(list)
    sizes = [len(s) for s in sets]
    for i in order:
        n = sizes[i]
        if n == 0:
            continue
        x = sets[i]
        prefix = sorted([rank[tok] for tok in x])[: n - math.ceil(threshold * n - 1e-9) + 1]
        min_len = threshold * n - 1e-9
        seen: set[int] = set()
        for tok in prefix:
            bucket = index[tok]
            seen.update(bucket)
            bucket.append(i)
        for j in seen:
            m = sizes[j]
            if m < min_len:
                continue
            inter = len(x & sets[j])
            score = inter / (n + m - inter)
            if score >= threshold:
                yield (min(i, j), max(i, j), score)


# ------------------------------------------------------------------------------------------ effects


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
    """Apply one op if its preconditions still hold; False = skipped. The one implementation of each effect."""
    e = book.current_entry(op.target)
    if e is None or untouchable(e):
        return False
    if op.action == "archive":
        history = e.valid_to is not None and e.valid_to <= now
        if not (history or (e.valid_to is None and e.current(now) and not e.resident)):
            return False  # neither history nor a current recall-tier entry (e.g. future-dated)
        book.archive(e.id)
        return True
    if op.action == "promote":
        if e.resident or not e.current(now):
            return False
        book.replace_entry(e.with_changes(pinned=True))
        return True
    if op.action == "demote":
        if e.type != "preference":
            return False
        book.replace_entry(e.with_changes(type="context"))
        return True
    other = book.current_entry(op.into) if op.into else None
    if other is None or other.id == e.id or untouchable(other) or not (e.current(now) and other.current(now)):
        return False
    book.replace_entry(e.with_changes(valid_to=now))
    if op.action == "merge":
        book.replace_entry(union(other, e))
    else:
        sup = other.supersedes if e.id in other.supersedes else (*other.supersedes, e.id)
        book.replace_entry(other.with_changes(supersedes=sup))
    return True


# ------------------------------------------------------------------------------------------ rules

Rule = Callable[[Sequence[Entry], datetime], list[LightOp]]


def _merge_order(e: Entry) -> tuple[int, int, datetime, str]:
    """Survivor preference: more hits, then more text (more detail), then older, then id."""
    return (-e.hits, -len(e.text), e.at or _EPOCH, e.id)


def merge_duplicates(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    """Near-duplicates (Jaccard ≥ DUPLICATE) fold into one survivor, strongest pairs first."""
    pool = [e for e in entries if e.current(now) and not untouchable(e)]
    sets = [bigrams(e.text) for e in pool]
    pairs = sorted(similar_pairs(sets, DUPLICATE), key=lambda p: (-p[2], pool[p[0]].id, pool[p[1]].id))
    subject: dict[str, str | None] = {e.id: subject_key(e) for e in pool}
    dead: set[str] = set()
    ops: list[LightOp] = []
    for i, j, _score in pairs:
        a, b = pool[i], pool[j]
        if a.id in dead or b.id in dead or a.resident != b.resident or scope_key(a) != scope_key(b):
            continue
        sa, sb = subject[a.id], subject[b.id]
        if sa and sb and sa != sb:
            continue
        survivor, loser = sorted((a, b), key=_merge_order)
        dead.add(loser.id)
        subject[survivor.id] = sa or sb  # the survivor takes the loser's subject: later pairs see it
        ops.append(LightOp("merge_duplicates", "merge", loser.id, survivor.id))
    return ops


def supersede_contradictions(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    """Several current holders of one attribute: the newest statement wins, the rest become history."""
    holders: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        key = subject_key(e)
        if key and not key.startswith("person:") and e.current(now):
            holders[key].append(e)
    ops: list[LightOp] = []
    for key in sorted(holders):
        group = holders[key]
        if len(group) < 2 or any(untouchable(e) for e in group):
            continue
        newest = max(group, key=lambda e: (stamp(e), e.at or _EPOCH, e.id))
        ops.extend(
            LightOp("supersede_contradictions", "supersede", e.id, newest.id)
            for e in group
            if e is not newest
        )
    return ops


def demote_stale_preferences(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    return [
        LightOp("demote_stale_preferences", "demote", e.id)
        for e in entries
        if e.type == "preference"
        and not e.pinned
        and e.hits == 0
        and e.current(now)
        and recency(e, now) < STALE_RECENCY
    ]


def promote_recalled(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    return [
        LightOp("promote_recalled", "promote", e.id)
        for e in entries
        if not e.resident and e.hits >= PROMOTE_HITS and e.current(now)
    ]


def archive_cold(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    return [
        LightOp("archive_cold", "archive", e.id)
        for e in entries
        if not e.resident
        and e.current(now)
        and e.valid_to is None
        and recency(e, now) < COLD_RECENCY
        and importance(e) < COLD_IMPORTANCE
    ]


def archive_history(entries: Sequence[Entry], now: datetime) -> list[LightOp]:
    return [
        LightOp("archive_history", "archive", e.id)
        for e in entries
        if e.valid_to is not None and e.valid_to <= now and not untouchable(e)
    ]


RULES: tuple[Rule, ...] = (
    merge_duplicates,
    supersede_contradictions,
    demote_stale_preferences,
    promote_recalled,
    archive_cold,
    archive_history,
)


# ------------------------------------------------------------------------------------------ plan & apply


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
        default_factory=lambda: dict.fromkeys(("merged", "superseded", "archived", "promoted", "demoted"), 0)
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
}


class _BookTarget:
    """A Book seen through the Target protocol; archive moves are batched (one pass over the file)."""

    def __init__(self, book: Book) -> None:
        self.book = book
        self.memory = {e.id: e for e in book.entries()}
        self.to_archive: list[str] = []

    def current_entry(self, entry_id: str) -> Entry | None:
        return self.memory.get(entry_id)

    def replace_entry(self, entry: Entry) -> None:
        self.memory[entry.id] = entry
        self.book.replace_entry(entry)

    def archive(self, entry_id: str) -> None:
        self.memory.pop(entry_id, None)
        self.to_archive.append(entry_id)

    def flush(self) -> None:
        move_to_archive(self.book, self.to_archive)


def move_to_archive(book: Book, ids: Sequence[str]) -> None:
    """Move entries to ARCHIVE.md, as `Book.move_to_archive` does, but in one pass over the file.

    `Book.move_to_archive` rescans MEMORY's slots per call (O(n) each, minutes for 10,000 moves in a
    100,000-entry book); this does the same moves through the Book's own structures at once.
    """
    wanted = set(ids)
    moved = [book.memory.entries.pop(i) for i in ids if i in book.memory.entries]
    if not moved:
        return
    book.memory.slots = [s for s in book.memory.slots if s.entry_id not in wanted]
    for entry in moved:
        book.archive.add(entry, book.archive.section_order[0])
    book.changed = True


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
