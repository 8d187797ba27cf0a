"""The CLI writes memory through the bot's own memory service: what a chat turn does to a statement, a
forget or a pin, `lucid remember/forget/pin` does too (the real command in-process, a real turn, real
Redis)."""

from __future__ import annotations

from pathlib import Path

import redis

from memory_core.namespace import Namespace
from tests.trust._history_helpers import Lucid
from tests.trust.turns import TENANT, make_runtime, turn
from workers.metrics import Metrics
from workers.runtime import Runtime


def entry(person: Lucid, text: str) -> dict[str, object]:
    [found] = [r for r in person.ok("show", "--all", "--json").json()["results"] if r["text"] == text]
    return dict(found)


def test_a_statement_is_kept_as_a_chat_turn_keeps_it(data_dir: Path) -> None:
    runtime = make_runtime(data_dir, None)
    for said in ("记住我是一名医生", "记住我喜欢爬山", "记住以后回答我都用中文"):
        turn(runtime, said, user="bob")  # the bot, memory-only: no model
    alice, bob = Lucid(data_dir, user="alice", tenant=TENANT), Lucid(data_dir, user="bob", tenant=TENANT)
    for text in ("我是一名医生", "我喜欢爬山", "以后回答我都用中文"):
        alice.ok("remember", text)
        by_bot, by_cli = entry(bob, text), entry(alice, text)
        assert by_cli["type"] == by_bot["type"] != "fact", text  # identity, preference, instruction
        assert by_cli["tier"] == by_bot["tier"] == "resident", text
    # so light dreaming a year on leaves them alone in both (a protected kind), as a fact would not be
    later = "2027-06-20T09:00:00Z"
    alice.ok("remember", "我的车是白色的", "--type", "fact")
    alice.ok("dream", "--phase", "light", now=later)
    assert sorted(alice.archived_texts()) == ["我的车是白色的"]


def test_a_forget_through_the_cli_drops_the_short_history_like_the_bots(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    alice = Lucid(data_dir, user="alice", tenant=TENANT, env={"REDIS_URL": redis_url})
    ns = Namespace.of(TENANT, "alice", "default")
    nut = alice.ok("remember", "我对花生过敏", "--json").json()["id"]
    redis_client.set(f"lucid:history:{ns.key}:oc_p2p_alice", "[我对花生过敏]")  # the model's recent turns
    assert alice.ok("forget", nut, "--json").json()["status"] == "forgotten"
    assert not list(redis_client.scan_iter(match=f"lucid:history:{ns.key}:*"))
    assert "花生" not in alice.read("MEMORY.md")


def recalled(runtime: Runtime, query: str) -> list[str]:
    ns = Namespace.of(TENANT, "alice", "default")
    return [s.entry.text for s in runtime.memory.recall(ns, query, runtime.clock())]


def test_an_undo_through_the_cli_is_a_memory_write_like_the_others(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """`lucid undo` writes through the bot's memory service: the bot running in the same process sees the
    undone state at its next recall (as does a fresh one), and /metrics counts it with the other writes."""
    bot = make_runtime(data_dir, redis_url, git=True)
    turn(bot, "记住我对花生过敏")
    assert recalled(bot, "我对什么过敏") == ["我对花生过敏"]
    alice = Lucid(data_dir, user="alice", tenant=TENANT, env={"REDIS_URL": redis_url})
    undone = alice.ok("undo", "--json").json()
    assert undone["summary"] == "remembered 1 (我对花生过敏)" and undone["entries"] == 1
    assert recalled(bot, "我对什么过敏") == []  # the bot's warm books follow the undo
    assert recalled(make_runtime(data_dir, redis_url), "我对什么过敏") == []
    assert 'lucid_memory_writes_total{outcome="undone"} 1' in Metrics(redis_client).render().splitlines()


def test_a_purge_through_the_cli_is_a_memory_write_like_the_others(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """`lucid forget --purge` goes through the bot's memory service too: the model's short history loses
    the fact, the bot running beside it no longer recalls it, git keeps no trace, /metrics counts it."""
    bot = make_runtime(data_dir, redis_url, git=True)
    turn(bot, "记住我对花生过敏")
    assert recalled(bot, "我对什么过敏") == ["我对花生过敏"]
    ns = Namespace.of(TENANT, "alice", "default")
    redis_client.set(f"lucid:history:{ns.key}:oc_p2p_alice", "[我对花生过敏]")
    alice = Lucid(data_dir, user="alice", tenant=TENANT, env={"REDIS_URL": redis_url})
    nut = entry(alice, "我对花生过敏")["id"]
    assert alice.ok("forget", str(nut), "--purge", "--json").json()["status"] == "purged"
    assert recalled(bot, "我对什么过敏") == []
    assert not list(redis_client.scan_iter(match=f"lucid:history:{ns.key}:*"))
    assert "花生" not in alice.ok("history", "--all").out
    shown = Metrics(redis_client).render().splitlines()
    assert 'lucid_memory_writes_total{outcome="purged"} 1' in shown


def test_a_pin_of_a_superseded_entry_is_refused_naming_its_successor(data_dir: Path) -> None:
    alice = Lucid(data_dir, user="alice")
    old = alice.ok("remember", "我住在余杭区", "--json", now="2026-06-01T09:00:00Z").json()["id"]
    new = alice.ok("remember", "我住在西湖区", "--json", now="2026-06-10T09:00:00Z").json()["id"]
    ran = alice("pin", old)
    assert ran.code == 2 and f"was superseded by {new[:8]} (我住在西湖区)" in ran.err
    assert "pin=1" not in alice.read("MEMORY.md")
