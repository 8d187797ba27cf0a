"""`lucid history` in words and `lucid undo` by revision, entry by entry (docs/ARCHITECTURE.md, History and
undo)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from itertools import islice
from typing import TYPE_CHECKING, Literal

from .book import Book
from .entry import Entry
from .errors import LineError, LucidError, UndoRefused
from .lineformat import MAX_LINE_CHARS, META_OPEN, as_item, parse_entry, parse_file
from .ops import Forget
from .recall import SHARE_KEY
from .store import ARCHIVE, DREAMS, MEMORY, PROFILE, Snapshot, Store

if TYPE_CHECKING:
    from .namespace import Namespace
    from .writer import Writer

Where = Literal["memory", "archive"]
State = tuple[Where, Entry]
Files = Mapping[str, str | None]
_RUN_TIME = re.compile(r"^## (\S+)")


def states(files: Files) -> dict[str, State]:
    """Every entry of MEMORY.md and ARCHIVE.md by id, with the file it lives in (read-only: shared)."""
    return _states(files.get(MEMORY), files.get(ARCHIVE))


@lru_cache(maxsize=4)  # a history walk reads each version twice: as a commit's "after", then "before"
def _states(memory: str | None, archive: str | None) -> dict[str, State]:
    out: dict[str, State] = {}
    for text, where in ((archive, "archive"), (memory, "memory")):
        if text:
            for e in parse_file(text).entries():
                out[e.id] = (where, e)  # type: ignore[assignment]
    return out


_MISSING_CHECKS = 200  # ids looked up in the other version's text before a full parse is cheaper


def _changed_lines(before: Files, after: Files) -> tuple[dict[str, State], dict[str, State]] | None:
    """The states of just the entries on lines that differ between two versions, without a full parse;
    None where only a full parse reads right (a changed preamble, id-less or repeated lines)."""
    old: dict[str, State] = {}
    new: dict[str, State] = {}
    for name, where in ((ARCHIVE, "archive"), (MEMORY, "memory")):
        a, b = before.get(name) or "", after.get(name) or ""
        if a == b:
            continue
        (head_a, lines_a), (head_b, lines_b) = _body(a), _body(b)
        if head_a != head_b and not _made_or_removed(a, b, head_a + head_b):
            return None
        for lines, out in ((lines_a - lines_b, old), (lines_b - lines_a, new)):
            for written, copies in lines.items():
                line = as_item(written)
                if not line.startswith("- ") or len(line) > MAX_LINE_CHARS:
                    continue  # a heading, a note, a set-aside line: no entry
                if META_OPEN not in line or copies > 1:
                    return None
                try:
                    entry = parse_entry(line)
                except LineError:
                    continue
                if entry.id in out:
                    return None
                out[entry.id] = (where, entry)  # type: ignore[assignment]
    missing = [(i, before) for i in new if i not in old] + [(i, after) for i in old if i not in new]
    if len(missing) > _MISSING_CHECKS:
        return None
    for ident, files in missing:
        if any(f"id={ident}" in (files.get(n) or "") for n in (MEMORY, ARCHIVE)):
            return None
    return old, new


def _made_or_removed(a: str, b: str, heads: list[str]) -> bool:
    """A file made (an archive is, by the first dream that moves a line) or removed, no entry in its preamble."""
    return not (a and b) and not any(as_item(line).startswith("- ") for line in heads)


@lru_cache(maxsize=4)  # each version is read twice: as one commit's "after", then the next one's "before"
def _body(text: str) -> tuple[list[str], Counter[str]]:
    """A memory file's preamble (before its first `## ` section) and its other lines, counted."""
    lines = [line.rstrip("\r") for line in text.split("\n")]
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    return lines[:start], Counter(lines[start:])


def _essence(state: State | None) -> tuple[str, Entry] | None:
    """A state without its usage counters: recalls do not count as a change of an entry."""
    if state is None:
        return None
    return state[0], state[1].with_changes(hits=0, last=None)


def entry_changes(before: Files, after: Files) -> dict[str, tuple[State | None, State | None]]:
    """Entries whose place or content (usage counters aside) differ between two versions."""
    old, new = _changed_lines(before, after) or (states(before), states(after))
    return {
        ident: (was, now)
        for ident in sorted(set(old) | set(new))
        # an unchanged line parses to the same entry (parse_entry is cached): the cheap test first
        if (was := old.get(ident)) != (now := new.get(ident)) and _essence(was) != _essence(now)
    }


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


