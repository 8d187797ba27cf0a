"""Per-person ordering of turns: the webhook's `Intake` (dedupe + inbox + job) and the worker's `Mailbox`.

Two messages from one person are answered in order: each accepted message goes into the person's inbox (a
Redis sorted set by Feishu create_time) and a `handle_message` job is enqueued. A job takes the namespace's
turn lease (a Redis lease with heartbeat) and drains the inbox oldest first, up to its own message (the later
ones have their own jobs, further back in the queue); a job that finds the lease taken waits until its own
message is answered, or the holder dies and the lease expires. Draining only up to its own message keeps a
backlog fair and fast: a person with fifty queued messages does not hold a worker for fifty replies in a row,
each waiting out the chat's send pacing (4 per second per chat), while everyone else waits; their turns
interleave with other people's in queue order. A recovery job (below) drains the whole inbox. A message leaves the inbox
only after its turn, so a killed worker's message is redone by the next job — safely, because the reply's
uuid is the message id, the raw record is idempotent by id, and upserts of the same text are no-ops.
`depends_on` chains were rejected: a replica can enqueue B before A's job exists.

Recovery without a next message (`Sweeper`, run by every `lucid worker` in a thread): the webhook also marks
the person's inbox in `lucid:inboxes` (a sorted set: namespace → when to look at it). Every SWEEP_SECONDS one
worker (a Redis lock picks it) looks at the marks that are due: an empty inbox is unmarked; one whose turn
lease is held is looked at again at the next sweep; one with pending messages, no lease and none
of its jobs still waiting in the queue (the worker running them was killed, or Redis lost the job) gets a
`handle_message` job for its oldest message, at the front of the chat queue. That job drains the inbox like
any other, under the lease, so nothing is answered twice. A SIGKILLed turn is answered about
TURN_LEASE_MS + SWEEP_SECONDS after the kill. RQ's own handling of the abandoned job was not enough: with a
SimpleWorker the job counts as abandoned only job_timeout + 60 s after the kill, and the registry cleanup
that would retry it runs every 10 minutes.
"""

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
from rq import Queue
from rq.job import JobStatus

from memory_core.errors import LucidError
from memory_core.namespace import Namespace

from .inbound import Inbound
from .metrics import Metrics
from .queues import queue
from .redis_backend import RedisLease, text

log = logging.getLogger(__name__)

SEEN_TTL = 12 * 3600  # ≥ Feishu's 7.1 h retry window
INBOX_TTL = 24 * 3600
TURN_LEASE_MS = 15_000
TURN_JOB_TIMEOUT = 600
MAX_TRIES = 3
INBOXES = "lucid:inboxes"  # namespaces whose inbox may hold messages → when to look (Redis clock, ms)
ACCEPT_GRACE_MS = 5_000  # a fresh message's own job normally starts well within this
RECHECK_MS = 10_000  # an inbox handed to a job (or whose job still waits in the queue) is looked at again
SWEEP_SECONDS = 3.0
SWEEP_BATCH = 500
SWEEP_ITEMS = 50  # jobs of an inbox's oldest messages checked for "still queued"


# --------------------------------------------------------------------------------------------- ordering

# KEYS: the seen-keys (message id, event id), the job's key, the inbox, the inbox marks. A job key that
# exists means this message was enqueued before (its claim expired): still a duplicate.
# ARGV: ttl, score, member, inbox ttl, the namespace key, the grace before a sweep looks at the inbox.
_ACCEPT = """
local n = #KEYS
for i = 1, n - 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 1, n - 3 do
  redis.call('SET', KEYS[i], '1', 'EX', ARGV[1])
end
redis.call('ZADD', KEYS[n - 1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[n - 1], ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[n], string.format('%d', now + tonumber(ARGV[6])), ARGV[5])
return 1
"""

