"""One chat turn — the same function for Feishu (an RQ job) and for `lucid chat` — and its ordering.

    run_turn: command? → record the message → assemble memory → model with `manage_memory` (or memory-only)
              → reply → record the reply → hit feedback → background extraction

The bot never goes silent: without a chat model, or with Ollama down or slow, explicit requests are handled
deterministically (`intents.parse_intent`) and questions answered from memory, with a plain note saying so.

Ordering (two messages from one person are answered in order): the webhook puts each accepted message in
the person's inbox (a Redis sorted set by Feishu create_time) and enqueues `handle_message`. A job takes
the namespace's turn lease (a Redis lease with heartbeat) and drains the inbox oldest first; a job that
finds the lease taken waits until its own message is answered, or the holder dies and the lease expires.
A message leaves the inbox only after its turn, so a killed worker's message is redone by the next job —
safely, because the reply's uuid is the message id, the raw record is idempotent by id, and upserts of
the same text are no-ops. `depends_on` chains were rejected: a replica can enqueue B before A's job exists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis
from rq import Queue

from memory_core.entry import TYPES, Entry
from memory_core.errors import LucidError
from memory_core.intents import classify_type, is_memorable, parse_intent
from memory_core.lineformat import RawMessage
from memory_core.namespace import Namespace
from memory_core.ops import Edit, Forget, Op, Outcome, Pin, Remember
from memory_core.recall import visible_in
from memory_core.secretscan import redact
from memory_core.store import DREAMS
from memory_core.subjects import canonical_subject, recognise

from . import dreaming
from .extraction import extract_turn
from .feishu_send import FeishuError, sender_for
from .llm import LLMError, LLMUnavailable
from .memory_service import Assembly, MemoryService
from .metrics import Metrics
from .redis_backend import RedisLease
from .runtime import Runtime, current
from .settings import Persona

log = logging.getLogger(__name__)

SEEN_TTL = 12 * 3600  # ≥ Feishu's 7.1 h retry window
INBOX_TTL = 24 * 3600
SESSION_TTL = 30 * 60
TURN_LEASE_MS = 15_000
TURN_JOB_TIMEOUT = 600
MAX_TRIES = 3


# --------------------------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Mention:
    """Someone else @mentioned in the message (never the bot itself)."""

    name: str
    open_id: str
    union_id: str = ""

    @property
    def user(self) -> str:
        return self.union_id or self.open_id


@dataclass(frozen=True)
class Inbound:
    """One message for the bot, as routing made it: JSON-safe, so it can ride an RQ job."""

    tenant: str
    user: str  # union_id when present (stable across a developer's apps), else open_id
    open_id: str
    persona: str
    chat_id: str
    chat_type: str  # "p2p" or "group"
    message_id: str
    text: str  # @_user_N placeholders resolved, the bot's own mention removed
    mentioned_bot: bool = False
    create_time: int = 0  # milliseconds since the epoch, as Feishu sends it
    event_id: str = ""
    mentions: tuple[Mention, ...] = ()

    @property
    def ns(self) -> Namespace:
        return Namespace.of(self.tenant, self.user, self.persona)

    @property
    def group(self) -> bool:
        return self.chat_type != "p2p"

    @property
    def scope(self) -> str:
        """Where what is learned from this message may be shown again (DESIGN §3 `scope`)."""
        return f"g:{self.chat_id}" if self.group else "p2p"

    def created(self, fallback: datetime) -> datetime:
        if self.create_time <= 0:
            return fallback
        return datetime.fromtimestamp(self.create_time / 1000, UTC).replace(microsecond=0)

    def to_json(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies and costs more than the rest of the webhook's work.
        data = {name: getattr(self, name) for name in _INBOUND_FIELDS}
        data["mentions"] = [
            {"name": m.name, "open_id": m.open_id, "union_id": m.union_id} for m in self.mentions
        ]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Inbound:
        mentions = tuple(Mention(**m) for m in data.get("mentions") or ())
        names = set(cls.__dataclass_fields__) - {"mentions"}
        return cls(**{k: v for k, v in data.items() if k in names}, mentions=mentions)


_INBOUND_FIELDS = tuple(name for name in Inbound.__dataclass_fields__ if name != "mentions")


@dataclass
class TurnResult:
    """What a turn did, for logs, the CLI and tests (never persisted)."""

    reply: str = ""
    mode: str = ""  # command, model, memory (no model or model down), error
    delivered: bool = False
    outcomes: list[Outcome] = field(default_factory=list)
    recalled: list[str] = field(default_factory=list)
    tool_calls: int = 0
    ms: float = 0.0


@dataclass(frozen=True)
class TurnLimits:
    """Budgets of one turn. The model gets `model_budget` seconds in all (its calls are cut to what is
    left); when it is spent or the model is down, the turn answers from memory and skips the model for
    `model_cooldown` seconds, so a dead Ollama costs one timeout, not one per message."""

    model_budget: float = 45.0
    tool_rounds: int = 3
    history_turns: int = 6
    model_cooldown: float = 30.0


# --------------------------------------------------------------------------------------------- the turn

_services: dict[int, tuple[Runtime, MemoryService]] = {}
_services_lock = threading.Lock()


def service(runtime: Runtime) -> MemoryService:
    """The process's memory service for `runtime` (it caches parsed books and search indexes)."""
    with _services_lock:
        held = _services.get(id(runtime))
        if held is None or held[0] is not runtime:
            held = (runtime, MemoryService(runtime))
            _services[id(runtime)] = held
        return held[1]


