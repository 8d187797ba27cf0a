"""End to end: Feishu deliveries → two bot replicas → Redis → one RQ worker → replies on the fake Feishu.

Everything real except Feishu and Ollama, which are local fakes driven by the real lark-oapi and ollama
clients. Feishu is played as the unreliable network it is: every event arrives twice (a retry with a new
nonce and signature), often at both replicas at once, and the API fails in between.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient

from bot.app import create_app
from memory_core.lineformat import RawMessage, parse_raw
from memory_core.namespace import Namespace
from tests.fakes.feishu import FakeFeishu, rate_limited, server_error
from tests.fakes.feishu_events import (
    ALICE,
    BOB,
    GROUP_CHAT_ID,
    TENANT_KEY,
    VERIFICATION_TOKEN,
    User,
    deliver,
    group_mention_event,
    message_event,
)
from tests.fakes.ollama import FakeOllama
from workers.llm import LLM
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.worker import Worker

KEY = "e2e-encrypt-key"
BOT = "ou_e2e_bot_0000000000000000000000"
ClientFactory = Callable[..., Any]


def parse_raw_file(text: str) -> list[RawMessage]:
    return [parse_raw(line) for line in text.splitlines() if line.startswith("- ")]


@pytest.fixture
def feishu() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id=BOT) as fake:
        yield fake


def settings_for(data_dir: Path, feishu: FakeFeishu, **extra: Any) -> Settings:
    personas = {
        name: Persona(
            name,
            app_id=f"cli_{uuid.uuid4().hex[:12]}",
            app_secret="secret",
            verification_token=VERIFICATION_TOKEN,
            encrypt_key=KEY,
            bot_open_id=BOT,
        )
        for name in ("x", "y")
    }
    return Settings(data_dir=data_dir, feishu_domain=feishu.url, personas=personas, **extra)


class Harness:
    """Two webhook replicas, the worker's runtime, and Feishu playing its delivery games."""

    def __init__(
        self, replicas: list[TestClient], worker: Runtime, feishu: FakeFeishu, client: redis.Redis
    ) -> None:
        self.replicas, self.worker, self.feishu, self.redis = replicas, worker, feishu, client
        self.rng = random.Random(7)
        self.clock = int(time.time() * 1000) - 60_000

    def event(self, text: str, sender: User = ALICE, group: bool = False) -> dict[str, Any]:
        self.clock += 1000  # each message a second after the last, as a person types
        if group:
            event = group_mention_event(text, bot_open_id=BOT, sender=sender, create_time_ms=self.clock)
        else:
            event = message_event(text, sender=sender, create_time_ms=self.clock)
        message = event["event"]["message"]
        self.feishu.note_message(message["message_id"], message["chat_id"])
        return event

    async def send(self, events: list[dict[str, Any]], persona: str = "x") -> None:
        """Each event twice (a retry: new nonce and signature), often to both replicas, all concurrently."""
        posts = []
        for event in events:
            for _ in range(2):
                target = self.rng.choice(self.replicas)
                d = deliver(event, encrypt_key=KEY)
                posts.append(target.post(f"/feishu/{persona}/events", data=d.body, headers=d.headers))
        statuses = [r.status for r in await asyncio.gather(*posts)]
        assert set(statuses) == {200}

    def work(self) -> None:
        Worker(self.worker, ("chat",)).work(burst=True)

    def replies_to(self, events: list[dict[str, Any]]) -> list[str]:
        """The replies in the order Feishu received them, one entry per reply to these messages."""
        ids = {e["event"]["message"]["message_id"] for e in events}
        return [m.text or "" for m in self.feishu.sent if m.parent_id in ids]

    def memory(self, who: User, persona: str = "x") -> str:
        path = self.worker.store.path(Namespace.of(TENANT_KEY, who.union_id, persona)) / "MEMORY.md"
        return path.read_text() if path.exists() else ""


@pytest.fixture
async def harness(
    aiohttp_client: ClientFactory,
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    feishu: FakeFeishu,
) -> Harness:
    settings = settings_for(data_dir, feishu)
    replicas = [await aiohttp_client(create_app(build(settings, redis_url, git=False))) for _ in range(2)]
    return Harness(replicas, build(settings, redis_url, git=False), feishu, redis_client)


