"""The Markdown contract: one memory per list item, metadata hidden in a trailing HTML comment.
Escaping and the comment's rules: docs/ARCHITECTURE.md ("The line format")."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from urllib.parse import quote, unquote

from .entry import Entry, as_utc, new_id
from .errors import LineError

META_OPEN = "<!--m:"
RAW_OPEN = "<!--r:"
META_CLOSE = "-->"

_KEY = re.compile(r"[a-z][a-z0-9_]*\Z")
_ESCAPE_RE = re.compile(r"\\(?:u\{([0-9a-fA-F]{1,6})\}|(.))", re.DOTALL)
_LEADING_MARKUP = frozenset("#-*+>~=|0123456789")


def _needs_codepoint_escape(ch: str) -> bool:
    cat = unicodedata.category(ch)
    if ch == "\t":
        return False
    # Cc: controls (newlines among them); Cs: lone surrogates; Zl/Zp: line/paragraph separators that
    # str.splitlines() would break on; Cf covers zero-width and bidi controls, which we keep visible.
    return cat in ("Cc", "Cs", "Zl", "Zp") or ch == "\ufeff"


# Characters `_needs_codepoint_escape` accepts, as one class, so the common case is one regex scan.
_SPECIAL = re.compile("[\\\\\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff]")


def _escape_char(m: re.Match[str]) -> str:
    ch = m.group(0)
    return "\\\\" if ch == "\\" else "\\u{%x}" % ord(ch)


def escape_inline(text: str) -> str:
    """`text` as it reads inside a line's visible part (what `escape` does away from the line's ends): how
    a forgotten text is found in lines that quote it."""
    s = _SPECIAL.sub(_escape_char, text)
    # A comment can neither open nor close inside content.
    return s.replace("<!--", "<\\!--").replace("-->", "--\\>")


def escape(text: str) -> str:
    """Escape `text` for the visible part of a line. Bijective with `unescape`."""
    s = escape_inline(text)
    if s and s[0] in _LEADING_MARKUP:
        s = "\\" + s
    # Leading/trailing white space would be lost to a reader's trim: spell it out.
    if s[:1].isspace():
        s = "\\u{%x}" % ord(s[0]) + s[1:]
    if s[-1:].isspace():
        s = s[:-1] + "\\u{%x}" % ord(s[-1])
    return s


def unescape(text: str) -> str:
    """Inverse of `escape`. An unknown escape keeps its character (lenient for hand edits)."""
    if "\\" not in text:
        return text

    def sub(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            cp = int(m.group(1), 16)
            # a lone surrogate is no character: it could not be encoded, so every read of the file would fail
            return chr(cp) if cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF else m.group(0)
        return m.group(2)

    return _ESCAPE_RE.sub(sub, text)


def format_time(when: datetime) -> str:
    return as_utc(when).strftime("%Y-%m-%dT%H:%M:%SZ")


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_STAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")  # what `format_time` writes


def parse_time(value: str) -> datetime:
    """Full ISO 8601 timestamps, or a bare date (midnight UTC). Raises ValueError."""
    v = value.strip()
    if _STAMP.fullmatch(v):  # the common case, already whole seconds in UTC
        return datetime.fromisoformat(v)
    if _DATE.fullmatch(v):
        return datetime.strptime(v, "%Y-%m-%d").replace(tzinfo=UTC)
    if v.endswith(("Z", "z")):
        v = v[:-1] + "+00:00"
    parsed = datetime.fromisoformat(v)
    try:
        return as_utc(parsed)
    except OverflowError:  # 9999-12-31T23:59:59-14:00 is past year 9999 in UTC
        raise ValueError(f"time out of range: {value!r}") from None


_QV_PLAIN = re.compile(r"[0-9A-Za-z_.:,+/@!*()'\[\]-]*\Z")


def _qv(value: str) -> str:
    """Percent-encode only what would break the comment (`%;=<>`, white space, controls); keep the rest
    readable, Chinese included."""
    if _QV_PLAIN.match(value):
        return value
    out: list[str] = []
    for ch in value:
        if ch in "%;=<>" or ch.isspace() or _needs_codepoint_escape(ch):
            out.append(quote(ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
    return "".join(out)


def encode_meta(pairs: Iterable[tuple[str, str]]) -> str:
    return ";".join(f"{k}={_qv(v)}" for k, v in pairs)


_PLAIN_META = re.compile(r"[a-z][a-z0-9_]*=[^;%\s]*(?:;[a-z][a-z0-9_]*=[^;%\s]*)*\Z")


def decode_meta(body: str) -> list[tuple[str, str]]:
    """`k=v;k=v` → pairs. Raises ValueError on a malformed pair."""
    pairs: list[tuple[str, str]] = []
    if not body.strip():
        return pairs
    if _PLAIN_META.match(body):  # what the writer writes: nothing to strip, skip or unquote
        return [(k, v) for k, _, v in (part.partition("=") for part in body.split(";"))]
    for part in body.split(";"):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise ValueError(f"bad metadata pair {part[:40]!r}")
        pairs.append((key, unquote(value.strip(), errors="surrogatepass")))
    return pairs


def _fmt_conf(c: float) -> str:
    return f"{c:.2f}"


def entry_meta(e: Entry) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = [("id", e.id), ("t", e.type)]
    if e.subject:
        pairs.append(("subj", e.subject))
    if e.valid_from is not None:
        pairs.append(("vf", format_time(e.valid_from)))
    if e.valid_to is not None:
        pairs.append(("vt", format_time(e.valid_to)))
    if e.at is not None:
        pairs.append(("at", format_time(e.at)))
    if e.supersedes:
        pairs.append(("sup", ",".join(e.supersedes)))
    if e.confidence is not None:
        pairs.append(("conf", _fmt_conf(e.confidence)))
    if e.hits:
        pairs.append(("hc", str(e.hits)))
    if e.last is not None:
        pairs.append(("last", format_time(e.last)))
    if e.pinned:
        pairs.append(("pin", "1"))
    if e.source:
        pairs.append(("src", e.source))
    if e.origin:
        pairs.append(("from", e.origin))
    if e.scope:
        pairs.append(("scope", e.scope))
    pairs.extend(e.extra)
    return pairs


@lru_cache(maxsize=200_000)
def render_entry(e: Entry) -> str:
    visible = escape(e.text)
    if e.valid_to is not None:
        visible = f"~~{visible}~~"
    return f"- {visible} {META_OPEN}{encode_meta(entry_meta(e))}{META_CLOSE}"


_KNOWN = {"id", "t", "subj", "vf", "vt", "at", "sup", "conf", "hc", "last", "pin", "src", "from", "scope"}


def legacy_id(text: str, salt: int = 0) -> str:
    """A deterministic id for a line that has none yet (a hand-written or legacy line)."""
    return hashlib.sha1(f"{salt}\x00{text}".encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _split_comment(body: str, opener: str) -> tuple[str, str | None]:
    """Return (visible, meta body or None). Raises LineError for an unclosed metadata comment."""
    stripped = body.rstrip()
    idx = stripped.rfind(opener)
    if idx < 0:
        return stripped, None
    if not stripped.endswith(META_CLOSE) or idx + len(opener) > len(stripped) - len(META_CLOSE):
        raise LineError("metadata comment is not closed with -->")
    return stripped[:idx], stripped[idx + len(opener) : -len(META_CLOSE)]


@lru_cache(maxsize=200_000)
def parse_entry(line: str) -> Entry:
    """Parse one `- …` line. Raises LineError when it is an entry line that cannot be read."""
    if not line.startswith("- ") and line.rstrip() != "-":
        raise LineError("not a list item")
    body = line[2:]
    visible, meta_body = _split_comment(body, META_OPEN)
    try:
        pairs = decode_meta(meta_body) if meta_body is not None else []
    except ValueError as exc:
        raise LineError(str(exc)) from exc
    fields: dict[str, object] = {}
    extra: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, value in pairs:
        if key in seen:
            raise LineError(f"metadata key {key!r} appears twice")
        seen.add(key)
        if key not in _KNOWN:
            extra.append((key, value))
            continue
        try:
            _apply_field(fields, key, value)
        except ValueError as exc:
            raise LineError(f"bad value for {key!r}: {exc}") from exc
    visible = visible.strip()
    if "valid_to" in fields:  # history is struck through; a person who took the strike away made it current
        if len(visible) >= 4 and visible.startswith("~~") and visible.endswith("~~"):
            visible = visible[2:-2]
        else:
            del fields["valid_to"]
    text = unescape(visible)
    if not text.strip():
        raise LineError("empty entry")
    ident = fields.pop("id", None)
    return Entry(
        id=str(ident) if ident else legacy_id(text),
        text=text,
        extra=tuple(extra),
        **fields,  # type: ignore[arg-type]
    )


_ID = re.compile(r"[0-9A-Za-z_.:-]{1,64}")


def _apply_field(fields: dict[str, object], key: str, value: str) -> None:
    if key == "id":
        if not _ID.fullmatch(value):
            raise ValueError("ids are letters, digits and _.:- (1 to 64)")
        fields["id"] = value
    elif key == "t":
        fields["type"] = value if value else "fact"
    elif key == "subj":
        fields["subject"] = value or None
    elif key in ("vf", "vt", "at", "last"):
        name = {"vf": "valid_from", "vt": "valid_to", "at": "at", "last": "last"}[key]
        fields[name] = parse_time(value)
    elif key == "sup":
        fields["supersedes"] = tuple(s for s in value.split(",") if s)
    elif key == "conf":
        c = float(value)
        if not 0.0 <= c <= 1.0:
            raise ValueError("confidence must be within 0..1")
        fields["confidence"] = round(c, 2)
    elif key == "hc":
        h = int(value)
        if h < 0:
            raise ValueError("hit count cannot be negative")
        fields["hits"] = h
    elif key == "pin":
        fields["pinned"] = value not in ("", "0", "false")
    elif key == "src":
        fields["source"] = value or None
    elif key == "from":
        fields["origin"] = value or None
    elif key == "scope":
        fields["scope"] = value or None


@dataclass(frozen=True)
class Unparsed:
    """A line kept verbatim. `problem` is set when it looked like an entry but could not be read."""

    line: str
    problem: str | None = None


Item = Entry | Unparsed


@dataclass(frozen=True)
class Section:
    name: str  # "resident", "recall", "archive" (lower case), or the heading text of another section
    heading: str  # the heading line as written
    items: tuple[Item, ...]


@dataclass(frozen=True)
class MemoryFile:
    """A parsed MEMORY.md or ARCHIVE.md: a preamble and sections, every line accounted for."""

    preamble: tuple[str, ...]
    sections: tuple[Section, ...]

    def entries(self) -> Iterator[Entry]:
        for sec in self.sections:
            for it in sec.items:
                if isinstance(it, Entry):
                    yield it

    def problems(self) -> list[tuple[str, str]]:
        """(line, problem) for every entry-like line that could not be read."""
        return [
            (it.line, it.problem)
            for sec in self.sections
            for it in sec.items
            if isinstance(it, Unparsed) and it.problem
        ]

    def section(self, name: str) -> Section | None:
        for sec in self.sections:
            if sec.name == name:
                return sec
        return None


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")

#: The longest line read as memory (characters): a longer hand-edited line is kept verbatim as a problem
#: and set aside by the writer (issue 15: one 20-million-character line made every write take 52 s).
MAX_LINE_CHARS = 8192
SET_ASIDE = "<!-- lucid:set-aside "


def set_aside_note(chars: int, where: str) -> str:
    """The line left in a file where the writer took out a line over `MAX_LINE_CHARS`."""
    return f"{SET_ASIDE}a hand-edited line of {chars:,} characters (over {MAX_LINE_CHARS:,}) is kept in {where} -->"


def distinct_ids(text: str, committed: Callable[[], str | None] = lambda: None) -> tuple[str, int]:
    """`text` with each line that repeats an earlier line's id (a hand edit copied a line and changed it)
    given a new id, so no line is left unreadable; the copy that still reads as the committed entry keeps
    the id (`committed` gives the file as committed, read only if an id repeats), else the first. Returns
    the text and how many lines got a new id."""
    lines = text.split("\n")
    copies: dict[str, list[tuple[int, Entry]]] = {}
    in_section = False
    for i, raw in enumerate(lines):
        line = as_item(raw.rstrip("\r"))
        m = _HEADING.match(line)
        if m and len(m.group(1)) == 2:
            in_section = True
        if not in_section or not line.startswith("- ") or META_OPEN not in line or len(line) > MAX_LINE_CHARS:
            continue
        try:
            entry = parse_entry(line)
        except LineError:
            continue
        if f"id={entry.id}" in line:
            copies.setdefault(entry.id, []).append((i, entry))
    repeated = {ident: found for ident, found in copies.items() if len(found) > 1}
    if not repeated:
        return text, 0
    last = committed()
    before = {e.id: e.text for e in parse_file(last).entries()} if last else {}
    renamed = 0
    for ident, found in repeated.items():
        keep = next((c for c in found if c[1].text == before.get(ident)), found[0])
        for i, entry in found:
            if i != keep[0]:
                ending = "\r" if lines[i].endswith("\r") else ""
                lines[i] = render_entry(entry.with_changes(id=new_id())) + ending
                renamed += 1
    return "\n".join(lines), renamed


# A list item written with another marker (* x, + x, • x, 1. x, 2) x, 3、x) or indented: a memory line as
# much as "- x" is, rewritten to "- x" on the next write, never silently a note.
_OTHER_ITEM = re.compile(r"^(?:[ \t]+-|[ \t]*(?:[*+•·]|\d{1,3}[.)、]))[ \t]+(?=\S)")


def as_item(line: str) -> str:
    """`line` with any list marker made "- " (a line that is no list item comes back as it was)."""
    m = _OTHER_ITEM.match(line)
    return line if m is None else "- " + line[m.end() :]


def parse_file(text: str) -> MemoryFile:
    """Parse a memory file. Never drops a line: what is not an entry stays as `Unparsed`."""
    preamble: list[str] = []
    sections: list[Section] = []
    current: tuple[str, str] | None = None
    items: list[Item] = []
    seen_ids: set[str] = set()

    def close() -> None:
        if current is not None:
            sections.append(Section(current[0], current[1], tuple(items)))

    for raw in text.split("\n"):
        line = raw.rstrip("\r")
        m = _HEADING.match(line)
        if m and len(m.group(1)) == 2:
            close()
            current = (m.group(2).strip().lower(), line)
            items = []
            continue
        if current is None:
            preamble.append(line)
            continue
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            items.append(
                Unparsed(line, f"line of {len(line):,} characters, over {MAX_LINE_CHARS:,}: not read")
            )
            continue
        if line.startswith(SET_ASIDE):
            items.append(Unparsed(line, "a hand-edited line was too long to be memory and was set aside"))
            continue
        line = as_item(line)
        if line.startswith("- ") or line.rstrip() == "-":
            try:
                entry = parse_entry(line)
            except LineError as exc:
                items.append(Unparsed(line, str(exc)))
                continue
            if entry.id in seen_ids:
                if META_OPEN in line and f"id={entry.id}" in line:
                    items.append(Unparsed(line, f"duplicate id {entry.id}"))
                    continue
                salt = 1
                while legacy_id(entry.text, salt) in seen_ids:
                    salt += 1
                entry = entry.with_changes(id=legacy_id(entry.text, salt))
            seen_ids.add(entry.id)
            items.append(entry)
        else:
            items.append(Unparsed(line))
    close()
    while preamble and not preamble[-1].strip():
        preamble.pop()
    return MemoryFile(tuple(preamble), tuple(sections))


def render_file(doc: MemoryFile) -> str:
    lines: list[str] = list(doc.preamble)
    for sec in doc.sections:
        if lines:
            lines.append("")
        lines.append(sec.heading)
        if sec.items:
            lines.append("")
        for it in sec.items:
            lines.append(render_entry(it) if isinstance(it, Entry) else it.line)
    return "\n".join(lines) + "\n"


MEMORY_PREAMBLE = (
    "# Memory",
    "",
    "<!-- One memory per line. Edit, add or delete lines freely: Lucid keeps your edit and commits it.",
    "     The trailing comment of a line holds its metadata (id, type, subject, validity, hits).",
    "     A line moved under Resident is pinned. Struck-through lines are history (superseded):",
    "     strike a line through (~~…~~) to end it, take the strike away to make it current again. -->",
)
ARCHIVE_PREAMBLE = (
    "# Archive",
    "",
    "<!-- Superseded and cold memories, kept restorable. Nothing here is shown to the model. -->",
)


def empty_memory_file() -> MemoryFile:
    return MemoryFile(
        MEMORY_PREAMBLE,
        (Section("resident", "## Resident", ()), Section("recall", "## Recall", ())),
    )


def empty_archive_file() -> MemoryFile:
    return MemoryFile(ARCHIVE_PREAMBLE, (Section("archived", "## Archived", ()),))


#: A reply's raw metadata: the entries the reply used, comma-separated ids (a forget then forgets the reply).
USED_KEY, USED_MAX = "used", 50
USED_IDS = re.compile(rf"[0-9A-Za-z_.:-]{{1,64}}(?:,[0-9A-Za-z_.:-]{{1,64}}){{0,{USED_MAX - 1}}}")


@dataclass(frozen=True)
class RawMessage:
    """One message of the raw archive (secrets already redacted)."""

    id: str
    ts: datetime
    speaker: str
    text: str
    chat: str = ""
    chat_type: str = "p2p"
    role: str = "user"
    session: str = ""
    extra: tuple[tuple[str, str], ...] = ()


REPLY_SUFFIX = ":reply"


def reply_id(message_id: str) -> str:
    """The raw line id of the reply to `message_id` (a turn's answer is archived under it)."""
    return message_id + REPLY_SUFFIX


def render_raw(msg: RawMessage) -> str:
    pairs: list[tuple[str, str]] = [
        ("id", msg.id),
        ("ts", format_time(msg.ts)),
        ("sp", msg.speaker),
        ("role", msg.role),
    ]
    if msg.chat:
        pairs.append(("chat", msg.chat))
    pairs.append(("ct", msg.chat_type))
    if msg.session:
        pairs.append(("sess", msg.session))
    pairs.extend(msg.extra)
    prefix = f"{as_utc(msg.ts):%H:%M} {escape(msg.speaker) or '?'}: "
    return f"- {prefix}{escape(msg.text)} {RAW_OPEN}{encode_meta(pairs)}{META_CLOSE}"


def parse_raw(line: str) -> RawMessage:
    """Parse one raw-archive line. Raises LineError."""
    if not line.startswith("- "):
        raise LineError("not a list item")
    visible, meta_body = _split_comment(line[2:], RAW_OPEN)
    if meta_body is None:
        raise LineError("raw line without metadata")
    try:
        meta = dict(decode_meta(meta_body))
        ts = parse_time(meta["ts"])
    except (ValueError, KeyError) as exc:
        raise LineError(f"bad raw metadata: {exc}") from exc
    speaker = meta.get("sp", "")
    prefix = f"{ts:%H:%M} {escape(speaker) or '?'}: "
    visible = visible.rstrip()
    if visible.startswith(prefix):
        body = visible[len(prefix) :]
    else:
        _, _, body = visible.partition(": ")
    known = {"id", "ts", "sp", "role", "chat", "ct", "sess"}
    if "id" not in meta:
        raise LineError("raw line without id")
    return RawMessage(
        id=meta["id"],
        ts=ts,
        speaker=speaker,
        text=unescape(body),
        chat=meta.get("chat", ""),
        chat_type=meta.get("ct", "p2p"),
        role=meta.get("role", "user"),
        session=meta.get("sess", ""),
        extra=tuple((k, v) for k, v in decode_meta(meta_body) if k not in known),
    )
