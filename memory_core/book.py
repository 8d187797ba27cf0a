"""The working copy of one namespace's memory during a write batch, and the upsert rules (`Book`)."""

from __future__ import annotations

import gc
import hashlib
import json
import operator
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cache
from typing import NamedTuple

from . import meaning, policy, similarity
from .entry import MAX_SUBJECT_CHARS, MAX_TEXT_CHARS, PROMOTED, TYPES, Entry, new_id
from .injection import carries_instruction
from .lineformat import (
    MAX_LINE_CHARS,
    Item,
    MemoryFile,
    Section,
    Unparsed,
    empty_archive_file,
    empty_memory_file,
    escape,
    parse_time,
    render_entry,
)
from .ops import Edit, Forget, Op, Outcome, Pin, Put, Remember, Touch, entry_from_json
from .policy import CANONICAL, HAN, subject_key
from .recall import SHARE_KEY, is_shared
from .secretscan import contains_secret, holds_redaction
from .subjects import recognise

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PLACEMENT = {"resident": "resident", "recall": "recall"}  # MEMORY.md's section of each tier
CHAT_BOUND = re.compile(
    r"这个群|本群|这群|群里|咱们群|我们群|这个频道|这个话题|in this (?:group|chat|channel|thread)|"
    r"here in (?:the|this) (?:group|chat)",
    re.I,
)


def _recognised_subject(text: str) -> str | None:
    found = recognise(text)
    return subject_key(found.subject) if found is not None else None


def _subject_verdict(text: str, holder: Entry, subject: str) -> meaning.Verdict:
    """How a statement with `subject` relates to a current holder of the same subject."""
    verdict = meaning.compare(text, holder.text)
    if verdict.kind in ("same", "contains", "contained", "similar"):
        return verdict
    if subject.startswith("person:"):
        mine, theirs = recognise(text), recognise(holder.text)
        a = meaning.person_attribute(mine.value) if mine and mine.subject == subject else None
        b = meaning.person_attribute(theirs.value) if theirs and theirs.subject == subject else None
        if a is not None and a == b:
            return meaning.Verdict("conflict", f"{subject}:{a}")
        return verdict if verdict.kind == "conflict" else meaning.Verdict("other")
    if meaning.calls_me(text) and not meaning.calls_me(holder.text):
        return meaning.Verdict("other")  # a nickname adds to the name
    theirs_subject = _recognised_subject(holder.text)
    if theirs_subject is not None and theirs_subject != subject:
        return meaning.Verdict("other")  # the model's label disagrees with what the holder plainly says
    if verdict.kind == "conflict":
        return verdict
    said, kept = meaning.read(text), meaning.read(holder.text)
    if said.accumulative and _recognised_subject(text) != subject:
        return meaning.Verdict("other")  # 我喜欢北京的秋天 labelled 所在地 says nothing about where one lives
    related = similarity.jaccard(said.core, kept.core) >= similarity.RELATED
    if subject in CANONICAL or related or said.negations != kept.negations:
        return meaning.Verdict("conflict", f"subject:{subject}")
    return meaning.Verdict("other")


@dataclass
class _Slot:
    """A position in a file: an entry id or a verbatim line, with the section it was found in."""

    section: str
    entry_id: str | None = None
    line: Unparsed | None = None


