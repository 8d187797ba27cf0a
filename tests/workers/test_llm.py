"""The model client's retry policy, against the fake Ollama HTTP API through the real `ollama` client."""

from __future__ import annotations

import pytest

from tests.fakes.ollama import Delay, FakeOllama, HttpError
from workers.llm import LLM, LLMUnavailable

MESSAGES = [{"role": "user", "content": "你好"}]


def test_a_timeout_is_not_retried_past_the_callers_budget() -> None:
    """A request that took the whole budget is not sent again: the caller (a turn with 45 s for the model)
    must hear "unavailable" on time, not an answer that comes after it has given up.

    Checked by what the fake saw, not by a stopwatch: had the client waited past its 1.5 s budget it would
    have got "太慢了" (no error); had it retried, the fake would have seen a second request (answered "好的。")."""
    replies = [Delay(3.0, "太慢了"), "好的。"]
    with FakeOllama(responder=lambda _body: replies.pop(0) if replies else "好的。") as fake:
        llm = LLM(fake.url, retries=1, backoff=0.0)
        with pytest.raises(LLMUnavailable):
            llm.chat("qwen3:4b", MESSAGES, timeout=1.5)
        assert len(fake.chat_requests) == 1 and replies == ["好的。"]


def test_a_server_error_is_retried_within_the_budget() -> None:
    replies: list[object] = [HttpError(503), "好的。"]
    with FakeOllama(responder=lambda _body: replies.pop(0) if replies else "好的。") as fake:
        answer = LLM(fake.url, retries=1, backoff=0.0).chat("qwen3:4b", MESSAGES, timeout=10)
        assert answer.content == "好的。" and len(fake.chat_requests) == 2
