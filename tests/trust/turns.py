"""Helpers for the trust tests that run a chat turn: a runtime on the suite's real Redis, messages as Feishu
routing makes them, one turn through `workers.turn.run_turn` (the Feishu and `lucid chat` path), and what a
person would read (MEMORY.md, raw, the prompt the model was shown)."""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from memory_core.namespace import Namespace
from tests.fakes.ollama import FakeOllama
from workers.inbound import Inbound, TurnResult
from workers.llm import LLM
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.turn import run_turn
from workers.worker import Worker

MODEL = "qwen3:4b"
GROUP = "oc_trust_group_0001"
TENANT = "t1"
_clock = itertools.count(1)


def make_runtime(
    data_dir: Path,
    redis_url: str | None,
    *,
    ollama: FakeOllama | None = None,
    admins: tuple[str, ...] = (),
    git: bool = False,
    chat: bool = True,
    timeout: float = 5.0,
    **settings: Any,
) -> Runtime:
    """`ollama` serves the chat and dream model (when `chat`), and an embedder if `embed_model=` names one."""
    personas = {"default": Persona("default", admins=admins)}
    model = MODEL if ollama and chat else None
    settings = {"dream_model": model, **settings}
    built = Settings(data_dir=data_dir, personas=personas, chat_model=model, **settings)
    runtime = build(built, redis_url, git=git)
    return replace(runtime, llm=LLM(ollama.url, timeout=timeout, retries=0) if ollama else None)


def msg(text: str, user: str = "alice", *, group: bool = False, chat: str = GROUP) -> Inbound:
    return Inbound(
        tenant=TENANT, user=user, open_id=f"ou_{user}", persona="default",
        chat_id=chat if group else f"oc_p2p_{user}", chat_type="group" if group else "p2p",
        message_id=f"om_{uuid.uuid4().hex}", text=text, mentioned_bot=group,
        create_time=int(time.time() * 1000) - 2000 + next(_clock),  # never ahead of the clock
    )  # fmt: skip


def turn(runtime: Runtime, text: str, **kw: Any) -> tuple[str, TurnResult]:
    replies: list[str] = []
    result = run_turn(runtime, msg(text, **kw), replies.append)
    assert len(replies) == 1
    return replies[0], result


def say(runtime: Runtime, text: str, **kw: Any) -> str:
    return turn(runtime, text, **kw)[0]


def ns(user: str = "alice") -> Namespace:
    return Namespace.of(TENANT, user, "default")


def memory_file(runtime: Runtime, user: str = "alice") -> str:
    path = runtime.store.path(ns(user)) / "MEMORY.md"
    return path.read_text() if path.exists() else ""


def raw_text(runtime: Runtime, user: str = "alice") -> str:
    raw = runtime.store.path(ns(user)) / "raw"
    return "".join(p.read_text() for p in sorted(raw.iterdir())) if raw.is_dir() else ""


def entry_id(runtime: Runtime, words: str, user: str = "alice") -> str:
    line = next(line for line in memory_file(runtime, user).splitlines() if words in line)
    return line.split("id=", 1)[1].split(";", 1)[0]


def run_jobs(runtime: Runtime, *queues: str) -> None:
    """Run what is queued, as a worker process does (a real RQ SimpleWorker, burst)."""
    assert runtime.redis is not None
    Worker(runtime, queues).work(burst=True)


def system_prompt(ollama: FakeOllama, n: int = -1) -> str:
    """The system prompt (with its memory block) of the model's `n`-th chat request."""
    return str(ollama.chat_requests[n]["messages"][0]["content"])


def new_session(runtime: Runtime) -> None:
    """As after 30 minutes idle: every chat starts a new session (the resident tier is frozen per session,
    so entries learned during a session show up from the next one)."""
    assert runtime.redis is not None
    keys = list(runtime.redis.scan_iter(match="lucid:session:*"))
    if keys:
        runtime.redis.delete(*keys)


def tool(**arguments: Any) -> dict[str, Any]:
    """A model reply that calls `manage_memory` once."""
    return {"content": "", "tool_calls": [{"function": {"name": "manage_memory", "arguments": arguments}}]}
