"""Per-person ordering and fair turns: the webhook's `Intake`, the worker's `Mailbox`, and the `Sweeper` that
recovers an inbox whose worker died (docs/ARCHITECTURE.md, "Ordering and fairness")."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from rq import Queue, get_current_job
from rq.job import JobStatus

from memory_core.namespace import Namespace

from .feishu_send import paced_seconds
from .inbound import Inbound
from .metrics import Metrics
from .queues import queue
from .redis_backend import ACCEPT, CLAIM, COMPARE_AND_DELETE, HAND_ON, Heartbeat, take, text
from .redis_keys import Keys
from .runtime import TurnTime, current
from .turn import busy_notice, chat_pace, feishu_turn

log = logging.getLogger(__name__)

SEEN_TTL = 12 * 3600  # ≥ Feishu's 7.1 h retry window
INBOX_TTL = 24 * 3600
TURN_LEASE_MS = 15_000
TURN_JOB_TIMEOUT = 600
MAX_TRIES = 3
INBOXES = Keys.INBOXES  # namespaces whose inbox may hold messages → when to look (Redis clock, ms)
ACCEPT_GRACE_MS = 5_000  # a fresh message's own job normally starts well within this
RECHECK_MS = 10_000  # an inbox handed to a job (or whose job still waits in the queue) is looked at again
SWEEP_SECONDS = 3.0
SWEEP_BATCH = 500
SWEEP_ITEMS = 50  # jobs of an inbox's oldest messages checked for "still queued"
TURN_BATCH = 1  # messages a turn job answers before it hands on to the back of the queue
BUSY_BACKLOG = 8  # unanswered messages of one person at which they are told, once, to slow down
BUSY_TTL = 3600
PACE_YIELD_MS = 20  # a chat whose next send slot is further off than this: hand on instead of sleeping
PACE_POLL = 0.01  # seconds between looks at the chat queue while a paced job waits for its chat's slot
MAX_LEAD = 0.25  # a paced turn starts at most this long before its chat's slot (one slot at 4/s)


def turn_job_id(inbound: Inbound) -> str:
    return "turn-" + hashlib.sha1(f"{inbound.persona}:{inbound.message_id}".encode()).hexdigest()[:32]


def _done_key(inbound: Inbound) -> str:
    return Keys.turn_done(inbound.persona, inbound.message_id)


class Intake:
    """The webhook's side of the chat queue: dedupe, the person's inbox, the turn job — nothing slow."""

    def __init__(self, client: redis.Redis, grace_ms: int = ACCEPT_GRACE_MS) -> None:
        self.client = client
        self.grace_ms = grace_ms
        self.queue = queue("chat", client)
        self._accept = client.register_script(ACCEPT)
        self._release_job = client.register_script(COMPARE_AND_DELETE)

    def accept(self, inbound: Inbound) -> bool:
        """Queue a turn for `inbound`; False if it is a duplicate (see `accept_many`)."""
        ok = self.accept_many([inbound])[0]
        if isinstance(ok, redis.RedisError):
            raise ok
        return ok

    def accept_many(self, batch: Sequence[Inbound]) -> list[bool | redis.RedisError]:
        """Claim, inbox and enqueue a batch in two round trips; False for each duplicate."""
        claims = []
        pipe = self.client.pipeline(transaction=False)
        for inbound in batch:
            seen = [Keys.seen_message(inbound.persona, inbound.message_id)]
            if inbound.event_id:
                seen.append(Keys.seen_event(inbound.persona, inbound.event_id))
            data = inbound.to_json()
            member = _member(inbound)
            job_key = self.queue.job_class.key_for(turn_job_id(inbound))
            ns_key = inbound.ns.key
            keys = [*seen, job_key, Keys.inbox(ns_key), INBOXES, Keys.turn_job(ns_key)]
            grace, job_id = self.grace_ms, turn_job_id(inbound)
            self._accept(
                keys=keys,
                args=[SEEN_TTL, inbound.create_time, member, INBOX_TTL, ns_key, grace, job_id],
                client=pipe,
            )
            claims.append((inbound, data, seen, member))
        results = pipe.execute(raise_on_error=False)
        refused = [c for c, r in zip(claims, results, strict=True) if isinstance(r, Exception)]
        if refused:  # a script stopped by an error keeps what it did before: the claim
            self._release(refused)
            errors = sorted({type(r).__name__ for r in results if isinstance(r, Exception)})
            log.warning("refused %d event(s) of a batch of %d: %s", len(refused), len(batch), errors)
        fresh = [r if isinstance(r, redis.RedisError) else bool(r) for r in results]
        # 2: the person had no turn job, so this message's job becomes it; 1: their turn job will answer it
        enqueue = [not isinstance(r, Exception) and int(r) == 2 for r in results]
        if not any(enqueue):
            return fresh
        pipe = self.client.pipeline(transaction=False)
        for (inbound, data, _, _), go in zip(claims, enqueue, strict=True):
            if go:
                _enqueue_turn(self.queue, data, turn_job_id(inbound), pipe)
        try:
            pipe.execute()
        except BaseException:
            self._release([c for c, ok in zip(claims, fresh, strict=True) if ok is True])
            raise
        return fresh

    def _release(self, claims: list[tuple[Inbound, dict[str, Any], list[str], str]]) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for inbound, _, seen, member in claims:
                pipe.delete(*seen)
                pipe.zrem(Keys.inbox(inbound.ns.key), member)
                self._release_job(
                    keys=[Keys.turn_job(inbound.ns.key)], args=[turn_job_id(inbound)], client=pipe
                )
            pipe.execute()
        except redis.RedisError:
            log.error(
                "could not release the claims of %d message(s); Feishu's retries will look like duplicates",
                len(claims),
            )


def _enqueue_turn(
    queue: Queue, data: dict[str, Any], job_id: str, pipe: Any, at_front: bool = False, drain: bool = False
) -> None:
    queue.enqueue_call(
        handle_message,
        args=(data,),
        kwargs={"drain": True} if drain else None,
        job_id=job_id,
        timeout=TURN_JOB_TIMEOUT,
        result_ttl=3600,
        failure_ttl=7 * 86400,
        at_front=at_front,
        pipeline=pipe,
    )


class Mailbox:
    """The worker's side: a person's turn job answers their oldest message(s), then hands on."""

    def __init__(
        self,
        client: redis.Redis,
        batch: int = TURN_BATCH,
        busy_backlog: int = BUSY_BACKLOG,
        pace: Callable[[Inbound], float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        lead: TurnTime | None = None,
        slept: Callable[[], float] = lambda: 0.0,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.client = client
        self.heartbeat = heartbeat if heartbeat is not None else Heartbeat()  # renews the turn lease
        self.sleep, self.clock = sleep, clock  # the wait for a paced chat's slot (tests inject both)
        self.lead = lead if lead is not None else TurnTime()  # the runtime's estimate (handle_message)
        self.slept = slept  # seconds this thread has slept in send pacing so far (not a turn's own work)
        self.batch = max(1, batch)
        self.busy_backlog = busy_backlog
        self.pace = pace  # seconds until a message's chat may be sent to again (Feishu's pacing)
        self.queue = queue("chat", client)
        self._hand_on = client.register_script(HAND_ON)

    def _done(self, inbound: Inbound) -> bool:
        return bool(self.client.exists(_done_key(inbound)))

    def deliver(
        self,
        inbound: Inbound,
        run: Callable[[Inbound], Any],
        drain: bool = False,
        job_id: str | None = None,
        busy: Callable[[Inbound, int], Any] | None = None,
    ) -> str:
        """One turn job of `inbound`'s person: their oldest `batch` message(s), then hand on or stop."""
        ns = inbound.ns
        if job_id is not None and self._superseded(ns.key, job_id):
            return "another job has this inbox"
        lease = take(self.client, Keys.turn_lock(ns.key), TURN_LEASE_MS, heartbeat=self.heartbeat)
        if lease is None:  # its holder hands on when it is done (the sweep, if the holder died)
            return "another turn holds this inbox"
        try:
            if busy is not None:
                self._tell_busy(ns, busy)
            answered = self._drain(ns, run)
            if not self._done(inbound) and self.client.zscore(Keys.inbox(ns.key), _member(inbound)) is None:
                self._run_once(inbound, run)  # enqueued without an inbox entry (or the inbox expired)
                answered += 1
            handed = self._hand_on_next(ns)
        finally:
            lease.release()
        return f"answered {answered}" + ("; handed on" if handed else "")

    def _superseded(self, ns_key: str, job_id: str) -> bool:
        """Another job is this person's turn job and still waits in the queue: it will do the work."""
        owner = self.client.get(Keys.turn_job(ns_key))
        if owner is None or text(owner) == job_id:
            return False
        status = self.client.hget(self.queue.job_class.key_for(text(owner)), "status")
        return status is not None and text(status) in _WAITING

    def _drain(self, ns: Namespace, run: Callable[[Inbound], Any]) -> int:
        """Answer up to `batch` of the inbox's oldest messages; how many were answered."""
        inbox, answered = Keys.inbox(ns.key), 0
        while answered < self.batch:
            head: list[Any] = list(self.client.zrange(inbox, 0, 0))
            if not head:
                break
            member: bytes = head[0]
            try:
                item = Inbound.from_json(json.loads(member))
            except (ValueError, TypeError) as exc:
                log.error("dropping an unreadable inbox entry of ns=%s: %s", ns.key, exc)
                self.client.zrem(inbox, member)
                continue
            if self._paced(item):
                break
            self._run_once(item, run)
            self.client.zrem(inbox, member)
            answered += 1
        return answered

    def _paced(self, item: Inbound) -> bool:
        """True: hand on. While Feishu's pacing holds the chat, wait here for its slot and hand on as soon as
        another chat's job waits for a worker; else start the turn just before its slot (4/s a chat)."""
        if self.pace is None or self._done(item):
            return False
        try:
            ahead = self.pace(item)
        except Exception:  # pacing is a courtesy: never block a turn over it
            return False
        deadline = self.clock() + ahead
        # Twice a turn's usual time: a turn that runs long then still makes its slot (starting late costs the
        # chat a slot; starting early costs a short sleep in the pacer).
        lead = min(2 * self.lead.seconds + PACE_YIELD_MS / 1000, MAX_LEAD)
        seen = 0  # looks in a row that found a job waiting: an idle worker takes one within a look
        while ahead > lead:
            seen = seen + 1 if self.queue.count > 0 else 0
            if seen >= 2:
                return True
            self.sleep(min(PACE_POLL, ahead))
            ahead = deadline - self.clock()
        return False

    def _tell_busy(self, ns: Namespace, busy: Callable[[Inbound, int], Any]) -> None:
        inbox = Keys.inbox(ns.key)
        backlog = int(self.client.zcard(inbox))
        if backlog < self.busy_backlog or not self.client.set(Keys.busy(ns.key), "1", nx=True, ex=BUSY_TTL):
            return
        newest: list[Any] = list(self.client.zrange(inbox, -1, -1))
        try:
            busy(Inbound.from_json(json.loads(newest[0])), backlog)
        except Exception:  # a notice must never cost the answers
            log.exception("busy notice failed: ns=%s", ns.key)

    def _hand_on_next(self, ns: Namespace) -> bool:
        """Under the lease: the person's next turn job at the back of the queue, or none (inbox empty)."""
        job_id = "turn-next-" + secrets.token_hex(12)
        keys = [Keys.inbox(ns.key), Keys.turn_job(ns.key), Keys.busy(ns.key)]
        if not self._hand_on(keys=keys, args=[job_id, INBOX_TTL]):
            return False
        head: list[Any] = list(self.client.zrange(Keys.inbox(ns.key), 0, 0))
        data = json.loads(head[0]) if head else None
        if not isinstance(data, dict):
            return False  # unreadable: the next turn (or the sweep) drops it
        pipe = self.client.pipeline(transaction=False)
        _enqueue_turn(self.queue, data, job_id, pipe)
        pipe.execute()
        return True

    def _run_once(self, item: Inbound, run: Callable[[Inbound], Any]) -> None:
        if self._done(item):
            return
        tries_key = Keys.turn_tries(item.persona, item.message_id)
        tries = int(self.client.incr(tries_key))
        self.client.expire(tries_key, SEEN_TTL)
        if tries > MAX_TRIES:  # it killed its worker MAX_TRIES times: skip it rather than block the person
            log.error(
                "giving up on message=%s of ns=%s after %d tries", item.message_id, item.ns.key, tries - 1
            )
        else:
            started, paced = self.clock(), self.slept()
            try:
                run(item)
            except Exception:
                log.exception("turn crashed: ns=%s message=%s", item.ns.key, item.message_id)
            self.lead.observe(self.clock() - started - (self.slept() - paced))
        self.client.set(_done_key(item), "1", ex=SEEN_TTL)