def run_turn(
    runtime: Runtime,
    inbound: Inbound,
    reply_fn: Callable[[str], Any],
    limits: TurnLimits | None = None,
) -> TurnResult:
    """Answer one message. Never raises for a person's input or a backend failure: the reply says so."""
    limits = limits or TurnLimits()
    started = time.monotonic()
    result = TurnResult()
    persona = runtime.settings.personas.get(inbound.persona) or Persona(inbound.persona)
    mem = service(runtime)
    scratch = Scratch(runtime.redis)
    after: Callable[[], None] | None = None
    try:
        command = parse_command(inbound.text)
        if command is not None:
            result.mode = "command"
            result.reply = run_command(runtime, mem, persona, inbound, *command)
        else:
            after = _converse(runtime, mem, scratch, persona, inbound, limits, result)
    except Exception:  # a bug must cost one polite answer, not the person's trust; the log has the ids
        log.exception("turn failed: ns=%s message=%s", inbound.ns.key, inbound.message_id)
        result.mode = "error"
        result.reply = say(inbound, "error")
    try:
        reply_fn(result.reply)
        result.delivered = True
    except LucidError as exc:
        log.error("reply not delivered: ns=%s message=%s (%s)", inbound.ns.key, inbound.message_id, exc)
    if after is not None and result.delivered:  # an answer nobody saw is not recorded as said
        try:
            after()
        except Exception:
            log.exception("after-turn step failed: ns=%s message=%s", inbound.ns.key, inbound.message_id)
    result.ms = (time.monotonic() - started) * 1000
    log.info(
        "turn ns=%s message=%s mode=%s delivered=%s ops=%d recalled=%d tools=%d ms=%.0f",
        inbound.ns.key,
        inbound.message_id,
        result.mode,
        result.delivered,
        len(result.outcomes),
        len(result.recalled),
        result.tool_calls,
        result.ms,
    )
    return result


def _converse(
    runtime: Runtime,
    mem: MemoryService,
    scratch: Scratch,
    persona: Persona,
    inbound: Inbound,
    limits: TurnLimits,
    result: TurnResult,
) -> Callable[[], None]:
    """Record, recall, answer; returns the steps that run once the answer is delivered."""
    ns, now = inbound.ns, runtime.clock()
    session = scratch.session(f"{ns.key}:{inbound.chat_id}", inbound.message_id)
    mem.record(
        ns, _raw(inbound.message_id, inbound.created(now), "user", inbound.text, inbound, "user", session)
    )
    assembly = mem.assemble(
        ns, inbound.text, chat_type=inbound.chat_type, chat=inbound.chat_id, session=session, now=now
    )
    result.recalled = [s.entry.id for s in assembly.recalled]
    model = persona.chat_model or runtime.settings.chat_model
    history_key = f"{ns.key}:{inbound.chat_id}"
    note = "no_model"
    if model and runtime.llm is not None:
        note = "model_down"
        if not scratch.flagged("llm-down"):
            try:
                history = scratch.history(history_key)
                result.reply = _model_reply(
                    runtime, mem, persona, inbound, assembly, model, history, limits, result
                )
                result.mode = "model"
            except LLMError as exc:
                log.warning(
                    "model %s failed for ns=%s message=%s: %s", model, ns.key, inbound.message_id, exc
                )
                if isinstance(exc, LLMUnavailable):
                    scratch.flag("llm-down", limits.model_cooldown)
    if result.mode == "model":
        _safety_net(mem, inbound, result)
    else:
        result.mode = "memory"
        result.reply = memory_reply(runtime, mem, inbound, assembly, note, result.outcomes)

    def after() -> None:
        mem.feedback(ns, result.recalled, now)  # queued first: it rides the reply's record batch
        said = _raw(
            f"{inbound.message_id}:reply",
            runtime.clock(),
            persona.name,
            result.reply,
            inbound,
            "assistant",
            session,
        )
        mem.record(ns, said, wait=False)
        if result.mode == "model" and model:
            scratch.add_history(history_key, inbound.text, result.reply, limits.history_turns)
            _enqueue_extraction(runtime, inbound, result.reply)

    return after


def _raw(
    ident: str, ts: datetime, speaker: str, text: str, inbound: Inbound, role: str, session: str
) -> RawMessage:
    return RawMessage(
        id=ident,
        ts=ts,
        speaker=speaker,
        text=text,
        chat=inbound.chat_id,
        chat_type=inbound.chat_type,
        role=role,
        session=session,
    )


# --------------------------------------------------------------------------------------------- the model

