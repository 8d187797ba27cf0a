"""Forget means forget (DESIGN §4): what else a forgotten entry leaves behind, and how it is removed."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from .dream_guard import coverage, key_terms
from .entry import Entry
from .errors import LineError
from .lineformat import USED_KEY, RawMessage, escape_inline, parse_entry, parse_raw, render_raw, reply_id
from .meaning import carried
from .profile import profile_digest, profile_inputs, split_lines, stored_digest, supported
from .similarity import normalise
from .store import ARCHIVE, MEMORY, PROFILE

FORGOTTEN = "〔已按要求忘记 · forgotten on request〕"
FORGOT_KEY = "fgt"
#: A span shorter than this is not matched in other lines (forgetting 茶 must not blank every 茶).
MIN_SPAN_CHARS = 4
_DIGEST = re.compile(r"digest=[0-9a-f]{16,64}")


@dataclass(frozen=True)
class Forgotten:
    """What the raw archive and git history must lose: the entry's id, text and provenance
    (docs/PRIVACY.md, "Forget"); the writer and `forget --purge` apply the same pure functions."""

    id: str
    text: str
    origin: str | None = None
    # only the lines of this entry lose `text` (a remainder's words in the line it was cut from)
    within: str | None = None

    @classmethod
    def of(cls, entry: Entry) -> Forgotten:
        return cls(entry.id, entry.text, entry.origin)

    @classmethod
    def with_cuts(cls, entry: Entry, predecessors: Iterable[Entry]) -> list[Forgotten]:
        """`entry`, and the clauses it was cut from in the lines it superseded (a remainder's words in its
        old line, as past commits hold it): what `forget --purge` removes from git history."""
        out = [cls.of(entry)]
        for old in predecessors:
            if old.id in entry.supersedes:
                out += [cls(entry.id, c, within=old.id) for c in carried(entry.text, old.text)]
        return out


def _spans(targets: Sequence[Forgotten]) -> list[tuple[re.Pattern[str], str]]:
    """(pattern, entry id) for each target text long enough to match, longest first; a text that a line
    holds escaped (a backslash, a control character, `-->`) also as it stands in the line."""
    by_text: dict[str, str] = {}
    for t in targets:
        if t.within is None and len(t.text.strip()) >= MIN_SPAN_CHARS:
            by_text.setdefault(t.text.strip(), t.id)
            by_text.setdefault(escape_inline(t.text.strip()), t.id)
    ordered = sorted(by_text, key=len, reverse=True)
    return [(re.compile(re.escape(text), re.I), by_text[text]) for text in ordered]


def redact_raw(day_text: str, targets: Sequence[Forgotten]) -> tuple[str, int, list[str]]:
    """A raw day file with the targets' lines marked and spans replaced; (new text, lines touched, the ids
    of those lines). Those messages said the fact (the one it was learned from, one that said it again, a
    reply that used it, `om_1:reply`): what they would teach is refused. A reply's id is its own: the
    person's message it answered may say other things, still to be learned."""
    if not targets:
        return day_text, 0, []
    sources = {t.origin: t.id for t in targets if t.origin}
    sources.update({reply_id(o): i for o, i in list(sources.items())})
    spans = _spans(targets)
    ids = {t.id for t in targets}
    out: list[str] = []
    touched = 0
    said: list[str] = []
    for line in day_text.split("\n"):
        new = _redact_line(line, sources, spans, ids)
        if new != line:
            touched += 1
            with contextlib.suppress(LineError):  # an unreadable line has no message to name
                said.append(parse_raw(new).id)
        out.append(new)
    return "\n".join(out), touched, list(dict.fromkeys(said))


