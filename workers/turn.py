"""One chat turn, the same for Feishu (an RQ job) and `lucid chat`: a command or a conversation, the reply,
then what is kept of it; without a model it answers from memory and says so (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import redis

from memory_core.errors import LucidError
from memory_core.forgetting import FORGOTTEN
from memory_core.intents import asks_about_me, is_memorable
from memory_core.lineformat import USED_KEY, USED_MAX, RawMessage, reply_id
from memory_core.namespace import Namespace
from memory_core.recall import used_by_reply
from memory_core.secretscan import redact

from .cards import CardStream
from .commands import (
    confirm,
    deterministic_intent,
    is_admin,
    language,
    language_of,
    memory_reply,
    parse_command,
    remember_op,
    run_command,
    say,
    tool_call,
)
from .errors import FeishuError, LLMError, LLMUnavailable
from .extraction import extract, extract_turn
from .feishu_send import FeishuSender
from .inbound import Inbound, TurnLimits, TurnResult
from .memory_card import build as memory_card
from .memory_card import last_dream, register, visible_entries
from .memory_service import Assembly, MemoryService
from .memory_switch import TurnMemory, per_message_off
from .metrics import Metrics
from .outbox import send_reply
from .queues import extraction_job_id
from .redis_backend import text
from .redis_keys import Keys
from .runtime import Runtime
from .scratch import Scratch
from .settings import Persona

log = logging.getLogger(__name__)

#: The longest answer a turn sends (four Feishu messages): a model that never stops, or is made to run on,
#: cannot flood a chat or the app's send quota.
MAX_REPLY_CHARS = 12_000
THINKING_TTL = 24 * 3600  # a turn's reaction id, kept so a redo can remove a killed attempt's


def run_turn(
    runtime: Runtime,
    inbound: Inbound,
    reply_fn: Callable[[str], Any],
    limits: TurnLimits | None = None,
    stream: Callable[[str], None] | None = None,
    card_fn: Callable[[dict[str, Any]], Any] | None = None,
) -> TurnResult:
    """Answer one message. Never raises for a person's input or a backend failure: the reply says so."""
    limits = limits or TurnLimits()
    started = time.monotonic()
    result = TurnResult()
    persona = runtime.settings.personas.get(inbound.persona) or Persona(inbound.persona)
    mem, scratch = runtime.memory, runtime.scratch
    after: Callable[[], None] | None = None
    try:
        inbound = _with_language(scratch, inbound)
        quiet, said = per_message_off(inbound.text) if inbound.kind == "text" else (False, inbound.text)
        if quiet:
            inbound = replace(inbound, text=said)
        state = runtime.switch.state(inbound.tenant, inbound.persona, inbound.chat_id)
        turn_memory = TurnMemory(quiet=quiet, chat_off=state.off, generation=state.generation)
        command = parse_command(inbound.text) if inbound.kind == "text" and inbound.text.strip() else None
        if inbound.kind != "text":
            result.mode = "unreadable"
            after = _unreadable(runtime, mem, scratch, persona, inbound, result, turn_memory)
        elif quiet and not inbound.text.strip():
            result.mode = "command"
            result.reply = say(inbound, "nomem")
        elif command is not None:
            result.mode = "command"
            result.reply = run_command(runtime, mem, persona, inbound, *command)
            if command[0] == "memory" and card_fn is not None:
                result.card = _memory_card(runtime, persona, inbound)
        else:
            after = _converse(runtime, mem, scratch, persona, inbound, limits, result, turn_memory, stream)
            if card_fn is not None and asks_about_me(inbound.text):  # "what do you remember about me"
                result.card = _memory_card(runtime, persona, inbound)
    except Exception:  # a bug must cost one polite answer, not the person's trust; the log has the ids
        log.exception("turn failed: ns=%s message=%s", inbound.ns.key, inbound.message_id)
        result.mode = "error"
        result.reply = say(inbound, "error")
    if inbound.cut_from and result.reply:
        result.reply += "\n" + say(inbound, "cut", sent=inbound.cut_from, read=len(inbound.text))
    parked = False
    try:
        if result.card is not None and card_fn is not None and _card_sent(card_fn, result.card, inbound):
            result.delivered = True
        else:  # "parked": Feishu did not take it now; the outbox delivers it later (its log says so)
            parked = reply_fn(result.reply) == "parked"
            result.delivered = not parked
    except LucidError as exc:
        log.error("reply not delivered: ns=%s message=%s (%s)", inbound.ns.key, inbound.message_id, exc)
    # An answer nobody will see is not recorded as said; a parked one will be seen (or its give-up is an
    # error in the log), so the conversation goes on from it.
    if after is not None and (result.delivered or parked):
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
        "parked" if parked else result.delivered,
        len(result.outcomes),
        len(result.recalled),
        result.tool_calls,
        result.ms,
    )
    return result


