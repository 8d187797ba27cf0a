"""Hits count only the entries a reply used (its words, or a tool call on the entry's id); entries merely
shown — recalled or resident — get none, and light dreaming's promotion (≥ 3 hits) follows. The resident
snapshot is frozen in Redis per (chat, persona) session: two workers serve the same one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from memory_core.entry import Entry
from memory_core.lineformat import parse_file
from memory_core.ops import Remember
from tests.fakes.ollama import FakeOllama
from tests.trust.recall_helpers import hits
from tests.trust.turns import make_runtime, memory_file, ns, system_prompt, turn
from workers.dreaming import run_phase
from workers.memory_service import MemoryService
from workers.runtime import Runtime

COFFEE = "我喜欢喝美式咖啡"
PREF = "I prefer dark mode in every editor"


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    with FakeOllama() as fake:
        yield fake


@pytest.fixture
def rt(data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama) -> Runtime:
    runtime = make_runtime(data_dir, redis_url, ollama=ollama)
    runtime.writer.submit(ns(), [Remember(COFFEE, type="fact", source="user"), Remember(PREF, source="user")])
    return runtime


def test_an_entry_shown_but_not_used_gets_no_hit(rt: Runtime, ollama: FakeOllama) -> None:
    ollama.script("街角那家新开的店不错，可以去看看。")
    turn(rt, "附近有什么好的咖啡店")

    assert COFFEE in system_prompt(ollama)  # it was shown to the model…
    assert hits(rt, COFFEE) == 0  # …but the reply did not use it
    assert hits(rt, PREF) == 0  # resident and shown on every turn: no hit either


def test_an_entry_the_reply_used_gets_a_hit(rt: Runtime, ollama: FakeOllama) -> None:
    ollama.script("你喜欢喝美式咖啡，那就点一杯美式吧！")
    _, result = turn(rt, "今天下午喝什么咖啡好")

    assert hits(rt, COFFEE) == 1
    assert result.used and hits(rt, PREF) == 0


def test_a_resident_entry_the_reply_used_gets_a_hit_in_english(rt: Runtime, ollama: FakeOllama) -> None:
    ollama.script("Since you prefer dark mode in every editor, try the Dracula theme.")
    turn(rt, "Which theme should I pick for my new editor?")
    assert hits(rt, PREF) == 1
    assert hits(rt, COFFEE) == 0


def test_a_tool_call_on_an_entry_is_a_hit(rt: Runtime, ollama: FakeOllama) -> None:
    target = next(e for e in MemoryService(rt).book(ns()).entries() if e.text == COFFEE)
    ollama.script(
        {"content": "", "tool_calls": [{"function": {"name": "manage_memory",
         "arguments": {"action": "pin", "target": target.id}}}]},
        "好的。",
    )  # fmt: skip
    turn(rt, "把喝咖啡那条置顶")
    assert hits(rt, COFFEE) == 1


def test_promotion_follows_used_hits_not_shown_ones(rt: Runtime, ollama: FakeOllama) -> None:
    for _ in range(4):  # shown four times, never used: stays in the recall tier
        ollama.script("可以试试手冲。")
        turn(rt, "推荐一种咖啡的做法")
    run_phase(rt, ns(), "light")
    assert not _entry(rt, COFFEE).resident

    for _ in range(3):  # used three times: promoted
        ollama.script("你喜欢喝美式咖啡，就来一杯美式。")
        turn(rt, "下午喝什么咖啡")
    assert hits(rt, COFFEE) == 3
    run_phase(rt, ns(), "light")
    assert _entry(rt, COFFEE).resident


def _entry(runtime: Runtime, text: str) -> Entry:
    return next(e for e in parse_file(memory_file(runtime)).entries() if e.text == text)


# ------------------------------------------------------------------------------------------ resident


def test_two_workers_serve_the_same_frozen_resident_snapshot(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    first = make_runtime(data_dir, redis_url)
    second = make_runtime(data_dir, redis_url)  # another worker: its own runtime and memory service
    first.writer.submit(ns(), [Remember("以后回答都用中文", type="instruction", source="user")])
    a, b = MemoryService(first), MemoryService(second)
    now = first.clock()

    before = [e.text for e in a.resident(ns(), now, "p2p", "oc_p2p_alice", "s1")]
    first.writer.submit(ns(), [Remember("I'm a backend engineer", type="identity", source="user")])
    on_b = [e.text for e in b.resident(ns(), now, "p2p", "oc_p2p_alice", "s1")]
    fresh = [e.text for e in b.resident(ns(), now, "p2p", "oc_p2p_alice", "s2")]

    assert before == ["以后回答都用中文"] and on_b == before  # the session's snapshot, on every worker
    assert "I'm a backend engineer" in fresh  # a new session takes a new snapshot
    ttl = redis_client.ttl(f"lucid:resident:{ns().key}:p2p:oc_p2p_alice:s1")
    assert 0 < ttl <= 30 * 60  # expires after 30 minutes idle


def test_a_forgotten_entry_leaves_the_frozen_snapshot_at_once(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    from memory_core.ops import Forget

    first, second = make_runtime(data_dir, redis_url), make_runtime(data_dir, redis_url)
    out = first.writer.submit(ns(), [Remember("以后回答都用中文", type="instruction", source="user")])[0]
    now = first.clock()
    assert [e.text for e in MemoryService(first).resident(ns(), now, "p2p", "c", "s")] == ["以后回答都用中文"]
    first.writer.submit(ns(), [Forget(id=str(out.id))])
    assert MemoryService(second).resident(ns(), now, "p2p", "c", "s") == []
