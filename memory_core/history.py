"""Undo by revision, entry by entry: what one commit changed, and how to take it back today.

A whole-file `git revert` fails as soon as any later commit touched the same file, and every dream run
prepends DREAMS.md, every recall bumps a hit counter. So an undo works on entries instead: the entries
(by id, with where they live — MEMORY.md or ARCHIVE.md) a commit changed are put back as they were
before it, provided no later change touched them since (usage counters `hc`/`last` do not count, and
are kept). PROFILE.md is restored if nobody changed it since; DREAMS.md is merged run by run (the
commit's journal runs leave, runs it removed come back), so the journal never blocks an undo. If a later
commit changed one of the same entries, the undo is refused and names them; nothing is written.

"Meaningful" (what a bare `lucid undo` picks): a commit that changed an entry other than its usage
counters, or PROFILE.md — not one that only recorded messages or counted hits. A bare undo skips undo
commits and what they undid, so repeating it steps further back; `undo REV` of an undo commit redoes
(and a bare undo right after takes that redo back).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from .book import Book
from .entry import Entry
from .errors import UndoRefused
from .lineformat import parse_file
from .ops import Forget
from .store import ARCHIVE, DREAMS, MEMORY, PROFILE, Snapshot

if TYPE_CHECKING:
    from .namespace import Namespace
    from .writer import Writer

Where = Literal["memory", "archive"]
State = tuple[Where, Entry]
Files = Mapping[str, str | None]
_RUN_TIME = re.compile(r"^## (\S+)")


def states(files: Files) -> dict[str, State]:
    """Every entry of MEMORY.md and ARCHIVE.md by id, with the file it lives in."""
    out: dict[str, State] = {}
    for name, where in ((ARCHIVE, "archive"), (MEMORY, "memory")):
        text = files.get(name)
        if text:
            for e in parse_file(text).entries():
                out[e.id] = (where, e)  # type: ignore[assignment]
    return out


def _essence(state: State | None) -> tuple[str, Entry] | None:
    """A state without its usage counters: recalls do not count as a change of an entry."""
    if state is None:
        return None
    return state[0], state[1].with_changes(hits=0, last=None)


def entry_changes(before: Files, after: Files) -> dict[str, tuple[State | None, State | None]]:
    """Entries whose place or content (usage counters aside) differ between two versions."""
    old, new = states(before), states(after)
    return {
        ident: (old.get(ident), new.get(ident))
        for ident in sorted(set(old) | set(new))
        if _essence(old.get(ident)) != _essence(new.get(ident))
    }


def meaningful(before: Files, after: Files) -> bool:
    return bool(entry_changes(before, after)) or (before.get(PROFILE) or "") != (after.get(PROFILE) or "")


def _runs(journal: str | None) -> tuple[str, list[str]]:
    if not journal or "\n## " not in "\n" + journal:
        return (journal or ""), []
    head, _, body = ("\n" + journal).partition("\n## ")
    return head.lstrip("\n"), ["## " + r.rstrip("\n") for r in body.split("\n## ")]


def merge_journal(before: str | None, after: str | None, current: str | None) -> str | None:
    """DREAMS.md with the commit's journal runs taken out and the runs it dropped put back (newest
    first); None when the commit did not change the journal."""
    if (before or "") == (after or ""):
        return None
    _, old = _runs(before)
    head, new = _runs(after)
    cur_head, cur = _runs(current)
    added = [r for r in new if r not in old]
    dropped = [r for r in old if r not in new]
    runs = [r for r in cur if r not in added] + [r for r in dropped if r not in cur]
    runs.sort(key=lambda r: m.group(1) if (m := _RUN_TIME.match(r)) else "", reverse=True)
    top = cur_head or head
    return (top.rstrip("\n") + "\n\n" if top.strip() else "") + "\n\n".join(runs) + ("\n" if runs else "")


@dataclass
class RevertPlan:
    """What an undo will do: each entry's target state (None: the commit added it, it goes)."""

    entries: dict[str, State | None] = field(default_factory=dict)
    profile: str | None = None  # the PROFILE.md to write, if it changes
    journal: str | None = None  # the DREAMS.md to write, if it changes
    order: list[str] = field(default_factory=list)  # MEMORY.md ids before the commit, for placement


def plan_revert(before: Files, after: Files, current: Files) -> RevertPlan:
    """The undo of the change `before` → `after`, applied on `current`. Raises UndoRefused if a later
    change touched one of the same entries (or PROFILE.md), or if there is nothing to undo."""
    changes = entry_changes(before, after)
    now = states(current)
    plan = RevertPlan()
    conflicts: list[str] = []
    for ident, (was, became) in changes.items():
        cur = now.get(ident)
        if _essence(cur) == _essence(was):
            continue  # already as it was (undone before, or changed back by hand)
        if _essence(cur) != _essence(became):
            conflicts.append(ident)
            continue
        plan.entries[ident] = was
    old_profile, new_profile, cur_profile = (f.get(PROFILE) or "" for f in (before, after, current))
    if old_profile != new_profile and cur_profile != old_profile:
        if cur_profile != new_profile:
            conflicts.append(PROFILE)
        else:
            plan.profile = old_profile
    if conflicts:
        shown = ", ".join(c[:8] if c != PROFILE else c for c in conflicts[:8])
        more = f" (+{len(conflicts) - 8} more)" if len(conflicts) > 8 else ""
        raise UndoRefused(
            f"later changes touch the same entries ({shown}{more}): undo those first, or edit by hand"
        )
    if not changes and old_profile == new_profile:
        raise UndoRefused("that commit changed no memory (only messages or hit counts): nothing to undo")
    if not plan.entries and plan.profile is None:
        raise UndoRefused("already undone: what that commit changed is as it was before it")
    plan.journal = merge_journal(before.get(DREAMS), after.get(DREAMS), current.get(DREAMS))
    plan.order = [i for i, (where, _) in states(before).items() if where == "memory"]
    return plan


