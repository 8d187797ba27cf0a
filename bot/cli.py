"""The `lucid` command: one entry point for people and scripts (DESIGN §10)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from memory_core.dream import PHASES
from memory_core.entry import TYPES, Entry
from memory_core.errors import InvalidInput, LucidError, NotFound
from memory_core.ids import resolve_id
from memory_core.importer import parse_import
from memory_core.lineformat import format_time, parse_time
from memory_core.namespace import Namespace
from memory_core.ops import Forget, Outcome, Pin, entry_to_json
from memory_core.store import MEMORY
from workers.memory_service import statement
from workers.runtime import Runtime, build
from workers.settings import Settings, duration_seconds

from . import chat_cli
from .terminal import printable, printable_json

COMMANDS: dict[str, Callable[[argparse.Namespace, Runtime], int]] = {}


def command(name: str) -> Callable[[Callable[[argparse.Namespace, Runtime], int]], Callable[..., int]]:
    def register(fn: Callable[[argparse.Namespace, Runtime], int]) -> Callable[..., int]:
        COMMANDS[name] = fn
        return fn

    return register


command("chat")(chat_cli.run)


def _ns(args: argparse.Namespace) -> Namespace:
    return Namespace.of(args.tenant, args.user, args.persona)


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    # What people wrote reaches the operator's terminal here: escapes and controls are printed inert.
    if getattr(args, "json", False):
        print(printable_json(json.dumps(data, ensure_ascii=False, indent=2)))
    else:
        print(printable(text))


def _short(entry_id: str | None) -> str:
    return (entry_id or "")[:8]


@command("remember")
def cmd_remember(args: argparse.Namespace, rt: Runtime) -> int:
    op = statement(args.text, type=args.type, subject=args.subject, pinned=args.pin)
    outcome = rt.memory.apply(_ns(args), [op])[0]
    text = f"{outcome.status} {outcome.id or ''}".strip()
    if outcome.superseded:
        text += f" (supersedes {', '.join(outcome.superseded)})"
    if outcome.detail and not outcome.ok:
        text += f": {outcome.detail}"
    _emit(args, outcome.to_json(), text)
    return 0 if outcome.ok else 3


def _entry(args: argparse.Namespace, rt: Runtime) -> tuple[Entry | None, list[Entry]]:
    """The entry `args.id` names, by full id or unique prefix, history and archive included (None: no
    match, the writer reports not_found); an ambiguous prefix is one clear error line."""
    book, _ = rt.writer.snapshot(_ns(args))
    every = book.entries() + book.archived()
    try:
        return resolve_id(every, args.id), every
    except NotFound:
        return None, every


def _done(args: argparse.Namespace, outcome: Outcome, ident: str) -> int:
    _emit(
        args,
        outcome.to_json(),
        f"{outcome.status} {ident}" + (f": {outcome.detail}" if outcome.detail else ""),
    )
    return 0 if outcome.ok else 3


@command("forget")
def cmd_forget(args: argparse.Namespace, rt: Runtime) -> int:
    if args.purge:  # resolves a prefix among the current entries and those git history holds
        outcome = rt.memory.purge(_ns(args), args.id)
        return _done(args, outcome, outcome.id or args.id)
    entry, _ = _entry(args, rt)
    ident = entry.id if entry else args.id
    outcome = rt.memory.apply(_ns(args), [Forget(id=ident)])[0]
    return _done(args, outcome, outcome.id or ident)


@command("erase")
def cmd_erase(args: argparse.Namespace, rt: Runtime) -> int:
    from workers import erasure

    report = erasure.erase_user(rt, args.user, args.tenant)
    data = {"user": args.user, **report.to_json()}
    if not report.namespaces:
        _emit(args, data, f"nothing to erase: no memory of user {args.user!r} under {rt.store.data_dir}")
        return 3
    text = (
        f"erased {len(report.namespaces)} namespace(s): {', '.join(report.namespaces)}; "
        f"{report.redis_keys} Redis key(s), {report.redis_members} member(s), {report.jobs} queued job(s); "
        f"Redis append-only file: {report.aof}"
    )
    _emit(args, data, text)
    return 0


@command("pin")
def cmd_pin(args: argparse.Namespace, rt: Runtime) -> int:
    entry, _ = _entry(args, rt)
    ident = entry.id if entry else args.id
    if entry and not args.unpin and (why := rt.memory.pin_refusal(_ns(args), entry)):
        raise InvalidInput(f"not pinned: {why}")
    outcome = rt.memory.apply(_ns(args), [Pin(id=ident, pinned=not args.unpin)])[0]
    return _done(args, outcome, ident)


def describe(entry: Entry, now: datetime) -> str:
    bits = [entry.type]
    if entry.subject:
        bits.append(entry.subject)
    if entry.pinned:
        bits.append("pinned")
    elif entry.promoted:
        bits.append("promoted")
    if entry.valid_from:
        bits.append(f"from {format_time(entry.valid_from)}")
    if entry.valid_to:
        bits.append(f"until {format_time(entry.valid_to)}")
    if entry.supersedes:
        bits.append("supersedes " + ",".join(_short(s) for s in entry.supersedes))
    if entry.hits:
        bits.append(f"hits {entry.hits}")
    mark = "" if entry.current(now) else "  [history]"
    return f"  {_short(entry.id)}  {entry.text}   ({' · '.join(bits)}){mark}"


@command("show")
def cmd_show(args: argparse.Namespace, rt: Runtime) -> int:
    book, _ = rt.writer.snapshot(_ns(args))
    now = rt.clock()
    entries = book.entries() if args.all else book.current(now)
    archived = book.archived() if args.all else []
    problems = book.problems()
    data: dict[str, Any] = {
        "namespace": str(_ns(args)),
        "results": [{**entry_to_json(e), "current": e.current(now), "archived": False} for e in entries]
        + [{**entry_to_json(e), "current": False, "archived": True} for e in archived],
        "problems": [{"line": line, "problem": why} for line, why in problems],
    }
    for r in data["results"]:
        r.setdefault("score", None)
    lines = [f"{_ns(args)}"]
    for tier in ("resident", "recall"):
        chosen = [e for e in entries if ("resident" if e.resident else "recall") == tier]
        lines.append(f"{tier.capitalize()} ({len(chosen)})")
        lines.extend(describe(e, now) for e in chosen)
    if archived:
        lines.append(f"Archived ({len(archived)})")
        lines.extend(describe(e, now) for e in archived)
    for line, why in problems:
        lines.append(f"! unreadable line kept as is ({why}): {line[:120]}")
    _emit(args, data, "\n".join(lines))
    return 0


@command("history")
def cmd_history(args: argparse.Namespace, rt: Runtime) -> int:
    """What changed, in words, newest first; each row's revision is what `lucid undo` takes."""
    from memory_core.history import rows

    ns = _ns(args)
    rt.writer.mend(ns)
    shown = rows(rt.store, ns, limit=args.limit, every=args.all)
    text = "\n".join(r.line() for r in shown) or "(no change to memory yet)"
    _emit(args, {"results": [r.to_json() for r in shown]}, text)
    return 0


