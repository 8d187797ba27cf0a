"""Memory-only mode (no chat model) is honest and useful: it says it stored something only when it did,
and what; durable first-person statements are stored; "what do you know about me" in any phrasing lists
memory; replies come in the person's language (also /memory); and chat, `lucid recall` and the viewer's
query box answer from one recall path. Through the real turn, the real writer and the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from bot import cli
from bot.viewer import view
from memory_core.ops import Remember
from tests.trust.turns import TENANT, make_runtime, memory_file, ns, turn
from workers.runtime import Runtime


@pytest.fixture
def rt(data_dir: Path, redis_url: str, redis_client: redis.Redis) -> Runtime:
    return make_runtime(data_dir, redis_url)


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("I mostly write Go and a bit of Rust", "I'll remember"),
        ("我养了一条狗叫旺财", "我记住了"),
        ("I have two cats called Miso and Tofu", "I'll remember"),
        ("我平时用Vim写代码", "我记住了"),
        # the people in one's life, in Chinese as in English (My sister lives in Berlin)
        ("我女儿今年五岁，叫朵朵", "我记住了"),
        ("我老婆是老师", "我记住了"),
        ("我儿子在上小学", "我记住了"),
        ("我家有两只猫", "我记住了"),
        # health, in English as in Chinese (我对花生过敏); a frank opener changes nothing
        ("I'm allergic to peanuts", "I'll remember"),
        ("I don't eat pork", "I'll remember"),
        ("其实我对花生过敏", "我记住了"),
    ],
)
def test_a_durable_first_person_statement_is_stored_and_the_reply_says_what(
    rt: Runtime, statement: str, said: str
) -> None:
    reply, _ = turn(rt, statement)
    assert said in reply and statement in reply
    assert statement in memory_file(rt)


@pytest.mark.parametrize(
    ("remark", "lie"),
    [
        ("I'm so tired today", "Noted"),
        ("我刚吃完饭", "收到"),
        ("I think it might rain", "Noted"),
        ("I have a question about Python", "Noted"),
        ("我是说你可以换个方法", "收到"),
        ("我老婆在做饭", "收到"),
        ("我女儿今天发烧了", "收到"),
        ("我老婆有点不高兴", "收到"),
    ],
)
def test_a_passing_remark_is_not_stored_and_the_reply_does_not_pretend(
    rt: Runtime, remark: str, lie: str
) -> None:
    reply, _ = turn(rt, remark)
    assert lie not in reply and "remember:" not in reply and "记住了：" not in reply
    assert "haven't stored" in reply or "没有把这句存" in reply
    assert remark not in memory_file(rt)


@pytest.mark.parametrize(
    "question",
    [
        "What do you remember about me?",
        "what do you know about me",
        "Tell me what you know about me.",
        "你记得我什么",
        "关于我你知道什么",
        "你都知道我哪些事？",
        "你对我有多少了解",
    ],
)
def test_what_do_you_know_about_me_lists_memory_in_any_phrasing(rt: Runtime, question: str) -> None:
    facts = ["我住在余杭区", "我对花生过敏", "I mostly write Go and a bit of Rust", "我养了一条狗叫旺财"]
    rt.writer.submit(ns(), [Remember(f, source="user") for f in facts])

    reply, _ = turn(rt, question)

    assert all(f in reply for f in facts), reply
    assert "don't know" not in reply and "还不知道" not in reply
    english = question.isascii()
    assert ("I remember 4 things" in reply) == english and ("4 件事" in reply) == (not english)


def test_memory_answers_in_the_conversations_language(rt: Runtime) -> None:
    turn(rt, "I mostly write Go and a bit of Rust")
    listing, _ = turn(rt, "/memory")
    assert listing.startswith("I remember 1 things about you") and "我记得" not in listing

    turn(rt, "我养了一条狗叫旺财")
    listing, _ = turn(rt, "/memory")
    assert listing.startswith("我记得关于你的 2 件事")


def test_chat_lucid_recall_and_the_viewer_find_the_same_answer(
    rt: Runtime,
    data_dir: Path,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    turn(rt, "我住在余杭区")
    turn(rt, "我现在在西湖区")
    rt.writer.submit(ns(), [Remember("我周末喜欢爬山", source="user")])

    answer, _ = turn(rt, "我住在哪")
    monkeypatch.setenv("REDIS_URL", redis_url)
    code = cli.main(
        ["recall", "我住在哪", "--data", str(data_dir), "--tenant", TENANT, "--user", "alice", "--json"]
    )
    printed = json.loads(capsys.readouterr().out)
    rows = [r for r in view(rt, rt.memory, ns(), "我住在哪")["recall"] if r["relevance"]]

    assert answer.startswith("根据我的记忆：我现在在西湖区")
    assert code == 0 and printed["results"][0]["text"] == "我现在在西湖区"
    assert rows[0]["text"] == "我现在在西湖区"
    assert "我在余杭区" not in [r["text"] for r in printed["results"]]


def test_an_english_question_is_answered_from_memory_in_english(rt: Runtime) -> None:
    rt.writer.submit(ns(), [Remember("My sister lives in Berlin", source="user")])
    reply, _ = turn(rt, "Where does my sister live?")
    assert reply.startswith("I remember") and "Berlin" in reply and "记" not in reply


def test_a_question_about_someone_in_ones_life_is_answered_from_memory(rt: Runtime) -> None:
    turn(rt, "我女儿今年五岁，叫朵朵")
    reply, _ = turn(rt, "我女儿多大了")
    assert reply.startswith("我记得") and "我女儿今年五岁，叫朵朵" in reply
    assert memory_file(rt).count("我女儿") == 1  # asked, not stored as a statement
