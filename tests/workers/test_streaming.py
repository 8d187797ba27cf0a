"""Streaming replies: the model's answer grows in a CardKit card (the real SDK against FakeFeishuCards, the
real ollama client against FakeOllama streaming at a set pace), throttled under CardKit's per-card limit,
exactly once under a redone turn, in the message's thread, and a plain reply when CardKit is refused."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from tests.fakes.feishu_cards import FakeFeishuCards
from tests.fakes.ollama import Endless, FakeOllama, Paced
from workers.cards import MIN_INTERVAL, visible
from workers.inbound import Inbound
from workers.llm import LLM
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.turn import MAX_REPLY_CHARS, feishu_turn

MODEL = "qwen3:4b"
ANSWER = "西湖在杭州的西边，春天去最好：苏堤的桃花和柳树都很好看，记得早点出发避开人群。" * 2


@pytest.fixture
def feishu() -> Iterator[FakeFeishuCards]:
    with FakeFeishuCards(bot_open_id="ou_bot") as fake:
        yield fake


@pytest.fixture
def ollama() -> Iterator[FakeOllama]:
    with FakeOllama() as fake:
        yield fake


@pytest.fixture
def rt(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, feishu: FakeFeishuCards, ollama: FakeOllama
) -> Runtime:
    persona = Persona("p", app_id="cli_stream", app_secret="s", verification_token="v", domain=feishu.url)
    settings = Settings(data_dir=data_dir, personas={"p": persona}, chat_model=MODEL)
    return replace(build(settings, redis_url, git=False), llm=LLM(ollama.url, timeout=20.0, retries=0))


def inbound(text: str = "春天去西湖怎么样？", thread: str = "") -> Inbound:
    message_id = f"om_{uuid.uuid4().hex}"
    return Inbound(
        tenant="t", user="alice", open_id="ou_alice", persona="p", chat_id="oc_alice", chat_type="p2p",
        message_id=message_id, text=text, create_time=int(time.time() * 1000), thread_id=thread,
    )  # fmt: skip


def _note(feishu: FakeFeishuCards, message: Inbound) -> Inbound:
    feishu.note_message(message.message_id, message.chat_id)
    return message


def test_the_answer_grows_in_a_card_and_ends_as_the_plain_reply_would(
    rt: Runtime, feishu: FakeFeishuCards, ollama: FakeOllama
) -> None:
    ollama.script(Paced(ANSWER, tokens_per_second=100))
    message = _note(feishu, inbound())
    feishu_turn(rt, message)

    (sent,) = [m for m in feishu.sent if m.parent_id == message.message_id]
    assert sent.msg_type == "interactive" and sent.uuid == message.message_id
    card = feishu.card_of(sent.message_id)
    assert card is not None
    assert card.text == ANSWER.strip() and not card.streaming  # streaming ended: no "[生成中…]" left
    # it grew: the first text a person saw was a short prefix, shown before the model had finished
    first = card.data["body"]["elements"][0]["content"]
    assert ANSWER.startswith(first) and len(first) < len(ANSWER) // 4
    assert card.created_at < ollama.streamed_at[0]
    texts = [text for _, _, text in card.updates]
    assert len(texts) >= 3 and all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert feishu.card_errors == []  # sequences strictly increasing, never over 10 operations a second


def test_updates_are_throttled_under_cardkits_per_card_limit(
    rt: Runtime, feishu: FakeFeishuCards, ollama: FakeOllama
) -> None:
    ollama.script(Paced(ANSWER, tokens_per_second=400))  # tokens far faster than a card may change
    message = _note(feishu, inbound())
    feishu_turn(rt, message)
    card = feishu.card_of(feishu.sent[-1].message_id)
    assert card is not None and card.text == ANSWER.strip()
    times = [t for t, _, _ in card.updates]
    assert len(times) < len(ANSWER) / 4  # far fewer updates than chunks (one per CJK character here)
    gaps = [b - a for a, b in itertools.pairwise(times)][:-1]  # the final update may come sooner
    assert all(gap >= MIN_INTERVAL * 0.9 for gap in gaps), gaps  # as the fake recorded them
    assert feishu.card_errors == []


def test_reasoning_never_reaches_the_card(rt: Runtime, feishu: FakeFeishuCards, ollama: FakeOllama) -> None:
    ollama.script(
        Paced("<think>用户问西湖，我先想想该不该提门票</think>西湖不要门票。", tokens_per_second=200)
    )
    message = _note(feishu, inbound())
    feishu_turn(rt, message)
    card = feishu.card_of(feishu.sent[-1].message_id)
    assert card is not None and card.text == "西湖不要门票。"
    seen = [card.data["body"]["elements"][0]["content"], *(t for _, _, t in card.updates)]
    assert not any("门票</think>" in t or "该不该" in t for t in seen)


def test_a_redone_turn_finishes_the_same_card_and_posts_nothing_twice(
    rt: Runtime, feishu: FakeFeishuCards, ollama: FakeOllama
) -> None:
    ollama.script(Paced(ANSWER, tokens_per_second=200), Paced(ANSWER, tokens_per_second=200))
    message = _note(feishu, inbound())
    feishu_turn(rt, message)
    feishu_turn(rt, message)  # its worker "died" after replying: the recovery sweep runs the turn again
    assert len([m for m in feishu.sent if m.parent_id == message.message_id]) == 1
    assert len(feishu.cards) == 1
    (card,) = feishu.cards.values()
    assert card.text == ANSWER.strip() and feishu.card_errors == []


def test_without_cardkit_the_same_answer_comes_as_a_plain_reply_and_cards_are_not_asked_again(
    rt: Runtime, feishu: FakeFeishuCards, ollama: FakeOllama
) -> None:
    feishu.refuse_cards()  # the app lacks cardkit:card:write
    ollama.script(Paced(ANSWER, tokens_per_second=400), Paced("好的。", tokens_per_second=400))
    first, second = _note(feishu, inbound()), _note(feishu, inbound("谢谢"))
    feishu_turn(rt, first)
    feishu_turn(rt, second)
    replies = [m for m in feishu.sent if m.parent_id in (first.message_id, second.message_id)]
    assert [m.msg_type for m in replies] != [] and all(m.msg_type in ("text", "post") for m in replies)
    assert ANSWER.strip()[:20] in replies[0].content
    card_calls = [c for c in feishu.requests if "/cardkit/" in c.path]
    assert len(card_calls) == 1  # refused once; the next reply did not ask again


def test_a_message_in_a_thread_is_answered_in_that_thread(
    rt: Runtime, feishu: FakeFeishuCards, ollama: FakeOllama
) -> None:
    ollama.script(Paced("在这个话题里回答你。", tokens_per_second=200))
    message = _note(feishu, inbound(thread="omt_topic_1"))
    feishu_turn(rt, message)
    (sent,) = [m for m in feishu.sent if m.parent_id == message.message_id]
    assert sent.reply_in_thread


def test_a_streamed_answer_that_does_not_stop_ends_at_the_cap(
    rt: Runtime, feishu: FakeFeishuCards, ollama: FakeOllama
) -> None:
    ollama.script(Endless("x" * 60 + " "))
    message = _note(feishu, inbound())
    feishu_turn(rt, message)
    (sent,) = [m for m in feishu.sent if m.parent_id == message.message_id]
    card = feishu.card_of(sent.message_id)
    assert card is not None and not card.streaming
    assert set(card.text) <= {"x", " ", "…"} and len(card.text) <= MAX_REPLY_CHARS
    assert ollama.streams_left == 1 and not ollama.streamed_at  # the stream was left, not read to its end


def test_visible_text_hides_an_open_think_block() -> None:
    assert visible("<think>还在想") == ""
    assert visible("<think>想好了</think>答：是") == "答：是"
    assert visible("答：<think>顺便想想</think>是的") == "答：是的"
