"""Background extraction: durable facts about the user from one turn, as Remember ops (DESIGN §7;
`extract_turn`)."""

from __future__ import annotations

import logging
import re
from typing import Any

from memory_core.dream_replay import Fact, extraction_messages, facts_to_ops, parse_facts
from memory_core.intents import is_memorable
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from memory_core.secretscan import redact

from .errors import LLMError
from .llm import LLM
from .metrics import Metrics
from .runtime import Runtime, current

log = logging.getLogger(__name__)

EXTRACT_TIMEOUT = 300.0  # local models on CPU need minutes, not seconds (reference pitfall AP-098)
JUNK_METRIC = "lucid_extraction_junk_total"

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)
_NOTHING = re.compile(r"^[\s`*\-]*(?:none|nothing|n/a|无|没有)?[\s.。!！`]*$", re.I)
# What a chat model says instead of facts: acknowledgements, promises to remember, introductions.
_CHATTER = re.compile(
    r"好的|好吧|好|嗯+|收到|明白了?|了解了?|没问题|知道了|当然|可以|我会记住|我记住了|记住了|已记住|已经记下|记下了|"
    r"以下是|如下|这是|\b(?:ok(?:ay)?|sure|got it|noted|certainly|of course|understood|alright|will do|"
    r"i(?:'ll| will) remember(?: that)?|i(?:'ve| have) noted(?: that)?|here (?:are|is)(?: the)?(?: facts?)?)\b",
    re.I,
)
_FILLER_CHARS = re.compile(r"[\W_我你的了呢吧啊哦呀]+")


def _chatter(text: str) -> bool:
    """A line that only acknowledges or introduces (好的。/ 好的，我记住了 / Sure, noted!) states no fact."""
    return len(_FILLER_CHARS.sub("", _CHATTER.sub("", text.lower()))) < 2


def answer_facts(reply: str, source_text: str) -> list[Fact] | None:
    """The grounded facts of an extraction or replay answer: [] for NONE or empty, None for junk (a chat
    model answering 好的。), which the caller counts (`JUNK_METRIC`)."""
    body = _THINK.sub("\n", reply)
    if _NOTHING.match(body):
        return []
    facts = [f for f in parse_facts(reply, source_text) if not _chatter(f.text)]
    return facts or None


def extract_facts(
    llm: LLM,
    model: str,
    user_text: str,
    assistant_text: str = "",
    *,
    origin: str | None = None,
    scope: str | None = None,
    source: str = "extract",
    gate: bool = True,
    metrics: Metrics | None = None,
) -> list[Remember]:
    """Ask `model` for durable facts about the current user in one turn; [] when there are none.
    The texts sent are redacted first, so a secret the user typed never reaches the model."""
    if gate and not is_memorable(user_text):
        return []
    user_clean, assistant_clean = redact(user_text), redact(assistant_text)
    try:
        reply = llm.chat(
            model, extraction_messages(user_clean, assistant_clean), temperature=0, timeout=EXTRACT_TIMEOUT
        )
    except LLMError as exc:
        log.warning("extraction skipped: %s", exc)
        return []
    facts = answer_facts(reply.content, user_clean)
    if facts is None:
        log.info("extraction answer was not a list of facts: nothing stored")
        if metrics is not None:
            metrics.inc(JUNK_METRIC, {"path": source})
        return []
    return facts_to_ops(facts, source, origin=origin, scope=scope)


def extract_turn(*args: Any) -> dict[str, Any]:
    """RQ job: `extract` (same arguments after the runtime) on the worker's runtime."""
    return extract(current(), *args)


def extract(
    rt: Runtime,
    ns: str,
    user_text: str,
    assistant_text: str = "",
    message_id: str | None = None,
    scope: str | None = None,
    chat: str | None = None,
    generation: int | None = None,
) -> dict[str, Any]:
    """Extract from one turn and write the facts through the memory service — unless the chat's
    memory was switched off (or flipped) since the turn: checked after the model, just before writing."""
    model = rt.settings.dream_model or rt.settings.chat_model
    if rt.llm is None or not model:
        return {"status": "skipped", "reason": "no model configured", "outcomes": []}
    ops = extract_facts(
        rt.llm, model, user_text, assistant_text, origin=message_id, scope=scope, metrics=Metrics(rt.redis)
    )
    where = Namespace.parse(ns)
    if chat is not None and not rt.switch.learning(where.tenant, where.persona, chat, generation):
        return {"status": "skipped", "reason": "memory is off in this chat", "outcomes": []}
    outcomes = rt.memory.apply(where, ops) if ops else []
    return {"status": "done", "outcomes": [o.to_json() for o in outcomes]}