@dataclass
class _Side:
    """One file (MEMORY.md or ARCHIVE.md) as an ordered list of slots plus an id → entry map."""

    preamble: tuple[str, ...]
    headings: dict[str, str]
    section_order: list[str]
    slots: list[_Slot] = field(default_factory=list)
    entries: dict[str, Entry] = field(default_factory=dict)

    # the slots and entries as the file on disk holds them (`settle`): what only-appended is measured against
    base: tuple[list[_Slot], dict[str, Entry]] = field(default_factory=lambda: ([], {}))

    @classmethod
    def load(cls, doc: MemoryFile) -> _Side:
        side = cls(doc.preamble, {}, [])
        for sec in doc.sections:
            if sec.name not in side.headings:
                side.headings[sec.name] = sec.heading
                side.section_order.append(sec.name)
            for it in sec.items:
                if isinstance(it, Entry):
                    if it.id in side.entries:  # the same id twice in one file: keep the second verbatim
                        side.slots.append(_Slot(sec.name, line=Unparsed(f"- {it.text}", "duplicate id")))
                        continue
                    side.entries[it.id] = it
                    side.slots.append(_Slot(sec.name, entry_id=it.id))
                else:
                    side.slots.append(_Slot(sec.name, line=it))
        side.settle()
        return side

    def settle(self) -> None:
        self.base = (list(self.slots), dict(self.entries))

    def added(self) -> list[_Slot] | None:
        """The slots added at the end since `settle`, if nothing else changed (every entry the same
        object, every old slot in place); None otherwise."""
        slots, entries = self.base
        if len(self.slots) < len(slots) or any(map(operator.is_not, self.slots, slots)):
            return None
        if any(map(operator.is_not, map(self.entries.get, entries), entries.values())):
            return None
        return self.slots[len(slots) :]

    def add(self, entry: Entry, section: str) -> None:
        self.entries[entry.id] = entry
        self.slots.append(_Slot(section, entry_id=entry.id))

    def remove(self, entry_id: str) -> Entry | None:
        entry = self.entries.pop(entry_id, None)
        if entry is not None:
            self.slots = [s for s in self.slots if s.entry_id != entry_id]
        return entry

    def render(self, placement: dict[str, str] | None = None) -> MemoryFile:
        """Group slots by section; `placement` maps an entry's tier to the section it must live in."""
        grouped: dict[str, list[Item]] = {name: [] for name in self.section_order}
        for slot in self.slots:
            if slot.entry_id is not None:
                entry = self.entries[slot.entry_id]
                name = slot.section
                if placement is not None:
                    name = placement["resident" if entry.resident else "recall"]
                grouped.setdefault(name, []).append(entry)
            elif slot.line is not None:
                grouped.setdefault(slot.section, []).append(slot.line)
        sections = []
        for name, items in grouped.items():
            heading = self.headings.get(name) or f"## {name.capitalize()}"
            sections.append(Section(name, heading, tuple(items)))
        return MemoryFile(self.preamble, tuple(sections))


#: The version of what `_keys_of` returns, saved with the dedup index's cache: bump it when `meaning.read`
#: or `similarity.normalise` change their answers (a probe of fixed texts catches a forgotten bump).
INDEX_VERSION = 1
_PROBES = (
    "我的猫叫小白",
    "我不再喝咖啡了",
    "我住在杭州西湖区，在字节跳动工作",
    "用户有2个孩子",
    "I no longer live in Paris",
    "My favourite colour is blue",
)


class _Keys(NamedTuple):
    """What one text is indexed under: its normalised text and core, the core's bigrams, its frame and slot
    keys."""

    norm: str
    core: str
    grams: frozenset[str]
    keys: tuple[str, ...]


def _keys_of(text: str) -> _Keys:
    r = meaning.read(text)
    core = similarity.normalise(r.core)
    keys = ("f:" + r.frame, "s:" + r.slot[0]) if r.slot else ("f:" + r.frame,)
    return _Keys(similarity.normalise(text), core, similarity.grams(core), keys)


@cache
def _fingerprint() -> str:
    probed = [[k.norm, k.core, *k.keys] for k in map(_keys_of, _PROBES)]
    return hashlib.sha256(json.dumps([INDEX_VERSION, probed]).encode()).hexdigest()[:16]


def _known_keys(data: bytes, entries: dict[str, Entry]) -> dict[str, _Keys] | None:
    """The keys a saved index cache holds by text, or None if it is not one this code wrote: another
    version or probe, a malformed row, or a sample of its rows that `_keys_of` no longer agrees with."""
    try:
        doc = json.loads(data.decode("utf-8", "surrogatepass"))
    except ValueError:
        return None
    rows = doc.get("rows") if isinstance(doc, dict) and doc.get("probe") == _fingerprint() else None
    if not isinstance(rows, list) or len(rows) % 5 or not all(type(x) is str for x in rows):
        return None
    known: dict[str, _Keys] = {}
    for i in range(0, len(rows), 5):  # text, norm, core, frame key, slot key or ""
        text, norm, core, frame, slot = rows[i : i + 5]
        if not frame.startswith("f:") or (slot and not slot.startswith("s:")):
            return None
        known[text] = _Keys(norm, core, similarity.grams(core), (frame, slot) if slot else (frame,))
    held = [e.text for e in entries.values() if e.text in known]
    if any(known[t] != _keys_of(t) for t in random.sample(held, min(8, len(held)))):
        return None
    return known


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cycle collector while a namespace is read in bulk: the thousands of objects made are
    acyclic (refcounting frees them) and its passes over them cost a cold batch a third of its time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_Ids = str | set[str]  # one id (most keys belong to one text: no set is made for them), or several