MANAGE_MEMORY: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "manage_memory",
        "description": (
            "Change the long-term memory about the user you are talking to. Use it when the user asks you to "
            "remember, correct, forget or pin something, or states a lasting fact about themselves. "
            "Never store passwords, keys or other secrets."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["add", "update", "forget", "pin"]},
                "text": {
                    "type": "string",
                    "description": "add/update: the memory, one short self-contained sentence",
                },
                "target": {
                    "type": "string",
                    "description": "update/forget/pin: the memory's id or words from it",
                },
                "type": {
                    "type": "string",
                    "enum": ["instruction", "preference", "fact", "identity", "context"],
                },
                "subject": {
                    "type": "string",
                    "description": "the attribute it sets, e.g. 所在地, employer, name",
                },
            },
            "required": ["action"],
        },
    },
}


def _model_reply(
    runtime: Runtime,
    mem: MemoryService,
    persona: Persona,
    inbound: Inbound,
    assembly: Assembly,
    model: str,
    history: list[dict[str, str]],
    limits: TurnLimits,
    result: TurnResult,
) -> str:
    """Chat with the model, looping its `manage_memory` calls back at most `tool_rounds` times."""
    llm = runtime.llm
    assert llm is not None
    where = "a group chat" if inbound.group else "a private chat"
    system = f"{persona.system_prompt}\n\nNow: {runtime.clock():%Y-%m-%d %H:%M} UTC, in {where}."
    if assembly.block:
        system += "\n\n" + assembly.block
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, *history]
    messages.append({"role": "user", "content": inbound.text})
    deadline = time.monotonic() + limits.model_budget
    for round_no in range(limits.tool_rounds + 1):
        left = deadline - time.monotonic()
        if left <= 0.05:
            raise LLMUnavailable("the turn's model budget is spent")
        tools = [MANAGE_MEMORY] if round_no < limits.tool_rounds else None
        answer = llm.chat(model, messages, tools=tools, timeout=min(llm.timeout, left))
        if not answer.tool_calls or tools is None:
            return answer.content.strip() or confirm(inbound, result.outcomes)
        calls = answer.tool_calls[:5]
        messages.append(
            {
                "role": "assistant",
                "content": answer.content,
                "tool_calls": [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls],
            }
        )
        for call in calls:
            result.tool_calls += 1
            reply = tool_call(mem, runtime, inbound, call.name, call.arguments, result.outcomes)
            messages.append(
                {"role": "tool", "tool_name": call.name, "content": json.dumps(reply, ensure_ascii=False)}
            )
    raise LLMError("tool loop did not finish")  # unreachable: the last round offers no tools


def _safety_net(mem: MemoryService, inbound: Inbound, result: TurnResult) -> None:
    """What memory-only mode would store (记住…, 我住在…) is stored even if the model skipped its tool."""
    kind, payload = deterministic_intent(inbound.text)
    if kind != "remember" or any(o.ok and o.status != "unchanged" for o in result.outcomes):
        return
    result.outcomes.extend(mem.apply(inbound.ns, [remember_op(payload, inbound)]))


# --------------------------------------------------------------------------------------------- extraction


def _enqueue_extraction(runtime: Runtime, inbound: Inbound, reply: str) -> None:
    """Background extraction on "memory" (never trust the model alone to save); text is redacted first."""
    if not is_memorable(inbound.text):
        return
    args = (str(inbound.ns), redact(inbound.text), redact(reply), inbound.message_id, inbound.scope)
    if runtime.redis is None:  # the terminal chat without Redis: after the reply was printed
        extract_turn(*args)
        return
    job_id = "extract-" + hashlib.sha1(f"{inbound.persona}:{inbound.message_id}".encode()).hexdigest()[:24]
    try:
        runtime.queue("memory").enqueue_call(
            extract_turn, args=args, job_id=job_id, timeout=600, result_ttl=3600, failure_ttl=86400
        )
    except redis.RedisError as exc:
        log.warning("extraction not queued for message=%s: %s", inbound.message_id, type(exc).__name__)


# --------------------------------------------------------------------------------------------- scratch