# The sweep's claim on one inbox mark, atomic so two sweepers never both hand it out. KEYS: the marks, the
# inbox, the turn lease. ARGV: the namespace key, the recheck delay (ms), how many members to return.
# Returns the inbox's oldest members when nobody holds its lease (the mark is pushed RECHECK_MS ahead),
# else nil: not due; empty (unmarked); leased (a turn runs: the mark stays due, so the next sweep after the
# lease expired sees it — at most one leased inbox per worker, so that costs little).
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due or tonumber(due) > now then return false end
if redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return false
end
if redis.call('PTTL', KEYS[3]) > 0 then return false end
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
return redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[3]) - 1)
"""


def turn_job_id(inbound: Inbound) -> str:
    return "turn-" + hashlib.sha1(f"{inbound.persona}:{inbound.message_id}".encode()).hexdigest()[:32]


def _inbox(ns: Namespace) -> str:
    return _inbox_of(ns.key)


def _inbox_of(ns_key: str) -> str:
    return f"lucid:inbox:{ns_key}"


def _turnlock_of(ns_key: str) -> str:
    return f"lucid:turnlock:{ns_key}"


def _resumed_key(ns_key: str) -> str:
    return f"lucid:resumed:{ns_key}"


def _done_key(inbound: Inbound) -> str:
    return f"lucid:turndone:{inbound.persona}:{inbound.message_id}"


class Intake:
    """The webhook's side of the chat queue: dedupe, the person's inbox, the turn job — nothing slow."""

    def __init__(self, client: redis.Redis, grace_ms: int = ACCEPT_GRACE_MS) -> None:
        self.client = client
        self.grace_ms = grace_ms
        self.queue = queue("chat", client)
        self._accept = client.register_script(_ACCEPT)

    def accept(self, inbound: Inbound) -> bool:
        """Queue a turn for `inbound`; False if it is a duplicate (see `accept_many`)."""
        ok = self.accept_many([inbound])[0]
        if isinstance(ok, redis.RedisError):
            raise ok
        return ok

    def accept_many(self, batch: Sequence[Inbound]) -> list[bool | redis.RedisError]:
        """Claim, inbox and enqueue a batch in two round trips; False for each duplicate.

        Duplicate = its message_id or event_id was claimed in the last 12 h, or its job (id derived from
        the message id) exists. The claim is atomic, so of two replicas racing on one message exactly one
        enqueues. Raises redis.RedisError when Redis fails (the webhook answers 503 so Feishu retries);
        claims taken by the batch are released first, so the retry is not mistaken for a duplicate. One
        event that Redis refuses (a bad field) fails alone: its entry is the error, its claim is released,
        and the rest of the batch is queued as if it had come alone.
        """
        claims = []
        pipe = self.client.pipeline(transaction=False)
        for inbound in batch:
            seen = [f"lucid:seen:m:{inbound.persona}:{inbound.message_id}"]
            if inbound.event_id:
                seen.append(f"lucid:seen:e:{inbound.persona}:{inbound.event_id}")
            data = inbound.to_json()
            member = json.dumps(data, ensure_ascii=False, sort_keys=True)
            job_key = self.queue.job_class.key_for(turn_job_id(inbound))
            ns_key = inbound.ns.key
            keys = [*seen, job_key, _inbox_of(ns_key), INBOXES]
            grace = self.grace_ms
            self._accept(
                keys=keys, args=[SEEN_TTL, inbound.create_time, member, INBOX_TTL, ns_key, grace], client=pipe
            )
            claims.append((inbound, data, seen, member))
        results = pipe.execute(raise_on_error=False)
        refused = [c for c, r in zip(claims, results, strict=True) if isinstance(r, Exception)]
        if refused:  # a script stopped by an error keeps what it did before: the claim
            self._release(refused)
            errors = sorted({type(r).__name__ for r in results if isinstance(r, Exception)})
            log.warning("refused %d event(s) of a batch of %d: %s", len(refused), len(batch), errors)
        fresh = [r if isinstance(r, redis.RedisError) else bool(r) for r in results]
        if not any(ok is True for ok in fresh):
            return fresh
        pipe = self.client.pipeline(transaction=False)
        for (inbound, data, _, _), ok in zip(claims, fresh, strict=True):
            if ok is True:
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
                pipe.zrem(_inbox(inbound.ns), member)
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
        "workers.turn.handle_message",  # by name: the turn module imports this one
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
    """The worker's side: answer a namespace's messages one at a time, oldest first (see module docs)."""

    def __init__(self, client: redis.Redis, wait: float = TURN_JOB_TIMEOUT - 60, poll: float = 0.05) -> None:
        self.client = client
        self.wait = wait
        self.poll = poll

    def _lease(self, ns: Namespace) -> RedisLease | None:
        key, owner = _turnlock_of(ns.key), secrets.token_hex(12)
        if self.client.set(key, owner, nx=True, px=TURN_LEASE_MS):
            return RedisLease(self.client, key, owner, 0, TURN_LEASE_MS)
        return None

    def _done(self, inbound: Inbound) -> bool:
        return bool(self.client.exists(_done_key(inbound)))

    def deliver(self, inbound: Inbound, run: Callable[[Inbound], Any], drain: bool = False) -> str:
        """Answer `inbound` after every older message of its person; with `drain`, the whole inbox."""
        ns = inbound.ns
        upto = None if drain else inbound.create_time
        deadline = time.monotonic() + self.wait
        while True:
            lease = self._lease(ns)
            if lease is None:
                if self._done(inbound):
                    return "answered by another job"
                if time.monotonic() > deadline:
                    raise LucidError(f"ns {ns.key}: turn lease still held after {self.wait:.0f}s")
                time.sleep(self.poll)
                continue
            try:
                self._drain(ns, run, upto)
                if not self._done(inbound):  # enqueued without an inbox entry (or the inbox expired)
                    self._run_once(inbound, run)
            finally:
                lease.release()
            if upto is not None or not self.client.zcard(_inbox(ns)):
                return "answered"

    def _drain(self, ns: Namespace, run: Callable[[Inbound], Any], upto: int | None = None) -> None:
        """Answer the inbox oldest first; with `upto`, only messages created no later than it."""
        inbox = _inbox(ns)
        while True:
            head: list[Any] = list(self.client.zrange(inbox, 0, 0, withscores=True))
            if not head:
                return
            member: bytes = head[0][0]
            if upto is not None and head[0][1] > upto:
                return
            try:
                item = Inbound.from_json(json.loads(member))
            except (ValueError, TypeError) as exc:
                log.error("dropping an unreadable inbox entry of ns=%s: %s", ns.key, exc)
            else:
                self._run_once(item, run)
            self.client.zrem(inbox, member)

    def _run_once(self, item: Inbound, run: Callable[[Inbound], Any]) -> None:
        if self._done(item):
            return
        tries_key = f"lucid:turntry:{item.persona}:{item.message_id}"
        tries = int(self.client.incr(tries_key))
        self.client.expire(tries_key, SEEN_TTL)
        if tries > MAX_TRIES:  # it killed its worker MAX_TRIES times: skip it rather than block the person
            log.error(
                "giving up on message=%s of ns=%s after %d tries", item.message_id, item.ns.key, tries - 1
            )
        else:
            try:
                run(item)
            except Exception:
                log.exception("turn crashed: ns=%s message=%s", item.ns.key, item.message_id)
        self.client.set(_done_key(item), "1", ex=SEEN_TTL)


# --------------------------------------------------------------------------------------------- recovery

_WAITING = {JobStatus.QUEUED.value, JobStatus.DEFERRED.value, JobStatus.SCHEDULED.value}


class Sweeper:
    """Hands an inbox nobody is draining (its worker died mid-turn) to a new turn job (see module docs).

    Cost: one lock attempt per worker per SWEEP_SECONDS; the one that wins reads the due marks (inboxes
    that got a message in the last few seconds, or that are leased, or stuck) in a few pipelined round
    trips — O(active inboxes), never a scan of Redis.
    """

    LOCK = "lucid:sweeping"

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
        self._claim = client.register_script(_CLAIM)

    def sweep_if_due(self) -> list[str]:
        """Sweep unless another worker did in the last interval; the namespace keys handed to a job."""
        ttl = max(1, int(self.interval * 900))  # a little under the interval: the next tick finds it free
        if not self.client.set(self.LOCK, secrets.token_hex(6), nx=True, px=ttl):
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
                keys=[INBOXES, _inbox_of(key), _turnlock_of(key)],
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
        resumed = self.client.mget([_resumed_key(key) for key, _ in unattended])
        pipe = self.client.pipeline(transaction=False)
        for (_, items), last in zip(unattended, resumed, strict=True):
            ids = [turn_job_id(item) for item in items] + ([text(last)] if last else [])
            for job_id in ids:
                pipe.hget(self.queue.job_class.key_for(job_id), "status")
        statuses = iter(pipe.execute())
        stuck: list[tuple[str, Inbound]] = []
        for (key, items), last in zip(unattended, resumed, strict=True):
            mine = [next(statuses) for _ in range(len(items) + (1 if last else 0))]
            if not any(s is not None and text(s) in _WAITING for s in mine):
                stuck.append((key, items[0]))
        if not stuck:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key, head in stuck:
            job_id = "resume-" + hashlib.sha1(f"{key}:{head.message_id}:{now_ms}".encode()).hexdigest()[:32]
            _enqueue_turn(self.queue, head.to_json(), job_id, pipe, at_front=True, drain=True)
            pipe.set(_resumed_key(key), job_id, ex=INBOX_TTL)
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