def _member(inbound: Inbound) -> str:
    """The inbox member of `inbound`, exactly as the webhook wrote it."""
    return json.dumps(inbound.to_json(), ensure_ascii=False, sort_keys=True)


_WAITING = {JobStatus.QUEUED.value, JobStatus.DEFERRED.value, JobStatus.SCHEDULED.value}


class Sweeper:
    """Hands an inbox nobody drains (its worker died mid-turn) to a new turn job (docs/ARCHITECTURE.md)."""

    LOCK = Keys.SWEEPING

    def __init__(
        self,
        client: redis.Redis,
        interval: float = SWEEP_SECONDS,
        recheck_ms: int = RECHECK_MS,
        also: Sequence[Callable[[], object]] = (),
    ) -> None:
        self.client = client
        self.also = tuple(also)  # further watchdogs run under the same lock (the outbox's `rescue`)
        self.interval = interval
        self.recheck_ms = recheck_ms
        self.queue = queue("chat", client)
        self._claim = client.register_script(CLAIM)

    def sweep_if_due(self) -> list[str]:
        """Sweep unless another worker did in the last interval; the namespace keys handed to a job."""
        ttl = max(1, int(self.interval * 900))  # a little under the interval: the next tick finds it free
        if take(self.client, self.LOCK, ttl) is None:  # left to expire: one sweep per interval
            return []
        for watchdog in self.also:
            watchdog()
        return self.sweep()

    def sweep(self) -> list[str]:
        """One pass over the due marks; returns the namespace keys it queued a job for."""
        seconds, micros = self.client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        due = [text(k) for k in self.client.zrangebyscore(INBOXES, "-inf", now_ms, start=0, num=SWEEP_BATCH)]
        if not due:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in due:
            self._claim(
                keys=[INBOXES, Keys.inbox(key), Keys.turn_lock(key)],
                args=[key, self.recheck_ms, SWEEP_ITEMS],
                client=pipe,
            )
        unattended: list[tuple[str, list[Inbound]]] = []
        for key, members in zip(due, pipe.execute(), strict=True):
            items = _readable(key, members or [])
            if items:
                unattended.append((key, items))
        if not unattended:
            return []
        # Is one of the inbox's jobs (its messages' own, or the last one queued here) still waiting for a
        # worker? Then it is a backlog, not a death: that job will drain the inbox.
        resumed = self.client.mget([Keys.resumed(key) for key, _ in unattended])
        owners = self.client.mget([Keys.turn_job(key) for key, _ in unattended])
        pipe = self.client.pipeline(transaction=False)
        counts = []
        for (_, items), last, owner in zip(unattended, resumed, owners, strict=True):
            ids = [turn_job_id(item) for item in items] + [text(j) for j in (last, owner) if j]
            counts.append(len(ids))
            for job_id in ids:
                pipe.hget(self.queue.job_class.key_for(job_id), "status")
        statuses = iter(pipe.execute())
        stuck: list[tuple[str, Inbound]] = []
        for (key, items), n in zip(unattended, counts, strict=True):
            mine = [next(statuses) for _ in range(n)]
            if not any(s is not None and text(s) in _WAITING for s in mine):
                stuck.append((key, items[0]))
        if not stuck:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key, head in stuck:
            job_id = "resume-" + hashlib.sha1(f"{key}:{head.message_id}:{now_ms}".encode()).hexdigest()[:32]
            _enqueue_turn(self.queue, head.to_json(), job_id, pipe, at_front=True, drain=True)
            pipe.set(Keys.resumed(key), job_id, ex=INBOX_TTL)
            pipe.set(Keys.turn_job(key), job_id, ex=INBOX_TTL)  # the person's turn job from now on
        pipe.execute()
        Metrics(self.client).inc("lucid_turns_recovered_total", value=len(stuck))
        for key, head in stuck:
            log.warning(
                "ns=%s: message=%s waits with no live turn (its worker died?); queued a turn to answer it",
                key,
                head.message_id,
            )
        return [key for key, _ in stuck]

    def run(self, stop: threading.Event) -> None:
        """Sweep every `interval` (±10 %) until `stop` is set; Redis errors are logged, never raised."""
        jitter = secrets.SystemRandom()
        failing = False
        while True:
            try:
                self.sweep_if_due()
                failing = False
            except redis.RedisError as exc:
                if not failing:  # once per outage, not every few seconds from every worker
                    log.warning("inbox sweep failed (retrying every %.0f s): %s", self.interval, exc)
                failing = True
            except Exception:  # a bug here must not stop the sweeping for the life of the worker
                log.exception("inbox sweep failed")
            if stop.wait(self.interval * jitter.uniform(0.9, 1.1)):
                return


def _readable(key: str, members: list[Any]) -> list[Inbound]:
    items = []
    for member in members:
        try:
            items.append(Inbound.from_json(json.loads(member)))
        except (ValueError, TypeError) as exc:
            log.error("an unreadable inbox entry of ns=%s (the next turn drops it): %s", key, exc)
    return items


def handle_message(event: dict[str, Any], drain: bool = False) -> str:
    """RQ job on "chat": the turn job of `event`'s person (`event`: an `Inbound` as JSON) — their oldest
    message(s) in order, then the rest handed on to the back of the queue (`mailbox`; `drain` is legacy)."""
    runtime = current()
    inbound = Inbound.from_json(event)
    if runtime.redis is None:
        feishu_turn(runtime, inbound)
        return "answered"
    job = get_current_job()
    mailbox = Mailbox(
        runtime.redis,
        pace=lambda item: chat_pace(runtime, item),
        lead=runtime.turn_time,
        slept=paced_seconds,
        heartbeat=runtime.heartbeat,
    )
    return mailbox.deliver(
        inbound,
        lambda item: feishu_turn(runtime, item),
        drain=drain,
        job_id=job.id if job is not None else None,
        busy=lambda item, backlog: busy_notice(runtime, item, backlog),
    )
