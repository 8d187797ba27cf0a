"""Dreaming as RQ jobs: `light_dream`, `deep_dream`, `replay` and `profile`, each a whole run for one
namespace written as one batch (docs/ARCHITECTURE.md, "Dreaming")."""

from __future__ import annotations

import difflib
import hashlib
import logging
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from rq import Retry
from rq.exceptions import DuplicateJobError

from memory_core.book import Book
from memory_core.dream import (
    MODEL_PHASES,
    PHASES,
    DreamReport,
    commit_message,
    journal_entry,
    prepend_journal,
)
from memory_core.dream_deep import Merge, apply_deep, merge_messages, plan_clusters, review_reply
from memory_core.dream_light import LightOp, apply_light, plan_light
from memory_core.dream_replay import extraction_messages, replay_chunks, replay_ops, worth_a_call
from memory_core.errors import InvalidInput
from memory_core.forgetting import checked_profile
from memory_core.lineformat import format_time, parse_time, render_file
from memory_core.namespace import Namespace
from memory_core.ops import Kind, Remember
from memory_core.profile import (
    guard_profile,
    profile_digest,
    profile_inputs,
    profile_messages,
    render_profile,
    split_lines,
    stored_digest,
    third_party_names,
    third_party_texts,
)
from memory_core.recall import estimate_tokens
from memory_core.store import ARCHIVE, DREAMS, MEMORY, PROFILE, Snapshot

from .errors import LLMError, LLMUnavailable, NamespaceBusy
from .extraction import JUNK_METRIC, answer_facts
from .metrics import Metrics
from .runtime import Runtime, current

log = logging.getLogger(__name__)

MAX_REPLANS = 3
DREAM_QUEUE = "dream"
JOB_TIMEOUT = {"light": 900, "deep": 1800, "replay": 1800, "profile": 900}
FAILURE_TTL = 3600  # a failed job blocks its unique id this long, then the scheduler may try again
RETRY_INTERVALS = [30, 120]
LLM_TIMEOUT = 300.0  # local models on CPU are slow (reference pitfall AP-098)
REPLAY_LOOKBACK = timedelta(days=14)
COMPLETION_RESERVE = 512  # tokens assumed for an answer when checking the budget before a call


@dataclass(frozen=True)
class Budget:
    calls: int
    tokens: int


BUDGETS = {"deep": Budget(4, 16_000), "replay": Budget(8, 24_000), "profile": Budget(1, 8_000)}


def state_key(phase: str) -> str:
    return f"dream.{phase}"


def memory_version(snap: Snapshot) -> str:
    """A hash of MEMORY.md + ARCHIVE.md only: what "the memories changed" means to the scheduler."""
    h = hashlib.sha256()
    for name in (MEMORY, ARCHIVE):
        h.update((snap.files.get(name) or b"") + b"\0")
    return h.hexdigest()[:32]


class _Model:
    """The dream model behind the run's budget; every call and token lands in the report."""

    def __init__(self, rt: Runtime, report: DreamReport, budget: Budget) -> None:
        self.rt = rt
        self.report = report
        self.budget = budget
        self.stopped: str | None = None

    def ask(self, messages: list[dict[str, str]], json_format: bool = False) -> str | None:
        r = self.report
        if self.stopped in ("budget", "unavailable"):
            return None
        estimate = sum(estimate_tokens(m["content"]) for m in messages) + COMPLETION_RESERVE
        if (
            r.llm_calls >= self.budget.calls
            or r.prompt_tokens + r.completion_tokens + estimate > self.budget.tokens
        ):
            if self.stopped is None:
                self.stopped = "budget"
                r.notes.append(
                    f"budget reached ({self.budget.calls} calls / {self.budget.tokens} tokens): stopped"
                )
            return None
        assert self.rt.llm is not None and r.model is not None
        try:
            result = self.rt.llm.chat(
                r.model, messages, format="json" if json_format else None, temperature=0, timeout=LLM_TIMEOUT
            )
        except LLMError as exc:  # unavailable: stop asking this run; refused: this call only
            r.reject("llm_error")
            r.notes.append(f"model call failed ({type(exc).__name__})")  # its text may quote the reply
            r.said.append(f"model call failed: {str(exc)[:160]}")
            self.stopped = "unavailable" if isinstance(exc, LLMUnavailable) else "error"
            return None
        r.llm_calls += 1
        r.prompt_tokens += result.prompt_tokens
        r.completion_tokens += result.completion_tokens
        return result.content


