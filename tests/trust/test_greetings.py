"""Greetings and fillers pull nothing — no recall tier and no active recall — on every path; short real
questions still do (issue 16). Through the real turn, with the real `ollama` client against FakeOllama, so
the assertion is on the prompt the model was actually shown."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from memory_core.lineformat import RawMessage
from memory_core.ops import Remember
from tests.fakes.ollama import FakeOllama
from tests.trust.turns import make_runtime, memory_file, ns, system_prompt, turn
from workers.memory_service import MemoryService
from workers.runtime import Runtime

GREETINGS = ["你好", "嗯嗯", "ok", "thanks", "哈哈", "好的谢谢", "Hi!", "早上好", "ok thanks 👍", "收到"]


OLLAMA_REPLY = "好的"  # what the model answers when a test scripts nothing


@pytest.fixture
def rt(data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama) -> Runtime:
    runtime = make_runtime(data_dir, redis_url, ollama=ollama)
    runtime.writer.submit(
        ns(), [Remember("我住在余杭区", source="user"), Remember("下周三公司团建去千岛湖", source="user")]
    )
    # An earlier conversation (another session) about a medical check-up: what 你好 once pulled in.
    old = RawMessage(
        id="om_old_1", ts=datetime(2026, 1, 2, 9, 0, tzinfo=UTC), speaker="alice",
        text="你好，我上周去做了体检，医生说血压有点高", chat="oc_p2p_alice", chat_type="p2p",
        role="user", session="older-session",
    )  # fmt: skip
    MemoryService(runtime).record(ns(), old)
    return runtime


@pytest.mark.parametrize("greeting", GREETINGS)
def test_a_greeting_shows_the_model_no_recalled_memory_and_no_past_conversation(
    rt: Runtime, ollama: FakeOllama, greeting: str
) -> None:
    reply, result = turn(rt, greeting)

    shown = system_prompt(ollama)
    assert reply == "好的" and result.mode == "model"
    assert "Relevant memories" not in shown and "团建" not in shown
    assert "Earlier conversation" not in shown and "体检" not in shown
    assert result.recalled == []


def test_a_short_real_question_still_recalls_and_finds_past_conversation(
    rt: Runtime, ollama: FakeOllama
) -> None:
    turn(rt, "我在哪")
    assert "余杭区" in system_prompt(ollama)

    turn(rt, "我的体检结果怎么样")
    shown = system_prompt(ollama)
    assert "Earlier conversation" in shown and "血压有点高" in shown


def test_greetings_get_nothing_from_the_memory_service_either(rt: Runtime) -> None:
    """The same gate for a caller that is not a turn (the assembly every path shares)."""
    mem = MemoryService(rt)
    now = rt.clock()
    for greeting in GREETINGS:
        got = mem.assemble(ns(), greeting, chat_type="p2p", chat="oc_p2p_alice", session="s", now=now)
        assert got.recalled == [] and got.snippets == [], greeting
        assert mem.active_recall(ns(), greeting, "s", "oc_p2p_alice") == []
    asked = mem.assemble(ns(), "团建去哪里", chat_type="p2p", chat="oc_p2p_alice", session="s", now=now)
    assert [s.entry.text for s in asked.recalled] == ["下周三公司团建去千岛湖"]


def test_memory_only_mode_answers_a_greeting_without_memory(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    runtime = make_runtime(data_dir, redis_url)
    runtime.writer.submit(ns(), [Remember("我对花生过敏", source="user")])
    for greeting in ("你好", "thanks"):
        reply, result = turn(runtime, greeting)
        assert "花生" not in reply and result.recalled == []
    assert "我对花生过敏" in memory_file(runtime)
