"""Per-person ordering of turns: the webhook's `Intake` (dedupe + inbox + job) and the worker's `Mailbox`.

Two messages from one person are answered in order: each accepted message goes into the person's inbox (a
Redis sorted set by Feishu create_time) and a `handle_message` job is enqueued. A job takes the namespace's
turn lease (a Redis lease with heartbeat) and drains the inbox oldest first; a job that finds the lease taken
waits until its own message is answered, or the holder dies and the lease expires. A message leaves the inbox
only after its turn, so a killed worker's message is redone by the next job — safely, because the reply's
uuid is the message id, the raw record is idempotent by id, and upserts of the same text are no-ops.
`depends_on` chains were rejected: a replica can enqueue B before A's job exists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from rq import Queue

from memory_core.errors import LucidError
from memory_core.namespace import Namespace

from .inbound import Inbound
from .redis_backend import RedisLease

log = logging.getLogger(__name__)

SEEN_TTL = 12 * 3600  # ≥ Feishu's 7.1 h retry window
INBOX_TTL = 24 * 3600
TURN_LEASE_MS = 15_000
TURN_JOB_TIMEOUT = 600
MAX_TRIES = 3


# --------------------------------------------------------------------------------------------- ordering

# KEYS: the seen-keys (message id, event id), the job's key, the inbox. A job key that exists means this
# message was enqueued before (its claim expired): still a duplicate. ARGV: ttl, score, member, inbox ttl.
_ACCEPT = """
for i = 1, #KEYS - 1 do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 1, #KEYS - 2 do
  redis.call('SET', KEYS[i], '1', 'EX', ARGV[1])
end
redis.call('ZADD', KEYS[#KEYS], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[#KEYS], ARGV[4])
return 1
"""


def turn_job_id(inbound: Inbound) -> str:
    return "turn-" + hashlib.sha1(f"{inbound.persona}:{inbound.message_id}".encode()).hexdigest()[:32]


def _inbox(ns: Namespace) -> str:
    return f"lucid:inbox:{ns.key}"


def _done_key(inbound: Inbound) -> str:
    return f"lucid:turndone:{inbound.persona}:{inbound.message_id}"


class Intake:
    """The webhook's side of the chat queue: dedupe, the person's inbox, the turn job — nothing slow."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.queue = Queue("chat", connection=client)
        self._accept = client.register_script(_ACCEPT)

    def accept(self, inbound: Inbound) -> bool:
        """Queue a turn for `inbound`; False if it is a duplicate (see `accept_many`)."""
        return self.accept_many([inbound])[0]

    def accept_many(self, batch: Sequence[Inbound]) -> list[bool]:
        """Claim, inbox and enqueue a batch in two round trips; False for each duplicate.

        Duplicate = its message_id or event_id was claimed in the last 12 h, or its job (id derived from
        the message id) exists. The claim is atomic, so of two replicas racing on one message exactly one
        enqueues. Raises redis.RedisError when Redis fails (the webhook answers 503 so Feishu retries);
        claims taken by the batch are released first, so the retry is not mistaken for a duplicate.
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
            keys = [*seen, job_key, _inbox(inbound.ns)]
            self._accept(keys=keys, args=[SEEN_TTL, inbound.create_time, member, INBOX_TTL], client=pipe)
            claims.append((inbound, data, seen, member))
        fresh = [bool(ok) for ok in pipe.execute()]
        if not any(fresh):
            return fresh
        pipe = self.client.pipeline(transaction=False)
        for (inbound, data, _, _), ok in zip(claims, fresh, strict=True):
            if ok:
                self.queue.enqueue_call(
                    "workers.turn.handle_message",  # by name: the turn module imports this one
                    args=(data,),
                    job_id=turn_job_id(inbound),
                    timeout=TURN_JOB_TIMEOUT,
                    result_ttl=3600,
                    failure_ttl=7 * 86400,
                    pipeline=pipe,
                )
        try:
            pipe.execute()
        except BaseException:
            self._release([c for c, ok in zip(claims, fresh, strict=True) if ok])
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


class Mailbox:
    """The worker's side: answer a namespace's messages one at a time, oldest first (see module docs)."""

    def __init__(self, client: redis.Redis, wait: float = TURN_JOB_TIMEOUT - 60, poll: float = 0.05) -> None:
        self.client = client
        self.wait = wait
        self.poll = poll

    def _lease(self, ns: Namespace) -> RedisLease | None:
        key, owner = f"lucid:turnlock:{ns.key}", secrets.token_hex(12)
        if self.client.set(key, owner, nx=True, px=TURN_LEASE_MS):
            return RedisLease(self.client, key, owner, 0, TURN_LEASE_MS)
        return None

    def _done(self, inbound: Inbound) -> bool:
        return bool(self.client.exists(_done_key(inbound)))

    def deliver(self, inbound: Inbound, run: Callable[[Inbound], Any]) -> str:
        ns = inbound.ns
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
                self._drain(ns, run)
                if not self._done(inbound):  # enqueued without an inbox entry (or the inbox expired)
                    self._run_once(inbound, run)
            finally:
                lease.release()
            if not self.client.zcard(_inbox(ns)):
                return "answered"

    def _drain(self, ns: Namespace, run: Callable[[Inbound], Any]) -> None:
        inbox = _inbox(ns)
        while True:
            head: list[Any] = list(self.client.zrange(inbox, 0, 0))
            if not head:
                return
            member: bytes = head[0]
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
