"""The Redis lease against a real redis-server: a live holder keeps it by heartbeat, and nobody else gets it.

The heartbeat is what lets a batch run longer than the lease's TTL; without renewals the lease would lapse
under a working holder and a second process would take the namespace. The test waits several TTLs and
asserts what Redis says, not how long anything took.
"""

from __future__ import annotations

import threading
import time

import redis

from memory_core.namespace import Namespace
from workers.redis_backend import Heartbeat, RedisLocker

NS = Namespace.of("t1", "u1", "default")
TTL_MS = 600


def test_a_live_holder_keeps_its_lease_past_several_ttls(redis_client: redis.Redis) -> None:
    locker = RedisLocker(redis_client, ttl_ms=TTL_MS)
    lease = locker.acquire(NS, 1.0, 0)
    assert lease is not None
    key = f"lucid:lease:{NS.key}"
    try:
        owner = redis_client.get(key)
        for _ in range(8):  # 8 × 300 ms = 4 TTLs: without renewal the key would have expired long ago
            time.sleep(TTL_MS / 2000)
            assert redis_client.get(key) == owner and redis_client.pttl(key) > 0
            assert lease.held()
        assert locker.acquire(NS, 0.0, 0) is None  # nobody else gets the namespace meanwhile
    finally:
        lease.release()
    assert redis_client.get(key) is None  # released at once, not left to expire
    other = locker.acquire(NS, 0.0, 0)
    assert other is not None and other.token > lease.token
    other.release()


def test_a_lease_taken_over_in_redis_is_reported_lost(redis_client: redis.Redis) -> None:
    """If the key's owner changes (it expired and someone else took it), the next heartbeat marks it lost."""
    lease = RedisLocker(redis_client, ttl_ms=TTL_MS).acquire(NS, 1.0, 0)
    assert lease is not None
    try:
        redis_client.set(f"lucid:lease:{NS.key}", "someone-else", px=10_000)
        for _ in range(20):
            if not lease.held():
                break
            time.sleep(TTL_MS / 3000)
        assert not lease.held()
    finally:
        lease.release()
    assert redis_client.get(f"lucid:lease:{NS.key}") == b"someone-else"  # release never drops another's


def test_a_short_lease_taken_while_the_heartbeat_waits_on_a_long_one_is_renewed_in_time(
    redis_client: redis.Redis,
) -> None:
    """The runtime's one heartbeat thread sleeps until the next lease is due; a lease due sooner than that
    must wake it, or it lapses under its working holder (and a second process takes the namespace)."""
    heartbeat = Heartbeat()
    locker = RedisLocker(redis_client, ttl_ms=60_000, heartbeat=heartbeat)
    long = locker.acquire(Namespace.of("t1", "long", "default"), 1.0, 0)
    assert long is not None
    time.sleep(0.05)  # the heartbeat thread is now asleep until the long lease is due (20 s)
    short = RedisLocker(redis_client, ttl_ms=TTL_MS, heartbeat=heartbeat).acquire(NS, 1.0, 0)
    assert short is not None
    try:
        for _ in range(8):  # 4 TTLs of the short lease
            time.sleep(TTL_MS / 2000)
            assert short.held()
        assert RedisLocker(redis_client).acquire(NS, 0.0, 0) is None
    finally:
        short.release()
        long.release()


def test_a_closed_heartbeat_stops_its_thread_and_renews_nothing(redis_client: redis.Redis) -> None:
    """The heartbeat belongs to its runtime (no process-wide registry): `Runtime.close()` closes it, its
    thread ends, and a lease still held then simply expires in Redis instead of being kept alive."""
    before = set(threading.enumerate())
    heartbeat = Heartbeat()
    lease = RedisLocker(redis_client, ttl_ms=TTL_MS, heartbeat=heartbeat).acquire(NS, 1.0, 0)
    assert lease is not None
    (thread,) = [t for t in threading.enumerate() if t not in before and t.name == "lease-heartbeat"]
    time.sleep(TTL_MS / 1000)  # renewed meanwhile: still there after a whole ttl
    assert redis_client.get(f"lucid:lease:{NS.key}") is not None
    heartbeat.close()
    thread.join(5)
    assert not thread.is_alive()
    for _ in range(30):
        if redis_client.get(f"lucid:lease:{NS.key}") is None:
            break
        time.sleep(TTL_MS / 3000)
    assert redis_client.get(f"lucid:lease:{NS.key}") is None  # expired: nobody renews it any more
