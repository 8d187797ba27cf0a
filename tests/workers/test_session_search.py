"""The model's `session_search` tool (issue 17, HexClaw spec §6): it searches this person's earlier
one-to-one conversations through the turn, and never returns a group's lines or another person's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from memory_core.lineformat import RawMessage
from memory_core.namespace import Namespace
from tests.fakes.ollama import FakeOllama
from tests.workers.test_turn import make_runtime, msg
from workers.turn import run_turn

PAST = datetime(2026, 5, 3, 9, 0, tzinfo=UTC)


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    with FakeOllama() as fake:
        yield fake


def _search(query: str, **more: Any) -> dict[str, Any]:
    call = {"function": {"name": "session_search", "arguments": {"query": query, **more}}}
    return {"content": "", "tool_calls": [call]}


def _past(rt: Any, user: str, ident: str, text: str, chat_type: str = "p2p") -> None:
    chat = "oc_team_group" if chat_type == "group" else f"oc_p2p_{user}"
    message = RawMessage(
        id=ident, ts=PAST, speaker=user, text=text, chat=chat, chat_type=chat_type, session="old"
    )
    assert rt.memory.record(Namespace.of("t1", user, "default"), message).status == "recorded"


def _tool_answers(fake: FakeOllama) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in fake.chat_requests[-1]["messages"] if m["role"] == "tool"]


def test_the_model_finds_what_was_said_in_an_earlier_private_chat(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    _past(rt, "alice", "om_p2p", "京都旅行的预算定在八千块")
    _past(rt, "alice", "om_grp", "京都旅行我和同事说好住在岚山", chat_type="group")
    _past(rt, "bob", "om_bob", "京都旅行的预算我这边是两万")
    ollama.script(_search("京都旅行 预算"), "上次说预算八千块。")
    replies: list[str] = []
    result = run_turn(rt, msg("我们之前说的京都旅行预算是多少？"), replies.append)

    assert replies == ["上次说预算八千块。"] and result.tool_calls == 1
    offered = [t["function"]["name"] for t in ollama.chat_requests[0]["tools"]]
    assert offered == ["manage_memory", "session_search"]
    [answer] = _tool_answers(ollama)
    texts = [r["text"] for r in answer["results"]]
    assert texts == ["京都旅行的预算定在八千块"]  # not the group's line, not Bob's, not this question
    assert answer["results"][0]["date"] == "2026-05-03 09:00"


def test_results_are_bounded_and_a_group_chat_has_no_such_tool(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = make_runtime(data_dir, redis_url, ollama=ollama)
    for i in range(12):
        _past(rt, "alice", f"om_{i}", f"第{i}次聊到咖啡豆的烘焙程度")
    ollama.script(_search("咖啡豆", limit=50), _search(""), "好的")
    run_turn(rt, msg("上次我们聊咖啡豆说了什么"), lambda _: None)
    bounded, empty = _tool_answers(ollama)
    assert len(bounded["results"]) == 5 and "error" in empty

    ollama.script(_search("咖啡豆"), "群里不查")
    run_turn(rt, msg("咖啡豆聊过什么", group=True), lambda _: None)
    offered = [t["function"]["name"] for t in ollama.chat_requests[-2]["tools"]]
    assert offered == ["manage_memory"]
    [refused] = _tool_answers(ollama)
    assert "results" not in refused and "private chat" in refused["error"]