class Scratch:
    """Short-lived conversation state: the session id, recent turns for the model, the model-down flag.

    In Redis when there is one (every worker sees the same), else in this process (the terminal chat).
    Message text kept here is redacted first.
    """

    _local: ClassVar[dict[str, tuple[float, Any]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, client: redis.Redis | None) -> None:
        self.client = client

    def _get(self, key: str) -> Any:
        with self._lock:
            held = self._local.get(key)
            return held[1] if held and held[0] > time.monotonic() else None

    def _set(self, key: str, value: Any, ttl: float) -> None:
        with self._lock:
            self._local[key] = (time.monotonic() + ttl, value)

    def session(self, key: str, candidate: str) -> str:
        """The chat's session id: kept while messages come within 30 minutes of each other."""
        full = f"lucid:session:{key}"
        if self.client is not None:
            pipe = self.client.pipeline()
            pipe.set(full, candidate, nx=True, ex=SESSION_TTL)
            pipe.get(full)
            pipe.expire(full, SESSION_TTL)
            value = pipe.execute()[1]
            return value.decode() if isinstance(value, bytes) else str(value or candidate)
        value = self._get(full) or candidate
        self._set(full, value, SESSION_TTL)
        return str(value)

    def history(self, key: str) -> list[dict[str, str]]:
        full = f"lucid:history:{key}"
        if self.client is not None:
            raw = self.client.lrange(full, 0, -1)
            return [json.loads(r) for r in reversed(raw)]
        return list(self._get(full) or [])

    def add_history(self, key: str, user: str, assistant: str, turns: int) -> None:
        full = f"lucid:history:{key}"
        pair = [
            {"role": "user", "content": redact(user)},
            {"role": "assistant", "content": redact(assistant)},
        ]
        if self.client is not None:
            pipe = self.client.pipeline()
            pipe.lpush(full, *[json.dumps(m, ensure_ascii=False) for m in pair])
            pipe.ltrim(full, 0, 2 * turns - 1)
            pipe.expire(full, SESSION_TTL)
            pipe.execute()
            return
        self._set(full, (list(self._get(full) or []) + pair)[-2 * turns :], SESSION_TTL)

    def flag(self, name: str, ttl: float) -> None:
        if self.client is not None:
            self.client.set(f"lucid:flag:{name}", "1", px=max(1, int(ttl * 1000)))
        else:
            self._set(name, True, ttl)

    def flagged(self, name: str) -> bool:
        if self.client is not None:
            return bool(self.client.exists(f"lucid:flag:{name}"))
        return bool(self._get(name))


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
                    handle_message,
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


def handle_message(event: dict[str, Any]) -> str:
    """RQ job on "chat": answer `event` (an `Inbound` as JSON) in order with the person's other messages."""
    runtime = current()
    inbound = Inbound.from_json(event)
    if runtime.redis is None:
        feishu_turn(runtime, inbound)
        return "answered"
    return Mailbox(runtime.redis).deliver(inbound, lambda item: feishu_turn(runtime, item))


def feishu_turn(runtime: Runtime, inbound: Inbound) -> TurnResult | None:
    """A turn whose answer goes back to Feishu, with the "thinking" reaction shown while it runs."""
    persona = runtime.settings.personas.get(inbound.persona)
    if persona is None:
        log.error("message=%s is for unknown persona %s; dropped", inbound.message_id, inbound.persona)
        return None
    try:
        sender = sender_for(persona, runtime.settings.feishu_domain, runtime.redis)
    except FeishuError as exc:
        log.error("message=%s: %s", inbound.message_id, exc)
        return None
    reaction = sender.react(inbound.message_id)
    started = time.perf_counter()
    outcome = "error"
    try:
        result = run_turn(
            runtime, inbound, lambda text: sender.reply(inbound.message_id, text, chat_id=inbound.chat_id)
        )
        outcome = "ok"
        return result
    finally:
        sender.unreact(inbound.message_id, reaction)
        metrics = Metrics(runtime.redis)
        metrics.observe("lucid_turn_seconds", time.perf_counter() - started)
        metrics.inc("lucid_turns_total", {"outcome": outcome, "chat_type": inbound.chat_type})


# --------------------------------------------------------------------------------------------- admin


def dream(runtime: Runtime, ns: Namespace, phase: str, dry_run: bool = False) -> dict[str, Any]:
    """Queue one dream phase for `ns` (the /dream command and the admin API): {"status", "job_id", …}."""
    return dreaming.enqueue_phase(runtime, ns, phase, dry_run)


def stats(runtime: Runtime, ns: Namespace | None = None) -> dict[str, Any]:
    """Queue depths, model usage and (with `ns`) that namespace's memory counts."""
    out: dict[str, Any] = {"queues": {}, "model": None}
    if runtime.redis is not None:
        for name in ("chat", "memory", "dream"):
            q = runtime.queue(name)
            out["queues"][name] = {"queued": q.count, "failed": q.failed_job_registry.count}
    if runtime.llm is not None:
        usage = runtime.llm.usage
        out["model"] = {"calls": usage.calls, "tokens": usage.tokens, "failures": usage.failures}
    if ns is not None:
        book = service(runtime).book(ns)
        now = runtime.clock()
        current_entries = book.current(now)
        out["memory"] = {
            "namespace": str(ns),
            "current": len(current_entries),
            "resident": sum(1 for e in current_entries if e.resident),
            "history": len(book.entries()) - len(current_entries),
            "archived": len(book.archived()),
        }
    return out


# --------------------------------------------------------------------------------------------- replies

# Every sentence the bot says without a model, in Chinese and English: (zh, en) format strings.
_T = {
    "error": (
        "抱歉，我这边出了点问题，请稍后再试。",
        "Sorry, something went wrong on my side. Please try again.",
    ),
    "admin_only": ("这个命令只有管理员可以使用。", "Only an admin can use this command."),
    "profile_private": ("画像只在私聊里显示。", "Your profile is shown in a private chat only."),
    "no_profile": (
        "还没有画像：聊得多了，做梦时会整理出来。",
        "No profile yet; dreaming distils one over time.",
    ),
    "persona": (
        "当前人格：{name}；对话模型：{model}。已配置的人格：{names}（每个人格是一个飞书应用）。",
        "Persona: {name}; chat model: {model}. Personas: {names} (one Feishu app each).",
    ),
    "no_model_name": ("未配置（仅记忆模式）", "none (memory-only mode)"),
    "help": (
        "我会记住你告诉我的事。可以直接说“记住……”“以后……”“忘掉……”，或者用命令：",
        "I remember what you tell me. Say “remember …”, “from now on …”, “forget …”, or use a command:",
    ),
    "empty": ("我还没有记住关于你的任何事。", "I don't remember anything about you yet."),
    "listing": ("我记得关于你的 {n} 件事：", "I remember {n} things about you:"),
    "group_listing": (
        "（群聊里只显示常驻记忆和在本群学到的）",
        "(in a group: standing memories and what I learned here)",
    ),
    "more": ("……还有 {n} 条", "… and {n} more"),
    "list_hint": ("用 /forget 编号 删除，/pin 编号 置顶。", "Use /forget ID to delete, /pin ID to pin."),
    "which": ("是哪一条？用 /{verb} 编号 指定：", "Which one? Use /{verb} ID:"),
    "forget_what": ("要忘掉哪一条？发 /memory 查看编号。", "Forget which one? Send /memory to see the ids."),
    "usage": ("用法：/{verb} 编号或文字", "Usage: /{verb} ID or text"),
    "not_found": ("我没有找到和“{target}”有关的记忆。", "I found no memory matching “{target}”."),
    "failed": ("没能完成：{why}", "Could not do that: {why}"),
    "forgotten": ("好的，已忘掉：{text}", "Done, forgotten: {text}"),
    "pinned": ("已置顶：{text}", "Pinned: {text}"),
    "unpinned": ("已取消置顶：{text}", "Unpinned: {text}"),
    "you": ("你", "you"),
    "no_dreams": ("{who} 还没有做过梦。", "No dreams yet for {who}."),
    "dream_failed": ("没能安排做梦：{why}", "Could not schedule the dream: {why}"),
    "dream_queued": ("已为 {who} 安排 {phase} 做梦{dry}。", "Queued a {phase} dream for {who}{dry}."),
    "dry": ("（试运行）", " (dry run)"),
    "dream_already": ("（已经在队列里了）", " (it was already queued)"),
    "remembered": ("好的，我记住了：{text}", "Got it, I'll remember: {text}"),
    "superseded": (
        "好的，已更新：{text}（之前的记录保留为历史）",
        "Got it, updated: {text} (the old one is kept as history)",
    ),
    "known": ("这个我已经记得了：{text}", "I already remember that: {text}"),
    "secret": (
        "这看起来像密码或密钥，为了安全我不会保存它。",
        "That looks like a password or key, so I won't store it.",
    ),
    "protected": (
        "这和一条置顶的记忆冲突，我没有改动；需要的话先 /unpin。",
        "That conflicts with a pinned memory, so I left it alone; /unpin it first.",
    ),
    "noted": ("好的，记下了。", "Okay, noted."),
    "okay": ("好的。", "Okay."),
    "recalled": ("根据我的记忆：{text}", "From what I remember: {text}"),
    "recalled_many": ("我记得：\n{lines}", "I remember:\n{lines}"),
    "unknown": (
        "这个我还不知道。你可以告诉我，比如：记住……",
        "I don't know that yet. You can tell me: remember …",
    ),
    "hello": ("你好！", "Hi!"),
    "received": ("收到。", "Noted."),
    "no_model": (
        "（提示：还没有配置对话模型，我现在只能帮你记住、忘掉和查询记忆。）",
        "(No chat model is configured, so for now I can only remember, forget and look things up.)",
    ),
    "model_down": (
        "（对话模型暂时不可用，这是根据记忆给出的回答。）",
        "(The chat model is unavailable right now; this answer comes from memory only.)",
    ),
}
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]*[G-Zg-z][A-Za-z]*")  # a word, not a hex id such as 4ca67195


