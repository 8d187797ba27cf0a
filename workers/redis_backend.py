"""Redis for every part: its Lua scripts, the one lock (`take`), the writer's op queue (key names:
`redis_keys`).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis

from memory_core.namespace import Namespace
from memory_core.ops import Op, Outcome
from memory_core.writer import Lease, op_json

from .metrics import label_text
from .redis_keys import Keys

log = logging.getLogger(__name__)

WRITES = "lucid_memory_writes_total"  # counted in the batch's own transaction: no extra round trip


# ------------------------------------------------------------------------------------------ Lua scripts

# The lock. KEYS: the lock[, its fencing counter]. ARGV: the owner, the ttl (ms), the lowest token allowed.
# Returns 0 (taken by someone else), else the fencing token (1 for an unfenced lock).
TAKE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
if #KEYS < 2 then return 1 end
local f = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if f <= floor then
  f = floor + 1
  redis.call('SET', KEYS[2], f)
end
return f
"""
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# Delete KEYS[1] only if it still holds ARGV[1] (a lock's owner, a turn job's id).
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# The mailbox (`workers.mailbox`): per-person ordering and its recovery.

# KEYS: the seen-keys (message id, event id), the job's key, the inbox, the inbox marks, the person's turn
# job. A job key that exists means this message was enqueued before (its claim expired): still a duplicate.
# ARGV: ttl, score, member, inbox ttl, the namespace key, the grace before a sweep looks at the inbox, the
# job id this message's job would have.
# Returns 0 (duplicate), 1 (inboxed; the person's turn job will answer it), 2 (inboxed; enqueue its job).
ACCEPT = """
local n = #KEYS
for i = 1, n - 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 1, n - 4 do
  redis.call('SET', KEYS[i], '1', 'EX', ARGV[1])
end
redis.call('ZADD', KEYS[n - 2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[n - 2], ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[n - 1], string.format('%d', now + tonumber(ARGV[6])), ARGV[5])
if redis.call('SET', KEYS[n], ARGV[7], 'NX', 'EX', ARGV[4]) then return 2 end
return 1
"""

# A turn job's end, under the lease. KEYS: the inbox, the person's turn job, the busy-notice flag. ARGV: the
# next job's id, its ttl. Empty inbox: no turn job any more (the next message enqueues one), notice reset;
# else the next job is the person's turn job (returns 1: enqueue it).
HAND_ON = """
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2], KEYS[3])
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
"""

# The sweep's claim on one inbox mark, atomic so two sweepers never both hand it out. KEYS: the marks, the
# inbox, the turn lease. ARGV: the namespace key, the recheck delay (ms), how many members to return.
# Returns the inbox's oldest members when nobody holds its lease (the mark is pushed RECHECK_MS ahead),
# else nil: not due; empty (unmarked); leased (a turn runs: the mark stays due, so the next sweep after the
# lease expired sees it — at most one leased inbox per worker, so that costs little).
CLAIM = """
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

# Feishu's send pacing (`feishu_send.Pacer`): one GCRA cell per key. KEYS: the app's buckets, then the chat's
# (when the send has a chat). ARGV: per bucket its interval and burst tolerance (ms), then the horizon (ms),
# whether the chat's slot is already held (1: taken by an earlier call of this send, which slept until it)
# and whether there is a chat bucket. Returns {ms until the slot, 1 if every bucket is taken / 0 if only the
# chat's}: a chat whose slot is further off than the horizon gets its slot alone, and the app's buckets are
# taken only when the send is about to go, so one chat's pacing never pushes the app's next slot (and with
# it every other chat's reply) into the future.
PACE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
local horizon = tonumber(ARGV[2 * n + 1])
local held = ARGV[2 * n + 2] == '1'
local has_chat = ARGV[2 * n + 3] == '1'
local apps = n
if has_chat then apps = n - 1 end
local slot = now
local tats = {}
for i = 1, apps do
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  tats[i] = tat
  local earliest = tat - tonumber(ARGV[2 * i])
  if earliest > slot then slot = earliest end
end
local chat_tat = now
if has_chat then
  chat_tat = tonumber(redis.call('GET', KEYS[n]) or '0')
  if chat_tat < now then chat_tat = now end
  if not held then
    if chat_tat - now > horizon then
      local nxt = chat_tat + tonumber(ARGV[2 * n - 1])
      redis.call('SET', KEYS[n], nxt, 'PX', math.ceil(nxt - now) + 2000)
      return {chat_tat - now, 0}
    end
    if chat_tat > slot then slot = chat_tat end
  end
end
for i = 1, apps do
  local tat = tats[i]
  if slot > tat then tat = slot end
  local nxt = tat + tonumber(ARGV[2 * i - 1])
  redis.call('SET', KEYS[i], nxt, 'PX', math.ceil(nxt - now) + 2000)
end
if has_chat then
  local nxt = slot + tonumber(ARGV[2 * n - 1])
  if held and chat_tat > nxt then nxt = chat_tat end
  redis.call('SET', KEYS[n], nxt, 'PX', math.ceil(nxt - now) + 2000)
end
return {slot - now, 1}
"""

# The viewer's failed logins of one client in the last LOGIN_WINDOW, on Redis's clock (`viewer.Sessions`).
# KEYS: the client's key. ARGV: the window (ms), 1 to count a new failure (0 to look), a random member.
# Returns how many are in the window.
FAILED_LOGINS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))
if ARGV[2] == '1' then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return redis.call('ZCARD', KEYS[1])
"""

# The writer's op queue: drop the ops a batch applied. KEYS: the queue. ARGV: the ops as queued.
FINISH = """
for i = 1, #ARGV do
  redis.call('LREM', KEYS[1], 1, ARGV[i])