def _redact_line(
    line: str, sources: dict[str, str], spans: list[tuple[re.Pattern[str], str]], ids: set[str]
) -> str:
    """`line` with its text forgotten if it is a target's message or its reply, or a reply that used a target
    (`used=`: its words may paraphrase the fact), else with the targets' texts cut out."""
    if not line.startswith("- "):
        return line
    if (
        not any(source in line for source in sources)
        and not any(p.search(line) for p, _ in spans)
        and not any(i in line for i in ids)
    ):
        return line  # the common case, without parsing the line
    try:
        msg = parse_raw(line)
    except LineError:  # a line we cannot read: at least its text loses the spans
        for pattern, _ in spans:
            line = pattern.sub(FORGOTTEN, line)
        return line
    ident = sources.get(msg.id)
    if ident is None:  # a reply that drew on a target says it in its own words
        ident = next((i for i in dict(msg.extra).get(USED_KEY, "").split(",") if i in ids), None)
    text = FORGOTTEN if ident is not None else msg.text
    if ident is None:
        for pattern, target in spans:
            if pattern.search(text):
                ident = ident or target
                text = pattern.sub(FORGOTTEN, text)
    if ident is None or (text == msg.text and FORGOT_KEY in dict(msg.extra)):
        return line
    marks = [i for k, v in msg.extra if k == FORGOT_KEY for i in v.split(",") if i]
    extra = tuple((k, v) for k, v in msg.extra if k != FORGOT_KEY)
    marked = ",".join(dict.fromkeys([*marks, ident]))
    return render_raw(replace(msg, text=text, extra=(*extra, (FORGOT_KEY, marked))))


def drawn_on_gone(msg: RawMessage, held: Callable[[str], object]) -> RawMessage:
    """`msg` as the archive may keep it: a reply that used an entry no longer held (forgotten while the
    reply was being written) is kept marked, not in clear, as a later forget would have left it."""
    used = [i for i in dict(msg.extra).get(USED_KEY, "").split(",") if i]
    gone = [i for i in used if held(i) is None]
    if not gone:
        return msg
    extra = tuple((k, v) for k, v in msg.extra if k != FORGOT_KEY)
    return replace(msg, text=FORGOTTEN, extra=(*extra, (FORGOT_KEY, ",".join(gone))))


def _drew_on(line: str, forgotten: Sequence[str], remaining: Sequence[str]) -> bool:
    """Did this profile line come from a forgotten fact (a key term only it had, or half its words)?"""
    kept_terms = frozenset().union(*(key_terms(t) for t in remaining)) if remaining else frozenset()
    low = normalise(line)
    for text in forgotten:
        if any(t in low for t in key_terms(text) - kept_terms):
            return True
        if coverage(text, line) >= 0.5 and not any(coverage(r, line) >= 0.5 for r in remaining):
            return True
    return False


def _keep_lines(profile_text: str, keep: Iterable[str]) -> str:
    """The profile with only the content lines in `keep` (headings, comments and blank lines stay)."""
    wanted = set(keep)
    out = []
    for raw in profile_text.splitlines():
        content = not raw.lstrip().startswith(("#", "<!--")) and split_lines(raw)
        if content and content[0] not in wanted:
            continue
        out.append(raw)
    return "\n".join(out) + ("\n" if profile_text.endswith("\n") else "")


def _lines(profile_text: str) -> list[str]:
    return [
        line
        for raw in profile_text.splitlines()
        if not raw.lstrip().startswith(("#", "<!--"))
        for line in split_lines(raw)
    ]


def redact_profile(
    profile_text: str | None, entries: Iterable[Entry], forgotten: Sequence[Forgotten], now: datetime
) -> str | None:
    """PROFILE.md without the lines that drew on `forgotten` (None: nothing to change). Its digest is set
    to the remaining facts', so the profile dream does not rewrite what a person just saw redacted."""
    if not profile_text or not forgotten:
        return None
    inputs = profile_inputs(entries, now)
    remaining = [e.text for e in inputs]
    gone = [f.text for f in forgotten]
    keep = [
        line
        for line in _lines(profile_text)
        if supported(line, remaining) and not _drew_on(line, gone, remaining)
    ]
    text = _keep_lines(profile_text, keep)
    text = _DIGEST.sub(f"digest={profile_digest(inputs)}", text, count=1)
    return None if text == profile_text else text


def checked_profile(profile_text: str | None, entries: Iterable[Entry], now: datetime) -> str | None:
    """The profile as it may be shown: whole when its digest matches the current facts, else only the
    lines those facts still support (a stale line never reaches a prompt)."""
    if not profile_text or not profile_text.strip():
        return None
    inputs = profile_inputs(entries, now)
    if stored_digest(profile_text) == profile_digest(inputs):
        return profile_text
    remaining = [e.text for e in inputs]
    keep = [line for line in _lines(profile_text) if remaining and supported(line, remaining)]
    if not keep:
        return None
    return _keep_lines(profile_text, keep)