def say(inbound: Inbound, key: str, **values: Any) -> str:
    """A catalogue sentence in the message's language: English only for Latin text without Chinese."""
    body = re.sub(r"^[/／]\S*", "", inbound.text.strip())
    zh, en = _T[key]
    return (en if _LATIN.search(body) and not _CJK.search(body) else zh).format(**values)


# --------------------------------------------------------------------------------------------- commands

_ALIASES = {
    "help": ("help", "h", "帮助"),
    "memory": ("memory", "mem", "记忆"),
    "forget": ("forget", "忘记", "忘掉"),
    "pin": ("pin", "置顶"),
    "unpin": ("unpin", "取消置顶"),
    "profile": ("profile", "画像"),
    "dream": ("dream", "做梦"),
    "stats": ("stats", "状态", "统计"),
    "persona": ("persona", "人格", "角色"),
    "whoami": ("whoami",),
}
_BY_WORD = {alias: name for name, aliases in _ALIASES.items() for alias in aliases}
ADMIN_COMMANDS = frozenset({"dream", "stats"})
PHASES = dict(
    light="light", deep="deep", replay="replay", profile="profile", 浅="light", 深="deep", 回放="replay"
)
_HELP = (
    "/memory 记忆 — 查看我记得的 · what I remember",
    "/forget 忘记 <编号|文字> — 删除一条 · delete one",
    "/pin 置顶 <编号|文字>, /unpin — 一直生效 · always keep in mind",
    "/profile 画像 — 你的画像 · your profile",
    "/persona 人格 — 当前人格和模型 · persona and model",
    "/whoami — open_id",
)
_ADMIN_HELP = (
    "/dream 做梦 [light|deep|replay|profile] [@某人] [dry] — 整理记忆 · tidy memory",
    "/dream status — 做梦记录 · dream journal",
    "/stats 状态 — 运行统计 · service stats",
)
LIST_LIMIT = 30


