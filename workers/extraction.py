"""Background extraction: durable facts about the user from one turn, as Remember ops (DESIGN §7).

The bot enqueues `extract_turn` on the `memory` queue after it replied, when a model is configured: the
chat model is never trusted alone to save what matters. The prompt and the parser are the replay
phase's (`memory_core.dream_replay`), so both paths store facts the same way. Secrets are never
forwarded (and the writer would refuse them anyway); a model failure costs nothing but this extraction.
"""

from __future__ import annotations

import logging
from typing import Any

from memory_core.dream_replay import extraction_messages, facts_to_ops, parse_facts
from memory_core.intents import is_memorable
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from memory_core.secretscan import redact

from .llm import LLM, LLMError
from .runtime import current

log = logging.getLogger(__name__)

EXTRACT_TIMEOUT = 300.0  # local models on CPU need minutes, not seconds (reference pitfall AP-098)


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
) -> list[Remember]:
    """Ask `model` for durable facts about the current user in one turn; [] when there are none.

    `gate` skips the call for messages with no memorable hint (greetings, questions). The texts sent are
    redacted first, so a secret the user typed never reaches the model either.
    """
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
    return facts_to_ops(parse_facts(reply.content, user_clean), source, origin=origin, scope=scope)


def extract_turn(
    ns: str, user_text: str, assistant_text: str = "", message_id: str | None = None, scope: str | None = None
) -> dict[str, Any]:
    """RQ job: extract from one turn and write the facts through the single writer."""
    rt = current()
    model = rt.settings.dream_model or rt.settings.chat_model
    if rt.llm is None or not model:
        return {"status": "skipped", "reason": "no model configured", "outcomes": []}
    ops = extract_facts(rt.llm, model, user_text, assistant_text, origin=message_id, scope=scope)
    outcomes = rt.writer.submit(Namespace.parse(ns), ops) if ops else []
    return {"status": "done", "outcomes": [o.to_json() for o in outcomes]}