def _memory_card(runtime: Runtime, persona: Persona, inbound: Inbound) -> dict[str, Any]:
    entries = visible_entries(runtime, inbound.ns, inbound.chat_type, inbound.chat_id)
    admin = is_admin(persona, inbound) and not inbound.group
    dream = last_dream(runtime, inbound.ns) if admin else None
    return memory_card(entries, language(inbound), inbound.group, dream=dream)


def _card_sent(card_fn: Callable[[dict[str, Any]], Any], card: dict[str, Any], inbound: Inbound) -> bool:
    """Send the card; False (reply with text instead) when Feishu will not take it."""
    try:
        card_fn(card)
    except FeishuError as exc:
        log.warning("card for message=%s refused (%s); replying with text", inbound.message_id, exc)
        return False
    return True


def _with_language(scratch: Scratch, inbound: Inbound) -> Inbound:
    """Remember the conversation's language; a message that shows none (/memory) is answered in it."""
    key = f"{inbound.ns.key}:{inbound.chat_id}"
    lang = language_of(inbound.text)
    if lang is not None:
        scratch.set_language(key, lang)
        return inbound
    known = scratch.language(key)
    return replace(inbound, lang=known) if known else inbound


def _converse(
    runtime: Runtime,
    mem: MemoryService,
    scratch: Scratch,
    persona: Persona,
    inbound: Inbound,
    limits: TurnLimits,
    result: TurnResult,
    memory: TurnMemory,
    stream: Callable[[str], None] | None = None,
) -> Callable[[], None]:
    """Record, recall, answer; returns the steps that run once the answer is delivered."""
    ns, now = inbound.ns, runtime.clock()
    session = scratch.session(f"{ns.key}:{inbound.conversation}", inbound.message_id)
    if memory.learns:
        mem.record(
            ns, _raw(inbound.message_id, inbound.created(now), "user", inbound.text, inbound, "user", session)
        )
    model = persona.chat_model or runtime.settings.chat_model
    history_key = f"{ns.key}:{inbound.conversation}"
    history = scratch.history(history_key) if model and runtime.llm is not None else []
    if memory.reads:
        assembly = mem.assemble(
            ns,
            inbound.text,
            chat_type=inbound.chat_type,
            chat=inbound.chat_id,
            session=session,
            now=now,
            context=[m["content"] for m in history if m["role"] == "user"],  # replies echo the block
        )
    else:
        assembly = Assembly("", [], [], [])
    result.recalled = [s.entry.id for s in assembly.recalled]
    note = "no_model"
    if model and runtime.llm is not None:
        note = "model_down"
        if not scratch.flagged("llm-down"):
            try:
                result.reply = _model_reply(
                    runtime, mem, persona, inbound, assembly, model, history, limits, result, memory, stream
                )
                result.mode = "model"
            except LLMError as exc:
                log.warning(
                    "model %s failed for ns=%s message=%s: %s", model, ns.key, inbound.message_id, exc
                )
                if isinstance(exc, LLMUnavailable):
                    scratch.flag("llm-down", limits.model_cooldown)
    if result.mode == "model":
        if memory.learns:
            _safety_net(mem, inbound, result)
    elif memory.quiet:
        result.mode = "memory"
        result.reply = say(inbound, "nomem") + "\n" + say(inbound, note)
    else:
        result.mode = "memory"
        result.reply = memory_reply(
            runtime, mem, inbound, assembly, note, result.outcomes, learning=memory.learns
        )

    def after() -> None:
        if not memory.learns:
            return  # nothing of this turn is kept: no hit, no record, no history, no extraction
        # A hit is an entry the reply used (its words, or a tool call on its id), not one merely shown.
        shown = [s.entry for s in assembly.recalled] + assembly.resident
        referenced = [o.id for o in result.outcomes if o.ok and o.id and o.status != "forgotten"]
        listing = result.mode == "memory" and asks_about_me(inbound.text)  # a list uses nothing
        result.used = [] if listing else used_by_reply(result.reply, shown, referenced)
        mem.feedback(ns, result.used, now)  # queued first: it rides the reply's record batch
        # A reply that forgot something names it ("forgotten: …"): it is archived marked, not in clear.
        forgot = any(o.status == "forgotten" for o in result.outcomes)
        said = _raw(
            reply_id(inbound.message_id),
            runtime.clock(),
            persona.name,
            FORGOTTEN if forgot else result.reply,
            inbound,
            "assistant",
            session,
        )
        if result.used and not forgot:  # a later forget of one of them forgets this reply too
            said = replace(said, extra=((USED_KEY, ",".join(result.used[:USED_MAX])),))
        mem.record(ns, said, wait=False)  # archived marked if what it used is forgotten meanwhile
        # nor may a reply that quotes a fact forgotten meanwhile be replayed or learned from
        if forgot or _used_gone(mem, ns, result.used):
            scratch.drop_history(history_key)
        elif result.mode == "model" and model:
            scratch.add_history(history_key, inbound.text, result.reply, limits.history_turns)
            _enqueue_extraction(runtime, inbound, result.reply, memory.generation)

    return after