def is_admin(persona: Persona, inbound: Inbound) -> bool:
    """Fail closed: an empty admin list means nobody; ids are the sender's open_id (or union_id)."""
    return bool(persona.admins) and (inbound.open_id in persona.admins or inbound.user in persona.admins)


def parse_command(text: str) -> tuple[str, str] | None:
    """`/name args` (any alias, also with a full-width slash) or a Chinese alias as the first word."""
    t = text.strip()
    slash = t[:1] in ("/", "／")
    parts = (t[1:] if slash else t).split(maxsplit=1)
    if not parts:
        return ("help", "") if slash else None
    word, rest = parts[0], parts[1].strip() if len(parts) > 1 else ""
    name = _BY_WORD.get(word.lower())
    if slash:
        return (name, rest) if name else ("help", "")
    return (name, rest) if name and _CJK.match(word) else None


def run_command(
    runtime: Runtime, mem: MemoryService, persona: Persona, inbound: Inbound, name: str, args: str
) -> str:
    if name in ADMIN_COMMANDS:
        allowed = is_admin(persona, inbound)
        log.warning(
            "admin command /%s %s: open_id=%s chat=%s message=%s",
            name, "run" if allowed else "refused", inbound.open_id, inbound.chat_id, inbound.message_id,
        )  # fmt: skip
        if not allowed:
            return say(inbound, "admin_only")
    if name == "memory":
        return _list_memory(runtime, mem, inbound)
    if name == "forget":
        return _forget(runtime, mem, inbound, args, [])
    if name in ("pin", "unpin"):
        return _pin(runtime, mem, inbound, args, name == "pin")
    if name == "profile":
        if inbound.group:
            return say(inbound, "profile_private")
        return (mem.profile(inbound.ns) or "").strip() or say(inbound, "no_profile")
    if name == "persona":
        model = persona.chat_model or runtime.settings.chat_model or say(inbound, "no_model_name")
        names = ", ".join(sorted(runtime.settings.personas)) or persona.name
        return say(inbound, "persona", name=persona.name, model=model, names=names)
    if name == "whoami":
        return f"open_id: {inbound.open_id}\nuser: {inbound.user}\nadmin: {is_admin(persona, inbound)}"
    if name == "dream":
        return _dream_command(runtime, inbound, args)
    if name == "stats":
        return json.dumps(stats(runtime, inbound.ns), ensure_ascii=False, indent=1)
    extra = _ADMIN_HELP if is_admin(persona, inbound) else ()
    return "\n".join([say(inbound, "help"), *_HELP, *extra])


def _visible(inbound: Inbound, entries: Sequence[Entry]) -> list[Entry]:
    """Group scope for everything a command shows or touches: in a group, private facts do not exist."""
    return [e for e in entries if visible_in(e, inbound.chat_type, inbound.chat_id)]


def _list_memory(runtime: Runtime, mem: MemoryService, inbound: Inbound) -> str:
    entries = _visible(inbound, mem.book(inbound.ns).current(runtime.clock()))
    if not entries:
        return say(inbound, "empty")
    lines = [say(inbound, "listing", n=len(entries))]
    if inbound.group:
        lines.append(say(inbound, "group_listing"))
    epoch = datetime.min.replace(tzinfo=UTC)
    ordered = sorted(entries, key=lambda e: (not e.pinned, not e.resident, e.at or epoch))
    lines += [f"- [{e.id[:8]}] {e.text}{' 📌' if e.pinned else ''}" for e in ordered[:LIST_LIMIT]]
    if len(ordered) > LIST_LIMIT:
        lines.append(say(inbound, "more", n=len(ordered) - LIST_LIMIT))
    lines.append(say(inbound, "list_hint"))
    return "\n".join(lines)


def _targets(runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str) -> tuple[list[Entry], bool]:
    """(entries, exact): an id or text match; else the best recall hits, offered for confirmation only."""
    found = _visible(inbound, mem.find(inbound.ns, target))
    if found:
        return found, True
    now, ct, chat = runtime.clock(), inbound.chat_type, inbound.chat_id
    hits = mem.recall(inbound.ns, target, now, k=3, chat_type=ct, chat=chat, gate=False)
    return [s.entry for s in hits], False