async def test_every_message_gets_exactly_one_reply_in_order_per_person(harness: Harness) -> None:
    alice = [harness.event(t, ALICE) for t in ("你好", "我住在余杭区", "记住我喜欢咖啡", "我在哪")]
    bob = [harness.event(t, BOB) for t in ("在吗", "我在哪")]
    await harness.send(alice + bob)
    harness.work()

    alice_replies, bob_replies = harness.replies_to(alice), harness.replies_to(bob)
    assert len(alice_replies) == 4 and len(bob_replies) == 2
    assert "余杭区" in alice_replies[1] and "咖啡" in alice_replies[2] and "余杭区" in alice_replies[3]
    assert "余杭区" not in "".join(bob_replies)
    for person in (alice, bob):  # in order per person (people are independent of each other)
        ids = [e["event"]["message"]["message_id"] for e in person]
        assert [m.parent_id for m in harness.feishu.sent if m.parent_id in ids] == ids
    assert all(r.deleted for r in harness.feishu.reactions) and len(harness.feishu.reactions) == 6


async def test_a_message_too_long_to_read_whole_says_so(harness: Harness) -> None:
    """A turn reads the first 8,000 characters: a longer message is answered with what was read, and the
    reply says the rest was not read, so a `记住…` at its end is not silently lost."""
    long = harness.event("会议记录：" + "讨论了很多事情。" * 1000 + "记住我对花生过敏")
    short = harness.event("记住我喜欢咖啡")
    await harness.send([long, short])
    harness.work()
    cut, plain = harness.replies_to([long, short])
    assert "8013" in cut and "8000" in cut and "没有读到" in cut
    assert "没有读到" not in plain


async def test_the_seed_story_over_feishu(harness: Harness) -> None:
    story = [harness.event(t) for t in ("我住在余杭区", "我现在在西湖区", "我在哪")]
    await harness.send(story)
    harness.work()

    *_, answer = harness.replies_to(story)
    assert "西湖区" in answer and "余杭区" not in answer
    lines = {
        line.split(" <!--")[0]: line for line in harness.memory(ALICE).splitlines() if line.startswith("- ")
    }
    assert "vt=" in lines["- ~~我住在余杭区~~"] and "sup=" in lines["- 我现在在西湖区"]


async def test_private_facts_stay_with_their_person_chat_and_persona(harness: Harness) -> None:
    private = [harness.event("我住在余杭区", ALICE)]
    await harness.send(private)
    harness.work()
    in_group = [harness.event("我在哪", ALICE, group=True), harness.event("/memory", ALICE, group=True)]
    bob = [harness.event("我在哪", BOB), harness.event("/memory", BOB)]
    other_persona = [harness.event("我在哪", ALICE)]
    await harness.send(in_group + bob)
    await harness.send(other_persona, persona="y")
    harness.work()

    leaked = harness.replies_to(in_group + bob + other_persona)
    assert len(leaked) == 5 and not any("余杭区" in r for r in leaked)
    # Where the answers went is what the product chose, not the fake's bookkeeping: each group message got
    # exactly one reply threaded under it (so it lands in the group), and nothing was pushed to anyone's
    # private chat (a `create` call) instead.
    group_ids = [e["event"]["message"]["message_id"] for e in in_group]
    to_group = [(m.kind, m.parent_id) for m in harness.feishu.sent if m.parent_id in group_ids]
    assert to_group == [("reply", mid) for mid in group_ids]
    assert [m for m in harness.feishu.sent if m.kind != "reply"] == []
    # And the product itself took the question as a group message of that chat: its raw archive says so
    # (commands such as /memory are not recorded).
    raw = harness.worker.store.path(Namespace.of(TENANT_KEY, ALICE.union_id, "x")) / "raw"
    recorded = {m.id: m for day in raw.glob("*.md") for m in parse_raw_file(day.read_text("utf-8"))}
    question = recorded[group_ids[0]]
    assert (question.text, question.chat, question.chat_type) == ("我在哪", GROUP_CHAT_ID, "group")
    assert "余杭区" not in harness.memory(ALICE, "y") and "余杭区" in harness.memory(ALICE, "x")


async def test_feishu_failures_are_retried_without_duplicates_or_losses(harness: Harness) -> None:
    messages = [harness.event(f"记住第{i}件事是买{i}个苹果") for i in range(4)]
    await harness.send(messages[:1])
    harness.work()
    await harness.send(messages[1:])
    harness.feishu.fail("reply", rate_limited(reset_seconds=0), server_error(502))
    harness.feishu.expire_tokens()  # the worker's cached token is now invalid: 99991663 on its next call
    harness.work()

    replies = harness.replies_to(messages)
    assert len(replies) == 4 and all("苹果" in r for r in replies)
    assert len({m.uuid for m in harness.feishu.sent}) == len(harness.feishu.sent)
    assert harness.feishu.token_fetches >= 2