def _put(table: dict[str, _Ids], key: str, ident: str) -> None:
    held = table.get(key)
    if held is None:
        table[key] = ident
    elif isinstance(held, set):
        held.add(ident)
    elif held != ident:
        table[key] = {held, ident}


def _take(table: dict[str, _Ids], key: str, ident: str) -> None:
    held = table.get(key)
    if held == ident:
        del table[key]
    elif isinstance(held, set):
        held.discard(ident)


def _ids(held: _Ids | None) -> Iterable[str]:
    return () if held is None else (held,) if isinstance(held, str) else held


class _DedupIndex:
    """Normalised text → ids, core bigram → ids, frame → ids and slot → ids, over MEMORY.md's entries."""

    def __init__(self, entries: dict[str, Entry], known: dict[str, _Keys] | None = None) -> None:
        self._entries = entries
        self._indexed: dict[str, tuple[str, _Keys]] = {}  # id → the text indexed for it, and its keys
        self.missed = 0  # texts the saved keys (`known`) lacked: read from the text to build this index
        # Built in bulk: a leader that never read this namespace builds it while the other writers wait.
        self._norm: dict[str, _Ids] = {}
        self._postings: dict[str, _Ids] = {}
        self._keys: dict[str, _Ids] = {}  # "f:<frame>" / "s:<slot>" → ids
        known = known or {}
        with collector_paused():
            for ident, e in entries.items():
                k = known.get(e.text)
                if k is None:
                    k = _keys_of(e.text)
                    self.missed += 1
                self._index(ident, e.text, k)

    def _index(self, ident: str, text: str, k: _Keys) -> None:
        self._indexed[ident] = (text, k)
        _put(self._norm, k.norm, ident)
        postings = self._postings
        for g in k.grams:
            if postings.setdefault(g, ident) is not ident:  # the gram is another text's too
                _put(postings, g, ident)
        for key in k.keys:
            _put(self._keys, key, ident)

    def add(self, e: Entry) -> None:
        if e.id in self._indexed:
            self._drop(e.id)
        self._index(e.id, e.text, _keys_of(e.text))

    def remove(self, e: Entry) -> None:
        self._drop(e.id)

    def _drop(self, ident: str) -> None:
        held = self._indexed.pop(ident, None)
        if held is None:
            return
        k = held[1]
        _take(self._norm, k.norm, ident)
        for g in k.grams:
            _take(self._postings, g, ident)
        for key in k.keys:
            _take(self._keys, key, ident)

    def rebase(self, entries: dict[str, Entry]) -> None:
        """Serve `entries` (the same namespace read again) by re-indexing only the entries whose text
        changed, appeared or went: far cheaper than a new index over thousands of entries."""
        indexed = self._indexed
        for ident in [i for i, (t, _) in indexed.items() if (e := entries.get(i)) is None or e.text != t]:
            self._drop(ident)
        for e in entries.values():
            if (held := indexed.get(e.id)) is None or held[0] != e.text:
                self.add(e)
        self._entries = entries

    def dump(self) -> bytes:
        """The keys of every indexed text, for the store's cache (`_known_keys` reads them back)."""
        rows = {t: (t, k.norm, k.core, *k.keys, "")[:5] for t, k in self._indexed.values()}
        doc = {"probe": _fingerprint(), "rows": [x for row in rows.values() for x in row]}
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")

    def same(self, text: str, now: datetime) -> list[Entry]:
        ids = _ids(self._norm.get(similarity.normalise(text)))
        return [e for i in sorted(ids) if (e := self._entries.get(i)) is not None and e.current(now)]

    def candidates(self, text: str, now: datetime) -> list[Entry]:
        """Current entries worth judging against `text`: core Jaccard ≥ `meaning.CANDIDATE`, one core
        containing the other, the same frame or the same possessive slot."""
        mine = _keys_of(text)
        shared: Counter[str] = Counter()
        for g in mine.grams:
            shared.update(_ids(self._postings.get(g)))
        wanted = set()
        size = len(mine.grams)
        for ident, n in shared.items():
            other = len(self._indexed[ident][1].grams)
            if n / (size + other - n) >= meaning.CANDIDATE or n == min(size, other):
                wanted.add(ident)
        for k in mine.keys:
            wanted.update(_ids(self._keys.get(k)))
        return [e for i in sorted(wanted) if (e := self._entries.get(i)) is not None and e.current(now)]