def apply_revert(book: Book, plan: RevertPlan, now: datetime) -> int:
    """Put each planned entry back in `book` (usage counters of the live entry kept); returns how many."""
    rank = {ident: i for i, ident in enumerate(plan.order)}
    for ident in sorted(plan.entries, key=lambda i: (rank.get(i, len(rank)), i)):
        target = plan.entries[ident]
        live = book.get(ident)
        where_now = "memory" if ident in book.memory.entries else "archive" if live is not None else None
        if target is None:
            book.apply(Forget(id=ident), now)
            continue
        where, entry = target
        if live is not None:
            lasts = [t for t in (entry.last, live.last) if t is not None]
            entry = entry.with_changes(hits=max(entry.hits, live.hits), last=max(lasts) if lasts else None)
        if where_now == where:
            book.replace_entry(entry)
            if where == "memory":
                _place(book, ident, plan.order)
        elif where == "archive":
            if where_now == "memory":
                book.replace_entry(entry)
                book.move_to_archive(ident)
            else:
                book.archive.add(entry, book.archive.section_order[0])
                book.changed = True
        else:
            if where_now == "archive":
                book.archive.remove(ident)
            book.add_entry(entry)
            _place(book, ident, plan.order)
    return len(plan.entries)


def _place(book: Book, ident: str, order: list[str]) -> None:
    """Move a restored entry's line back after the line of its tier that preceded it before the commit
    (MEMORY.md is rendered tier by tier, in slot order)."""
    if ident not in order:
        return
    entries = book.memory.entries
    tier = entries[ident].resident
    slots = book.memory.slots
    slot = slots.pop(next(i for i, s in enumerate(slots) if s.entry_id == ident))
    for prev in reversed(order[: order.index(ident)]):
        if prev not in entries or entries[prev].resident != tier:
            continue
        at = next((i for i, s in enumerate(slots) if s.entry_id == prev), None)
        if at is not None:
            slots.insert(at + 1, slot)
            return
    first = next(
        (i for i, s in enumerate(slots) if s.entry_id is not None and entries[s.entry_id].resident == tier),
        len(slots),
    )
    slots.insert(first, slot)


@dataclass(frozen=True)
class Undone:
    """What an undo did: the commit taken back, its subject, the new commit, entries restored."""

    rev: str
    subject: str
    revision: str | None
    entries: int

    @property
    def message(self) -> str:
        return f"undo {self.rev[:10]}: {self.subject}"


_UNDO_SUBJECT = re.compile(r"undo ([0-9a-f]{7,40}):")


def last_meaningful(writer: Writer, ns: Namespace, scan: int = 200) -> str:
    """The newest commit that changed memory (not messages or hit counts) and is not undone yet; undo
    commits are skipped, so `lucid undo` again steps further back. Raises UndoRefused if none."""
    store = writer.store
    rows = store.revisions_touching(ns, (MEMORY, ARCHIVE, PROFILE), scan)
    undone: list[str] = []
    for rev, subject in rows:
        m = _UNDO_SUBJECT.match(subject)
        target = next((s for r, s in rows if m is not None and r.startswith(m.group(1))), "")
        if m is not None and not _UNDO_SUBJECT.match(target):  # an undo of an undo is a redo: a change
            undone.append(m.group(1))
            continue
        if any(rev.startswith(u) for u in undone):
            continue
        if meaningful(store.files_at(ns, f"{rev}^"), store.files_at(ns, rev)):
            return rev
    raise UndoRefused("no change to memory left to undo in the history")


def undo(writer: Writer, ns: Namespace, rev: str | None = None) -> Undone:
    """Take back commit `rev` (default: the last meaningful one) as one new batch of the writer."""
    store = writer.store
    full = store.resolve(ns, rev) if rev else last_meaningful(writer, ns)
    subject = store.subject(ns, full)
    before, after = store.files_at(ns, f"{full}^"), store.files_at(ns, full)
    restored = 0

    def change(book: Book, snap: Snapshot) -> dict[str, str]:
        nonlocal restored
        current = {name: snap.text(name) for name in (MEMORY, ARCHIVE, PROFILE, DREAMS)}
        plan = plan_revert(before, after, current)
        restored = apply_revert(book, plan, writer.clock())
        files: dict[str, str] = {}
        if plan.profile is not None:
            files[PROFILE] = plan.profile
        if plan.journal is not None:
            files[DREAMS] = plan.journal
        return files

    done = Undone(full, subject, None, 0)
    report = writer.transact(ns, change, done.message)
    return Undone(full, subject, report.revision if report else None, restored)
