"""Redis adapters for the single writer: a lease with heartbeat and fencing token, and the op queue.

Keys (all under `lucid:`): `lease:<ns>` the holder's random owner string (PX ttl); `fence:<ns>` the
fencing counter (INCR); `ops:<ns>` the pending ops (JSON, oldest first); `res:<op_id>` an op's outcome.
The fencing token is what keeps a paused holder from writing: the store refuses a token older than the
newest one recorded on disk, whatever the holder believes (see memory_core.store.Store.fenced).
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from memory_core.namespace import Namespace
from memory_core.ops import Op, Outcome
from memory_core.writer import Lease, op_json

log = logging.getLogger(__name__)

_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = redis.call('INCR', KEYS[2])
  local floor = tonumber(ARGV[3])
  if f <= floor then
    f = floor + 1
    redis.call('SET', KEYS[2], f)
  end
  return f
end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_FINISH = """
for i = 1, #ARGV do
  redis.call('LREM', KEYS[1], 1, ARGV[i])
end
return #ARGV
"""


class RedisLease:
    """A held lease. A daemon thread renews it every ttl/3; any failure marks it lost at once."""

    def __init__(self, client: redis.Redis, key: str, owner: str, token: int, ttl_ms: int) -> None:
        self._client = client
        self._key = key
        self._owner = owner
        self.token = token
        self._ttl = ttl_ms / 1000
        self._renewed = time.monotonic()
        self._lost = False
        self._stop = threading.Event()
        self._renew = client.register_script(_RENEW)
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease-{key}", daemon=True)
        self._thread.start()

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
            self._client.eval(_RELEASE, 1, self._key, self._owner)
        except redis.RedisError:
            log.warning("could not release lease %s (it will expire)", self._key)


class RedisLocker:
    def __init__(self, client: redis.Redis, ttl_ms: int = 10_000) -> None:
        self.client = client
        self.ttl_ms = ttl_ms
        self._acquire = client.register_script(_ACQUIRE)

    def acquire(self, ns: Namespace, wait: float, floor: int) -> Lease | None:
        key = f"lucid:lease:{ns.key}"
        owner = secrets.token_hex(12)
        deadline = time.monotonic() + wait
        delay = 0.002
        while True:
            token = int(self._acquire(keys=[key, f"lucid:fence:{ns.key}"], args=[owner, self.ttl_ms, floor]))
            if token:
                return RedisLease(self.client, key, owner, token, self.ttl_ms)
            if time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


class RedisOpQueue:
    """Pending ops per namespace and their outcomes, shared by every process on every host."""

    def __init__(self, client: redis.Redis, result_ttl: int = 600) -> None:
        self.client = client
        self.result_ttl = result_ttl
        self._finish = client.register_script(_FINISH)

    def push(self, ns: Namespace, ops: Sequence[Op]) -> None:
        self.client.rpush(f"lucid:ops:{ns.key}", *[op_json(op) for op in ops])

    def pending(self, ns: Namespace, limit: int) -> list[str]:
        raw = self.client.lrange(f"lucid:ops:{ns.key}", 0, limit - 1)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    def finish(self, ns: Namespace, raw_ops: Sequence[str], outcomes: Sequence[Outcome]) -> None:
        pipe = self.client.pipeline(transaction=True)
        for outcome in outcomes:
            key = f"lucid:res:{outcome.op_id}"
            pipe.rpush(key, json.dumps(outcome.to_json(), ensure_ascii=False))
            pipe.expire(key, self.result_ttl)
        pipe.execute()
        self._finish(keys=[f"lucid:ops:{ns.key}"], args=list(raw_ops))

    def results(self, op_ids: Sequence[str], wait: float) -> dict[str, Outcome]:
        found: dict[str, Outcome] = {}
        if not op_ids:
            return found
        pipe = self.client.pipeline(transaction=False)
        for op_id in op_ids:
            pipe.lpop(f"lucid:res:{op_id}")
        for op_id, raw in zip(op_ids, pipe.execute(), strict=True):
            if raw is not None:
                found[op_id] = Outcome.from_json(json.loads(raw))
        if found or wait <= 0:
            return found
        got = self.client.blpop([f"lucid:res:{i}" for i in op_ids], timeout=wait)
        if got is not None:
            key, raw = got
            op_id = (key.decode() if isinstance(key, bytes) else str(key)).rsplit(":", 1)[1]
            found[op_id] = Outcome.from_json(json.loads(raw))
        return found


def text(value: Any) -> str:
    """A Redis reply (bytes, or str with decode_responses) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
