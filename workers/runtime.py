"""The wiring: one `Runtime` built at each entry point (serve, bot, worker, cron, CLI, tests) holds every
shared piece; functions take the piece they need, RQ jobs find it with `current()`, `close()` ends it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

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
from .memory_service import MemoryService
from .memory_switch import ChatSwitch
from .metrics import Metrics
from .redis_backend import Heartbeat, RedisLocker, RedisOpQueue
from .scratch import LocalScratch, RedisScratch, Scratch
from .settings import Persona, Settings, ollama_embed_model

if TYPE_CHECKING:  # lark-oapi costs ~3 s to import: only a process that sends to Feishu pays it
    from .feishu_send import FeishuSender


def make_clock(settings: Settings) -> Callable[[], datetime]:
    """`LUCID_NOW` pins the clock (tests, demos); otherwise the wall clock in UTC."""
    fixed = settings.now
    if fixed is not None:
        return lambda: fixed
    return utcnow


class TurnTime:
    """How long a turn's own work takes on this runtime (a moving average, time asleep in the send pacer
    left out): how early the mailbox starts a paced turn."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def observe(self, seconds: float) -> None:
        self.seconds = 0.7 * self.seconds + 0.3 * max(0.0, seconds)


@dataclass
class Runtime:
    settings: Settings
    store: Store
    writer: Writer
    redis: redis.Redis | None
    clock: Callable[[], datetime]
    llm: LLM | None = None
    heartbeat: Heartbeat = field(default_factory=Heartbeat, repr=False)  # renews this runtime's leases
    scratch: Scratch = field(init=False, repr=False)
    switch: ChatSwitch = field(init=False, repr=False)
    turn_time: TurnTime = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.scratch = RedisScratch(self.redis) if self.redis is not None else LocalScratch()
        self.switch = ChatSwitch(self.redis)
        self.turn_time = TurnTime()
        self._senders: dict[tuple[str, str, str], FeishuSender] = {}
        self._memory: MemoryService | None = None
        self._lock = threading.Lock()

    @property
    def memory(self) -> MemoryService:
        """The memory service (parsed books, search indexes): built on first use, one per runtime."""
        with self._lock:
            if self._memory is None:
                self._memory = MemoryService(self)
            return self._memory

    def sender(self, persona: Persona) -> FeishuSender:
        """The persona's Feishu app, one per app and domain, so the SDK client and connections are reused.
        Raises FeishuError when the persona has no app configured."""
        domain = persona.api_domain(self.settings.feishu_domain)
        key = (persona.app_id, persona.app_secret, domain)
        with self._lock:
            sender = self._senders.get(key)
            if sender is None:
                from .feishu_send import FeishuSender, Pacer

                pacer = Pacer(self.redis, app_limit=(self.settings.send_rate, 60.0))
                sender = FeishuSender(persona, domain, self.redis, pacer=pacer)
                self._senders[key] = sender
            return sender

    def queue(self, name: str) -> Queue:
        """An RQ queue on this runtime's Redis: `chat` (turns), `memory` (extraction), `dream` (low)."""
        if self.redis is None:
            raise LucidError("queues need Redis: set REDIS_URL or run `lucid serve` (embedded Redis)")
        return queues.queue(name, self.redis)

    @contextmanager
    def active(self) -> Iterator[Runtime]:
        """Make this the runtime `current()` returns (in this thread or task) while the block runs."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the threads this runtime started and close its clients (Redis, Ollama)."""
        with self._lock:  # lark-oapi keeps no session of its own: dropping the senders is enough
            memory, self._memory, self._senders = self._memory, None, {}
        if memory is not None:
            memory.close()
        if self.llm is not None:
            self.llm.close()
        self.heartbeat.close()
        if self.redis is not None:
            self.redis.close()


QUEUES = ("chat", "memory", "dream")
_current: ContextVar[Runtime | None] = ContextVar("lucid_runtime", default=None)


def current() -> Runtime:
    """The runtime of the job being run: set by `workers.worker.Worker` around each job (`Runtime.active`).
    Raises outside one: a job never builds its own wiring from the environment."""
    runtime = _current.get()
    if runtime is None:
        raise LucidError(
            "no Lucid runtime is active: RQ jobs run on `lucid worker` (workers.worker.Worker), "
            "other code passes the runtime it was given"
        )
    return runtime


def connect(url: str) -> redis.Redis:
    """A client that fails within about a second when Redis is down (the webhook answers 503 then),
    instead of redis-py's default retries of several seconds."""
    retry = Retry(ExponentialBackoff(cap=0.25, base=0.05), 2)
    return redis.Redis.from_url(
        url, socket_connect_timeout=1, health_check_interval=30, retry=retry, retry_on_timeout=True
    )


def build(
    settings: Settings,
    redis_url: str | None = None,
    git: bool = True,
    clock: Callable[[], datetime] | None = None,
) -> Runtime:
    """A runtime on `redis_url` (or settings.redis_url, or an embedded server already running), on `clock`
    (default: `make_clock`), which the writer and the memory service share."""
    store = Store(settings.data_dir, git=git)
    clock = clock or make_clock(settings)
    vault = derive_key(settings.vault_key) if settings.vault_key else None
    url = redis_url or settings.redis_url or embedded_redis.running_url(settings.data_dir)
    client = connect(url) if url else None
    heartbeat = Heartbeat()
    if client is not None:
        locker = RedisLocker(client, heartbeat=heartbeat)
        writer = Writer(store, locker, RedisOpQueue(client), clock=clock, vault_key=vault)
    else:
        writer = Writer(store, LocalLocker(store), None, clock=clock, vault_key=vault)
    llm = LLM(settings.ollama_host) if _wants_llm(settings) else None
    if llm is not None and client is not None:
        llm.on_call = _llm_metrics(Metrics(client))
    return Runtime(settings, store, writer, client, clock, llm, heartbeat)


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
    models = [settings.chat_model, settings.dream_model, ollama_embed_model(settings.embed_model)]
    models += [p.chat_model for p in settings.personas.values()]
    return any(models)
