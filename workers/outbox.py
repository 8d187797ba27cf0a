"""Replies Feishu did not take during their turn: parked in Redis and delivered later, exactly once, or given
up loudly (docs/ARCHITECTURE.md, "Delivery")."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Literal

import redis
from redis.typing import EncodableT, FieldT
from rq import Retry as JobRetry

from memory_core.errors import LucidError
from memory_core.secretscan import redact

from .errors import FeishuError
from .feishu_send import FeishuSender
from .inbound import Inbound
from .metrics import Metrics
from .queues import queue
from .redis_backend import take, text
from .redis_keys import Keys
from .runtime import Runtime, current

log = logging.getLogger(__name__)

QUEUE = "chat"
FIRST_DELAY = 2.0
BUSY_DELAY = 5.0
MAX_DELAY = 300.0
JITTER = 0.1
LOCK_MS = 90_000  # one attempt: a 10 s SDK timeout, maybe a token fetch, pacing; far below this
KEEP = 3600  # keys expire this long after their give-up time, whatever happened to their jobs
JOB_TIMEOUT = 120
DUE = Keys.REPLIES_DUE
OVERDUE_MS = 30_000  # a retry job this late never ran: its worker died, or the RQ scheduler did
RESCUE_BATCH = 200


@dataclass
class Parked:
    """One parked reply, as kept in its Redis hash."""

    persona: str
    chat_id: str
    message_id: str
    text: str
    order: int  # the message's create time (ms): a chat's parked replies go out in this order
    first_try: float  # epoch seconds of the turn's first attempt
    give_up_at: float  # no attempt starts after this
    attempts: int = 1  # the turn's tries count as one
    chunks_sent: int = 0
    last_error: str = ""
    in_thread: bool = False  # the message was in a thread: the reply goes there too

    def to_redis(self) -> dict[FieldT, EncodableT]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_redis(cls, raw: dict[Any, Any]) -> Parked:
        data = {text(k): text(v) for k, v in raw.items()}
        return cls(
            persona=data["persona"],
            chat_id=data["chat_id"],
            message_id=data["message_id"],
            text=data["text"],
            order=int(data["order"]),
            first_try=float(data["first_try"]),
            give_up_at=float(data["give_up_at"]),
            attempts=int(data.get("attempts") or 1),
            chunks_sent=int(data.get("chunks_sent") or 0),
            last_error=data.get("last_error") or "",
            in_thread=data.get("in_thread") == "True",
        )


def _due_member(persona: str, message_id: str) -> str:
    return f"{persona}\x1f{message_id}"


def backoff(n: int) -> float:
    """Seconds before attempt n + 1 of the parked reply (n ≥ 1), without jitter."""
    return min(MAX_DELAY, FIRST_DELAY * 2.0 ** (n - 1))


class Outbox:
    """The parked replies of every chat, in Redis."""

    def __init__(
        self, client: redis.Redis, metrics: Metrics | None = None, overdue_ms: int = OVERDUE_MS
    ) -> None:
        self.client = client
        self.overdue_ms = overdue_ms
        self.metrics = metrics or Metrics(client)
        self.queue = queue(QUEUE, client)

    def get(self, persona: str, message_id: str) -> Parked | None:
        raw = self.client.hgetall(Keys.reply(persona, message_id))
        if not raw:
            return None
        try:
            return Parked.from_redis(raw)
        except (KeyError, ValueError) as exc:
            log.error("unreadable parked reply to message=%s (%s); removed", message_id, exc)
            self.client.delete(Keys.reply(persona, message_id))
            return None

    def pending(self, persona: str, chat_id: str, upto: float = float("inf")) -> list[str]:
        """Message ids of the chat's parked replies, oldest first (create time ≤ `upto`)."""
        ids = self.client.zrangebyscore(
            Keys.replies(persona, chat_id), "-inf", "+inf" if upto == float("inf") else upto
        )
        return [text(i) for i in ids]

    def park(self, p: Parked, error: FeishuError) -> None:
        """Keep `p` and schedule its first retry, in one transaction: a parked reply always has a job."""
        p.last_error = str(error)
        p.chunks_sent = max(p.chunks_sent, error.chunks_sent)
        ttl = max(60, int(p.give_up_at - time.time()) + KEEP)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(Keys.reply(p.persona, p.message_id), mapping=p.to_redis())
            pipe.expire(Keys.reply(p.persona, p.message_id), ttl)
            pipe.zadd(Keys.replies(p.persona, p.chat_id), {p.message_id: p.order})
            pipe.expire(Keys.replies(p.persona, p.chat_id), ttl)
            self._schedule(pipe, p, 1, FIRST_DELAY)
            pipe.execute()
        self.metrics.inc("lucid_replies_parked_total")
        log.warning(
            "reply to message=%s (persona %s, chat %s) parked after %s; next try in %.0fs, gives up in %.0fs",
            p.message_id,
            p.persona,
            p.chat_id,
            error,
            FIRST_DELAY,
            p.give_up_at - time.time(),
        )

    def _schedule(self, pipe: Any | None, p: Parked, n: int, delay: float) -> None:
        """The n-th retry job of `p`, `delay` seconds from now (through RQ's scheduler), or at once (`pipe`
        None: straight onto the queue's front, no scheduler involved); its due mark for `rescue`."""
        due = {_due_member(p.persona, p.message_id): int((time.time() + delay) * 1000)}
        (pipe if pipe is not None else self.client).zadd(DUE, due)
        tag = hashlib.sha1(f"{p.persona}:{p.message_id}".encode()).hexdigest()[:24]
        options: dict[str, Any] = {
            "job_id": f"reply-{tag}-{n}-{secrets.token_hex(3)}",
            "job_timeout": JOB_TIMEOUT,
            "result_ttl": 600,
            "failure_ttl": 7 * 86400,
            "retry": JobRetry(max=3, interval=[10, 30, 60]),  # a job that raised: run it again
            "pipeline": pipe,
        }
        if pipe is None:
            del options["pipeline"]
            self.queue.enqueue(deliver_parked, p.persona, p.message_id, n, at_front=True, **options)
        else:
            self.queue.enqueue_in(
                timedelta(seconds=delay), deliver_parked, p.persona, p.message_id, n, **options
            )

    def _remove(self, p: Parked) -> bool:
        """Forget `p`; True if this call removed it (so only one caller logs and counts the outcome)."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(Keys.reply(p.persona, p.message_id))
            pipe.zrem(Keys.replies(p.persona, p.chat_id), p.message_id)
            pipe.zrem(DUE, _due_member(p.persona, p.message_id))
            removed, _, _ = pipe.execute()
        return bool(removed)

    def _drop(self, p: Parked, reason: str, error: FeishuError | str) -> None:
        if not self._remove(p):
            return
        self.metrics.inc("lucid_replies_undelivered_total", {"reason": reason})
        log.error(
            "reply to message=%s (persona %s, chat %s) NOT delivered: %s after %d attempt(s) over %.0fs (%s); "
            "giving up",
            p.message_id,
            p.persona,
            p.chat_id,
            "refused" if reason == "refused" else "still failing at the deadline",
            p.attempts,
            time.time() - p.first_try,
            error,
        )

    @contextlib.contextmanager
    def _locked(self, persona: str, message_id: str) -> Iterator[bool]:
        lock = take(self.client, Keys.reply_lock(persona, message_id), LOCK_MS)
        try:
            yield lock is not None
        finally:
            if lock is not None:
                lock.release()

    def _try(self, sender: FeishuSender, p: Parked) -> str:
        """One attempt at `p` (its lock held): delivered, failed (parked still) or dropped."""
        if time.time() > p.give_up_at:
            self._drop(p, "deadline", p.last_error)
            return "dropped"
        try:
            sender.reply(
                p.message_id,
                p.text,
                chat_id=p.chat_id,
                attempts=1,
                start=p.chunks_sent,
                in_thread=p.in_thread,
            )
        except FeishuError as exc:
            p.attempts += 1
            p.chunks_sent = max(p.chunks_sent, exc.chunks_sent)
            p.last_error = str(exc)
            if not exc.retryable:
                self._drop(p, "refused", exc)
                return "dropped"
            if self.client.exists(Keys.reply(p.persona, p.message_id)):
                self.client.hset(
                    Keys.reply(p.persona, p.message_id),
                    mapping={
                        "attempts": p.attempts,
                        "chunks_sent": p.chunks_sent,
                        "last_error": p.last_error,
                    },
                )
            log.info("parked reply to message=%s: attempt %d failed (%s)", p.message_id, p.attempts, exc)
            return "failed"
        p.attempts += 1
        if self._remove(p):
            self.metrics.inc("lucid_replies_delivered_late_total")
            log.warning(
                "parked reply to message=%s (persona %s, chat %s) delivered at attempt %d, %.1fs after the first",
                p.message_id,
                p.persona,
                p.chat_id,
                p.attempts,
                time.time() - p.first_try,
            )
        return "delivered"

    def flush(
        self,
        sender: FeishuSender,
        persona: str,
        chat_id: str,
        upto: float = float("inf"),
        skip: str | None = None,
    ) -> dict[str, str]:
        """Try the chat's parked replies (create time ≤ `upto`, but `skip`) once each, oldest first, stopping
        at the first that is still refused or being sent by someone else; their outcomes by message id."""
        outcomes: dict[str, str] = {}
        for message_id in self.pending(persona, chat_id, upto):
            if message_id == skip:
                continue
            with self._locked(persona, message_id) as mine:
                if not mine:
                    outcomes[message_id] = "busy"
                    return outcomes
                p = self.get(persona, message_id)
                if p is None:  # delivered or dropped meanwhile (or its hash expired)
                    self.client.zrem(Keys.replies(persona, chat_id), message_id)
                    continue
                outcomes[message_id] = self._try(sender, p)
            if outcomes[message_id] == "failed":
                return outcomes
        return outcomes

    def retry(self, runtime: Runtime, persona: str, message_id: str, n: int) -> str:
        """The n-th retry job of a parked reply: older parked replies of its chat first, then this one."""
        with self._locked(persona, message_id) as mine:
            p = self.get(persona, message_id)
            if p is None:
                return "nothing parked (delivered or given up)"
            if not mine:  # a turn is sending it right now: look again soon (its deadline is checked then)
                self._schedule_now(p, n, BUSY_DELAY)
                return "busy"
            conf = runtime.settings.personas.get(persona)
            try:
                if conf is None:
                    raise FeishuError(f"persona {persona} is no longer configured")
                sender = runtime.sender(conf)
            except FeishuError as exc:
                self._drop(p, "refused", exc)
                return "dropped"
            delay = backoff(n) * (1 + random.random() * JITTER)
            last_chance = time.time() + delay > p.give_up_at
            older = self.flush(sender, persona, p.chat_id, p.order, skip=message_id)
            if any(o in ("failed", "busy") for o in older.values()) and not last_chance:
                self._schedule_now(p, n + 1, delay)
                return f"waiting behind an older reply; next try in {delay:.0f}s"
            outcome = self._try(sender, p)
            if outcome != "failed":
                return outcome
            if last_chance:
                self._drop(p, "deadline", p.last_error)
                return "given up"
            self._schedule_now(p, n + 1, delay)
            return f"failed; next try in {delay:.0f}s"

    def rescue(self) -> list[str]:
        """Queue a job now for every parked reply whose retry job is overdue; the message ids it queued. Run
        by the workers' sweeper thread; cost O(overdue replies)."""
        now_ms = int(time.time() * 1000)
        late = now_ms - self.overdue_ms
        members = [text(m) for m in self.client.zrangebyscore(DUE, "-inf", late, 0, RESCUE_BATCH)]
        rescued: list[str] = []
        for member in members:
            persona, _, message_id = member.partition("\x1f")
            p = self.get(persona, message_id)
            if p is None:
                self.client.zrem(DUE, member)
                continue
            if self.client.exists(Keys.reply_lock(persona, message_id)):  # being sent right now
                self.client.zadd(DUE, {member: now_ms})
                continue
            self._schedule(None, p, p.attempts, JOB_TIMEOUT)  # queued now; its due mark gives it time to run
            rescued.append(message_id)
            self.metrics.inc("lucid_replies_rescued_total")
            log.warning(
                "parked reply to message=%s (persona %s): its retry job is overdue (worker or scheduler died?);"
                " queued another",
                message_id,
                persona,
            )
        return rescued

    def _schedule_now(self, p: Parked, n: int, delay: float) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            self._schedule(pipe, p, n, delay)
            pipe.execute()