class Phase(Protocol):
    """`prepare` runs once (model calls happen here); `apply` runs on the planning copy (to know what the
    commit will say) and again under the lease on the live book; it fills the report's counts."""

    def prepare(self, book: Book, snap: Snapshot, now: datetime) -> None: ...

    def apply(self, book: Book, snap: Snapshot, now: datetime) -> dict[str, str]: ...

    def state(self) -> dict[str, Any]: ...


@dataclass
class _Light:
    rt: Runtime
    ns: Namespace
    report: DreamReport
    _plan: tuple[str, list[LightOp]] | None = None

    def prepare(self, book: Book, snap: Snapshot, now: datetime) -> None:
        return None

    def apply(self, book: Book, snap: Snapshot, now: datetime) -> dict[str, str]:
        if self._plan is None or self._plan[0] != snap.version:  # same version → same plan: plan once
            self._plan = (snap.version, plan_light(book.entries(), now))
        result = apply_light(book, self._plan[1], now)
        self.report.counts = dict(result.counts)
        self.report.touched = {k: list(v) for k, v in result.touched.items()}
        return {}

    def state(self) -> dict[str, Any]:
        return {}


@dataclass
class _Deep:
    rt: Runtime
    ns: Namespace
    report: DreamReport
    model: _Model
    merges: list[Merge] = field(default_factory=list)

    def prepare(self, book: Book, snap: Snapshot, now: datetime) -> None:
        clusters = plan_clusters(book.entries(), now)
        known = {e.id for e in book.entries()} | {e.id for e in book.archived()}
        taken: set[str] = set()
        self.report.counts["clusters"] = len(clusters)
        for cluster in clusters:
            reply = self.model.ask(merge_messages(cluster), json_format=True)
            if reply is None:
                if self.model.stopped in ("budget", "unavailable"):
                    break
                continue
            review = review_reply(cluster, reply, known, taken)
            self.merges.extend(review.merges)
            for reason, n in review.rejected.items():
                self.report.reject(reason, n)
            self.report.said.extend(f"rejected {d}" for d in review.details[:8])

    def apply(self, book: Book, snap: Snapshot, now: datetime) -> dict[str, str]:
        applied = apply_deep(book, self.merges, now)
        self.report.counts.update(
            merged=len(applied),
            superseded=sum(len(m.sources) for _, m in applied),
            stale=len(self.merges) - len(applied),
        )
        self.report.touched = {"merged": [f"{','.join(m.ids)}>{new}" for new, m in applied]}
        return {}

    def state(self) -> dict[str, Any]:
        return {}


def _parse_or_none(value: object) -> datetime | None:
    try:
        return parse_time(str(value))
    except (TypeError, ValueError):
        return None


