"""Pins and identities change only by the person's own act, and then only the part they change: a new
nickname adds, a new name supersedes just the name, and what else the line said stays current and
recallable."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from memory_core.namespace import Namespace
from memory_core.ops import Remember
from tests.fakes.ollama import FakeOllama
from workers.inbound import Inbound
from workers.turn import run_turn

from .conftest import Lucid, turn_runtime

ID_LINE = "我叫王小明，在字节跳动做后端开发"


def test_a_nickname_adds_and_the_pinned_identity_stays(lucid: Lucid) -> None:
    pinned = lucid.remember(ID_LINE, "--type", "identity", "--pin")
    out = lucid.remember("以后叫我小明")
    assert out["status"] == "added"
    assert sorted(lucid.current()) == sorted([ID_LINE, "以后叫我小明"])
    assert lucid.entry(ID_LINE)["pinned"] is True and lucid.entry(ID_LINE)["id"] == pinned["id"]
    assert "pin=1" in lucid.line_of(ID_LINE) and "vt=" not in lucid.line_of(ID_LINE)
    assert ID_LINE in lucid.recall("字节跳动")  # the employer is still recallable


def test_a_new_name_supersedes_only_the_name(lucid: Lucid) -> None:
    old = lucid.remember(ID_LINE, "--type", "identity", "--pin")
    out = lucid.remember("我的名字是王大明")
    assert out["status"] == "superseded:subject:姓名" and out["superseded"] == [old["id"]]
    current = lucid.current()
    assert "我的名字是王大明" in current and ID_LINE not in current
    rest = lucid.entry("我在字节跳动做后端开发")  # the rest of the line, still current, still pinned
    assert rest["current"] and rest["pinned"] and rest["type"] == "identity"
    assert lucid.history() == [ID_LINE]
    assert "我在字节跳动做后端开发" in lucid.recall("字节跳动")


def test_english_nickname_adds_to_the_full_name(lucid: Lucid) -> None:
    line = "My name is John Smith, I work at Acme as a designer"
    lucid.remember(line, "--type", "identity", "--pin")
    assert lucid.remember("call me Johnny")["status"] == "added"
    assert sorted(lucid.current()) == sorted([line, "call me Johnny"])


def test_english_name_change_keeps_the_employer(lucid: Lucid) -> None:
    lucid.remember("my name is John Smith, I work at Acme", "--type", "identity", "--pin")
    out = lucid.remember("my name is John Brown")
    assert out["status"].startswith("superseded:")
    assert sorted(lucid.current()) == sorted(["my name is John Brown", "I work at Acme"])


def test_a_new_nickname_replaces_the_old_nickname(lucid: Lucid) -> None:
    lucid.remember("叫我小明就行")
    out = lucid.remember("以后叫我阿明")
    assert out["status"] == "superseded:subject:姓名"
    assert lucid.current() == ["以后叫我阿明"] and lucid.history() == ["叫我小明就行"]


@pytest.mark.parametrize(
    ("pinned", "change", "rest"),
    [
        ("我住在杭州，养了一只橘猫", "我搬到上海了", "我养了一只橘猫"),
        ("我在余杭区，对花生过敏", "我现在在西湖区", "我对花生过敏"),
        ("I live in Paris, I am allergic to peanuts", "I moved to Berlin", "I am allergic to peanuts"),
    ],
)
def test_changing_one_fact_of_a_pinned_line_keeps_the_others(
    lucid: Lucid, pinned: str, change: str, rest: str
) -> None:
    lucid.remember(pinned, "--pin")
    lucid.remember(change)
    assert sorted(lucid.current()) == sorted([change, rest])
    assert lucid.entry(rest)["pinned"] is True  # the user's pin stays on what they pinned
    assert lucid.history() == [pinned]


def test_the_users_own_forget_of_a_pin_works(lucid: Lucid) -> None:
    pinned = lucid.remember(ID_LINE, "--type", "identity", "--pin")
    assert lucid.forget(pinned["id"])["status"] == "forgotten"
    assert lucid.current() == [] and ID_LINE not in lucid.memory_md()


def test_a_title_as_address_adds(lucid: Lucid) -> None:
    lucid.remember("我叫王小明，是产品经理", "--type", "identity", "--pin")
    assert lucid.remember("以后叫我王经理")["status"] == "added"
    assert "我叫王小明，是产品经理" in lucid.current()


def test_after_a_nickname_the_model_still_sees_the_employer(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, ollama: FakeOllama
) -> None:
    """The issue's story through a chat turn: the pinned identity stays in what the model is shown."""
    rt = turn_runtime(data_dir, redis_url, ollama)
    ns = Namespace.of("t1", "alice", "default")
    rt.writer.submit(ns, [Remember(text=ID_LINE, type="identity", pinned=True)])
    rt.writer.submit(ns, [Remember(text="以后叫我小明", type="identity")])
    ollama.script("小明，你在字节跳动做后端开发。")
    replies: list[str] = []
    inbound = Inbound(
        tenant="t1", user="alice", open_id="ou_alice", persona="default", chat_id="oc_p2p_alice",
        chat_type="p2p", message_id="om_q1", text="我在哪家公司工作？", mentioned_bot=False,
        create_time=int(time.time() * 1000),
    )  # fmt: skip
    run_turn(rt, inbound, replies.append)
    system = ollama.chat_requests[-1]["messages"][0]["content"]
    assert ID_LINE in system and "以后叫我小明" in system
    assert replies == ["小明，你在字节跳动做后端开发。"]