def plan_revert(before: Files, after: Files, current: Files, bring_back: bool = False) -> RevertPlan:
    """The undo of the change `before` → `after`, applied on `current`. Raises UndoRefused if a later
    change touched one of the same entries (or PROFILE.md), or if there is nothing to undo. An entry the
    change forgot stays forgotten unless `bring_back` (the undo of an undo: what it brought back). A line
    deleted by hand is a forget too, and stays forgotten (docs/PRIVACY.md)."""
    changes = entry_changes(before, after)
    now = states(current)
    plan = RevertPlan()
    conflicts: list[str] = []
    kept_forgotten = 0
    for ident, (was, became) in changes.items():
        if became is None and not bring_back:
            kept_forgotten += 1  # forget means forget: said again, it is remembered again
            continue
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
    if not plan.entries and plan.profile is None and kept_forgotten:
        raise UndoRefused("a forgotten memory is not brought back by undo: say it again if it is still true")
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
    summary: str = ""  # the undone commit in words, as `lucid history` shows it
    written: bool = False  # the files taken back (without `revision`: committed by the lease's next holder)

    @property
    def message(self) -> str:
        return f"undo {self.rev[:10]}: {self.subject}"

    def line(self) -> str:
        """What `lucid undo` says it did."""
        if self.revision:
            done = self.revision[:10]
        elif self.written:
            done = "taken back; the writer lost its lease before the commit, the next write commits it"
        else:
            done = "nothing left to undo"
        return f"undo {self.rev[:10]}: {self.summary} → {done} ({self.entries} entries restored)"


_UNDO_SUBJECT = re.compile(r"undo ([0-9a-f]{7,40}): ")
_RECORDED = re.compile(r"\b(\d+) recorded\b")
SCAN = 200  # commits read by `lucid history` and a bare `lucid undo`
VERBS = (
    "remembered",
    "superseded",
    "reworded",
    "forgot",
    "pinned",
    "unpinned",
    "archived",
    "restored",
    "shared",
    "unshared",
    "ended",
    "changed",
)
_QUOTES = 2  # texts quoted per verb
GONE = "[gone]"  # in place of words no longer in memory
_QUOTE_CHARS = 24


@dataclass(frozen=True)
class Change:
    """One entry's change in words. `text`/`was` (its text before) are None for an entry that is not
    in memory any more (forgotten): `lucid history` never brings forgotten words back."""

    verb: str
    id: str
    text: str | None = None
    was: str | None = None

    def quote(self) -> str | None:
        if self.verb in ("superseded", "reworded") and (self.was or self.text) is not None:
            return f"{_cut(self.was) if self.was else GONE} → {_cut(self.text) if self.text else GONE}"
        return _cut(self.text) if self.text is not None else None

    def to_json(self) -> dict[str, str | None]:
        return {"verb": self.verb, "id": self.id, "text": self.text, "was": self.was}


@dataclass(frozen=True)
class Row:
    """One commit of a namespace in words, as `lucid history` shows it and `lucid undo` targets it."""

    rev: str
    time: str
    subject: str  # the git subject line
    kind: str  # memory | dream | hand edit | undo | recovered
    summary: str
    changes: tuple[Change, ...] = ()
    profile: bool = False  # PROFILE.md changed
    messages: int = 0  # messages recorded in this commit (folded in, never a row of their own)
    undone_by: str | None = None

    @property
    def undoable(self) -> bool:
        """It changed memory (not only messages or hit counts), so `lucid undo REV` has work to do."""
        return bool(self.changes) or self.profile

    @property
    def takeback(self) -> bool:
        """An undo (not a redo: an undo of an undo puts a change back, and counts as one)."""
        return _depth(self.subject) % 2 == 1

    def line(self) -> str:
        done = f"  [undone by {self.undone_by[:10]}]" if self.undone_by else ""
        return f"{self.rev[:10]}  {self.time}  {self.summary}{done}"

    def to_json(self) -> dict[str, object]:
        return {
            "rev": self.rev,
            "time": self.time,
            "message": self.subject,
            "kind": self.kind,
            "summary": self.summary,
            "changes": [c.to_json() for c in self.changes],
            "profile": self.profile,
            "messages": self.messages,
            "undoable": self.undoable,
            "undone_by": self.undone_by,
        }


def _cut(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 1] + "…"


def _depth(subject: str) -> int:
    """How many undos deep a subject is: `undo A: undo B: memory: …` is 2."""
    depth = 0
    while m := _UNDO_SUBJECT.match(subject):
        depth, subject = depth + 1, subject[m.end() :]
    return depth