def _rejoined(kept: Sequence[str], whole: str) -> str:
    """Clauses kept of `whole`, as one line that stands alone (its speaker put back on the first)."""
    sep = "，" if re.search(f"[{HAN}]", whole) else ", "
    return sep.join([meaning.with_speaker(kept[0], whole), *kept[1:]])


class Book:
    """MEMORY.md + ARCHIVE.md of one namespace, as a mutable working copy for one batch."""

    def __init__(self, memory: MemoryFile | None = None, archive: MemoryFile | None = None) -> None:
        memory = memory if memory is not None and memory.sections else _with_sections(memory)
        self.memory = _Side.load(memory)
        self.archive = _Side.load(
            archive if archive is not None and archive.sections else empty_archive_file()
        )
        for name in ("resident", "recall"):
            if name not in self.memory.headings:
                self.memory.headings[name] = f"## {name.capitalize()}"
                self.memory.section_order.insert(0 if name == "resident" else 1, name)
        self._normalise_hand_moves()
        self._dedup_index: _DedupIndex | None = None  # built on the first write that needs it
        # Messages whose entries were forgotten (the writer loads and keeps them): what an extraction or a
        # dream planned from one before the forget may not bring back.
        self.forgotten_from: set[str] = set()
        self._known: dict[str, _Keys] | None = None  # keys by text from a saved cache (`index_from`)
        self.changed = False

    def reuse_index(self, older: Book) -> None:
        """Take over the dedup index of `older` (this namespace as this process last wrote it), updated
        for what changed since: rebuilding it for a 5,000-entry file cost more than the rest of the batch."""
        if self._dedup_index is None and older._dedup_index is not None:
            older._dedup_index.rebase(self.memory.entries)
            self._dedup_index, older._dedup_index = older._dedup_index, None

    def index_from(self, data: bytes) -> None:
        """Build the dedup index, when needed, from a saved cache (`index_bytes`): only the texts it lacks
        are read. A cache this code did not write, or that disagrees with it, is ignored."""
        if self._dedup_index is None:
            self._known = _known_keys(data, self.memory.entries)

    def index_bytes(self) -> bytes:
        return self._dedup.dump()

    @property
    def index_missed(self) -> int:
        """Texts the saved keys lacked when the dedup index was built (all of them, with none saved)."""
        return self._dedup_index.missed if self._dedup_index is not None else 0

    def index_saved(self) -> None:
        if self._dedup_index is not None:
            self._dedup_index.missed = 0

    @property
    def _dedup(self) -> _DedupIndex:
        if self._dedup_index is None:
            self._dedup_index, self._known = _DedupIndex(self.memory.entries, self._known), None
        return self._dedup_index

    def entries(self) -> list[Entry]:
        return list(self.memory.entries.values())

    def archived(self) -> list[Entry]:
        return list(self.archive.entries.values())

    def get(self, entry_id: str) -> Entry | None:
        return self.memory.entries.get(entry_id) or self.archive.entries.get(entry_id)

    def current(self, now: datetime) -> list[Entry]:
        return [e for e in self.memory.entries.values() if e.current(now)]

    def problems(self) -> list[tuple[str, str]]:
        out = []
        for side in (self.memory, self.archive):
            for slot in side.slots:
                if slot.line is not None and slot.line.problem:
                    out.append((slot.line.line, slot.line.problem))
        return out

    def memory_file(self) -> MemoryFile:
        return self.memory.render(_PLACEMENT)

    def memory_appended(self, text: str) -> str | None:
        """The lines to append to MEMORY.md `text` (as last rendered from this book) when the only change
        is new entries at the end of the last section; None: render the whole file."""
        new, archived = self.memory.added(), self.archive.added()
        if not new or archived is None or archived:
            return None
        last = self.memory.section_order[-1]

        def section(slot: _Slot) -> str:
            if slot.entry_id is None:
                return slot.section
            return _PLACEMENT["resident" if self.memory.entries[slot.entry_id].resident else "recall"]

        if any(slot.entry_id is None or section(slot) != last for slot in new):
            return None
        before = next((s for s in reversed(self.memory.base[0]) if section(s) == last), None)
        if before is None:  # the section was empty: its heading, then a blank line before the items
            end, lead = (self.memory.headings.get(last) or f"## {last.capitalize()}") + "\n", "\n"
        elif before.entry_id is not None:
            end, lead = render_entry(self.memory.entries[before.entry_id]) + "\n", ""
        else:
            end, lead = (before.line.line if before.line else "") + "\n", ""
        if not text.endswith(end):
            return None
        return lead + "".join(render_entry(self.memory.entries[s.entry_id]) + "\n" for s in new if s.entry_id)

    def settle(self) -> None:
        """The book is now what the files on disk hold (the writer wrote them from it)."""
        self.memory.settle()
        self.archive.settle()

    def archive_file(self) -> MemoryFile:
        return self.archive.render()

    def apply(self, op: Op, now: datetime) -> Outcome:
        if isinstance(op, Remember):
            return self._remember(op, now)
        if isinstance(op, Forget):
            return self._forget(op)
        if isinstance(op, Pin):
            return self._pin(op)
        if isinstance(op, Edit):
            return self._edit(op, now)
        if isinstance(op, Touch):
            return self._touch(op)
        if isinstance(op, Put):
            return self._put(op, now)
        return Outcome(op.op_id, "rejected:unsupported")

    def replace_entry(self, entry: Entry) -> None:
        """Swap in a new value for an existing entry (dreaming, hit feedback)."""
        if entry.id in self.memory.entries:
            self._set(entry)
        elif entry.id in self.archive.entries:
            self.archive.entries[entry.id] = entry
        else:
            raise KeyError(entry.id)
        self.changed = True

    def add_entry(self, entry: Entry) -> None:
        self.memory.add(entry, "resident" if entry.resident else "recall")
        self._dedup.add(entry)
        self.changed = True

    def _set(self, entry: Entry) -> None:
        old = self.memory.entries[entry.id]
        self.memory.entries[entry.id] = entry
        if old.text != entry.text:
            self._dedup.remove(old)
            self._dedup.add(entry)
        self.changed = True

    def move_to_archive_many(self, ids: Iterable[str]) -> int:
        """Move entries to ARCHIVE.md in one pass over the file's slots (light dreaming moves thousands)."""
        wanted = {i for i in ids if i in self.memory.entries}
        if not wanted:
            return 0
        self.memory.slots = [s for s in self.memory.slots if s.entry_id not in wanted]
        section = self.archive.section_order[0]
        for ident in [i for i in self.memory.entries if i in wanted]:
            entry = self.memory.entries.pop(ident)
            if self._dedup_index is not None:
                self._dedup_index.remove(entry)
            self.archive.add(entry, section)
        self.changed = True
        return len(wanted)

    def move_to_archive(self, entry_id: str) -> None:
        entry = self.memory.remove(entry_id)
        if entry is not None:
            self._dedup.remove(entry)
            self.archive.add(entry, self.archive.section_order[0])
            self.changed = True

    def _reject_text(self, op_id: str, text: str) -> Outcome | None:
        if not text.strip():
            return Outcome(op_id, "rejected:empty", detail="nothing to remember")
        # Control characters are written as escapes (\\u{1}): the line must still be one a reader reads.
        if len(text) > MAX_TEXT_CHARS or len(escape(text)) > MAX_LINE_CHARS // 2:
            return Outcome(op_id, "rejected:too_long", detail=f"over {MAX_TEXT_CHARS} characters")
        if contains_secret(text):
            return Outcome(op_id, "rejected:secret", detail="looks like a secret; not stored")
        if holds_redaction(text):  # "我的密码是 [REDACTED:password]": only a secret, and it was cut out
            return Outcome(op_id, "rejected:secret", detail="only a redacted secret; nothing to remember")
        return None

    def _remember(self, op: Remember, now: datetime) -> Outcome:
        text = op.text.strip()
        rejected = self._reject_text(op.op_id, text)
        if rejected:
            return rejected
        if op.type not in TYPES:
            return Outcome(op.op_id, "rejected:bad_type", detail=f"type must be one of {', '.join(TYPES)}")
        if op.subject and len(op.subject) > MAX_SUBJECT_CHARS:
            return Outcome(
                op.op_id, "rejected:too_long", detail=f"a subject of over {MAX_SUBJECT_CHARS} characters"
            )
        subject = subject_key(op.subject)
        if subject is None:
            found = recognise(text)
            if found is not None:
                subject = subject_key(found.subject)
        automatic = policy.automatic(op.source)
        if automatic and op.origin in self.forgotten_from:
            return Outcome(op.op_id, "rejected:forgotten", detail="its message's memory was forgotten since")
        if automatic and (op.type in policy.RESIDENT_TYPES or op.pinned) and carries_instruction(text):
            # a model's tool call or an extraction may not put "ignore previous instructions…" in every prompt
            op = replace(op, type="fact", pinned=False)

        # A statement about the chat it is said in (我在这个群的代号是…) concerns that chat only: it never
        # ends, updates or absorbs what was said elsewhere. Anything else is about the person.
        scope = op.scope or "p2p"
        local = CHAT_BOUND.search(text) is not None

        def here(e: Entry) -> bool:
            return not local or (e.scope or "p2p") == scope

        # 1. The same text again: nothing to do.
        for e in self._dedup.same(text, now):
            if here(e):
                return Outcome(op.op_id, "unchanged", id=e.id)

        stated = _stated(op.valid_from, now)
        # 2. Judge every candidate: same-subject holders and entries alike in core, frame or slot.
        ended: dict[str, str] = {}  # id → why it is superseded
        alike: list[tuple[float, Entry, str]] = []
        seen: set[str] = set()
        for e, verdict in self._judged(text, subject, now):
            if e.id in seen or not here(e):
                continue
            seen.add(e.id)
            if verdict.kind == "conflict":
                ended[e.id] = verdict.why
            elif verdict.kind in meaning.REWORDING:
                alike.append((verdict.score, e, verdict.kind))

        if ended:
            holders = [self.memory.entries[i] for i in ended]
            if automatic and any(policy.protected(e) for e in holders):
                return Outcome(op.op_id, "rejected:protected", detail=policy.REFUSAL)
            newer = [e.valid_from or e.at for e in holders if (e.valid_from or e.at or _EPOCH) > stated]
            # Said before the current value was (replay, import): history, not a change.
            if op.valid_from and newer:
                until = min(t for t in newer if t is not None)
                entry = self._new_entry(op, text, subject, now).with_changes(valid_to=until)
                self.add_entry(entry)
                return Outcome(op.op_id, "added", id=entry.id, detail="history: older than the current value")
            for old in holders:
                self._set(old.with_changes(valid_to=stated))
            entry = self._new_entry(op, text, subject, now, supersedes=tuple(ended))
            self.add_entry(entry)
            for old in holders:  # what else the old line said stays current (我叫王小明，在字节跳动…)
                self._keep_remainder(old, text, subject, now)
            why = ",".join(dict.fromkeys(ended.values()))
            return Outcome(op.op_id, f"superseded:{why}", id=entry.id, superseded=tuple(ended))

        # 3. A same-meaning rewording (best match): update in place, keeping metadata. Only within the place it
        # was learned, and not what the person shared: a fuller wording said in private must not take a group's
        # scope or a share (and show in groups), and a group keeps what it was told; else it is a new entry.
        alike = [
            a
            for a in alike
            if policy.scope_key(a[1].scope) == policy.scope_key(scope) and not is_shared(a[1])
        ]
        if alike:
            _score, old, relation = max(alike, key=lambda t: (t[0], t[1].at or _EPOCH))
            if relation == "contained":  # the new text says less than what is stored
                return Outcome(op.op_id, "unchanged", id=old.id)
            if automatic and policy.protected(old):
                return Outcome(op.op_id, "rejected:protected", id=old.id, detail=policy.REFUSAL)
            updated = old.with_changes(
                text=text,
                subject=subject or old.subject,
                pinned=old.pinned or op.pinned,
                confidence=op.confidence if op.confidence is not None else old.confidence,
            )
            self._set(updated)
            return Outcome(op.op_id, "updated", id=old.id)

        entry = self._new_entry(op, text, subject, now)
        self.add_entry(entry)
        return Outcome(op.op_id, "added", id=entry.id)

    def _judged(
        self, text: str, subject: str | None, now: datetime
    ) -> Iterable[tuple[Entry, meaning.Verdict]]:
        """(entry, verdict) for the current holders of `subject`, then for the text's other candidates."""
        if subject is not None:
            for e in self.memory.entries.values():
                if e.current(now) and subject_key(e.subject) == subject:
                    yield e, _subject_verdict(text, e, subject)
        for e in self._dedup.candidates(text, now):
            yield e, meaning.compare(text, e.text)

    def _keep_remainder(self, old: Entry, text: str, subject: str | None, now: datetime) -> None:
        """When `text` ends only part of `old`, the rest of `old` stays current as its own entry (same type,
        pin and provenance): superseding a name must not drop the employer said in the same line."""
        parts = meaning.clauses(old.text)
        if len(parts) < 2:
            return
        kept = [
            c
            for c in parts
            if not (
                (subject is not None and _recognised_subject(c) == subject)
                or meaning.compare(text, meaning.with_speaker(c, old.text)).kind != "other"
            )
        ]
        if not kept or len(kept) == len(parts):
            return
        rest = _rejoined(kept, old.text)
        remainder = old.with_changes(
            id=self._fresh_id(),
            text=rest,
            subject=subject_key(_recognised_subject(rest)),
            valid_from=now,
            valid_to=None,
            at=now,
            supersedes=(old.id,),
        )
        self.add_entry(remainder)

    def _new_entry(
        self, op: Remember, text: str, subject: str | None, now: datetime, supersedes: tuple[str, ...] = ()
    ) -> Entry:
        stated = _stated(op.valid_from, now)
        free = op.entry_id is not None and self.get(op.entry_id) is None
        return Entry(
            id=op.entry_id if free and op.entry_id else self._fresh_id(),
            text=text,
            type=op.type,
            subject=subject,
            valid_from=stated if supersedes or op.valid_from else None,
            at=_stated(op.at, now),
            supersedes=supersedes,
            confidence=round(op.confidence, 2) if op.confidence is not None else None,
            pinned=op.pinned,
            source=op.source,
            origin=op.origin,
            scope=op.scope,
        )

    def _fresh_id(self) -> str:
        while True:
            ident = new_id()
            if self.get(ident) is None:
                return ident

    def _forget(self, op: Forget) -> Outcome:
        held = self.get(op.id)
        if held is not None and not policy.may_change(held, op.source):
            return Outcome(op.op_id, "rejected:protected", id=op.id, detail=policy.REFUSAL)
        removed = self.memory.remove(op.id)
        if removed is not None:
            self._dedup.remove(removed)
        else:
            removed = self.archive.remove(op.id)
        if removed is None:
            return Outcome(op.op_id, "rejected:not_found", detail=f"no entry {op.id}")
        if removed.origin:
            self.forgotten_from.add(removed.origin)
        self.cut_from_predecessors(removed)
        self.changed = True
        return Outcome(op.op_id, "forgotten", id=op.id)

    def cut_from_predecessors(self, removed: Entry) -> None:
        """A forgotten remainder's words also stand in the line it was cut from (`_keep_remainder`:
        我叫小王，在阿里上班 → 我叫小李 keeps 我在阿里上班): they are cut from that superseded line too, so
        the history holds what was said of the rest (我叫小王) and not the forgotten fact. A line that is
        current again (an undo of the supersede put it back) is whole and true: it is left alone."""
        for ident in removed.supersedes:
            old = self.get(ident)
            cut = meaning.carried(removed.text, old.text) if old is not None else []
            if old is None or old.valid_to is None or not cut:
                continue
            text = _rejoined([c for c in meaning.clauses(old.text) if c not in cut], old.text)
            if ident in self.memory.entries:
                self._set(old.with_changes(text=text))
            else:
                self.archive.entries[ident] = old.with_changes(text=text)

    def _pin(self, op: Pin) -> Outcome:
        entry = self.memory.entries.get(op.id)
        if entry is None:
            return Outcome(op.op_id, "rejected:not_found", detail=f"no current entry {op.id}")
        if not op.pinned and entry.promoted:  # unpinning a promoted entry takes the promotion back too
            entry = entry.with_mark(PROMOTED, None)
            self._set(entry)
            if not entry.pinned:
                return Outcome(op.op_id, "updated", id=op.id)
        if entry.pinned == op.pinned:
            return Outcome(op.op_id, "unchanged", id=op.id)
        self._set(entry.with_changes(pinned=op.pinned))
        return Outcome(op.op_id, "updated", id=op.id)

    def _edit(self, op: Edit, now: datetime) -> Outcome:
        entry = self.memory.entries.get(op.id)
        if entry is None:
            return Outcome(op.op_id, "rejected:not_found", detail=f"no current entry {op.id}")
        if not policy.may_change(entry, op.source):
            return Outcome(op.op_id, "rejected:protected", id=op.id, detail=policy.REFUSAL)
        text = op.text.strip()
        rejected = self._reject_text(op.op_id, text)
        if rejected:
            return rejected
        if text == entry.text:
            return Outcome(op.op_id, "unchanged", id=op.id)
        # rewritten elsewhere (a group's line in private): the new words are shown where they were said
        moved = op.scope is not None and policy.scope_key(op.scope) != policy.scope_key(entry.scope)
        scope = op.scope if moved else entry.scope
        # The person shared the words they shared: the model's new words are not shared until they are
        # (a rewording with a private or sensitive detail must not reach every group).
        unshared = is_shared(entry) and policy.automatic(op.source)
        extra = tuple((k, v) for k, v in entry.extra if k != SHARE_KEY) if unshared else entry.extra
        verdict = meaning.compare(text, entry.text)
        if verdict.kind in meaning.REWORDING:
            self._set(entry.with_changes(text=text, scope=scope, extra=extra))
            return Outcome(op.op_id, "updated", id=op.id)
        # Another meaning (余杭区 → 西湖区, or other words altogether): the old line stays as history.
        self._set(entry.with_changes(valid_to=now))
        new = entry.with_changes(
            id=self._fresh_id(),
            text=text,
            scope=scope,
            extra=extra,
            valid_from=now,
            at=now,
            supersedes=(entry.id,),
            hits=0,
            last=None,
        )
        self.add_entry(new)
        why = verdict.why or "edit"
        return Outcome(op.op_id, f"superseded:{why}", id=new.id, superseded=(entry.id,))

    def _touch(self, op: Touch) -> Outcome:
        at = parse_time(op.at)
        touched = 0
        for ident in op.ids:
            entry = self.memory.entries.get(ident)
            if entry is None:
                continue
            last = entry.last if entry.last is not None and entry.last > at else at
            self._set(entry.with_changes(hits=entry.hits + 1, last=last))
            touched += 1
        if touched:
            self.changed = True
        return Outcome(op.op_id, "updated" if touched else "unchanged", detail=f"{touched} touched")

    def _put(self, op: Put, now: datetime) -> Outcome:
        try:
            entry = entry_from_json(op.entry)
        except (KeyError, ValueError, TypeError) as exc:
            return Outcome(op.op_id, "rejected:invalid", detail=str(exc))
        rejected = self._reject_text(op.op_id, entry.text)
        if rejected:
            return rejected
        if entry.type not in TYPES:
            return Outcome(op.op_id, "rejected:bad_type", detail=f"type must be one of {', '.join(TYPES)}")
        if len(render_entry(entry)) > MAX_LINE_CHARS:  # else written, then never read back
            return Outcome(
                op.op_id, "rejected:too_long", detail=f"its line is over {MAX_LINE_CHARS} characters"
            )
        existing = self.get(entry.id)
        if existing is not None:
            if existing == entry:
                return Outcome(op.op_id, "unchanged", id=entry.id)
            if existing.text != entry.text:  # another text under a known id: a change, never an overwrite
                if not policy.may_change(existing, entry.source):
                    return Outcome(op.op_id, "rejected:protected", id=existing.id, detail=policy.REFUSAL)
                entry = entry.with_changes(id=new_id(), supersedes=(*entry.supersedes, existing.id))
                self.add_entry(entry)
                self._end_superseded(entry, now)
                return Outcome(op.op_id, "superseded:id", id=entry.id, superseded=(existing.id,))
            self.replace_entry(entry)
            self._end_superseded(entry, now)
            return Outcome(op.op_id, "updated", id=entry.id)
        self.add_entry(entry)
        self._end_superseded(entry, now)
        return Outcome(op.op_id, "added", id=entry.id)

    def _end_superseded(self, entry: Entry, now: datetime) -> None:
        """An entry written as given that names what it supersedes ends those that are still open."""
        for ident in entry.supersedes:
            old = self.memory.entries.get(ident)
            if old is not None and old.valid_to is None and ident != entry.id:
                self._set(old.with_changes(valid_to=entry.valid_from or now))

    def _normalise_hand_moves(self) -> None:
        """A line a person moved under Resident counts as pinned; one moved out of it is unpinned."""
        for slot in self.memory.slots:
            if slot.entry_id is None:
                continue
            entry = self.memory.entries[slot.entry_id]
            if slot.section == "resident" and not entry.resident:
                self.memory.entries[entry.id] = entry.with_changes(pinned=True)
            elif slot.section == "recall" and entry.pinned and entry.type not in policy.RESIDENT_TYPES:
                self.memory.entries[entry.id] = entry.with_changes(pinned=False)
            elif slot.section == "recall" and entry.promoted and not entry.pinned:
                self.memory.entries[entry.id] = entry.with_mark(PROMOTED, None)  # moved back by hand


def _stated(value: str | None, now: datetime) -> datetime:
    """An op's own time (ISO, as given); the write time when it has none."""
    if not value:
        return now
    try:
        return parse_time(value)
    except ValueError:
        return now


def _with_sections(memory: MemoryFile | None) -> MemoryFile:
    if memory is None:
        return empty_memory_file()
    base = empty_memory_file()
    return MemoryFile(memory.preamble or base.preamble, base.sections)