@command("undo")
def cmd_undo(args: argparse.Namespace, rt: Runtime) -> int:
    done = rt.memory.undo(_ns(args), args.rev)
    _emit(
        args,
        {
            "message": done.message,
            "summary": done.summary,
            "undone": done.rev,
            "revision": done.revision,
            "written": done.written,
            "entries": done.entries,
        },
        done.line(),
    )
    return 0


@command("import")
def cmd_import(args: argparse.Namespace, rt: Runtime) -> int:
    path = Path(args.file)
    try:
        data = sys.stdin.buffer.read() if args.file == "-" else path.read_bytes()
    except OSError as exc:
        raise LucidError(f"cannot read {args.file}: {exc.strerror}") from exc
    plan = parse_import(data, _ns(args), upsert=args.upsert)
    counts: dict[str, int] = {}
    done = 0
    for ns, ops in plan.ops.items():
        for start in range(0, len(ops), args.batch):
            chunk = ops[start : start + args.batch]
            for outcome in rt.memory.apply(ns, chunk, timeout=600):
                key = str(outcome.kind) if outcome.ok else outcome.status
                counts[key] = counts.get(key, 0) + 1
            done += len(chunk)
            if not args.quiet and not args.json:
                _progress(done, plan.total)
    if not args.quiet and not args.json and plan.total:
        print(file=sys.stderr)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    _emit(
        args,
        {"messages": plan.messages, "facts": plan.facts, "namespaces": len(plan.ops), "outcomes": counts},
        f"imported {plan.messages} message(s) and {plan.facts} fact(s) into {len(plan.ops)} namespace(s): {summary}",
    )
    return 0


def _progress(done: int, total: int) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    sys.stderr.flush()


