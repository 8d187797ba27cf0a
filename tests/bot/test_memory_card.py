"""Memory from the chat: /memory answers with a card whose buttons (忘记 / 置顶 / 取消置顶 / 历史) come back
as `card.action.trigger` over the webhook or the long connection, act through the single writer for the
card's owner only, and update the card in place — in a group, showing only what the group may see."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient

from bot.app import create_app
from memory_core.history import rows
from memory_core.namespace import Namespace
from tests.fakes.feishu_cards import FakeFeishuCards, card_action_event
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
from tests.fakes.feishu_ws import FakeFeishuWS
from workers.metrics import Metrics
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.worker import Worker

KEY, BOT, APP = "card-key", "ou_card_bot", "cli_cards"


@pytest.fixture
def feishu() -> Iterator[FakeFeishuCards]:
    with FakeFeishuCards(bot_open_id=BOT) as fake:
        yield fake


@pytest.fixture
def ws(feishu: FakeFeishuCards) -> Iterator[FakeFeishuWS]:
    with FakeFeishuWS(APP, "s", ping_interval=5, api=feishu) as fake:
        yield fake


class Chat:
    def __init__(self, client: TestClient, runtime: Runtime, feishu: FakeFeishuCards, r: redis.Redis) -> None:
        self.client, self.runtime, self.feishu, self.redis = client, runtime, feishu, r
        self.clock = int(time.time() * 1000) - 60_000

    async def say(self, text: str, who: User = ALICE, group: bool = False) -> str:
        self.clock += 1000
        if group:
            event = group_mention_event(text, bot_open_id=BOT, sender=who, create_time_ms=self.clock)
        else:
            event = message_event(text, sender=who, create_time_ms=self.clock)
        message = event["event"]["message"]
        self.feishu.note_message(message["message_id"], message["chat_id"])
        await self.post(event)
        self.work()
        return str(message["message_id"])

    async def post(self, event: dict[str, Any]) -> dict[str, Any]:
        d = deliver(event, encrypt_key=KEY)
        resp = await self.client.post("/feishu/p/events", data=d.body, headers=d.headers)
        assert resp.status == 200
        return dict(await resp.json())

    def work(self) -> None:
        Worker(self.runtime, ("chat",)).work(burst=True)

    def card_reply(self, message_id: str) -> str:
        (sent,) = [m for m in self.feishu.sent if m.parent_id == message_id]
        assert sent.msg_type == "interactive"
        return sent.message_id

    def memory(self, who: User = ALICE) -> str:
        path = self.runtime.store.path(Namespace.of(TENANT_KEY, who.union_id, "p")) / "MEMORY.md"
        return path.read_text() if path.exists() else ""


def _texts(card: dict[str, Any]) -> str:
    """Every text a person sees on the card, buttons included."""
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("content"), str):
                out.append(node["content"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(card)
    return "\n".join(out)


def _button(card: dict[str, Any], op: str, containing: str) -> dict[str, Any]:
    """The value of the `op` button in the row whose text contains `containing`."""
    for row in card["body"]["elements"]:
        if row.get("tag") != "column_set":
            continue
        text_col, buttons = row["columns"][0], row["columns"][1]["elements"]
        if containing in _texts(text_col):
            for b in buttons:
                value = b["behaviors"][0]["value"]
                if value["op"] == op:
                    return dict(value)
    raise AssertionError(f"no {op} button for {containing!r} in {_texts(card)!r}")


@pytest.fixture
async def chat(
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    feishu: FakeFeishuCards,
    ws: FakeFeishuWS,
    aiohttp_client: Callable[..., Any],
) -> Chat:
    persona = Persona(
        "p", app_id=APP, app_secret="s", verification_token=VERIFICATION_TOKEN, encrypt_key=KEY,
        bot_open_id=BOT, domain=ws.url, mode="ws", admins=(ALICE.open_id,),
    )  # fmt: skip
    runtime = build(Settings(data_dir=data_dir, personas={"p": persona}), redis_url)
    client = await aiohttp_client(create_app(runtime))
    return Chat(client, runtime, feishu, redis_client)


async def test_memory_is_a_card_whose_forget_button_forgets_and_updates_it_in_place(chat: Chat) -> None:
    await chat.say("记住我喜欢喝乌龙茶")
    await chat.say("我住在余杭区")
    card_msg = chat.card_reply(await chat.say("/memory"))
    card = chat.feishu.card_shown(card_msg)
    assert "乌龙茶" in _texts(card) and "余杭区" in _texts(card) and "忘记" in _texts(card)

    value = _button(card, "forget", "乌龙茶")
    answer = await chat.post(
        card_action_event(value, operator=ALICE, message_id=card_msg, chat_id=GROUP_CHAT_ID)
    )
    assert "toast" in answer
    chat.work()
    assert "乌龙茶" not in chat.memory() and "余杭区" in chat.memory()
    updated = chat.feishu.card_shown(card_msg)
    assert "乌龙茶" not in _texts(updated) and "余杭区" in _texts(updated)


async def test_someone_else_pressing_my_card_changes_nothing(chat: Chat) -> None:
    await chat.say("记住我对花生过敏")
    card_msg = chat.card_reply(await chat.say("/memory"))
    value = _button(chat.feishu.card_shown(card_msg), "forget", "花生")
    await chat.post(card_action_event(value, operator=BOB, message_id=card_msg, chat_id=GROUP_CHAT_ID))
    chat.work()
    assert "花生过敏" in chat.memory()
    assert card_msg not in chat.feishu.patches


async def test_a_repushed_button_press_acts_once(chat: Chat) -> None:
    await chat.say("记住我喜欢跑步")
    card_msg = chat.card_reply(await chat.say("/memory"))
    value = _button(chat.feishu.card_shown(card_msg), "pin", "跑步")
    event = card_action_event(value, operator=ALICE, message_id=card_msg, chat_id=GROUP_CHAT_ID)
    await chat.post(event)
    await chat.post(event)  # Feishu delivers it again
    chat.work()
    assert len(chat.feishu.patches[card_msg]) == 1


async def test_a_button_press_redis_could_not_queue_is_acted_on_when_feishu_retries(
    chat: Chat, redis_url: str, redis_client: redis.Redis, aiohttp_client: Callable[..., Any]
) -> None:
    """The webhook answers 503 when the job cannot be queued, so Feishu retries: the retry must be queued,
    not taken for a repeat of a press that was claimed but never queued."""
    await chat.say("记住我每天早上七点起床")
    card_msg = chat.card_reply(await chat.say("/memory"))
    press = card_action_event(
        _button(chat.feishu.card_shown(card_msg), "pin", "七点"),
        operator=ALICE,
        message_id=card_msg,
        chat_id="oc_x",
    )
    name = f"no-queue-{uuid.uuid4().hex[:8]}"  # a Redis user that may claim but not queue
    redis_client.acl_setuser(
        name, enabled=True, nopass=True, keys=["*"], channels=["*"], commands=["+@all", "-rpush", "-lpush"]
    )
    try:
        scheme, _, rest = redis_url.partition("://")  # the same server as user `name` (any password)
        limited = build(chat.runtime.settings, f"{scheme}://{name}:x@{rest.rpartition('@')[2]}")
        client = await aiohttp_client(create_app(limited))
        d = deliver(press, encrypt_key=KEY)
        resp = await client.post("/feishu/p/events", data=d.body, headers=d.headers)
        assert resp.status == 503, await resp.text()
    finally:
        redis_client.acl_deluser(name)
    assert "toast" in await chat.post(press)  # Feishu's retry
    chat.work()
    assert "pin=1" in next(x for x in chat.memory().splitlines() if "七点" in x)


async def test_an_old_button_press_is_stale_like_an_old_message(chat: Chat) -> None:
    """A captured press replayed after its seen-key expired acts no more than a replayed message."""
    await chat.say("记住我每天早上七点起床")
    card_msg = chat.card_reply(await chat.say("/memory"))
    old = int(time.time() * 1000) - 13 * 3600 * 1000
    assert (await chat.post(message_event("hi", sender=ALICE, create_time_ms=old)))["msg"] == "ignored: stale"
    press = card_action_event(
        _button(chat.feishu.card_shown(card_msg), "pin", "七点"),
        operator=ALICE,
        message_id=card_msg,
        chat_id="oc_x",
    )
    press["header"]["create_time"] = str(old)
    assert (await chat.post(press)) == {"msg": "ignored: stale"}
    chat.work()
    assert "pin=1" not in next(x for x in chat.memory().splitlines() if "七点" in x)


async def test_pin_over_the_long_connection_then_unpin(chat: Chat, ws: FakeFeishuWS) -> None:
    for _ in range(200):
        if ws.live:
            break
        await asyncio.sleep(0.05)
    await chat.say("记住我每天早上七点起床")
    card_msg = chat.card_reply(await chat.say("/memory"))
    value = _button(chat.feishu.card_shown(card_msg), "pin", "七点")
    frame = await asyncio.to_thread(
        ws.push, card_action_event(value, operator=ALICE, message_id=card_msg, chat_id="oc_x")
    )
    assert await asyncio.to_thread(ws.ack, frame) == 200
    chat.work()
    line = next(x for x in chat.memory().splitlines() if "七点" in x)
    assert "pin=1" in line
    card = chat.feishu.card_shown(card_msg)
    unpin = _button(card, "unpin", "七点")  # the card now offers the opposite
    await chat.post(card_action_event(unpin, operator=ALICE, message_id=card_msg, chat_id="oc_x"))
    chat.work()
    assert "pin=1" not in next(x for x in chat.memory().splitlines() if "七点" in x)


async def test_history_shows_what_a_subject_was_before(chat: Chat) -> None:
    await chat.say("我住在余杭区")
    await chat.say("我现在在西湖区")
    card_msg = chat.card_reply(await chat.say("/memory"))
    value = _button(chat.feishu.card_shown(card_msg), "history", "西湖区")
    await chat.post(card_action_event(value, operator=ALICE, message_id=card_msg, chat_id="oc_x"))
    chat.work()
    shown = _texts(chat.feishu.card_shown(card_msg))
    assert "以前" in shown and "余杭区" in shown and "西湖区" in shown


async def test_in_a_group_the_card_shows_only_what_the_group_may_see(chat: Chat) -> None:
    await chat.say("我住在余杭区")  # learned in private
    await chat.say("记住我们组周五下午发版", group=True)  # learned in this group
    card_msg = chat.card_reply(await chat.say("/memory", group=True))
    shown = _texts(chat.feishu.card_shown(card_msg))
    assert "发版" in shown and "余杭区" not in shown
    # a button naming a private entry (a forged or stale value) cannot act on it from the group card
    private_id = next(
        line.split("id=")[1].split(";")[0] for line in chat.memory().splitlines() if "余杭区" in line
    )
    forged = {"lucid": "memory", "op": "forget", "id": private_id}
    await chat.post(card_action_event(forged, operator=ALICE, message_id=card_msg, chat_id=GROUP_CHAT_ID))
    chat.work()
    assert "余杭区" in chat.memory()


async def test_an_unknown_card_or_foreign_value_is_acknowledged_and_ignored(chat: Chat) -> None:
    answer = await chat.post(
        card_action_event(
            {"something": "else"}, operator=ALICE, message_id=f"om_{uuid.uuid4().hex}", chat_id="oc"
        )
    )
    assert "toast" not in answer


async def test_an_admin_card_offers_the_last_dream_and_its_undo_button_takes_it_back(chat: Chat) -> None:
    from workers.dreaming import run_phase

    await chat.say("我住在余杭区")
    await chat.say("我现在在西湖区")
    ns = Namespace.of(TENANT_KEY, ALICE.union_id, "p")
    run_phase(chat.runtime, ns, "light")  # archives the superseded 余杭区
    assert "余杭区" not in chat.memory()
    card_msg = chat.card_reply(await chat.say("/memory"))
    card = chat.feishu.card_shown(card_msg)
    assert "上次做梦" in _texts(card) and "dream light" in _texts(card)
    undo = next(
        b["behaviors"][0]["value"]
        for row in card["body"]["elements"]
        if row.get("tag") == "column_set"
        for b in row["columns"][1]["elements"]
        if b["behaviors"][0]["value"]["op"] == "undo"
    )
    dream_words = next(r.summary for r in rows(chat.runtime.store, ns) if r.kind == "dream")
    assert f"上次做梦：{dream_words}" in _texts(card)  # the words `lucid history` shows
    await chat.post(card_action_event(undo, operator=ALICE, message_id=card_msg, chat_id="oc_x"))
    chat.work()
    assert "余杭区" in chat.memory()  # the archived line is back where it was
    undone = 'lucid_memory_writes_total{outcome="undone"} 1'  # a write of the memory service, counted
    assert undone in Metrics(chat.redis).render().splitlines()
    assert "上次做梦" not in _texts(chat.feishu.card_shown(card_msg))  # no undo offered for it again

    # someone who is not an admin gets no dream on their card, and a forged undo does nothing
    await chat.say("我住在拱墅区", who=BOB)
    await chat.say("我现在在滨江区", who=BOB)
    bob_ns = Namespace.of(TENANT_KEY, BOB.union_id, "p")
    run_phase(chat.runtime, bob_ns, "light")
    bob_card = chat.card_reply(await chat.say("/memory", who=BOB))
    assert "上次做梦" not in _texts(chat.feishu.card_shown(bob_card))
    bob_dream = next(r["rev"] for r in chat.runtime.store.history(bob_ns) if r["message"].startswith("dream"))
    forged = {"lucid": "memory", "op": "undo", "id": bob_dream[:16]}
    before = chat.memory(BOB)
    await chat.post(card_action_event(forged, operator=BOB, message_id=bob_card, chat_id="oc_y"))
    chat.work()
    assert chat.memory(BOB) == before
    assert undone in Metrics(chat.redis).render().splitlines()  # the forged one wrote and counted nothing


async def test_asking_what_it_remembers_in_words_gets_the_card_too(chat: Chat) -> None:
    await chat.say("记住我喜欢爬山")
    card_msg = chat.card_reply(await chat.say("你记得我什么？"))
    assert "爬山" in _texts(chat.feishu.card_shown(card_msg))
    english = chat.card_reply(await chat.say("What do you remember about me?"))
    shown = chat.feishu.card_shown(english)
    assert "What I remember about you" in _texts(shown) and "Forget" in _texts(shown)
