"""Redis for every part: its Lua scripts, the one lock (`take`), the writer's op queue (key names:
`redis_keys`)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from memory_core.namespace import Namespace
from memory_core.ops import Op, Outcome
from memory_core.writer import MAX_BATCH, Lease, op_json

from .metrics import label_text
from .redis_keys import Keys

log = logging.getLogger(__name__)

WRITES = "lucid_memory_writes_total"  # counted in the batch's own transaction: no extra round trip


# The lock. KEYS: the lock[, its fencing counter[, the writer's op queue]]. ARGV: the owner, the ttl (ms), the
# lowest token allowed[, how many queued ops to return, then ops to queue if the lock is taken].
# Returns 0 (taken by someone else; the ops given are queued), else the fencing token (1 for an unfenced
# lock), or with a queue {token, its oldest ops}: one round trip takes the writer's lease and its batch.
TAKE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if #ARGV > 4 then redis.call('RPUSH', KEYS[3], unpack(ARGV, 5)) end
  return 0
end
if #KEYS < 2 then return 1 end
local f = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if f <= floor then
  f = floor + 1
  redis.call('SET', KEYS[2], f)
end
if #KEYS < 3 then return f end
return {f, redis.call('LRANGE', KEYS[3], 0, tonumber(ARGV[4]) - 1)}
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

# A parked reply (`workers.outbox`) to a message whose fact was forgotten: its text replaced, if it is still
# parked (never a stray hash without the others' fields). KEYS: the reply's hash. ARGV: the new text.
REWRITE_PARKED = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HSET', KEYS[1], 'text', ARGV[1]) end
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
# else nil: not due, empty (unmarked) or leased (the mark stays due for the sweep after the lease expires).
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
# (if any). ARGV: per bucket its interval and burst tolerance (ms), the horizon (ms), whether the chat's slot
# is already held (by an earlier call of this send) and whether there is a chat bucket. Returns {ms until the
# slot, 1 if every bucket is taken / 0 if only the chat's}: the app's buckets are taken only when the send is
# about to go, so one chat's pacing never pushes every other chat's reply into the future.
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

# The writer's op queue: a batch's outcomes. KEYS: the queue, the metrics hash, the writer's lease, the result
# list of each queued op. ARGV: the results' ttl, how many queued ops to return, the lease's owner to release
# it if nothing is queued ('' to keep it), per queued op (its queued form, outcome, metric field), then the
# metric fields of the never-queued ops. An outcome is published and counted only while its op is queued,
# dropping it, so a batch published twice counts nothing twice. Returns the oldest queued, or nil: released.
FINISH = """
local n = #KEYS - 3
for i = 1, n do
  local a = 3 * i + 1
  if redis.call('LREM', KEYS[1], 1, ARGV[a]) == 1 then
    redis.call('RPUSH', KEYS[3 + i], ARGV[a + 1])
    redis.call('EXPIRE', KEYS[3 + i], ARGV[1])
    redis.call('HINCRBYFLOAT', KEYS[2], ARGV[a + 2], 1)
  end
end
for i = 3 * n + 4, #ARGV do
  redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], 1)
end
if ARGV[3] ~= '' and redis.call('LLEN', KEYS[1]) == 0 then
  if redis.call('GET', KEYS[3]) == ARGV[3] then redis.call('DEL', KEYS[3]) end
  return false