_ENTRY_ID = re.compile(r"<!--m:(?:[^>]*?;)?id=([^;>]+)")


NOT_HELD = "〔no longer held · 已不再保存〕"


def held_diff(diff: str, held: set[str], profile: str) -> str:
    """A past commit's diff as the viewer may show it: an entry line whose id is no longer held (forgotten,
    or undone) and a profile line the current profile does not say lose their text, so a forgotten fact
    is not read back from history where no `--purge` has run yet."""
    kept = {line.strip() for line in profile.split("\n") if line.strip()}
    out: list[str] = []
    where = ""
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            where = line.rsplit("/", 1)[-1]
        elif (
            line[:1] in ("+", "-")
            and not line.startswith(("+++", "---"))
            and not _held(line[1:], where, held, kept)
        ):
            line = line[0] + NOT_HELD
        out.append(line)
    return "\n".join(out)


def _held(line: str, where: str, held: set[str], profile: set[str]) -> bool:
    if where == PROFILE:
        return not line.strip() or line.strip() in profile
    if where not in (MEMORY, ARCHIVE) or not line.startswith("- "):
        return True  # a heading, a note, the dream journal (ids and counts only)
    try:
        return parse_entry(line).id in held  # a line typed without a comment has its text's id
    except LineError:
        return False


def past_entries(texts: Iterable[str], ids: Sequence[str]) -> list[Entry]:
    """Each distinct (id, text) among the entry lines of `texts` (past versions of MEMORY.md and
    ARCHIVE.md) whose id is one of `ids` or starts with one: what `forget --purge` must find of an entry
    no longer in the files. Only lines naming one are parsed (a long history holds thousands of others)."""
    needles = [f"id={i.strip().lower()}" for i in ids if i.strip()]
    seen: dict[tuple[str, str], Entry] = {}
    for text in texts:
        if not any(n in text for n in needles):
            continue
        for line in text.split("\n"):
            if line.startswith("- ") and any(n in line for n in needles) and _ENTRY_ID.search(line):
                try:
                    entry = parse_entry(line)
                except LineError:
                    continue
                seen.setdefault((entry.id, entry.text), entry)
    return list(seen.values())


def purge_blob(data: bytes, targets: Sequence[Forgotten]) -> bytes:
    """One file of any past commit as `forget --purge` leaves it; path-free, so git-filter-repo can run
    it on every blob of the history."""
    text = data.decode("utf-8", errors="surrogateescape")
    needles = [t.id for t in targets] + [t.origin for t in targets if t.origin]
    needles += [t.within for t in targets if t.within]
    if not any(n in text for n in needles) and not any(p.search(text) for p, _ in _spans(targets)):
        return data  # most blobs of a history never held the entry
    ids = {t.id for t in targets}
    sources = {t.origin: t.id for t in targets if t.origin}
    sources.update({reply_id(o): i for o, i in list(sources.items())})
    spans = _spans(targets)
    gone = [t.text for t in targets if t.text.strip()]  # "": only the id's lines and message go
    profile = "lucid:profile" in text
    clauses: dict[str, list[str]] = {}  # entry id → the clauses a forgotten remainder took from its line
    for t in targets:
        if t.within and t.text:
            clauses.setdefault(t.within, []).append(t.text)
    out: list[str] = []
    for line in text.split("\n"):
        found = _ENTRY_ID.search(line)
        if found and found.group(1) in ids:
            continue
        for clause in clauses.get(found.group(1), []) if found else []:
            line = line.replace(clause, FORGOTTEN)
        if profile and line.lstrip().startswith(("-", "*")) and _drew_on(line, gone, []):
            continue
        if line.startswith("- ") and "<!--r:" in line:
            line = _redact_line(line, sources, spans, ids)
        else:
            for pattern, _ in spans:
                line = pattern.sub(FORGOTTEN, line)
        out.append(line)
    return "\n".join(out).encode("utf-8", errors="surrogateescape")