def _resolve(runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str, verb: str) -> Entry | str:
    """The one entry `target` names, or the sentence to send instead (not found, or which one?)."""
    if not target.strip():
        return say(inbound, "forget_what" if verb == "forget" else "usage", verb=verb)
    entries, exact = _targets(runtime, mem, inbound, target)
    if not entries:
        return say(inbound, "not_found", target=target)
    if len(entries) > 1 or not exact:  # never guess which memory to change
        return "\n".join(
            [say(inbound, "which", verb=verb)] + [f"- [{e.id[:8]}] {e.text}" for e in entries[:8]]
        )
    return entries[0]


def _forget(
    runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str, outcomes: list[Outcome]
) -> str:
    """The one forget: the /forget command and 忘掉… in memory-only mode."""
    entry = _resolve(runtime, mem, inbound, target, "forget")
    if isinstance(entry, str):
        return entry
    outcome = mem.apply(inbound.ns, [Forget(id=entry.id)])[0]
    outcomes.append(outcome)
    if not outcome.ok:
        return say(inbound, "failed", why=outcome.detail or outcome.status)
    return say(inbound, "forgotten", text=entry.text)


def _pin(runtime: Runtime, mem: MemoryService, inbound: Inbound, target: str, pinned: bool) -> str:
    entry = _resolve(runtime, mem, inbound, target, "pin" if pinned else "unpin")
    if isinstance(entry, str):
        return entry
    outcome = mem.apply(inbound.ns, [Pin(id=entry.id, pinned=pinned)])[0]
    if not outcome.ok:
        return say(inbound, "failed", why=outcome.detail or outcome.status)
    return say(inbound, "pinned" if pinned else "unpinned", text=entry.text)


def _dream_command(runtime: Runtime, inbound: Inbound, args: str) -> str:
    words = [w.lower() for w in args.split()]
    target = inbound.mentions[0] if inbound.mentions else None
    ns = Namespace.of(inbound.tenant, target.user, inbound.persona) if target else inbound.ns
    who = f"@{target.name}" if target else say(inbound, "you")
    if words and words[0] in ("status", "状态"):
        return dream_status(runtime, ns)["journal"] or say(inbound, "no_dreams", who=who)
    phase = next((PHASES[w] for w in words if w in PHASES), "light")
    dry = any(w in ("dry", "dry-run", "--dry-run", "试运行") for w in words)
    try:
        job = dream(runtime, ns, phase, dry)
    except LucidError as exc:
        return say(inbound, "dream_failed", why=exc)
    log.warning(
        "dream %s (dry=%s) for ns=%s by open_id=%s: %s", phase, dry, ns.key, inbound.open_id, job["status"]
    )
    state = say(inbound, "dream_already") if job["status"] != "queued" else ""
    return say(inbound, "dream_queued", who=who, phase=phase, dry=say(inbound, "dry") if dry else "") + state


def dream_status(runtime: Runtime, ns: Namespace, lines: int = 20) -> dict[str, Any]:
    """Last run of each phase, the newest DREAMS.md entries (newest first by design), the queue depth."""
    text = runtime.store.read_text(ns, DREAMS) or ""
    return {
        "namespace": str(ns),
        "last_run": {phase: dreaming.last_run(runtime, ns, phase) for phase in dreaming.PHASES},
        "journal": "\n".join(text.strip().splitlines()[:lines]),
        "queued": runtime.queue("dream").count if runtime.redis is not None else 0,
    }


# --------------------------------------------------------------------------------------------- memory-only

_QUESTION_SUBJECTS = tuple(
    (subject, re.compile(pattern, re.I))
    for subject, pattern in (
        ("雇主", r"哪(?:家|个)?公司|在哪里?(?:上班|工作|任职)|where do i work|who do i work for|my employer"),
        ("家乡", r"老家|家乡|籍贯|hometown|where am i from"),
        (
            "所在地",
            r"(?:在|住)(?:在)?哪|住址|所在地|where (?:do i live|am i|i live)|my (?:location|city|address)",
        ),
        ("姓名", r"我叫什么|我的名字|叫我什么|what(?:'s| is) my name|who am i"),
        ("时区", r"时区|time ?zone"),
        ("语言", r"什么语言|哪种语言|which language"),
        ("生日", r"生日|birthday"),
        ("技术栈", r"技术栈|tech stack"),
        ("职业", r"我(?:是做什么|的职业|的工作是)|what do i do|my job"),
    )
)


def remember_op(text: str, inbound: Inbound, source: str = "user") -> Remember:
    found = recognise(text)
    subject = found.subject if found else None
    return Remember(text, classify_type(text), subject, source, inbound.message_id, inbound.scope)