def _count(text: str) -> int:
    """A count option: a whole number from 1 to 100,000 (0 or -1 used to reach numpy or islice as is)."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or not 1 <= int(digits) <= 100_000:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 100000, got {text!r}")
    return int(digits)


def _seconds(text: str) -> float:
    """A wait option: seconds from 0 to 3600."""
    try:
        value = float(text.strip())
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be a number of seconds from 0 to 3600, got {text!r}")
    return value


#: How long `lucid recall`/`search` wait for the embedder (the bot embeds between turns; a CLI process
#: has only this command): each run saves what it embedded, so the next one continues.
SETTLE_WAIT = 20.0


def _wait_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        type=_seconds,
        default=SETTLE_WAIT,
        metavar="SECONDS",
        help=f"wait this long at most for the embedder to read what is not embedded yet (default {SETTLE_WAIT:g})",
    )


def _settle(args: argparse.Namespace, rt: Runtime, ns: Namespace, raw: bool = False) -> None:
    if rt.memory.settle(ns, args.wait, raw=raw, archived=bool(getattr(args, "as_of", None))):
        return
    if rt.memory.embeddings is not None and rt.memory.embeddings.failing:
        print(
            f"note: the embedder is not answering (lucid doctor checks it); {ns} is ranked by its words alone",
            file=sys.stderr,
        )
    else:
        print(
            f"note: the embedder has not read all of {ns} yet (--wait {args.wait:g}); what it has not read is "
            "ranked by its words alone. Running the command again continues where this one stopped.",
            file=sys.stderr,
        )


def parse_as_of(value: str, now: datetime) -> datetime:
    """`--as-of`: an ISO time or date, `now`, `today`, `yesterday`, or a time ago (`3d`, `12h`, `3d ago`)."""
    v = value.strip().lower()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    named = {"now": now, "today": midnight, "yesterday": midnight - timedelta(days=1)}
    if v in named:
        return named[v]
    try:
        ago = duration_seconds(v.removesuffix("ago").strip())
        if ago is not None:
            return now - timedelta(seconds=ago)
        return parse_time(value)
    except (ValueError, OverflowError):  # OverflowError: 99999999d is before year 1
        raise InvalidInput(
            f"--as-of {value!r} is not a time: use an ISO time (2026-06-01 or 2026-06-01T09:00:00Z), "
            "now, today, yesterday, or a time ago such as 3d or 12h"
        ) from None


@command("recall")
def cmd_recall(args: argparse.Namespace, rt: Runtime) -> int:
    """The chat's own recall path (the runtime's memory service, with its embedder and floor)."""
    ns = _ns(args)
    now = rt.clock()
    as_of = parse_as_of(args.as_of, now) if args.as_of else None
    chat_type = args.chat_type
    if chat_type == "group" and not args.chat:
        raise LucidError("--chat-type group needs --chat ID")
    _settle(args, rt, ns)
    results = rt.memory.recall(
        ns, args.query, now, k=args.k, as_of=as_of, chat_type=chat_type, chat=args.chat, gate=not args.no_gate
    )
    data = {
        "namespace": str(ns),
        "query": args.query,
        "as_of": format_time(as_of) if as_of else None,
        "results": [
            {
                **entry_to_json(s.entry),
                "score": round(s.score, 4),
                "recency": round(s.recency, 4),
                "importance": round(s.importance, 4),
                "relevance": round(s.relevance, 4),
            }
            for s in results
        ],
    }
    lines = [f"{'score':>6} {'rec':>5} {'imp':>5} {'rel':>5}  tier      id        text"]
    for s in results:
        lines.append(
            f"{s.score:6.3f} {s.recency:5.2f} {s.importance:5.2f} {s.relevance:5.2f}  {s.tier:<8}  "
            f"{_short(s.entry.id)}  {s.entry.text}"
        )
    if not results:
        lines.append("(nothing relevant)")
    _emit(args, data, "\n".join(lines))
    return 0


@command("search")
def cmd_search(args: argparse.Namespace, rt: Runtime) -> int:
    ns = _ns(args)
    service = rt.memory
    _settle(args, rt, ns, raw=True)
    hits = service.search(ns, args.query, k=args.k)
    whys = [service.why(ns, args.query, h) for h in hits]
    data = {
        "namespace": str(ns),
        "query": args.query,
        "results": [
            {
                "id": h.id,
                "text": h.text,
                "type": "message",
                "score": round(h.score, 4),
                "speaker": h.speaker,
                "ts": format_time(h.ts),
                "chat": h.chat,
                "chat_type": h.chat_type,
                "matched": why.matched,
                "context": why.context_json(),
                "why": why.line(),
            }
            for h, why in zip(hits, whys, strict=True)
        ],
    }
    lines = [
        f"{h.score:7.3f}  {format_time(h.ts)}  {h.id}  {h.speaker}: {h.text[:100]}\n         ↳ {why.line()}"
        for h, why in zip(hits, whys, strict=True)
    ]
    _emit(args, data, "\n".join(lines) if lines else "(no match)")
    return 0


@command("dream")
def cmd_dream(args: argparse.Namespace, rt: Runtime) -> int:
    from memory_core.namespace import list_namespaces
    from workers.dreaming import format_report, run_phase

    targets = list_namespaces(rt.settings.data_dir) if args.all else [_ns(args)]
    reports = [run_phase(rt, ns, args.phase, dry_run=args.dry_run) for ns in targets]
    data = str(rt.settings.data_dir) if rt.settings.data_dir != Path("./lucid-data") else None
    text = "\n\n".join(format_report(r, data) for r in reports) or "no namespaces"
    _emit(args, {"results": reports} if args.all else reports[0], text)
    return 0


def demo(args: argparse.Namespace, settings: Settings) -> int:
    """The seed's story: 余杭区 → 西湖区 (supersede) → current value → back to 余杭区, each step written
    through the memory service, as a chat turn or `lucid remember` writes it."""
    ns = _ns(args)
    start = settings.now or datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
    steps = [
        (start, "我在余杭区", "the user says where they are"),
        (start + timedelta(days=19), "我在西湖区", "they moved: the old line is kept, with a valid-to time"),
        (start + timedelta(days=40), "我在余杭区", "and back again: another supersede"),
    ]
    story = [start]  # the runtime's clock: each step happens at its own time
    with build(settings, clock=lambda: story[-1]) as rt:
        for i, (when, text, why) in enumerate(steps, start=1):
            story.append(when)
            outcome = rt.memory.apply(ns, [statement(text)])[0]
            print(
                f"{i}. {format_time(when)}  remember {text!r}: {outcome.status}"
                + (f" (supersedes {', '.join(outcome.superseded)})" if outcome.superseded else "")
                + f"  — {why}"
            )
            if i == 2:
                current = [e.text for e in rt.memory.book(ns).current(when) if e.subject == "所在地"]
                print(f"   where is the user now? {' / '.join(current)}")
        root = rt.store.path(ns)
        print(f"\n$ cat {root / MEMORY}\n")
        print(rt.store.read_text(ns, MEMORY) or "")
        print(f"$ git -C {root} log --oneline\n")
        for row in rt.store.history(ns):
            print(f"{row['rev'][:7]} {row['message']}")
    return 0


def _common(p: argparse.ArgumentParser, memory: bool = True) -> None:
    p.add_argument("--data", help="data directory (default: $LUCID_DATA or ./lucid-data)")
    if memory:
        p.add_argument("--user", default="default", help="user id (default: default)")
        p.add_argument("--persona", default="default", help="persona (default: default)")
        p.add_argument("--tenant", default="default", help="tenant (default: default)")
        p.add_argument("--json", action="store_true", help="machine-readable output")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lucid")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lucid", description="Lucid: a chat bot whose memory is plain Markdown.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument("--version", action="version", version=f"lucid {_version()}")
    sub: Any = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("remember", help="write one memory through the single writer")
    p.add_argument("text")
    p.add_argument(
        "--type",
        choices=TYPES,
        help="default: read from the words, as in a chat (我是… identity, 我喜欢… preference)",
    )
    p.add_argument("--subject", help="attribute for contradiction handling, e.g. 所在地")
    p.add_argument("--pin", action="store_true", help="pin it (always resident)")
    _common(p)

    p = sub.add_parser("show", help="the namespace's entries (current, or with history)")
    p.add_argument("--all", action="store_true", help="include superseded and archived entries")
    _common(p)

    p = sub.add_parser("forget", help="delete one entry (and what drew on it: profile lines, raw lines)")
    p.add_argument("id")
    p.add_argument("--purge", action="store_true", help="also rewrite the namespace's git history")
    _common(p)

    p = sub.add_parser("erase", help="remove a person completely: files, git, vault, indexes, Redis")
    p.add_argument("--user", required=True, help="the person's user id (union_id or open_id)")
    p.add_argument("--tenant", help="only this tenant (default: every tenant)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _common(p, memory=False)

    p = sub.add_parser("pin", help="pin an entry so it is always resident")
    p.add_argument("id")
    p.add_argument("--unpin", action="store_true", help="unpin instead")
    _common(p)

    p = sub.add_parser("recall", help="scored memories for a query (recency, importance, relevance)")
    p.add_argument("query")
    p.add_argument("--k", type=_count, default=5, help="how many (default 5)")
    p.add_argument(
        "--as-of", help="what was current at this time: ISO 8601, now, today, yesterday, or 3d / 12h ago"
    )
    p.add_argument(
        "--chat-type", choices=("p2p", "group"), default="p2p", help="as seen from this kind of chat"
    )
    p.add_argument("--chat", help="the chat id (group scope)")
    p.add_argument("--no-gate", action="store_true", help="also answer greetings and fillers")
    _wait_option(p)
    _common(p)

    p = sub.add_parser("search", help="full-text search of the raw message archive")
    p.add_argument("query")
    p.add_argument("--k", type=_count, default=10, help="how many (default 10)")
    _wait_option(p)
    _common(p)

    p = sub.add_parser("dream", help="run one dream phase now and print its report")
    p.add_argument("--phase", required=True, choices=PHASES)
    p.add_argument("--all", action="store_true", help="every namespace under the data directory")
    p.add_argument("--dry-run", action="store_true", help="plan and show the would-be changes; write nothing")
    _common(p)

    p = sub.add_parser("history", help="what changed in memory, in words, newest first (revisions for undo)")
    p.add_argument("--limit", type=_count, default=50, help="how many rows (default 50)")
    p.add_argument(
        "--all", action="store_true", help="also commits that only recorded messages or hit counts"
    )
    _common(p)

    p = sub.add_parser(
        "undo", help="take back one commit, entry by entry (default: the last change to memory)"
    )
    p.add_argument("rev", nargs="?", default=None, help="the commit (see `lucid history`)")
    _common(p)

    p = sub.add_parser("import", help="bulk-load JSON Lines of messages and facts")
    p.add_argument("file", help="a .jsonl file, or - for standard input")
    p.add_argument("--upsert", action="store_true", help="send facts through the upsert rules")
    p.add_argument("--batch", type=_count, default=2000, help="ops per write batch")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _common(p)

    p = sub.add_parser("demo", help="a scripted story: remember → supersede → recall, printing the files")
    _common(p)

    p = sub.add_parser(
        "doctor", help="check Redis, Ollama and models, Feishu credentials, data dir, git, clock"
    )
    p.add_argument("--data", help="data directory")

    from . import serve

    chat_cli.add_parser(sub)
    serve.add_parsers(sub)
    return parser


class JsonFormatter(logging.Formatter):
    """One JSON object per line (LUCID_LOG_FORMAT=json), for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to `sys.stderr` as it is when a line is logged: a StreamHandler keeps the stream it was made
    with, so `main` run in-process (the tests) left every later log line failing on a closed stream."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(verbose: bool, env: Mapping[str, str]) -> None:
    """Logging is configured here, at the entry point only. Log lines carry ids, never message text."""
    handler = _Stderr()
    if env.get("LUCID_LOG_FORMAT", "").lower() == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)