def _used_gone(mem: MemoryService, ns: Namespace, used: Sequence[str]) -> bool:
    """Was an entry the reply used forgotten while the reply was written (by another chat, a card, the
    CLI)? The reply then quotes a fact that is no longer held."""
    if not used:
        return False
    book = mem.book(ns)
    return any(book.get(i) is None for i in used)


UNREADABLE = {
    "image": ("图片", "images"),
    "file": ("文件", "files"),
    "folder": ("文件夹", "folders"),
    "audio": ("语音", "voice messages"),
    "media": ("视频", "videos"),
    "sticker": ("表情包", "stickers"),
    "share_chat": ("群名片", "shared chats"),
    "share_user": ("个人名片", "shared contacts"),
    "location": ("位置", "locations"),
    "merge_forward": ("合并转发的聊天记录", "forwarded chat histories"),
}


def _unreadable(
    runtime: Runtime,
    mem: MemoryService,
    scratch: Scratch,
    persona: Persona,
    inbound: Inbound,
    result: TurnResult,
    memory: TurnMemory,
) -> Callable[[], None]:
    """A message the bot cannot read: its placeholder goes to the raw archive (unless memory is off in
    the chat), the reply says so plainly."""
    ns, now = inbound.ns, runtime.clock()
    session = scratch.session(f"{ns.key}:{inbound.conversation}", inbound.message_id)
    if memory.learns:
        mem.record(
            ns, _raw(inbound.message_id, inbound.created(now), "user", inbound.text, inbound, "user", session)
        )
    what, what_en = UNREADABLE.get(inbound.kind, ("这类消息", "this kind of message"))
    result.reply = say(inbound, "unreadable", what=what, what_en=what_en)

    def after() -> None:
        if not memory.learns:
            return
        said = _raw(
            reply_id(inbound.message_id),
            runtime.clock(),
            persona.name,
            result.reply,
            inbound,
            "assistant",
            session,
        )
        mem.record(ns, said, wait=False)

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
                "action": {"type": "string", "enum": ["add", "update", "forget", "pin", "share"]},
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
                "share": {
                    "type": "boolean",
                    "description": (
                        "only when the user explicitly asks that a private memory be known in their group "
                        "chats too; health, money, relationships and id numbers are never shared this way"
                    ),
                },
            },
            "required": ["action"],
        },
    },
}


