"""Wiring: build the store, the writer and the Redis connection from settings, once, at an entry point."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from rq import Queue

from memory_core.entry import utcnow
from memory_core.errors import LucidError
from memory_core.store import Store
from memory_core.vault import derive_key
from memory_core.writer import LocalLocker, Writer

from . import embedded_redis, queues
from .llm import LLM
from .metrics import Metrics
from .redis_backend import RedisLocker, RedisOpQueue
from .settings import Settings


def make_clock(settings: Settings) -> Callable[[], datetime]:
    """`LUCID_NOW` pins the clock (tests, demos); otherwise the wall clock in UTC."""
    fixed = settings.now
    if fixed is not None:
        return lambda: fixed
    return utcnow


@dataclass
class Runtime:
    settings: Settings
    store: Store
    writer: Writer
    redis: redis.Redis | None
    clock: Callable[[], datetime]
    llm: LLM | None = None

    def queue(self, name: str) -> Queue:
        """An RQ queue on this runtime's Redis: `chat` (turns), `memory` (extraction), `dream` (low)."""
        if self.redis is None:
            raise LucidError("queues need Redis: set REDIS_URL or run `lucid serve` (embedded Redis)")
        return queues.queue(name, self.redis)


QUEUES = ("chat", "memory", "dream")
_current: Runtime | None = None


def install(runtime: Runtime) -> None:
    """Make `runtime` the one that RQ jobs in this process use (set by `lucid worker` / `serve`)."""
    global _current
    _current = runtime


def current() -> Runtime:
    """The process's runtime; built from the environment on first use inside a worker process."""
    global _current
    if _current is None:
        _current = build(Settings.from_env())
    return _current


def connect(url: str) -> redis.Redis:
    """A client that fails within about a second when Redis is down (the webhook answers 503 then),
    instead of redis-py's default retries of several seconds."""
    retry = Retry(ExponentialBackoff(cap=0.25, base=0.05), 2)
    return redis.Redis.from_url(
        url, socket_connect_timeout=1, health_check_interval=30, retry=retry, retry_on_timeout=True
    )


def build(settings: Settings, redis_url: str | None = None, git: bool = True) -> Runtime:
    """A runtime on `redis_url` (or settings.redis_url, or an embedded server already running).

    With no Redis at all, the writer falls back to a host-local lock: one machine, same guarantees.
    """
    store = Store(settings.data_dir, git=git)
    clock = make_clock(settings)
    vault = derive_key(settings.vault_key) if settings.vault_key else None
    url = redis_url or settings.redis_url or embedded_redis.running_url(settings.data_dir)
    client = connect(url) if url else None
    if client is not None:
        writer = Writer(store, RedisLocker(client), RedisOpQueue(client), clock=clock, vault_key=vault)
    else:
        writer = Writer(store, LocalLocker(store), None, clock=clock, vault_key=vault)
    llm = LLM(settings.ollama_host) if _wants_llm(settings) else None
    if llm is not None and client is not None:
        llm.on_call = _llm_metrics(Metrics(client))
    return Runtime(settings, store, writer, client, clock, llm)


def _llm_metrics(metrics: Metrics) -> Callable[[str, str, bool, int, int], None]:
    def record(what: str, model: str, ok: bool, prompt: int, completion: int) -> None:
        metrics.inc(
            "lucid_llm_calls_total", {"call": what, "model": model, "outcome": "ok" if ok else "error"}
        )
        if prompt:
            metrics.inc(
                "lucid_llm_tokens_total", {"call": what, "model": model, "direction": "prompt"}, prompt
            )
        if completion:
            metrics.inc(
                "lucid_llm_tokens_total",
                {"call": what, "model": model, "direction": "completion"},
                completion,
            )

    return record


def _wants_llm(settings: Settings) -> bool:
    models = [settings.chat_model, settings.dream_model, settings.embed_model]
    models += [p.chat_model for p in settings.personas.values()]
    return any(models)


@contextlib.contextmanager
def with_redis(settings: Settings) -> Iterator[str]:
    """Yield a Redis URL: REDIS_URL if set, else the embedded server (spawned if needed, stopped after)."""
    if settings.redis_url:
        yield settings.redis_url
        return
    server = embedded_redis.start(settings.data_dir)
    try:
        yield server.url
    finally:
        server.stop()