end
if tonumber(ARGV[2]) == 0 then return {} end
return redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
"""


class Heartbeat:
    """One thread that renews every lease it was given at a third of its ttl (a thread per lease cost a
    thread start, a scheduling round on a loaded machine, per write). The runtime owns one; `close()`."""

    def __init__(self) -> None:
        self._leases: dict[int, RedisLease] = {}
        self._wake = threading.Condition()
        self._pid = 0
        self._until = 0.0  # when the thread wakes next on its own
        self._closed = False

    def add(self, lease: RedisLease) -> None:
        with self._wake:
            self._leases[id(lease)] = lease
            if self._pid != os.getpid():  # first use (in this process)
                self._pid = os.getpid()
                self._closed = False
                threading.Thread(target=self._run, name="lease-heartbeat", daemon=True).start()
            if lease.due < self._until:  # else it wakes in time anyway: no thread switch per write
                self._wake.notify()

    def discard(self, lease: RedisLease) -> None:
        with self._wake:
            self._leases.pop(id(lease), None)

    def close(self) -> None:
        """Stop the thread (leases still held are no longer renewed; they expire)."""
        with self._wake:
            self._closed = True
            self._pid = 0
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                if self._closed:
                    return
                now = time.monotonic()
                due = [lease for lease in self._leases.values() if lease.due <= now]
                if not due:
                    self._until = min((lease.due for lease in self._leases.values()), default=now + 60)
                    self._wake.wait(max(self._until - now, 0.001))
                    self._until = 0.0  # awake: an add need not notify
                    continue
            for lease in due:  # outside the lock: a round trip each
                lease.beat()


class RedisLease:
    """A held lock: with a `heartbeat` renewed every ttl/3 (a failure marks it lost at once), else it
    expires after its ttl. `pending`: the writer's queued ops read with the lease (None: not read)."""

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        owner: str,
        token: int,
        ttl_ms: int,
        heartbeat: Heartbeat | None = None,
        pending: list[str] | None = None,
    ) -> None:
        self._client = client
        self._key = key
        self._owner = owner
        self.token = token
        self.pending = pending
        self._ttl = ttl_ms / 1000
        self._renewed = time.monotonic()
        self._lost = False
        self._stop = threading.Event()
        self.due = self._renewed + self._ttl / 3
        self._heartbeat = heartbeat
        if heartbeat is not None:
            heartbeat.add(self)

    def beat(self) -> None:
        """Renew the lease (the heartbeat thread); a refusal or an error marks it lost."""
        if self._stop.is_set():
            return
        try:
            if self._client.register_script(RENEW)(
                keys=[self._key], args=[self._owner, int(self._ttl * 1000)]
            ):
                self._renewed = time.monotonic()
                self.due = self._renewed + self._ttl / 3
                return
        except Exception:  # any failure: lost (and the heartbeat thread lives on)
            pass
        self._lost = True
        self._stop_renewing()

    @property
    def owner(self) -> str:
        return self._owner

    def gone(self) -> None:
        """Released elsewhere (by the writer's FINISH, with its batch's outcomes): stop renewing it."""
        self._stop.set()
        self._stop_renewing()

    def _stop_renewing(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.discard(self)

    def held(self) -> bool:
        if self._stop.is_set():
            return False
        # A process paused past its TTL may wake with the thread not yet run: trust the clock, not hope.
        return not self._lost and time.monotonic() - self._renewed < self._ttl * 0.9

    def release(self) -> None:
        if self._stop.is_set():
            return
        self.gone()
        try:
            self._client.register_script(COMPARE_AND_DELETE)(keys=[self._key], args=[self._owner])
        except redis.RedisError:
            log.warning("could not release lease %s (it will expire)", self._key)


def take(
    client: redis.Redis,
    key: str,
    ttl_ms: int,
    *,
    heartbeat: Heartbeat | None = None,
    fence_key: str | None = None,
    floor: int = 0,
    queue_key: str | None = None,
    peek: int = 0,
    push: Sequence[str] = (),
) -> RedisLease | None:
    """The lock on `key` if free (`SET NX PX`, released only by its owner), else None; `fence_key` gives a
    growing token above `floor`, `queue_key` reads `peek` queued ops or queues `push` (ARCHITECTURE.md)."""
    owner = secrets.token_hex(12)
    keys = [key] if fence_key is None else [key, fence_key]
    args: list[str | int] = [owner, ttl_ms, floor]
    if queue_key is not None and fence_key is not None:
        keys.append(queue_key)
        args += [max(peek, 1), *push]
    got = run(client, client.register_script(TAKE), keys, args)
    if not got:
        return None
    pending = None
    if isinstance(got, list):
        got, pending = got[0], [text(r) for r in got[1]]
    return RedisLease(client, key, owner, int(got) if fence_key else 0, ttl_ms, heartbeat, pending)


class RedisLocker:
    """The writer's lock per namespace: fenced and renewed, waited for up to `wait` seconds; taken with the
    namespace's first queued ops (`pending`), or, with `push`, those ops queued if it is not free."""

    def __init__(self, client: redis.Redis, ttl_ms: int = 10_000, heartbeat: Heartbeat | None = None) -> None:
        self.client = client
        self.ttl_ms = ttl_ms
        self.heartbeat = heartbeat if heartbeat is not None else Heartbeat()

    def acquire(self, ns: Namespace, wait: float, floor: int, push: Sequence[str] = ()) -> Lease | None:
        deadline = time.monotonic() + wait
        delay = 0.002
        while True:
            last = time.monotonic() >= deadline
            held = take(
                self.client,
                Keys.lease(ns.key),
                self.ttl_ms,
                heartbeat=self.heartbeat,
                fence_key=Keys.fence(ns.key),
                floor=floor,
                queue_key=Keys.ops(ns.key),
                peek=MAX_BATCH,
                push=push if last else (),
            )
            if held is not None or last:
                return held
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


class RedisOpQueue:
    """Pending ops per namespace and their outcomes, shared by every process on every host."""

    def __init__(self, client: redis.Redis, result_ttl: int = 600) -> None:
        self.client = client
        self.result_ttl = result_ttl
        self._finish = client.register_script(FINISH)

    def push(self, ns: Namespace, ops: Sequence[Op]) -> None:
        self.client.rpush(Keys.ops(ns.key), *[op_json(op) for op in ops])

    def pending(self, ns: Namespace, limit: int) -> list[str]:
        return [text(r) for r in self.client.lrange(Keys.ops(ns.key), 0, limit - 1)]

    def finish(
        self,
        ns: Namespace,
        raw_ops: Sequence[str],
        outcomes: Sequence[Outcome],
        own: Sequence[Outcome] = (),
        limit: int = 0,
        let_go: Lease | None = None,
    ) -> list[str] | None:
        owner = let_go.owner if isinstance(let_go, RedisLease) else ""
        keys = [Keys.ops(ns.key), Keys.METRICS, Keys.lease(ns.key), *(Keys.result(o.op_id) for o in outcomes)]
        args: list[str | int] = [self.result_ttl, limit, owner]
        for raw, outcome in zip(raw_ops, outcomes, strict=True):
            args += [raw, json.dumps(outcome.to_json(), ensure_ascii=False), _metric(outcome)]
        args += [_metric(o) for o in own]
        got = run(self.client, self._finish, keys, args)
        if got is None:
            assert isinstance(let_go, RedisLease)
            let_go.gone()
            return None
        return [text(r) for r in got]

    def results(self, op_ids: Sequence[str], wait: float) -> dict[str, Outcome]:
        """The outcomes published for `op_ids` so far; with `wait`, blocks up to that long for the first."""
        found: dict[str, Outcome] = {}
        if op_ids and wait > 0:
            got = self.client.blpop([Keys.result(i) for i in op_ids], timeout=wait)
            if got is None:
                return found
            op_id = text(got[0]).rsplit(":", 1)[1]
            found[op_id] = Outcome.from_json(json.loads(got[1]))
            op_ids = [i for i in op_ids if i != op_id]
        if not op_ids:
            return found
        pipe = self.client.pipeline(transaction=False)
        for op_id in op_ids:
            pipe.lpop(Keys.result(op_id))
        for op_id, raw in zip(op_ids, pipe.execute(), strict=True):
            if raw is not None:
                found[op_id] = Outcome.from_json(json.loads(raw))
        return found


def run(client: redis.Redis, script: Script, keys: Sequence[str], args: Sequence[str | int]) -> Any:
    """`script(keys=keys, args=args)` as a bare EVALSHA on a pooled connection (redis-py's retry and
    observability layers were a third of the call's CPU); a missing script or a failed connection: `script`."""
    if client.connection is not None:  # a single-connection client: its own lock and path
        return script(keys=keys, args=args)
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
        return conn.read_response()
    except NoScriptError:
        pass
    except (redis.ConnectionError, redis.TimeoutError):
        conn.disconnect()  # type: ignore[no-untyped-call]
    finally:
        pool.release(conn)
    return script(keys=keys, args=args)


def _metric(outcome: Outcome) -> str:
    return WRITES + label_text({"outcome": str(outcome.kind)})


def text(value: Any) -> str:
    """A Redis reply (bytes, or str with decode_responses) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