def _done_ids(value: object) -> dict[str, str]:
    """The `done` map of a replay state record; anything malformed (a hand-edited state.json) is ignored."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


@dataclass
class _Replay:
    rt: Runtime
    ns: Namespace
    report: DreamReport
    model: _Model
    ops: list[Remember] = field(default_factory=list)
    watermark: datetime | None = None
    done: dict[str, str] = field(default_factory=dict)  # id → ts of messages read past the watermark
    chats: dict[str, str] = field(default_factory=dict)  # message id → its chat (the memory switch)
    _model_rejections: dict[str, int] = field(default_factory=dict)

    def prepare(self, book: Book, snap: Snapshot, now: datetime) -> None:
        record = self.rt.store.state_value(self.ns, state_key("replay")) or {}
        since = parse_time(record["watermark"]) if record.get("watermark") else now - REPLAY_LOOKBACK
        done = _done_ids(record.get("done"))
        days = [d for d in self.rt.store.raw_days(self.ns) if d >= f"{since:%Y-%m-%d}.md"]
        switch, ns = self.rt.switch, self.ns
        self.chats = {}
        fresh = (
            m
            for m in self.rt.store.iter_raw(self.ns, days)
            if m.id not in done and switch.learning(ns.tenant, ns.persona, m.chat)
        )
        chunks = replay_chunks(fresh, since, now)
        self.report.counts.update(messages=sum(len(c.messages) for c in chunks), chunks=len(chunks))
        self.watermark, self.done = now, {}
        for i, chunk in enumerate(chunks):
            if not worth_a_call(chunk):
                continue
            reply = self.model.ask(extraction_messages(chunk.text))
            if reply is None:  # out of budget or the model failed: the rest waits for the next run
                # Resume before the first unread chunk, remembering later messages read: imported ones
                # often share one timestamp, so a bare time watermark would re-read the same chunks forever.
                self.watermark = chunks[i].messages[0].ts - timedelta(seconds=1)
                read = {m.id: format_time(m.ts) for c in chunks[:i] for m in c.messages}
                self.done = {
                    ident: ts
                    for ident, ts in {**done, **read}.items()
                    if (when := _parse_or_none(ts)) is not None and when > self.watermark
                }
                break
            facts = answer_facts(reply, chunk.text)
            if facts is None:  # not a list of grounded facts (a chat model's 好的。): nothing lands, counted
                self.report.reject("junk_answer")
                Metrics(self.rt.redis).inc(JUNK_METRIC, {"path": "replay"})
                continue
            self.ops.extend(replay_ops(facts, chunk))
            self.chats.update({m.id: m.chat for m in chunk.messages})
        self.report.counts["facts"] = len(self.ops)
        self._model_rejections = dict(self.report.rejections)

    def apply(self, book: Book, snap: Snapshot, now: datetime) -> dict[str, str]:
        counts = dict.fromkeys(("added", "updated", "superseded", "unchanged"), 0)
        self.report.rejections = dict(self._model_rejections)  # apply runs twice: count the writer's once
        added: list[str] = []
        switch, ns = self.rt.switch, self.ns
        for op in self.ops:
            chat = self.chats.get(op.origin or "")
            if chat is not None and not switch.learning(ns.tenant, ns.persona, chat):
                self.report.reject("memory_off")  # switched off while the model read the chat
                continue
            outcome = book.apply(op, now)
            if outcome.kind is Kind.REJECTED:
                self.report.reject(outcome.why or "rejected")
            else:
                counts[str(outcome.kind)] = counts.get(outcome.kind, 0) + 1
                if outcome.kind in (Kind.ADDED, Kind.SUPERSEDED) and outcome.id:
                    added.append(outcome.id)
        self.report.counts.update(counts)
        self.report.touched = {"added": added}
        return {}

    def state(self) -> dict[str, Any]:
        if not self.watermark:
            return {}
        return {"watermark": format_time(self.watermark), **({"done": self.done} if self.done else {})}


@dataclass
class _Profile:
    rt: Runtime
    ns: Namespace
    report: DreamReport
    model: _Model
    text: str | None = None

    def prepare(self, book: Book, snap: Snapshot, now: datetime) -> None:
        inputs = profile_inputs(book.entries(), now)
        self.report.counts.update(inputs=len(inputs), profile=0)
        previous = snap.text(PROFILE)
        if not inputs:
            self.report.notes.append("no identity, preference or fact entries about the user yet")
            return
        digest = profile_digest(inputs)
        if stored_digest(previous) == digest:
            self.report.notes.append("facts unchanged since the last profile: no model call")
            return
        shown = "\n".join(line for line in split_lines(previous or "") if not line.startswith("<!--"))
        reply = self.model.ask(profile_messages(inputs, shown))
        if reply is None:
            return
        everyone = [*book.entries(), *book.archived()]
        verdict = guard_profile(reply, inputs, third_party_names(everyone), third_party_texts(everyone))
        if verdict.reason == "nothing":
            self.report.notes.append("the model found too little for a profile")
        elif not verdict.accepted:
            self.report.reject(verdict.reason or "rejected")
            self.report.notes.append(f"profile rejected ({verdict.reason})")
            self.report.said.append(f"profile rejected ({verdict.reason}): {verdict.detail}")
        else:
            self.text = render_profile(verdict.lines, digest, now, len(inputs))

    def apply(self, book: Book, snap: Snapshot, now: datetime) -> dict[str, str]:
        text = self.text
        if text is not None and stored_digest(text) != profile_digest(profile_inputs(book.entries(), now)):
            # the facts changed while the model wrote (a forget): only the lines they still support
            text = checked_profile(text, book.entries(), now)
        if text is None or text == snap.text(PROFILE):
            self.report.counts["profile"] = 0
            return {}
        self.report.counts["profile"] = 1
        return {PROFILE: text}

    def state(self) -> dict[str, Any]:
        return {}


def _phase(rt: Runtime, ns: Namespace, phase: str, report: DreamReport) -> Phase:
    if phase == "light":
        return _Light(rt, ns, report)
    model = _Model(rt, report, BUDGETS[phase])
    if phase == "deep":
        return _Deep(rt, ns, report, model)
    if phase == "replay":
        return _Replay(rt, ns, report, model)
    return _Profile(rt, ns, report, model)


def _namespace(ns: str | Namespace) -> Namespace:
    return ns if isinstance(ns, Namespace) else Namespace.parse(ns)


def _settle(report: DreamReport, dry_run: bool) -> None:
    report.status = "dry run" if dry_run else ("done" if report.changes else "nothing to do")


def run_phase(rt: Runtime, ns: str | Namespace, phase: str, dry_run: bool = False) -> dict[str, Any]:
    """Run one phase for one namespace now and return its report (JSON-safe). The CLI calls this."""
    try:
        report = _run_phase(rt, ns, phase, dry_run)
    except Exception:
        Metrics(rt.redis).inc("lucid_dream_runs_total", {"phase": phase, "outcome": "failed"})
        raise
    _count(rt, report)
    return report


def _count(rt: Runtime, report: dict[str, Any]) -> None:
    """Dream metrics: runs by outcome, operations by kind, cage rejections by reason."""
    metrics = Metrics(rt.redis)
    phase = str(report.get("phase"))
    metrics.inc("lucid_dream_runs_total", {"phase": phase, "outcome": str(report.get("status"))})
    if report.get("dry_run"):
        return
    for kind, n in (report.get("counts") or {}).items():
        if n:
            metrics.inc("lucid_dream_operations_total", {"phase": phase, "kind": str(kind)}, n)
    for reason, n in (report.get("rejections") or {}).items():
        if n:
            metrics.inc("lucid_dream_rejections_total", {"phase": phase, "reason": str(reason)}, n)


def _run_phase(rt: Runtime, ns: str | Namespace, phase: str, dry_run: bool) -> dict[str, Any]:
    if phase not in PHASES:
        raise InvalidInput(f"unknown dream phase {phase!r}: one of {', '.join(PHASES)}")
    space = _namespace(ns)
    report = DreamReport(phase, str(space), rt.clock(), dry_run=dry_run)
    if phase in MODEL_PHASES:
        report.model = rt.settings.dream_model
        if not report.model or rt.llm is None:
            report.status = "skipped"
            report.notes.append(f"no dream model: set LUCID_DREAM_MODEL to enable the {phase} phase")
            return report.to_json()
    if not rt.store.path(space).is_dir():
        report.status = "skipped"
        report.notes.append("no such namespace (nothing was ever written for it)")
        return report.to_json()
    work = _phase(rt, space, phase, report)
    book, snap = rt.writer.snapshot(space)
    now = rt.clock()
    work.prepare(book, snap, now)
    for attempt in range(MAX_REPLANS + 1):
        if attempt:
            book, snap = rt.writer.snapshot(space)
            now = rt.clock()
            report.replans = attempt
        files = work.apply(book, snap, now)  # on our own copy: what the commit will say
        _settle(report, dry_run)
        if dry_run:
            return {**report.to_json(), "diff": would_be_diff(snap, book, files)}
        written = rt.writer.transact(space, _change(work, report, now), commit_message(report), snap.version)
        if written is not None:
            report.revision = written.revision
            _record_run(rt, space, phase, now, work.state())
            log.info("%s", commit_message(report))
            return report.to_json()
        log.info("dream %s of %s: the namespace moved, re-planning", phase, space)
    raise NamespaceBusy(
        f"{space} kept changing during {MAX_REPLANS} re-plans of the {phase} phase; nothing written"
    )


def would_be_diff(snap: Snapshot, book: Book, files: dict[str, str]) -> str:
    """The unified diff a dry run would have committed (MEMORY.md, ARCHIVE.md and any other file)."""
    after = {MEMORY: render_file(book.memory_file()), ARCHIVE: render_file(book.archive_file()), **files}
    out: list[str] = []
    for name, text in after.items():
        before = snap.text(name) or ""
        if text != before:
            out.extend(
                difflib.unified_diff(
                    before.splitlines(), text.splitlines(), f"a/{name}", f"b/{name}", lineterm=""
                )
            )
    return "\n".join(out)


def _change(work: Phase, report: DreamReport, now: datetime) -> Callable[[Book, Snapshot], dict[str, str]]:
    def change(book: Book, snap: Snapshot) -> dict[str, str]:
        files = work.apply(book, snap, now)
        _settle(report, False)
        files[DREAMS] = prepend_journal(snap.text(DREAMS), journal_entry(report))
        return files

    return change


def _record_run(rt: Runtime, ns: Namespace, phase: str, now: datetime, extra: dict[str, Any]) -> None:
    """Persist the last-run time and the memory version the run left, for the scheduler."""
    version = memory_version(rt.store.snapshot(ns))
    rt.store.set_state_value(ns, state_key(phase), {"at": format_time(now), "version": version, **extra})


def last_run(rt: Runtime, ns: Namespace, phase: str) -> dict[str, Any]:
    value = rt.store.state_value(ns, state_key(phase))
    return value if isinstance(value, dict) else {}


def light_dream(ns: str, dry_run: bool = False) -> dict[str, Any]:
    return run_phase(current(), ns, "light", dry_run)


def deep_dream(ns: str, dry_run: bool = False) -> dict[str, Any]:
    return run_phase(current(), ns, "deep", dry_run)


def replay(ns: str, dry_run: bool = False) -> dict[str, Any]:
    return run_phase(current(), ns, "replay", dry_run)


def profile(ns: str, dry_run: bool = False) -> dict[str, Any]:
    return run_phase(current(), ns, "profile", dry_run)


JOBS: dict[str, Callable[..., dict[str, Any]]] = {
    "light": light_dream,
    "deep": deep_dream,
    "replay": replay,
    "profile": profile,
}


def job_id(ns: Namespace, phase: str, dry_run: bool = False) -> str:
    return f"dream-{phase}-{ns.key}" + ("-dry" if dry_run else "")


def enqueue_phase(rt: Runtime, ns: str | Namespace, phase: str, dry_run: bool = False) -> dict[str, Any]:
    """Queue one phase for one namespace on the `dream` queue; at most one such job queued or running."""
    if phase not in JOBS:
        raise InvalidInput(f"unknown dream phase {phase!r}: one of {', '.join(PHASES)}")
    space = _namespace(ns)
    ident = job_id(space, phase, dry_run)
    try:
        rt.queue(DREAM_QUEUE).enqueue(
            JOBS[phase],
            str(space),
            dry_run,
            job_id=ident,
            unique=True,
            result_ttl=0,
            failure_ttl=FAILURE_TTL,
            job_timeout=JOB_TIMEOUT[phase],
            retry=Retry(max=2, interval=RETRY_INTERVALS),
            description=f"dream {phase} {space}",
        )
    except DuplicateJobError:
        return {"status": "already queued", "job_id": ident, "phase": phase, "namespace": str(space)}
    return {"status": "queued", "job_id": ident, "phase": phase, "namespace": str(space)}


def command_hint(command: str, namespace: str, data_dir: str | None = None) -> str:
    """`lucid COMMAND` with the flags that reach `namespace` (tenant/user/persona) and the data directory,
    each only when not the default, quoted for a POSIX shell: it runs as printed."""
    words = ["lucid", *shlex.split(command)]
    try:
        ns = Namespace.parse(namespace)
    except ValueError:
        ns = None
    if ns is not None:
        for flag, value in (("--tenant", ns.tenant), ("--user", ns.user), ("--persona", ns.persona)):
            if value != "default":
                words += [flag, value]
    if data_dir:
        words += ["--data", data_dir]
    return shlex.join(words)


def format_report(report: dict[str, Any], data_dir: str | None = None) -> str:
    """A report as a few lines for people (the CLI and the bot's /dream reply); a dry run adds its diff.
    `data_dir`: the data directory to name in the undo hint (None: the default one)."""
    counts = ", ".join(f"{n} {k}" for k, n in report.get("counts", {}).items()) or "no counts"
    head = (
        f"dream {report.get('phase')} · {report.get('namespace')} · {str(report.get('status', '')).upper()}"
    )
    lines = [head, f"  counts: {counts}"]
    for action, ids in report.get("touched", {}).items():
        if ids:
            lines.append(
                f"  {action}: {', '.join(ids[:20])}" + (f" (+{len(ids) - 20} more)" if len(ids) > 20 else "")
            )
    rejections = ", ".join(f"{n} {r}" for r, n in sorted(report.get("rejections", {}).items())) or "none"
    lines.append(f"  rejections: {rejections}")
    llm = report.get("llm", {})
    lines.append(
        f"  model: {report.get('model') or 'none'} · {llm.get('calls', 0)} calls · "
        f"{llm.get('prompt_tokens', 0) + llm.get('completion_tokens', 0)} tokens"
    )
    lines.extend(f"  note: {n}" for n in report.get("notes", []))
    lines.extend(f"  {n}" for n in report.get("said", []))
    if report.get("revision"):
        rev = str(report["revision"])[:10]
        hint = command_hint(f"undo {rev}", str(report.get("namespace", "")), data_dir)
        lines.append(f"  commit: {rev} (undo with `{hint}`)")
    if report.get("diff"):
        lines.append("  would-be diff:")
        lines.extend("    " + line for line in str(report["diff"]).splitlines())
    return "\n".join(lines)