def send_reply(
    runtime: Runtime, sender: FeishuSender, inbound: Inbound, text: str
) -> Literal["delivered", "parked"]:
    """A turn's reply: the chat's parked replies first (oldest first, once each), then this one."""
    started = time.time()
    outbox = Outbox(runtime.redis) if runtime.redis is not None else None
    order = inbound.create_time or int(started * 1000)
    if outbox is not None:
        try:
            own = outbox.flush(sender, inbound.persona, inbound.chat_id, order).get(inbound.message_id)
        except redis.RedisError as exc:  # the turn's own reply matters more than the backlog
            log.warning("parked replies of chat %s not flushed (%s)", inbound.chat_id, type(exc).__name__)
            own = None
        if own == "delivered":  # this turn ran before (its worker died after parking the reply)
            return "delivered"
        if own in ("failed", "busy"):
            return "parked"
        if own == "dropped":
            raise LucidError(f"the parked reply to {inbound.message_id} was given up")
    try:
        sender.reply(inbound.message_id, text, chat_id=inbound.chat_id, in_thread=bool(inbound.thread_id))
        return "delivered"
    except FeishuError as exc:
        if not exc.retryable or outbox is None:
            Metrics(runtime.redis).inc("lucid_replies_undelivered_total", {"reason": "refused"})
            raise
        parked = Parked(
            persona=inbound.persona,
            chat_id=inbound.chat_id,
            message_id=inbound.message_id,
            text=redact(text),  # secrets never reach Redis (the model never saw one: its input is redacted)
            order=order,
            first_try=started,
            give_up_at=started + runtime.settings.reply_deadline,
            chunks_sent=exc.chunks_sent,
            in_thread=bool(inbound.thread_id),
        )
        try:
            outbox.park(parked, exc)
        except redis.RedisError as rexc:
            log.error("reply to message=%s could not be parked (%s)", inbound.message_id, type(rexc).__name__)
            Metrics(runtime.redis).inc("lucid_replies_undelivered_total", {"reason": "not_parked"})
            raise exc from rexc
        return "parked"


def deliver_parked(persona: str, message_id: str, n: int) -> str:
    """RQ job on "chat": retry a parked reply (docs/ARCHITECTURE.md, "Delivery")."""
    runtime = current()
    if runtime.redis is None:
        raise LucidError("parked replies need Redis")
    return Outbox(runtime.redis).retry(runtime, persona, message_id, n)
