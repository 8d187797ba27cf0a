"""`lucid cron`: one rq CronScheduler with one `tick` job that queues the dream phases each namespace is due
for (`due_phases`; docs/ARCHITECTURE.md, "Dreaming")."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rq.cron import CronScheduler

from memory_core.dream import MODEL_PHASES, PHASES
from memory_core.errors import InvalidInput
from memory_core.lineformat import format_time, parse_time
from memory_core.namespace import Namespace, list_namespaces

from .dreaming import enqueue_phase, last_run, memory_version, state_key
from .queues import JSONCronJob
from .runtime import Runtime, current
from .settings import DREAM_INTERVALS, Settings

log = logging.getLogger(__name__)

TICK_SECONDS = 300
TICK_QUEUE = "memory"
JITTER_FRACTION = 0.1
MAX_JITTER = timedelta(hours=2)
BASELINE_PHASES = ("deep", "replay")  # first sighting records a start instead of running


@dataclass(frozen=True)
class Cadence:
    """How often each phase runs (absent = switched off) and whether a dream model exists."""

    intervals: Mapping[str, timedelta] = field(default_factory=lambda: dict(DREAM_INTERVALS))
    model: bool = False

    @classmethod
    def of(cls, settings: Settings) -> Cadence:
        """The settings' switches, parsed once at start (`Settings.from_env`): a tick never reads the env."""
        return cls(settings.dream_intervals, bool(settings.dream_model))


def jitter(ns_key: str, phase: str, interval: timedelta) -> timedelta:
    """A stable delay in [0, min(10 % of interval, 2 h)) for this namespace and phase."""
    span = min(interval * JITTER_FRACTION, MAX_JITTER).total_seconds()
    if span <= 0:
        return timedelta(0)
    h = int.from_bytes(hashlib.sha256(f"{ns_key}:{phase}".encode()).digest()[:8], "big")
    return timedelta(seconds=h % int(span) if span >= 1 else 0)


def due_phases(
    last_runs: Mapping[str, datetime | None],
    changed: Mapping[str, bool],
    now: datetime,
    settings: Cadence,
    ns_key: str = "",
) -> list[str]:
    """The phases to enqueue now for one namespace (pure: everything it needs is passed in)."""
    due = []
    for phase in PHASES:
        interval = settings.intervals.get(phase)
        if interval is None or (phase in MODEL_PHASES and not settings.model):
            continue
        if not changed.get(phase, True):
            continue
        last = last_runs.get(phase)
        if last is None:
            if phase not in BASELINE_PHASES:
                due.append(phase)
            continue
        if now - last >= interval + jitter(ns_key, phase, interval):
            due.append(phase)
    return due


def _last_runs(rt: Runtime, ns: Namespace) -> dict[str, dict[str, Any]]:
    return {phase: last_run(rt, ns, phase) for phase in PHASES}


def _changes(rt: Runtime, ns: Namespace, records: Mapping[str, Mapping[str, Any]]) -> dict[str, bool]:
    version = memory_version(rt.store.snapshot(ns))
    changed = {p: records[p].get("version") != version for p in PHASES if p != "replay"}
    watermark = str(records["replay"].get("watermark") or records["replay"].get("at") or "")
    newest = max(rt.store.raw_days(ns), default="")
    changed["replay"] = bool(newest) and (not watermark or newest >= f"{watermark[:10]}.md")
    return changed


def tick_runtime(rt: Runtime) -> dict[str, Any]:
    """One scheduling pass over every namespace: enqueue what is due, record first sightings."""
    now = rt.clock()
    cadence = Cadence.of(rt.settings)
    queued: list[str] = []
    waiting: list[str] = []
    spaces = list_namespaces(rt.settings.data_dir)
    for ns in spaces:
        records = _last_runs(rt, ns)
        last = {p: parse_time(r["at"]) if r.get("at") else None for p, r in records.items()}
        for phase in BASELINE_PHASES:
            if last[phase] is None and phase in cadence.intervals and cadence.model:
                rt.store.set_state_value(ns, state_key(phase), {"at": format_time(now), "baseline": True})
        if not due_phases(last, {}, now, cadence, ns.key):
            continue  # nothing is due by time: skip reading the files
        for phase in due_phases(last, _changes(rt, ns, records), now, cadence, ns.key):
            result = enqueue_phase(rt, ns, phase)
            (queued if result["status"] == "queued" else waiting).append(f"{phase} {ns}")
    if queued:
        log.info("dream tick: queued %s", ", ".join(queued))
    return {"namespaces": len(spaces), "queued": queued, "already_queued": waiting}


def tick() -> dict[str, Any]:
    """The cron job (runs on a worker): schedule due dream phases for every namespace."""
    return tick_runtime(current())


def make_cron(rt: Runtime, interval: int = TICK_SECONDS) -> CronScheduler:
    """The cron scheduler with its single tick registered (tests call `enqueue_jobs()` on it)."""
    if rt.redis is None:
        raise InvalidInput("`lucid cron` needs Redis: set REDIS_URL or use `lucid serve`")
    cron = CronScheduler(connection=rt.redis, name=f"lucid-cron-{os.getpid()}")
    job = cron.register(
        tick, queue_name=TICK_QUEUE, interval=interval, job_timeout=120, result_ttl=0, failure_ttl=3600
    )
    job.__class__ = JSONCronJob  # rq's CronJob enqueues with pickle; ours on the JSON queue
    return cron


def run_cron(rt: Runtime, interval: int = TICK_SECONDS) -> None:
    """`lucid cron`: run the scheduler in the foreground (main thread: it installs signal handlers).
    Run one per deployment: rq's cron has no leader election (two would tick twice)."""
    make_cron(rt, interval).start()  # type: ignore[no-untyped-call]
