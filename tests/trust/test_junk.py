"""Junk never lands: an extraction or replay answer that is not a list of facts grounded in what the user
said stores nothing, and is counted (`lucid_extraction_junk_total`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from memory_core.lineformat import format_time
from memory_core.namespace import Namespace
from memory_core.ops import Record
from tests.fakes.ollama import FakeOllama
from workers.dreaming import run_phase
from workers.extraction import JUNK_METRIC, extract_facts
from workers.llm import LLM
from workers.metrics import Metrics
from workers.runtime import build
from workers.settings import Settings

from .conftest import MODEL, ns_memory, turn_runtime

NS = Namespace.of("t1", "alice", "default")
SAID = "记住我喜欢喝茶，周末常去西湖边跑步"


def _junk_count(client: redis.Redis, path: str) -> int:
    line = f'{JUNK_METRIC}{{path="{path}"}}'
    for row in Metrics(client).render().splitlines():
        if row.startswith(line + " "):
            return int(float(row.split()[-1]))
    return 0


JUNK = [
    "好的。",
    "好的，我记住了。",
    "收到！",
    "OK",
    "Sure, I'll remember that.",
    "Got it!",
    "<think>用户喜欢喝茶</think>好的",
    "没问题，已经记下了",
    "Here are the facts:",
]


@pytest.mark.parametrize("answer", JUNK)
def test_a_chatty_extraction_answer_stores_nothing_and_is_counted(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama, answer: str
) -> None:
    rt = turn_runtime(data_dir, redis_url, ollama)
    assert rt.llm is not None
    ollama.script(answer)
    ops = extract_facts(rt.llm, MODEL, SAID, metrics=Metrics(redis_client))
    if ops:
        rt.writer.submit(NS, ops)
    assert ops == [] and ns_memory(rt, NS).count("\n- ") == 0  # nothing in MEMORY.md
    assert _junk_count(redis_client, "extract") == 1


def test_a_valid_answer_lands_and_none_is_not_junk(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = turn_runtime(data_dir, redis_url, ollama)
    assert rt.llm is not None
    ollama.script("好的。\n[饮食] 用户喜欢喝茶", "NONE")
    ops = extract_facts(rt.llm, MODEL, SAID, metrics=Metrics(redis_client))
    rt.writer.submit(NS, ops)
    assert [op.text for op in ops] == ["用户喜欢喝茶"]  # the fact lands, the chatter beside it does not
    assert "- 用户喜欢喝茶" in ns_memory(rt, NS) and "好的" not in ns_memory(rt, NS)
    assert extract_facts(rt.llm, MODEL, SAID, metrics=Metrics(redis_client)) == []
    assert _junk_count(redis_client, "extract") == 0


def test_an_ungrounded_answer_is_junk(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    rt = turn_runtime(data_dir, redis_url, ollama)
    assert rt.llm is not None
    ollama.script("[所在地] 用户住在纽约曼哈顿")  # nothing of it was said
    assert extract_facts(rt.llm, MODEL, SAID, metrics=Metrics(redis_client)) == []
    assert _junk_count(redis_client, "extract") == 1


@pytest.mark.parametrize("answer", ["好的。", "Sure, noted!"])
def test_a_chatty_replay_answer_stores_nothing_and_is_counted(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama, answer: str
) -> None:
    settings = Settings(data_dir=data_dir, dream_model=MODEL, ollama_host=ollama.url)
    rt = replace(build(settings, redis_url, git=False), llm=LLM(ollama.url, timeout=2.0, retries=0))
    ts = format_time(datetime.now(UTC) - timedelta(hours=2))
    message = {
        "id": "om_1",
        "ts": ts,
        "speaker": "u1",
        "text": SAID,
        "chat": "c1",
        "chat_type": "p2p",
        "role": "user",
    }
    rt.writer.submit(NS, [Record(message=message)])
    ollama.script(answer)
    report = run_phase(rt, NS, "replay")
    assert report["rejections"].get("junk_answer") == 1
    assert ns_memory(rt, NS).count("\n- ") == 0
    assert _junk_count(redis_client, "replay") == 1