def describe(before: Files, after: Files, known: Callable[[str], bool] | None = None) -> list[Change]:
    """What changed between two versions, entry by entry, in words (a supersede is one change).
    `known`: ids whose text may be shown (None: every one)."""
    changes = entry_changes(before, after)
    ended_by = {old: ident for ident, (_, new) in changes.items() if new for old in new[1].supersedes}
    out: list[Change] = []
    for ident, (was, became) in changes.items():
        shown = known is None or known(ident)
        text = became[1].text if became and shown else None
        if was is None:
            olds = [changes[o][0] for o in became[1].supersedes if o in changes] if became else []
            old_texts = [o[1].text for o in olds if o and (known is None or known(o[1].id))]
            if olds:
                out.append(Change("superseded", ident, text, " / ".join(old_texts) if old_texts else None))
            else:
                out.append(Change("remembered", ident, text))
            continue
        if became is None:
            out.append(Change("forgot", ident))
            continue
        (w_where, w), (b_where, b) = was, became
        if w_where != b_where:
            verb = "archived" if b_where == "archive" else "restored"
        elif w.valid_to is None and b.valid_to is not None:
            if ended_by.get(ident) in changes:
                continue  # told as the supersede of the entry that ends it
            verb = "ended"
        elif w.text != b.text:
            out.append(Change("reworded", ident, text, w.text if shown else None))
            continue
        elif w.pinned != b.pinned:
            verb = "pinned" if b.pinned else "unpinned"
        elif (w.mark(SHARE_KEY) is None) != (b.mark(SHARE_KEY) is None):
            verb = "shared" if b.mark(SHARE_KEY) is not None else "unshared"
        elif w.valid_to is not None and b.valid_to is None:
            verb = "restored"
        elif w.at is None and w.with_changes(at=b.at, source=b.source) == b:
            continue  # a hand-written line stamped with when the writer first saw it: bookkeeping
        else:
            verb = "changed"
        out.append(Change(verb, ident, text))
    return out


def words(changes: Sequence[Change], profile: bool = False) -> str:
    """`remembered 2 (我喜欢爬山; 我对花生过敏) · superseded 1 (我在余杭区 → 我在西湖区) · forgot 1`."""
    parts = []
    for verb in VERBS:
        mine = [c for c in changes if c.verb == verb]
        if not mine:
            continue
        quotes = [q for c in mine if (q := c.quote())]
        shown = "; ".join(quotes[:_QUOTES]) + ("; …" if len(quotes) > _QUOTES else "")
        parts.append(f"{verb} {len(mine)}" + (f" ({shown})" if shown else ""))
    if profile:
        parts.append("profile rewritten")
    return " · ".join(parts)


def _hand_words(changes: Sequence[Change], profile: bool) -> str:
    counts = Counter(
        "added" if c.verb == "remembered" else "deleted" if c.verb == "forgot" else "changed" for c in changes
    )
    parts = [f"{counts[k]} {k}" for k in ("added", "changed", "deleted") if counts[k]]
    return "hand edit: " + ", ".join(parts + (["profile changed"] if profile else []) or ["no memory"])


def _kind(subject: str) -> str:
    if _UNDO_SUBJECT.match(subject):
        return "undo"
    if subject.startswith("dream "):
        return "dream"
    if subject.startswith("manual edit"):
        return "hand edit"
    if subject.startswith("recover"):
        return "recovered"
    return "memory"