SESSION_SEARCH: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "session_search",
        "description": (
            "Search your earlier private conversations with this user (their words and yours). Use it when "
            'the user asks what was said before ("what did we say about …", "上次我们聊的…") and the '
            "memory above does not answer. Returns at most 5 dated lines."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "words to look for"},
                "limit": {"type": "integer", "description": "how many lines, 1-5"},
            },
            "required": ["query"],
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
    memory: TurnMemory,
    stream: Callable[[str], None] | None = None,
) -> str:
    """Chat with the model, looping its `manage_memory` calls back at most `tool_rounds` times (none for
    a quiet message: it may not touch memory at all)."""
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
        offered = [MANAGE_MEMORY] if inbound.group else [MANAGE_MEMORY, SESSION_SEARCH]
        tools = offered if round_no < limits.tool_rounds and memory.reads else None
        timeout = min(llm.timeout, left)
        if stream is not None:
            answer = llm.chat_stream(
                model, messages, stream, tools=tools, timeout=timeout, max_chars=MAX_REPLY_CHARS
            )
        else:
            answer = llm.chat(model, messages, tools=tools, timeout=timeout, max_chars=MAX_REPLY_CHARS)
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
            reply = tool_call(
                mem, runtime, inbound, call.name, call.arguments, result.outcomes, memory.generation
            )
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


def _enqueue_extraction(runtime: Runtime, inbound: Inbound, reply: str, generation: int) -> None:
    """Background extraction on "memory" (never trust the model alone to save); text is redacted first.
    It carries the chat and the memory switch's generation, re-checked before it writes."""
    if not is_memorable(inbound.text):
        return
    args = (
        str(inbound.ns), redact(inbound.text), redact(reply), inbound.message_id, inbound.scope,
        inbound.chat_id, generation,
    )  # fmt: skip
    if runtime.redis is None:  # the terminal chat without Redis: after the reply was printed
        extract(runtime, *args)
        return
    job_id = extraction_job_id(inbound.persona, inbound.message_id)
    try:
        runtime.queue("memory").enqueue_call(
            extract_turn, args=args, job_id=job_id, timeout=600, result_ttl=3600, failure_ttl=86400
        )
    except redis.RedisError as exc:
        log.warning("extraction not queued for message=%s: %s", inbound.message_id, type(exc).__name__)


def _sender(runtime: Runtime, inbound: Inbound) -> FeishuSender | None:
    persona = runtime.settings.personas.get(inbound.persona)
    if persona is None:
        return None
    try:
        return runtime.sender(persona)
    except FeishuError:
        return None


def chat_pace(runtime: Runtime, inbound: Inbound) -> float:
    sender = _sender(runtime, inbound)
    return sender.pacer.ahead(inbound.chat_id) if sender is not None else 0.0


def busy_notice(runtime: Runtime, newest: Inbound, backlog: int) -> None:
    """Tell a person once per backlog that every message will be answered in order: a new message, not a
    reply, so each message keeps one reply; posted once per `uuid` even when a redone job resends it."""
    sender = _sender(runtime, newest)
    if sender is None:
        return
    mention = newest.open_id if newest.group and newest.open_id else None
    try:
        sender.post(newest.chat_id, say(newest, "busy"), uuid=f"{newest.message_id}:busy", mention=mention)
    except FeishuError as exc:
        log.info("busy notice for ns=%s not posted (code %s)", newest.ns.key, exc.code)
        return
    Metrics(runtime.redis).inc("lucid_busy_notices_total")
    log.info(
        "ns=%s has %d unanswered messages; told them they will be answered in order", newest.ns.key, backlog
    )


