"""Helpers for the honest-recall tests (issue 16, part 2): a runtime on the suite's real Redis, a person's
message, one turn, and what a person would read (MEMORY.md, the prompt the model was shown)."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from memory_core.lineformat import parse_file
from memory_core.namespace import Namespace
from tests.fakes.ollama import FakeOllama
from workers.inbound import Inbound, TurnResult
from workers.llm import LLM
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.turn import run_turn

MODEL = "qwen3:4b"
TENANT = "t1"
DATA = Path(__file__).resolve().parents[1] / "data"
_clock = itertools.count(1)


def make_runtime(
    data_dir: Path,
    redis_url: str | None,
    *,
    ollama: FakeOllama | None = None,
    chat: bool = True,
    embed_model: str | None = None,
) -> Runtime:
    """`ollama` serves the chat model (when `chat`) and an embedder (`embed_model="nomic-embed-text"`)."""
    settings = Settings(
        data_dir=data_dir,
        personas={"default": Persona("default")},
        chat_model=MODEL if ollama is not None and chat else None,
        embed_model=embed_model,
    )
    runtime = build(settings, redis_url, git=False)
    return replace(runtime, llm=LLM(ollama.url, timeout=5.0, retries=0) if ollama else None)


def ns(user: str = "alice") -> Namespace:
    return Namespace.of(TENANT, user, "default")


def msg(text: str, user: str = "alice") -> Inbound:
    return Inbound(
        tenant=TENANT, user=user, open_id=f"ou_{user}", persona="default", chat_id=f"oc_p2p_{user}",
        chat_type="p2p", message_id=f"om_{uuid.uuid4().hex}", text=text,
        create_time=int(time.time() * 1000) + next(_clock),
    )  # fmt: skip


def turn(runtime: Runtime, text: str, user: str = "alice") -> tuple[str, TurnResult]:
    replies: list[str] = []
    result = run_turn(runtime, msg(text, user), replies.append)
    assert len(replies) == 1
    return replies[0], result


def memory_text(runtime: Runtime, user: str = "alice") -> str:
    path = runtime.store.path(ns(user)) / "MEMORY.md"
    return path.read_text("utf-8") if path.exists() else ""


def hits(runtime: Runtime, text: str, user: str = "alice") -> int:
    """The hit count MEMORY.md shows for the entry whose text is `text`."""
    runtime.writer.flush(ns(user))  # hit feedback rides the next batch: apply it now
    parsed = parse_file(memory_text(runtime, user))
    found = [e for e in parsed.entries() if e.text == text]
    assert found, f"{text!r} is not in MEMORY.md"
    return found[0].hits


def prompt_seen(ollama: FakeOllama, n: int = -1) -> str:
    """The system prompt (with its memory block) of the model's `n`-th chat request."""
    return str(ollama.chat_requests[n]["messages"][0]["content"])


def unrelated_set() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "unrelated_requests.json").read_text("utf-8"))
    return data