class _Parser(argparse.ArgumentParser):
    """A bad argument is one clear line and exit status 2, never a usage dump or a traceback."""

    def error(self, message: str) -> Any:  # argparse's signature is NoReturn
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _data_dir(value: str) -> Path:
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise InvalidInput(f"--data {value}: that is a file, not a data directory")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Every subcommand takes `--data DIR`; memory commands take `--user/--persona/--tenant` and `--json`.
    Errors become one clear line on stderr and a non-zero exit; `--json` output is a stable contract."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose or args.command in ("serve", "bot", "worker", "cron"), os.environ)
    try:
        overrides: dict[str, Any] = {}
        if getattr(args, "data", None):
            overrides["data_dir"] = _data_dir(args.data)
        elif args.command == "demo":
            overrides["data_dir"] = Path(tempfile.mkdtemp(prefix="lucid-demo-"))
            print(f"(demo data directory: {overrides['data_dir']})\n")
        settings = Settings.from_env(**overrides)
        from . import serve

        if args.command in serve.ROLES:
            return serve.ROLES[args.command](args, settings)
        if args.command == "doctor":
            from . import doctor

            return doctor.run(settings)
        if args.command == "demo":
            return demo(args, settings)
        with build(settings) as runtime:
            return COMMANDS[args.command](args, runtime)
    except LucidError as exc:
        print(f"lucid: {printable(str(exc))}", file=sys.stderr)
        return 2
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # a stopped Redis or a wrong REDIS_URL
        print(
            f"lucid: Redis is unreachable ({printable(str(exc))}): start it, or fix REDIS_URL",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:  # a data directory that cannot be made or read: say which, no traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"lucid: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