end
return #ARGV
"""

# ------------------------------------------------------------------------------------------------ lock


class RedisLease:
    """A held lock. With `heartbeat`, a daemon thread renews it every ttl/3 and any failure marks it lost at
    once; without, it simply expires after its ttl unless released first."""

    def __init__(
        self, client: redis.Redis, key: str, owner: str, token: int, ttl_ms: int, heartbeat: bool = True
    ) -> None:
        self._client = client
        self._key = key
        self._owner = owner
        self.token = token
        self._ttl = ttl_ms / 1000
        self._renewed = time.monotonic()
        self._lost = False
        self._stop = threading.Event()
        if heartbeat:
            self._renew = client.register_script(RENEW)
            threading.Thread(target=self._heartbeat, name=f"lease-{key}", daemon=True).start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._ttl / 3):
            try:
                if not self._renew(keys=[self._key], args=[self._owner, int(self._ttl * 1000)]):
                    self._lost = True
                    return
                self._renewed = time.monotonic()
            except redis.RedisError:
                self._lost = True
                return

    def held(self) -> bool:
        # A process paused past its TTL may wake with the thread not yet run: trust the clock, not hope.
        return not self._lost and time.monotonic() - self._renewed < self._ttl * 0.9

    def release(self) -> None:
        self._stop.set()
        try:
            self._client.eval(COMPARE_AND_DELETE, 1, self._key, self._owner)
        except redis.RedisError:
            log.warning("could not release lease %s (it will expire)", self._key)


def take(
    client: redis.Redis,
    key: str,
    ttl_ms: int,
    *,
    heartbeat: bool = True,
    fence_key: str | None = None,
    floor: int = 0,
) -> RedisLease | None:
    """The lock on `key` if nobody holds it (one attempt), else None. With `fence_key`, its token is the next
    value of that counter and above `floor`.

    The lock (`take`) is a `SET NX PX` with a random owner, released only by its owner (compare-and-delete),
    renewed by a heartbeat while held, and — for the writer — fenced: a token from a counter that only grows,
    which the store checks on disk (`memory_core.store.Store.fenced`), so a paused holder cannot write.
    """
    owner = secrets.token_hex(12)
    keys = [key] if fence_key is None else [key, fence_key]
    token = int(client.register_script(TAKE)(keys=keys, args=[owner, ttl_ms, floor]))
    if not token:
        return None
    return RedisLease(client, key, owner, token if fence_key else 0, ttl_ms, heartbeat)


class RedisLocker:
    """The writer's lock per namespace: fenced and renewed, waited for up to `wait` seconds."""

    def __init__(self, client: redis.Redis, ttl_ms: int = 10_000) -> None:
        self.client = client
        self.ttl_ms = ttl_ms

    def acquire(self, ns: Namespace, wait: float, floor: int) -> Lease | None:
        deadline = time.monotonic() + wait
        delay = 0.002
        while True:
            held = take(
                self.client, Keys.lease(ns.key), self.ttl_ms, fence_key=Keys.fence(ns.key), floor=floor
            )
            if held is not None:
                return held
            if time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


# ------------------------------------------------------------------------------------ the writer's ops


class RedisOpQueue:
    """Pending ops per namespace and their outcomes, shared by every process on every host."""

    def __init__(self, client: redis.Redis, result_ttl: int = 600) -> None:
        self.client = client
        self.result_ttl = result_ttl
        self._finish = client.register_script(FINISH)

    def push(self, ns: Namespace, ops: Sequence[Op]) -> None:
        self.client.rpush(Keys.ops(ns.key), *[op_json(op) for op in ops])

    def pending(self, ns: Namespace, limit: int) -> list[str]:
        raw = self.client.lrange(Keys.ops(ns.key), 0, limit - 1)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    def finish(
        self,
        ns: Namespace,
        raw_ops: Sequence[str],
        outcomes: Sequence[Outcome],
        applied: Sequence[Outcome] = (),
    ) -> None:
        pipe = self.client.pipeline(transaction=True)
        for outcome in outcomes:
            key = Keys.result(outcome.op_id)
            pipe.rpush(key, json.dumps(outcome.to_json(), ensure_ascii=False))
            pipe.expire(key, self.result_ttl)
        for kind, n in Counter(str(o.kind) for o in applied).items():
            pipe.hincrbyfloat(Keys.METRICS, WRITES + label_text({"outcome": kind}), n)
        pipe.execute()
        if raw_ops:
            self._finish(keys=[Keys.ops(ns.key)], args=list(raw_ops))

    def results(self, op_ids: Sequence[str], wait: float) -> dict[str, Outcome]:
        found: dict[str, Outcome] = {}
        if not op_ids:
            return found
        pipe = self.client.pipeline(transaction=False)
        for op_id in op_ids:
            pipe.lpop(Keys.result(op_id))
        for op_id, raw in zip(op_ids, pipe.execute(), strict=True):
            if raw is not None:
                found[op_id] = Outcome.from_json(json.loads(raw))
        if found or wait <= 0:
            return found
        got = self.client.blpop([Keys.result(i) for i in op_ids], timeout=wait)
        if got is not None:
            key, raw = got
            op_id = (key.decode() if isinstance(key, bytes) else str(key)).rsplit(":", 1)[1]
            found[op_id] = Outcome.from_json(json.loads(raw))
        return found


def text(value: Any) -> str:
    """A Redis reply (bytes, or str with decode_responses) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