def feishu_turn(runtime: Runtime, inbound: Inbound) -> TurnResult | None:
    """A turn whose answer goes back to Feishu, with the "thinking" reaction shown while it runs."""
    persona = runtime.settings.personas.get(inbound.persona)
    if persona is None:
        log.error("message=%s is for unknown persona %s; dropped", inbound.message_id, inbound.persona)
        return None
    try:
        sender = runtime.sender(persona)
    except FeishuError as exc:
        log.error("message=%s: %s", inbound.message_id, exc)
        return None
    reaction = _show_thinking(runtime, sender, inbound)
    started = time.perf_counter()
    outcome = "error"
    card = _card_stream(runtime, persona, sender, inbound)

    def deliver(text: str) -> str:
        if card is not None and card.finish(text):
            return "delivered"
        return send_reply(runtime, sender, inbound, text)

    def send_card(memory: dict[str, Any]) -> None:
        content = json.dumps(memory, ensure_ascii=False)
        sent = sender.reply_content(
            inbound.message_id,
            "interactive",
            content,
            chat_id=inbound.chat_id,
            in_thread=bool(inbound.thread_id),
        )
        register(runtime.redis, sent, inbound, language(inbound))

    try:
        result = run_turn(
            runtime,
            inbound,
            deliver,
            stream=card.partial if card is not None else None,
            card_fn=send_card,
        )
        outcome = "ok"
        return result
    finally:
        sender.unreact(inbound.message_id, reaction)
        _thinking_done(runtime, inbound)
        metrics = Metrics(runtime.redis)
        metrics.observe("lucid_turn_seconds", time.perf_counter() - started)
        metrics.inc("lucid_turns_total", {"outcome": outcome, "chat_type": inbound.chat_type})


def _card_stream(
    runtime: Runtime, persona: Persona, sender: FeishuSender, inbound: Inbound
) -> CardStream | None:
    """A streaming card when a chat model will answer and the app may use CardKit (else a plain reply)."""
    if runtime.llm is None or not (persona.chat_model or runtime.settings.chat_model):
        return None
    return CardStream(sender, inbound, runtime.redis)


def _thinking_key(inbound: Inbound) -> str:
    return Keys.thinking(inbound.persona, inbound.message_id)


def _show_thinking(runtime: Runtime, sender: FeishuSender, inbound: Inbound) -> str | None:
    """Add the "thinking" reaction, or take over the one a killed attempt of this turn left showing
    (its id is kept in Redis, so a SIGKILLed attempt's reaction does not show "thinking" forever)."""
    client, key = runtime.redis, _thinking_key(inbound)
    if client is not None:
        try:
            left = client.get(key)
        except redis.RedisError:
            left = None
        if left:
            return text(left)
    reaction = sender.react(inbound.message_id)
    if reaction and client is not None:
        with contextlib.suppress(redis.RedisError):
            client.set(key, reaction, ex=THINKING_TTL)
    return reaction


def _thinking_done(runtime: Runtime, inbound: Inbound) -> None:
    if runtime.redis is not None:
        with contextlib.suppress(redis.RedisError):
            runtime.redis.delete(_thinking_key(inbound))


def handle_message(event: dict[str, Any], drain: bool = False) -> str:
    """Kept for turn jobs queued by name (`workers.turn.handle_message`) before the upgrade that moved the
    turn job to `workers.mailbox.handle_message`: it runs that one. Remove once no such job can be queued."""
    from .mailbox import handle_message as turn_job  # the mailbox imports this module

    return turn_job(event, drain)
