"""A reasoning model's scratchpad never reaches a chat or a memory file.

qwen3 (the model the deployment runs) writes `<think>…</think>` before its answer, or returns the
scratchpad in `message.thinking` (Ollama with `think: true`). FakeOllama answers the same way. The
scratchpads below are written to do harm if they leaked: fact-shaped lines the extraction, replay and
profile parsers would take as facts, a merge proposal the deep dream would run, chat text the user
would read. Real Redis, real RQ SimpleWorker, the real ollama and lark-oapi clients against the fakes.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from memory_core.dream_replay import parse_facts
from memory_core.lineformat import format_time
from memory_core.namespace import Namespace
from memory_core.ops import Put, Record
from memory_core.reasoning import strip_partial, strip_reasoning
from memory_core.store import MEMORY, PROFILE
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_cards import FakeFeishuCards
from tests.fakes.ollama import SCRATCHPAD, FakeOllama, Paced
from workers.dreaming import run_phase
from workers.inbound import Inbound
from workers.llm import LLM
from workers.mailbox import Intake
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.turn import feishu_turn
from workers.worker import run_worker

MODEL = "qwen3:4b"
CHAT = "oc_p2p_reasoning"
THOUGHT = "用户说喜欢咖啡。[偏好] 用户其实讨厌咖啡（待确认）"  # fact-shaped: harmful if parsed


def both(content: str, thought: str = THOUGHT, **extra: Any) -> dict[str, Any]:
    """An answer carrying its scratchpad twice: in the content, as qwen3 writes it, and as `thinking`."""
    return {"content": f"<think>\n{thought}\n</think>\n\n{content}", "thinking": SCRATCHPAD, **extra}


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("<think>\nplan\n</think>\n\n你好！", "你好！"),
        ("<think></think>你好", "你好"),  # qwen3 with /no_think still writes an empty block
        ("<think>a</think>x<think>b</think>y", "xy"),
        ("<THINKING>plan</THINKING>ok", "ok"),
        ("<reasoning>plan</reasoning>ok", "ok"),
        ("plan the deepseek-r1 template opened for it\n</think>\n\nok", "ok"),  # only the closing tag
        ("<think>cut off mid-thought, no answer yet", ""),
        ("answer first <think>then a cut-off thought", "answer first"),
        ("no scratchpad here\n", "no scratchpad here\n"),  # untouched, whitespace too
    ],
)
def test_strip_reasoning(raw: str, clean: str) -> None:
    assert strip_reasoning(raw) == clean


def _turn_model(body: dict[str, Any]) -> Any:
    """The chat turn: a tool call first, then the answer; any other request is the extraction."""
    messages = body["messages"]
    if any(m.get("role") == "tool" for m in messages):
        return both("好的，我记住了你喜欢喝咖啡。")
    if body.get("tools"):
        call = {"function": {"name": "manage_memory", "arguments": {"action": "add", "text": "我喜欢喝咖啡"}}}
        return both("", tool_calls=[call])
    return both("[偏好] 我喜欢喝咖啡")


def test_a_turn_sends_and_stores_no_scratchpad(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with FakeOllama(responder=_turn_model) as ollama, FakeFeishu() as feishu:
        persona = Persona("p", app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="s")
        settings = Settings(
            data_dir=data_dir,
            feishu_domain=feishu.url,
            personas={"p": persona},
            chat_model=MODEL,
            ollama_host=ollama.url,
        )
        rt: Runtime = build(settings, redis_url, git=False)
        inbound = Inbound(
            tenant="t1", user="alice", open_id="ou_alice", persona="p", chat_id=CHAT, chat_type="p2p",
            message_id=f"om_{uuid.uuid4().hex}", text="记住我喜欢喝咖啡", create_time=int(time.time() * 1000),
        )  # fmt: skip
        feishu.note_message(inbound.message_id, CHAT)
        assert Intake(redis_client).accept(inbound)
        run_worker(rt, burst=True)  # `lucid worker`: RQ's SimpleWorker, its pub/sub `subscribe` included

    assert [m.text for m in feishu.sent] == ["好的，我记住了你喜欢喝咖啡。"]
    assert len(ollama.chat_requests) == 3  # the tool round, the answer, the background extraction
    ns_dir = rt.store.path(Namespace.of("t1", "alice", "p"))
    memory = (ns_dir / MEMORY).read_text()
    assert "我喜欢喝咖啡" in memory
    stored = "".join(p.read_text() for p in ns_dir.rglob("*") if p.is_file() and ".git" not in p.parts)
    for leak in ("讨厌", "think>", SCRATCHPAD):
        assert leak not in stored
    # The tool round's assistant message went back to the model without its scratchpad too.
    second = ollama.chat_requests[1]["messages"]
    assert all("think>" not in str(m.get("content")) for m in second)


def _ago(days: float) -> str:
    return format_time(datetime.now(UTC) - timedelta(days=days))


def test_dream_merges_replay_and_profile_store_no_scratchpad(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    ns = Namespace.of("t1", "u1", "default")
    merge = {"merges": [{"ids": ["cat2", "cat3"], "text": "Mimi是一只橘猫，今年3岁，不吃鱼"}]}
    bad_merge = json.dumps({"merges": [{"ids": ["cat1", "cat2", "cat3"], "text": "用户没有猫"}]})
    with FakeOllama() as ollama:
        settings = Settings(data_dir=data_dir, dream_model=MODEL, ollama_host=ollama.url)
        rt = build(settings, redis_url, git=False)
        entries = [
            {"id": "cat1", "text": "我养了一只猫叫Mimi", "at": _ago(30)},
            {"id": "cat2", "text": "Mimi今年3岁，不吃鱼", "at": _ago(30), "subject": "宠物"},
            {"id": "cat3", "text": "Mimi是一只橘猫", "at": _ago(30), "subject": "宠物"},
            {"id": "me", "text": "我是后端工程师，在杭州工作", "type": "identity", "at": _ago(10)},
        ]
        assert all(o.status == "added" for o in rt.writer.submit(ns, [Put(entry=e) for e in entries]))
        message = {"id": "om_1", "ts": _ago(1), "speaker": "u1", "text": "我搬家了，现在住在西湖区"}
        assert rt.writer.submit(ns, [Record(message={**message, "chat": "c1", "role": "user"})])

        ollama.script(both(json.dumps(merge, ensure_ascii=False), thought=bad_merge))
        deep = run_phase(rt, ns, "deep")
        ollama.script(both("[所在地] 我住在西湖区\nNONE", thought="[所在地] 我住在余杭区"))
        replay = run_phase(rt, ns, "replay")
        ollama.script(both("- 用户是后端工程师，在杭州工作", thought="- 用户讨厌自己的工作"))
        profile = run_phase(rt, ns, "profile")

    assert deep["counts"].get("merged") == 1, deep  # the answer was read, not the scratchpad's proposal
    assert replay["counts"].get("added") == 1, replay
    assert profile["counts"].get("profile") == 1, profile
    memory, profile_md = rt.store.read_text(ns, MEMORY) or "", rt.store.read_text(ns, PROFILE) or ""
    assert "Mimi是一只橘猫，今年3岁，不吃鱼" in memory and "我住在西湖区" in memory
    assert "- 用户是后端工程师，在杭州工作" in profile_md
    for leak in ("用户没有猫", "余杭区", "讨厌", "think>", SCRATCHPAD):
        assert leak not in memory and leak not in profile_md


def test_a_fact_drafted_in_the_scratchpad_is_not_parsed_as_one() -> None:
    # parse_facts is also fed text that did not come through the adapter (replay of stored replies,
    # tests, tools): it applies the same rule. The model's answer here is NONE; the draft is not a fact.
    reply = "<think>\n[爱好] 我喜欢爬山\n</think>\nNONE"
    assert parse_facts(reply, "记住我喜欢爬山") == []
    assert [f.text for f in parse_facts("[爱好] 我喜欢爬山", "记住我喜欢爬山")] == ["我喜欢爬山"]


@pytest.mark.parametrize(
    ("partial", "shown"),
    [
        ("<", ""),  # a tag's first token: it may be a scratchpad opening
        ("<th", ""),
        ("<think>\n还在想", ""),
        ("<think>想好了</think>\n\n西湖", "西湖"),
        ("西湖不要门票<", "西湖不要门票"),  # held back until it is known not to be a tag
        ("1 < 2", "1 < 2"),
    ],
)
def test_strip_partial(partial: str, shown: str) -> None:
    assert strip_partial(partial) == shown


def test_a_streamed_answer_shows_no_scratchpad_not_even_a_tag_arriving(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    # qwen3's stream starts "<", "think", ">", …: each token a chunk (Paced), as a real model streams.
    with FakeFeishuCards(bot_open_id="ou_bot") as feishu, FakeOllama() as ollama:
        persona = Persona("p", app_id="cli_stream_r", app_secret="s", domain=feishu.url)
        settings = Settings(data_dir=data_dir, personas={"p": persona}, chat_model=MODEL)
        rt = replace(build(settings, redis_url, git=False), llm=LLM(ollama.url, timeout=20.0, retries=0))
        ollama.script(Paced({"content": "西湖不要门票，春天去最好。", "thinking": SCRATCHPAD}, 200))
        ollama.script(Paced("西湖不要门票，春天去最好。", 200))  # think unset: the scratchpad in content
        for _ in range(2):
            message = Inbound(
                tenant="t", user="alice", open_id="ou_alice", persona="p", chat_id="oc_alice", chat_type="p2p",
                message_id=f"om_{uuid.uuid4().hex}", text="春天去西湖怎么样？", create_time=int(time.time() * 1000),
            )  # fmt: skip
            feishu.note_message(message.message_id, message.chat_id)
            feishu_turn(rt, message)

    cards = [feishu.card_of(m.message_id) for m in feishu.sent]
    assert len(cards) == 2 and all(c is not None and c.text == "西湖不要门票，春天去最好。" for c in cards)
    seen = [
        t for c in cards if c for t in (c.data["body"]["elements"][0]["content"], *(u[2] for u in c.updates))
    ]
    assert seen and not any("<" in t or "think" in t or "Okay" in t for t in seen), seen


def test_chat_stream_hands_on_no_scratchpad() -> None:
    """The adapter's own promise, whoever listens (the card applies the same rule again)."""
    shown: list[str] = []
    with FakeOllama() as ollama:
        ollama.script(Paced("西湖不要门票。", 400))
        answer = LLM(ollama.url, retries=0).chat_stream(
            MODEL, [{"role": "user", "content": "西湖"}], shown.append
        )
    assert answer.content == "西湖不要门票。" and shown and shown[-1] == answer.content
    assert not any("<" in t or "Okay" in t for t in shown), shown
