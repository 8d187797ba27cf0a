"""Memory off, when the person says so (HexClaw §10): per message (/nomem, 这句别记, "don't remember
this") nothing is read or written for that turn; per chat (/memory off|on, admins in a group) nothing is
learned from that chat, also by background work already in flight. One test per path: injection, active
recall, tool calls, raw recording, extraction, replay — each with its positive control, so a path that
does nothing at all cannot pass.

Through the real turn with the real `ollama` client against FakeOllama, real Redis and RQ workers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fakes.ollama import Delay, FakeOllama
from tests.trust.turns import (
    GROUP,
    make_runtime,
    memory_file,
    new_session,
    ns,
    raw_text,
    run_jobs,
    say,
    system_prompt,
    tool,
    turn,
)
from workers.dreaming import run_phase
from workers.runtime import Runtime

OLLAMA_REPLY = "好的。"  # what the model answers when a test scripts nothing


@pytest.fixture
def rt(data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama) -> Runtime:
    return make_runtime(data_dir, redis_url, ollama=ollama, admins=("ou_boss",))


@pytest.fixture
def bare(data_dir: Path, redis_url: str, redis_client: redis.Redis) -> Runtime:
    """Memory-only mode (no chat model)."""
    return make_runtime(data_dir, redis_url)


def _extraction_jobs(runtime: Runtime) -> list[Any]:
    return [j for j in runtime.queue("memory").jobs if j.id.startswith("extract-")]


# ------------------------------------------------------------------------------------- per message


@pytest.mark.parametrize(
    ("seed", "chatter", "quiet", "plain", "fact", "said"),
    [
        (
            "记住我住在余杭区",
            "上周去医院做了体检，医生说要复查",
            "/nomem 我住在哪，复查的事怎么样",
            "我住在哪，复查的事怎么样",
            "余杭区",
            "复查",
        ),
        (
            "Remember that I live in Berlin",
            "last week the doctor asked me to come back for a checkup",
            "where do I live, and the checkup? don't remember this",
            "where do I live, and the checkup?",
            "Berlin",
            "checkup",
        ),
    ],
)
def test_a_quiet_message_gets_no_injection_no_active_recall_and_is_not_recorded(
    rt: Runtime, ollama: FakeOllama, seed: str, chatter: str, quiet: str, plain: str, fact: str, said: str
) -> None:
    say(rt, seed)
    say(rt, chatter)
    new_session(rt)
    before_raw, jobs = raw_text(rt), len(_extraction_jobs(rt))

    turn(rt, quiet)
    request = ollama.chat_requests[-1]
    assert "memory-context" not in system_prompt(ollama) and fact not in system_prompt(ollama)  # injection
    assert chatter not in system_prompt(ollama)  # active recall
    assert not request.get("tools")  # no manage_memory tool for this turn
    assert raw_text(rt) == before_raw  # raw recording: neither the message nor the reply
    assert len(_extraction_jobs(rt)) == jobs  # extraction

    new_session(rt)
    turn(rt, plain)  # positive control: the same question, memory on
    shown = system_prompt(ollama)
    assert fact in shown and said in shown.split("Earlier conversation")[-1]
    history = ollama.chat_requests[-1]["messages"]
    assert not any(
        "don't remember" in str(m.get("content")) or "nomem" in str(m.get("content")) for m in history
    )


def test_a_quiet_message_cannot_run_a_tool_even_if_the_model_sends_one(
    rt: Runtime, ollama: FakeOllama
) -> None:
    ollama.script(tool(action="add", text="我住在余杭区"))
    turn(rt, "我住在余杭区，这句别记")
    assert "余杭区" not in memory_file(rt) and "余杭区" not in raw_text(rt)
    ollama.script(tool(action="add", text="我住在余杭区"), "好的")
    turn(rt, "我住在余杭区")  # positive control
    assert "余杭区" in memory_file(rt)


@pytest.mark.parametrize("text", ["这句别记：我住在余杭区", "I live in Berlin, don't remember this"])
def test_a_quiet_message_in_memory_only_mode_stores_nothing_and_says_so(bare: Runtime, text: str) -> None:
    reply = say(bare, text)
    assert "不记" in reply or "won't remember" in reply
    assert memory_file(bare) == "" and raw_text(bare) == ""
    say(bare, text.replace("这句别记：", "").replace(", don't remember this", ""))  # positive control
    assert ("余杭区" in memory_file(bare)) or ("Berlin" in memory_file(bare))


def test_replay_never_sees_a_quiet_message(rt: Runtime, ollama: FakeOllama) -> None:
    say(rt, "/nomem I am learning the piano these days")
    say(rt, "我在准备下个月的日语考试")
    ollama.script("[考试] 我在准备下个月的日语考试")
    run_phase(rt, ns(), "replay")
    replay_input = str(ollama.chat_requests[-1]["messages"])
    assert "日语" in replay_input and "piano" not in replay_input
    assert "日语" in memory_file(rt) and "piano" not in memory_file(rt)


# ------------------------------------------------------------------------------------- per chat


@pytest.mark.parametrize(
    ("off", "on", "statement", "word"),
    [
        ("/memory 关闭", "/memory 开启", "我住在余杭区", "余杭区"),
        ("/memory off", "/memory on", "I live in Berlin", "Berlin"),
    ],
)
def test_memory_off_in_a_chat_stops_learning_there_until_on(
    bare: Runtime, off: str, on: str, statement: str, word: str
) -> None:
    say(bare, off)
    reply = say(bare, statement)
    assert "没有记下来" in reply or "didn't store" in reply
    assert word not in memory_file(bare) and word not in raw_text(bare)
    assert "关闭" in say(bare, "/memory") or "off" in say(bare, "/memory")
    say(bare, statement, group=True)  # another chat is not affected
    assert word in memory_file(bare)
    say(bare, on)
    say(bare, statement + "。")
    assert word in raw_text(bare).split("oc_p2p_alice", 1)[-1] or word in raw_text(bare)


def test_memory_off_refuses_the_models_tool_but_reading_and_forget_still_work(
    rt: Runtime, ollama: FakeOllama
) -> None:
    say(rt, "记住我住在余杭区")
    new_session(rt)
    say(rt, "/memory off")
    jobs = len(_extraction_jobs(rt))
    ollama.script(tool(action="add", text="我在准备下个月的日语考试"), "好的")
    turn(rt, "记住我在准备下个月的日语考试")
    tool_answer = next(m for m in ollama.chat_requests[-1]["messages"] if m["role"] == "tool")["content"]
    assert "memory is off" in tool_answer
    assert "余杭区" in system_prompt(ollama)  # reading is not learning: injection goes on
    assert "日语" not in memory_file(rt) and "日语" not in raw_text(rt)  # nor the safety net, nor raw
    assert len(_extraction_jobs(rt)) == jobs
    ollama.script(tool(action="forget", target="余杭区"), "好的")
    turn(rt, "忘掉我住在余杭区")
    assert "余杭区" not in memory_file(rt)


def test_extraction_already_queued_writes_nothing_after_memory_off(rt: Runtime, ollama: FakeOllama) -> None:
    ollama.script("好的", "好的")
    say(rt, "我在准备下个月的日语考试")
    say(rt, "I am learning the piano these days")
    assert len(_extraction_jobs(rt)) == 2
    say(rt, "/memory off")  # both extractions are still queued
    ollama.script("[考试] 我在准备下个月的日语考试", "[hobby] I am learning the piano these days")
    run_jobs(rt, "memory")
    assert len(ollama.chat_requests) >= 4  # the model ran: the check is at write time
    assert "日语" not in memory_file(rt) and "piano" not in memory_file(rt)

    say(rt, "/memory on")
    ollama.script("好的", "[考试] 我在准备下个月的日语考试")
    say(rt, "我在准备下个月的日语考试！")
    run_jobs(rt, "memory")  # positive control: with memory on, extraction writes
    assert "日语" in memory_file(rt)


def test_a_replay_in_flight_when_memory_goes_off_writes_nothing(rt: Runtime, ollama: FakeOllama) -> None:
    say(rt, "我在准备下个月的日语考试")
    ollama.script(Delay(1.5, "[考试] 我在准备下个月的日语考试"))
    done: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: done.append(run_phase(rt, ns(), "replay")))
    asked = len(ollama.chat_requests)
    worker.start()
    while len(ollama.chat_requests) == asked and worker.is_alive():
        threading.Event().wait(0.01)
    say(rt, "/memory off")  # while the model reads the chat
    worker.join(30)
    assert done and "日语" not in memory_file(rt)
    assert done[0]["rejections"].get("memory_off") == 1


def test_replay_skips_a_chat_whose_memory_is_off(rt: Runtime, ollama: FakeOllama) -> None:
    say(rt, "我在准备下个月的日语考试")
    say(rt, "我在准备下个月的日语考试", user="bob")
    say(rt, "/memory off")
    asked = len(ollama.chat_requests)
    run_phase(rt, ns(), "replay")
    assert len(ollama.chat_requests) == asked and "日语" not in memory_file(rt)  # never even shown
    ollama.script("[考试] 我在准备下个月的日语考试")
    run_phase(rt, ns("bob"), "replay")  # positive control: bob's chat is on, replay learns from it
    assert "日语" in memory_file(rt, "bob")


def test_in_a_group_only_an_admin_turns_memory_off(rt: Runtime, ollama: FakeOllama) -> None:
    refused = say(rt, "/memory off", group=True)
    assert "管理员" in refused or "Only an admin" in refused
    assert "learn nothing" in say(rt, "/memory off", group=True, user="boss")
    say(rt, "记住我负责前端", group=True)
    assert "前端" not in memory_file(rt) and "前端" not in raw_text(rt)
    say(rt, "记住我负责前端", group=False)  # a private chat is another chat
    assert "前端" in memory_file(rt)
    assert GROUP not in raw_text(rt)