class _Reader:
    """Commits of one namespace described in words; each file version parsed once."""

    def __init__(self, store: Store, ns: Namespace) -> None:
        self.store, self.ns = store, ns
        self._files: dict[str, Files] = {}
        head = store.files_at(ns, "HEAD")
        self._head = [head.get(MEMORY) or "", head.get(ARCHIVE) or ""]

    def known(self, ident: str) -> bool:
        """Whether entry `ident` is still in memory (MEMORY.md or ARCHIVE.md as last committed): the
        writer renders every line's metadata starting with its id, so no parse of the whole file."""
        return any(f"{META_OPEN}id={ident}{end}" in text for text in self._head for end in (";", "-->"))

    def files(self, rev: str) -> Files:
        if rev not in self._files:
            self._files[rev] = self.store.files_at(self.ns, rev)
        return self._files[rev]

    def row(self, rev: str, time: str, subject: str, touched: bool, depth: int = 0) -> Row:
        kind = _kind(subject)
        changes: list[Change] = []
        profile = False
        if touched:
            before, after = self.files(f"{rev}^"), self.files(rev)
            changes = describe(before, after, self.known)
            profile = (before.get(PROFILE) or "") != (after.get(PROFILE) or "")
        found = _RECORDED.search(subject) if kind == "memory" else None
        messages = int(found.group(1)) if found else 0
        if kind == "dream":
            summary = subject
        elif kind == "hand edit":
            summary = _hand_words(changes, profile)
        elif kind == "undo":
            summary = self._undo_words(subject, depth)
        else:
            summary = words(changes, profile)
        if not summary:
            recorded = f"recorded {messages} message{'s' * (messages != 1)}" if messages else ""
            summary = recorded or "recall counts"
        return Row(rev, time, subject, kind, summary, tuple(changes), profile, messages)

    def _undo_words(self, subject: str, depth: int) -> str:
        m = _UNDO_SUBJECT.match(subject)
        assert m is not None
        target = m.group(1)
        if depth < 3:
            try:
                full = self.store.resolve(self.ns, target)
                inner = self.row(full, "", self.store.subject(self.ns, full), True, depth + 1).summary
                return f"undo of {target[:10]}: {inner}"
            except LucidError:
                pass
        return f"undo of {target[:10]}: {subject[m.end() :]}"


def rows(store: Store, ns: Namespace, limit: int = 50, *, every: bool = False, scan: int = SCAN) -> list[Row]:
    """The namespace's history in words, newest first (with `every`, also commits of messages or hits);
    a commit taken back by a later undo carries `undone_by`."""
    return list(islice(iter_rows(store, ns, every=every, scan=max(scan, limit)), limit))


def iter_rows(
    store: Store, ns: Namespace, *, every: bool = False, scan: int = SCAN, kinds: Collection[str] = ()
) -> Iterator[Row]:
    """`rows`, lazily, over the newest `scan` commits; `kinds` (e.g. "dream"): only rows of those."""
    log = store.history(ns, limit=scan)
    if not log:
        return
    touching = {rev for rev, _ in store.revisions_touching(ns, (MEMORY, ARCHIVE, PROFILE), scan)}
    reader = _Reader(store, ns)
    undone: dict[str, str] = {}  # revision prefix → the undo that took it back
    for commit in log:
        rev, subject = commit["rev"], commit["message"]
        by = next((u for t, u in undone.items() if rev.startswith(t)), None)
        if (m := _UNDO_SUBJECT.match(subject)) is not None and by is None:
            undone[m.group(1)] = rev
        if (rev not in touching and not every) or (kinds and _kind(subject) not in kinds):
            continue
        row = reader.row(rev, commit["time"], subject, rev in touching)
        if row.undoable or every:
            yield replace(row, undone_by=by)


def last_meaningful(writer: Writer, ns: Namespace, scan: int = SCAN) -> str:
    """What a bare `lucid undo` takes back: the newest row not undone and not itself an undo, so
    `lucid undo` again steps further back. Raises UndoRefused if none."""
    for row in iter_rows(writer.store, ns, scan=scan):
        if row.undone_by is None and not row.takeback:
            return row.rev
    raise UndoRefused("no change to memory left to undo in the history")


def undo(writer: Writer, ns: Namespace, rev: str | None = None) -> Undone:
    """Take back commit `rev` (default: the last meaningful one) as one new batch of the writer."""
    store = writer.store
    writer.mend(ns)
    full = store.resolve(ns, rev) if rev else last_meaningful(writer, ns)
    subject = store.subject(ns, full)
    summary = _Reader(store, ns).row(full, "", subject, True).summary
    before, after = store.files_at(ns, f"{full}^"), store.files_at(ns, full)
    restored = 0

    def change(book: Book, snap: Snapshot) -> dict[str, str]:
        nonlocal restored
        current = {name: snap.text(name) for name in (MEMORY, ARCHIVE, PROFILE, DREAMS)}
        plan = plan_revert(before, after, current, bring_back=_kind(subject) == "undo")
        restored = apply_revert(book, plan, writer.clock())
        files: dict[str, str] = {}
        if plan.profile is not None:
            files[PROFILE] = plan.profile
        if plan.journal is not None:
            files[DREAMS] = plan.journal
        return files

    done = Undone(full, subject, None, 0)
    report = writer.transact(ns, change, done.message)
    return Undone(
        full, subject, report.revision if report else None, restored, summary, bool(report and report.written)
    )
