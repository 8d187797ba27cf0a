"""TAKE alone, against a real redis-server: the writer's one round trip that either takes a namespace's lease
with the queue's oldest ops (at most MAX_BATCH) and a fencing token above the caller's floor, or — the lease
being held — queues the caller's ops, in order and once. Driven through RedisLocker.acquire and RedisOpQueue
as the writer drives them."""

from __future__ import annotations

import json

import redis

from memory_core.namespace import Namespace
from memory_core.ops import Outcome, Remember
from memory_core.writer import MAX_BATCH, op_json
from workers.redis_backend import RedisLocker, RedisOpQueue
from workers.redis_keys import Keys

NS = Namespace.of("t1", "u1", "default")
OTHER = Namespace.of("t1", "u2", "default")
TTL_MS = 5_000


def _ops(prefix: str, n: int) -> list[Remember]:
    return [Remember(text=f"{prefix}第{i}条") for i in range(n)]


def _queued(client: redis.Redis, ns: Namespace = NS) -> list[str]:
    return [json.loads(r)["text"] for r in client.lrange(Keys.ops(ns.key), 0, -1)]


def test_a_free_lease_comes_with_the_queues_oldest_ops_at_most_a_batch(redis_client: redis.Redis) -> None:
    queue, locker = RedisOpQueue(redis_client), RedisLocker(redis_client, ttl_ms=TTL_MS)
    queued = _ops("早", 600)
    queue.push(NS, queued)
    mine = [op_json(op) for op in _ops("我", 3)]
    lease = locker.acquire(NS, 0.0, 0, push=mine)
    assert lease is not None
    try:
        assert MAX_BATCH == 500
        assert lease.pending == [op_json(op) for op in queued[:MAX_BATCH]]  # the oldest 500, oldest first
        assert lease.token == 1 and redis_client.get(Keys.fence(NS.key)) == b"1"
        assert 0 < redis_client.pttl(Keys.lease(NS.key)) <= TTL_MS
        # Taken: the caller's own ops are not queued (it applies them itself), and nothing was consumed.
        assert _queued(redis_client) == [op.text for op in queued]
        assert lease.held()
    finally:
        lease.release()
    assert redis_client.exists(Keys.lease(NS.key)) == 0


def test_a_free_lease_over_an_empty_queue_has_no_pending_ops(redis_client: redis.Redis) -> None:
    lease = RedisLocker(redis_client, ttl_ms=TTL_MS).acquire(NS, 0.0, 0)
    assert lease is not None
    try:
        assert lease.pending == []  # read, and empty (None would mean "not read")
    finally:
        lease.release()


def test_a_held_lease_queues_the_callers_ops_in_order_once(redis_client: redis.Redis) -> None:
    queue, locker = RedisOpQueue(redis_client), RedisLocker(redis_client, ttl_ms=TTL_MS)
    queue.push(NS, _ops("早", 2))
    holder = locker.acquire(NS, 0.0, 0)
    assert holder is not None
    try:
        mine = _ops("我", 3)
        # Waiting 0.1 s: several attempts, the ops go with the last one only.
        assert locker.acquire(NS, 0.1, 0, push=[op_json(op) for op in mine]) is None
        assert _queued(redis_client) == ["早第0条", "早第1条", "我第0条", "我第1条", "我第2条"]
        assert locker.acquire(NS, 0.0, 0, push=[op_json(_ops("又", 1)[0])]) is None
        assert _queued(redis_client)[-1] == "又第0条" and len(_queued(redis_client)) == 6
        assert locker.acquire(NS, 0.0, 0) is None  # nothing to push: nothing queued
        assert len(_queued(redis_client)) == 6
        assert redis_client.get(Keys.fence(NS.key)) == b"1"  # a refused take draws no token
        assert _queued(redis_client, OTHER) == []  # another namespace's queue is untouched
    finally:
        holder.release()
    # Let go: the next take gets the lease, with what was queued meanwhile, the caller's ops among them.
    nxt = locker.acquire(NS, 0.0, 0)
    assert nxt is not None
    try:
        assert [json.loads(r)["text"] for r in nxt.pending or []] == _queued(redis_client)
        assert nxt.token == 2
    finally:
        nxt.release()


def test_the_fencing_token_is_above_the_floor_and_never_goes_back(redis_client: redis.Redis) -> None:
    """The floor is the fence on disk (the highest token that wrote): a counter lost with Redis's data is
    lifted above it; a stale floor (below the counter) changes nothing, the counter just grows."""
    locker = RedisLocker(redis_client, ttl_ms=TTL_MS)
    tokens = []
    for floor in (0, 41, 43, 3, 0, 47):
        lease = locker.acquire(NS, 0.0, floor)
        assert lease is not None
        tokens.append(lease.token)
        lease.release()
    # 1; lifted to 42 (above 41); the counter's next (43) equal to the floor: lifted to 44; 45 and 46: stale
    # floors change nothing; 47 equal to the floor again: 48.
    assert tokens == [1, 42, 44, 45, 46, 48]
    assert redis_client.get(Keys.fence(NS.key)) == b"48"
    # The counter was wiped (Redis restarted without its data): the disk's floor keeps tokens growing.
    redis_client.delete(Keys.fence(NS.key))
    lease = locker.acquire(NS, 0.0, 48)
    assert lease is not None and lease.token == 49
    lease.release()
    other = locker.acquire(OTHER, 0.0, 0)  # each namespace has its own counter
    assert other is not None and other.token == 1
    other.release()


def test_take_and_finish_survive_a_server_without_their_scripts_or_a_dropped_connection(
    redis_url: str,
) -> None:
    """TAKE and FINISH go out as a bare EVALSHA on a pooled connection (`redis_backend.run`): a server that
    lost its scripts (restarted) or closed the connection gets them as a script call would, loaded and on a
    new connection, and the lease is taken and let go as usual."""
    client, other = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url)
    queue, locker = RedisOpQueue(client), RedisLocker(client, ttl_ms=TTL_MS)
    client.ping()
    for breaking in (other.script_flush, lambda: other.client_kill_filter(_type="normal", skipme=True)):
        breaking()
        lease = locker.acquire(NS, 0.0, 0)
        assert lease is not None and lease.pending == []
        assert queue.finish(NS, [], [], [Outcome("o", "added", id="x")], MAX_BATCH, lease) is None  # let go
        assert other.exists(Keys.lease(NS.key)) == 0
    client.close()
    other.close()