async def test_hostile_deliveries_never_produce_a_reply(harness: Harness) -> None:
    good = harness.event("你好")
    forged = deliver(harness.event("伪造的消息"), encrypt_key="not-our-key")
    stale = message_event("很久以前", create_time_ms=int(time.time() * 1000) - 3 * 3600 * 1000)
    replica = harness.replicas[0]
    statuses = [
        (await replica.post("/feishu/x/events", data=d.body, headers=d.headers)).status
        for d in (forged, deliver(stale, encrypt_key=KEY))
    ]
    await harness.send([good])
    harness.work()

    assert statuses == [401, 200]
    assert [m.parent_id for m in harness.feishu.sent] == [good["event"]["message"]["message_id"]]


async def test_ollama_down_still_gets_an_answer_from_memory(
    aiohttp_client: ClientFactory,
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    feishu: FakeFeishu,
) -> None:
    with FakeOllama() as ollama:
        settings = settings_for(data_dir, feishu, chat_model="qwen3:4b", ollama_host=ollama.url)
        replicas = [await aiohttp_client(create_app(build(settings, redis_url, git=False)))]
        worker = build(settings, redis_url, git=False)
        worker = replace(worker, llm=LLM(ollama.url, timeout=1.0, retries=0))
        harness = Harness(replicas, worker, feishu, redis_client)
        ollama.script("好的，我记住了你住在余杭区。")
        first = [harness.event("我住在余杭区")]
        await harness.send(first)
        harness.work()
        ollama.down()
        asked = len(ollama.chat_requests)
        second = [harness.event("我在哪")]
        await harness.send(second)
        harness.work()

    [answer] = harness.replies_to(second)
    assert "余杭区" in answer and "暂时不可用" in answer
    assert len(ollama.chat_requests) == asked  # nothing reached the model: no wait, no late answer
    assert "余杭区" in harness.memory(
        ALICE
    )  # saved by the safety net / statement rule, not by trust in the model


def _typed(harness: Harness, kind: str, content: dict[str, Any]) -> dict[str, Any]:
    harness.clock += 1000
    event = message_event("", message_type=kind, content=content, create_time_ms=harness.clock)
    message = event["event"]["message"]
    harness.feishu.note_message(message["message_id"], message["chat_id"])
    return event


async def test_every_message_type_is_kept_in_the_raw_archive_and_answered_plainly(harness: Harness) -> None:
    typed = {
        "image": {"image_key": "img_v3_abc"},
        "file": {"file_key": "file_v3_1", "file_name": "季度 报告.pdf"},
        "audio": {"file_key": "file_v3_2", "duration": 4200},
        "media": {"file_key": "file_v3_3", "image_key": "img_v3_4", "file_name": "a.mp4", "duration": 9},
        "sticker": {"file_key": "file_v3_5"},
        "share_chat": {"chat_id": "oc_shared"},
        "share_user": {"user_id": "ou_shared"},
        "location": {"name": "西湖", "latitude": "30.25", "longitude": "120.15"},
        "merge_forward": {"content": "Merged and Forwarded Message"},
    }
    events = [_typed(harness, kind, content) for kind, content in typed.items()]
    images_only = _typed(
        harness, "post", {"zh_cn": {"title": "", "content": [[{"tag": "img", "image_key": "k"}]]}}
    )
    with_text = _typed(
        harness,
        "post",
        {
            "zh_cn": {
                "content": [
                    [{"tag": "text", "text": "记住我下周去东京出差"}, {"tag": "img", "image_key": "k2"}]
                ]
            }
        },
    )
    await harness.send([*events, images_only, with_text])
    harness.work()

    replies = harness.replies_to([*events, images_only])
    assert len(replies) == len(typed) + 1
    for reply, what in zip(
        replies,
        ["图片", "文件", "语音", "视频", "表情包", "群名片", "个人名片", "位置", "合并转发"],
        strict=False,
    ):
        assert "读不了" in reply and what in reply and "can't read" in reply
    raw = "".join(
        p.read_text()
        for p in (harness.worker.store.path(Namespace.of(TENANT_KEY, ALICE.union_id, "x")) / "raw").glob(
            "*.md"
        )
    )
    for kind in typed:
        assert f"[{kind}" in raw
    assert "image_key=img_v3_abc" in raw and "file_name=季度_报告.pdf" in raw and "duration=4200" in raw
    # a rich text with an image keeps its text: it is read and remembered like any message
    (answer,) = harness.replies_to([with_text])
    assert "东京" in answer and "读不了" not in answer
    assert "记住" not in harness.memory(ALICE) and "我下周去东京出差" in harness.memory(ALICE)
    assert "[image" not in harness.memory(ALICE)  # placeholders are never taken for facts


async def test_an_image_in_a_group_without_a_mention_is_not_for_the_bot(harness: Harness) -> None:
    harness.clock += 1000
    event = message_event(
        "",
        message_type="image",
        content={"image_key": "img_g"},
        chat_type="group",
        create_time_ms=harness.clock,
    )
    await harness.send([event])
    harness.work()
    assert harness.replies_to([event]) == []