def deterministic_intent(text: str) -> tuple[str, str]:
    """(kind, payload) of `intents.parse_intent`, where a first-person statement counts as "remember"
    when it sets a known attribute (我住在余杭区) or reads as a lasting identity, preference or
    instruction. The one rule for memory-only mode and for the safety net under the model."""
    intent = parse_intent(text)
    if intent.kind == "statement":
        standing = is_memorable(intent.text) and classify_type(intent.text) in (
            "identity",
            "preference",
            "instruction",
        )
        if standing or recognise(intent.text) is not None:
            return "remember", intent.text
    return intent.kind, intent.text


def memory_reply(
    runtime: Runtime,
    mem: MemoryService,
    inbound: Inbound,
    assembly: Assembly,
    note: str,
    outcomes: list[Outcome],
) -> str:
    """The answer without a model: explicit requests deterministically, questions from memory."""
    kind, payload = deterministic_intent(inbound.text)
    if kind == "remember":
        outcome = mem.apply(inbound.ns, [remember_op(payload, inbound)])[0]
        outcomes.append(outcome)
        key = {
            "added": "remembered",
            "updated": "remembered",
            "superseded": "superseded",
            "unchanged": "known",
        }
        text = say(inbound, key[outcome.status], text=payload) if outcome.ok else _refusal(inbound, outcome)
    elif kind == "forget":
        text = _forget(runtime, mem, inbound, payload, outcomes)
    elif kind == "question":
        text = _answer(runtime, mem, inbound, assembly)
    else:
        text = say(inbound, "hello" if kind == "chitchat" else "received")
    if note == "model_down" or kind not in ("remember", "forget"):
        text += "\n" + say(inbound, note)
    return text


def _refusal(inbound: Inbound, outcome: Outcome) -> str:
    if outcome.status in ("rejected:secret", "rejected:protected"):
        return say(inbound, outcome.status.split(":")[1])
    return say(inbound, "failed", why=outcome.detail or outcome.status)


def confirm(inbound: Inbound, outcomes: Sequence[Outcome]) -> str:
    """What to say when the model changed memory but wrote no text itself."""
    refused = [o for o in outcomes if not o.ok]
    if refused:
        return _refusal(inbound, refused[0])
    return say(inbound, "noted" if outcomes else "okay")


def _answer(runtime: Runtime, mem: MemoryService, inbound: Inbound, assembly: Assembly) -> str:
    """A question without a model: the current value of the attribute asked about, else the best recall."""
    now = runtime.clock()
    subject = next((s for s, pattern in _QUESTION_SUBJECTS if pattern.search(inbound.text)), None)
    if subject is not None:
        current_entries = _visible(inbound, mem.book(inbound.ns).current(now))
        holders = [e for e in current_entries if e.subject and canonical_subject(e.subject) == subject]
        if holders:
            newest = max(holders, key=lambda e: (e.valid_from or e.at or now, e.at or now))
            return say(inbound, "recalled", text=newest.text)
    if assembly.recalled:
        return say(
            inbound, "recalled_many", lines="\n".join(f"- {s.entry.text}" for s in assembly.recalled[:3])
        )
    return say(inbound, "unknown")


# --------------------------------------------------------------------------------------------- the tool


def tool_call(
    mem: MemoryService,
    runtime: Runtime,
    inbound: Inbound,
    name: str,
    args: dict[str, Any],
    outcomes: list[Outcome],
) -> dict[str, Any]:
    """Validate one `manage_memory` call and run it through the writer; the answer goes back to the model.

    Targets resolve within what this chat may see (group scope), and only to exactly one entry.
    """
    if name != "manage_memory":
        return {"error": f"unknown tool {name!r}"}
    action = str(args.get("action") or "").strip().lower()
    text, target = (
        v.strip() if isinstance(v, str) else ""
        for v in (args.get("text"), args.get("target") or args.get("id"))
    )
    op: Op
    if action == "add":
        if not text:
            return {"error": "add needs text"}
        op = remember_op(text, inbound, source="tool")
        kind, subject = args.get("type"), args.get("subject")
        if isinstance(kind, str) and kind in TYPES and kind != "rule":
            op = replace(op, type=kind)
        if isinstance(subject, str) and 0 < len(subject.strip()) <= 64:
            op = replace(op, subject=subject.strip())
    elif action in ("update", "forget", "pin"):
        target = target or ("" if action == "update" else text)
        if not target or (action == "update" and not text):
            return {
                "error": f"{action} needs a target (an id or words from the memory)"
                + (" and text" * (action == "update"))
            }
        entries, exact = _targets(runtime, mem, inbound, target)
        if len(entries) != 1 or not exact:
            return {
                "error": "no single memory matches",
                "candidates": [{"id": e.id, "text": e.text} for e in entries[:5]],
            }
        ident = entries[0].id
        op = (
            Edit(ident, text, "tool")
            if action == "update"
            else Forget(ident)
            if action == "forget"
            else Pin(ident)
        )
    else:
        return {"error": "action must be add, update, forget or pin"}
    outcome = mem.apply(inbound.ns, [op])[0]
    outcomes.append(outcome)
    return {"status": outcome.status, "id": outcome.id, "detail": outcome.detail}
