"""Service metrics: counters and histograms in one Redis hash (every process adds to it), served by the bot
as Prometheus text at `/metrics`."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

import redis

from .redis_keys import Keys

log = logging.getLogger(__name__)

_KEY = Keys.METRICS
TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

HELP = {
    "lucid_events_received_total": ("counter", "Webhook events received, by persona."),
    "lucid_events_deduplicated_total": (
        "counter",
        "Webhook events dropped as repeats (event or message id).",
    ),
    "lucid_events_rejected_total": ("counter", "Webhook requests rejected, by reason."),
    "lucid_events_ignored_total": ("counter", "Events accepted but not answered, by reason."),
    "lucid_turns_total": ("counter", "Chat turns run, by outcome."),
    "lucid_turn_seconds": ("histogram", "Wall time of a chat turn, from job start to reply sent."),
    "lucid_replies_parked_total": (
        "counter",
        "Replies Feishu did not take within the turn's tries, parked for later delivery.",
    ),
    "lucid_replies_delivered_late_total": ("counter", "Parked replies delivered by a later attempt."),
    "lucid_replies_undelivered_total": (
        "counter",
        "Replies never delivered, by reason (refused: a refusal no retry cures; deadline: retried too long).",
    ),
    "lucid_replies_rescued_total": (
        "counter",
        "Parked replies whose retry job was overdue (its worker or RQ's scheduler died), queued again.",
    ),
    "lucid_turns_recovered_total": (
        "counter",
        "Inboxes with messages and no live turn (their worker died mid-turn), handed to a new turn job.",
    ),
    "lucid_busy_notices_total": (
        "counter",
        "People told they write faster than they are answered (their backlog reached 8; answered in order).",
    ),
    "lucid_dream_runs_total": ("counter", "Dream runs, by phase and outcome."),
    "lucid_dream_operations_total": ("counter", "Dream operations applied, by phase and kind."),
    "lucid_dream_rejections_total": ("counter", "Dream operations rejected by the cage, by reason."),
    "lucid_llm_calls_total": ("counter", "Calls to the model server, by purpose and outcome."),
    "lucid_llm_tokens_total": ("counter", "Tokens spent, by purpose and direction."),
    "lucid_memory_writes_total": ("counter", "Memory writes applied, by outcome (an undo: once, undone)."),
    "lucid_extraction_junk_total": (
        "counter",
        "Extraction or replay answers that were not a list of grounded facts (stored nothing), by path.",
    ),
    "lucid_queue_depth": ("gauge", "Jobs waiting in each RQ queue."),
    "lucid_ws_connected": ("gauge", "1 while this bot process holds the persona's Feishu long connection."),
    "lucid_ws_reconnects_total": ("counter", "Long connections made again after a drop or a dead socket."),
}


def label_text(labels: Mapping[str, str] | None) -> str:
    """`{a="x",b="y"}`, sorted and escaped (empty for no labels)."""
    if not labels:
        return ""
    parts = []
    for k in sorted(labels):
        v = str(labels[k]).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{k}="{v}"')
    return "{" + ",".join(parts) + "}"


class Metrics:
    """Counters and histograms shared by every process through one Redis hash. Never raises, and never
    slows a caller down for long: after a failure, metrics are skipped for `PAUSE` seconds."""

    PAUSE = 10.0

    def __init__(self, client: redis.Redis | None) -> None:
        self.client = client
        self._paused_until = 0.0

    def _usable(self) -> bool:
        return self.client is not None and time.monotonic() >= self._paused_until

    def _failed(self) -> None:
        self._paused_until = time.monotonic() + self.PAUSE
        log.debug("metrics unavailable")

    def inc(self, name: str, labels: Mapping[str, str] | None = None, value: float = 1.0) -> None:
        if not self._usable():
            return
        assert self.client is not None
        try:
            self.client.hincrbyfloat(_KEY, name + label_text(labels), value)
        except redis.RedisError:
            self._failed()

    def observe(
        self,
        name: str,
        seconds: float,
        labels: Mapping[str, str] | None = None,
        buckets: Iterable[float] = TURN_BUCKETS,
    ) -> None:
        if not self._usable():
            return
        assert self.client is not None
        base = dict(labels or {})
        try:
            pipe = self.client.pipeline(transaction=False)
            for b in buckets:
                if seconds <= b:
                    pipe.hincrbyfloat(_KEY, f"{name}_bucket" + label_text({**base, "le": f"{b:g}"}), 1)
            pipe.hincrbyfloat(_KEY, f"{name}_bucket" + label_text({**base, "le": "+Inf"}), 1)
            pipe.hincrbyfloat(_KEY, f"{name}_sum" + label_text(base), seconds)
            pipe.hincrbyfloat(_KEY, f"{name}_count" + label_text(base), 1)
            pipe.execute()
        except redis.RedisError:
            self._failed()

    def render(self, gauges: Mapping[str, float] | None = None) -> str:
        """The Prometheus text exposition of every recorded series, plus gauges computed at scrape time."""
        series: dict[str, float] = {}
        if self._usable() and self.client is not None:
            try:
                raw = self.client.hgetall(_KEY)
                series = {(k.decode() if isinstance(k, bytes) else str(k)): float(v) for k, v in raw.items()}
            except redis.RedisError:
                self._failed()
        series.update(gauges or {})
        lines: list[str] = []
        for family, (kind, text) in HELP.items():
            members = sorted(s for s in series if _family(s) == family)
            lines.append(f"# HELP {family} {text}")
            lines.append(f"# TYPE {family} {kind}")
            for s in members:
                value = series[s]
                lines.append(f"{s} {int(value) if value.is_integer() else value}")
        return "\n".join(lines) + "\n"


class Buffered(Metrics):
    """Counters kept in memory and flushed to Redis in one pipeline: for the webhook's event loop, which
    must never wait on a Redis round trip per event. Call `flush()` periodically (off the loop)."""

    def __init__(self, client: redis.Redis | None) -> None:
        super().__init__(client)
        self._pending: dict[str, float] = {}

    def inc(self, name: str, labels: Mapping[str, str] | None = None, value: float = 1.0) -> None:
        key = name + label_text(labels)
        self._pending[key] = self._pending.get(key, 0.0) + value

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        if not pending or not self._usable():
            return
        assert self.client is not None
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value in pending.items():
                pipe.hincrbyfloat(_KEY, key, value)
            pipe.execute()
        except redis.RedisError:
            self._failed()


def _family(series: str) -> str:
    name = series.split("{", 1)[0]
    for suffix in ("_bucket", "_sum", "_count"):
        if (
            name.endswith(suffix)
            and name[: -len(suffix)] in HELP
            and HELP[name[: -len(suffix)]][0] == "histogram"
        ):
            return name[: -len(suffix)]
    return name


def queue_depths(client: redis.Redis | None, names: Iterable[str]) -> dict[str, float]:
    """`lucid_queue_depth{queue=…}` for each RQ queue (read at scrape time)."""
    if client is None:
        return {}
    from rq import Queue

    out: dict[str, float] = {}
    for name in names:
        try:
            out["lucid_queue_depth" + label_text({"queue": name})] = float(
                Queue(name, connection=client).count
            )
        except redis.RedisError:
            continue
    return out
