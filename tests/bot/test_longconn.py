"""The long connection (`mode = "ws"`): the real lark.ws.Client against a fake Feishu endpoint that speaks the
SDK's frame protocol — events reach a turn and a reply, acks, shared dedupe, a dropped socket, a half-open
socket, re-pushes, Redis down, bad credentials."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient

from bot.app import create_app
from memory_core.namespace import Namespace
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import (
    ALICE,
    BOB,
    TENANT_KEY,
    VERIFICATION_TOKEN,
    deliver,
    message_event,
    user,
)
from tests.fakes.feishu_ws import FakeFeishuWS
from workers import embedded_redis
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.worker import Worker

APP, SECRET, BOT = "cli_ws_app", "ws-secret", "ou_ws_bot"


@pytest.fixture
def feishu() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id=BOT) as fake:
        yield fake


@pytest.fixture
def ws(feishu: FakeFeishu) -> Iterator[FakeFeishuWS]:
    with FakeFeishuWS(APP, SECRET, ping_interval=1, api=feishu) as fake:
        yield fake


def _settings(data_dir: Path, ws: FakeFeishuWS, secret: str = SECRET, **persona: Any) -> Settings:
    personas = {
        "p": Persona(
            "p",
            app_id=APP,
            app_secret=secret,
            mode="ws",
            domain=ws.url,
            bot_open_id=BOT,
            verification_token=VERIFICATION_TOKEN,
            **persona,
        )
    }
    # LUCID_FEISHU_DOMAIN points nowhere: the persona's own domain must be what is used
    return Settings(data_dir=data_dir, feishu_domain="http://127.0.0.1:9", personas=personas)


@pytest.fixture
async def bot(
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    ws: FakeFeishuWS,
    aiohttp_client: Callable[..., Any],
) -> AsyncIterator[tuple[TestClient, Runtime]]:
    runtime = build(_settings(data_dir, ws), redis_url=redis_url)
    client = await aiohttp_client(create_app(runtime))
    assert await _until(lambda: ws.live != [])
    yield client, runtime


async def _until(cond: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return cond()


async def _ack(ws: FakeFeishuWS, frame: str) -> int | None:
    return await asyncio.to_thread(ws.ack, frame)


def _work(runtime: Runtime, client: redis.Redis) -> None:
    Worker(runtime, ("chat",)).work(burst=True)


async def test_an_event_over_the_long_connection_is_acked_and_answered(
    bot: tuple[TestClient, Runtime], ws: FakeFeishuWS, feishu: FakeFeishu, redis_client: redis.Redis
) -> None:
    _, runtime = bot
    event = message_event("记住我喜欢喝乌龙茶", sender=ALICE, app_id=APP)
    message_id = event["event"]["message"]["message_id"]
    feishu.note_message(message_id, event["event"]["message"]["chat_id"])
    frame = await asyncio.to_thread(ws.push, event)
    assert await _ack(ws, frame) == 200
    _work(runtime, redis_client)  # in the main thread: RQ installs signal handlers
    replies = [m for m in feishu.sent if m.parent_id == message_id]
    assert len(replies) == 1 and "乌龙茶" in (replies[0].text or "")
    memory = runtime.store.path(Namespace.of(TENANT_KEY, ALICE.union_id, "p")) / "MEMORY.md"
    assert "我喜欢喝乌龙茶" in memory.read_text()
    assert ws.errors == []


async def test_a_split_event_and_a_repush_are_answered_once(
    bot: tuple[TestClient, Runtime], ws: FakeFeishuWS, feishu: FakeFeishu, redis_client: redis.Redis
) -> None:
    _, runtime = bot
    event = message_event("我住在杭州西湖区" * 40, sender=BOB, app_id=APP)
    message_id = event["event"]["message"]["message_id"]
    first = await asyncio.to_thread(ws.push, event, 3)  # one event in three frames
    again = await asyncio.to_thread(ws.push, event)  # Feishu re-pushes it (no ack seen in time)
    assert await _ack(ws, first) == 200 and await _ack(ws, again) == 200
    _work(runtime, redis_client)  # in the main thread: RQ installs signal handlers
    assert len([m for m in feishu.sent if m.parent_id == message_id]) == 1


async def test_a_frame_too_deep_or_with_lone_surrogates_is_acked_not_pushed_forever(
    bot: tuple[TestClient, Runtime], ws: FakeFeishuWS, feishu: FakeFeishu, redis_client: redis.Redis
) -> None:
    """A 500 ack makes Feishu push the frame again and again: a frame no push can make readable (nested
    5,000 deep) is acked 200 and dropped; one whose mention name escapes a lone surrogate is answered."""
    _, runtime = bot
    raw = json.dumps(message_event("hi", sender=ALICE, app_id=APP))
    deep = (raw[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}").encode()
    assert await _ack(ws, await asyncio.to_thread(ws.push_raw, deep)) == 200
    event = message_event(
        "看 @_user_1 记住我喜欢喝乌龙茶", sender=BOB, mentions=[user("Mallory")], app_id=APP
    )
    event["event"]["message"]["mentions"][0]["name"] = "M\ud800"
    message_id = event["event"]["message"]["message_id"]
    feishu.note_message(message_id, event["event"]["message"]["chat_id"])
    frame = await asyncio.to_thread(ws.push_raw, json.dumps(event).encode())
    assert await _ack(ws, frame) == 200
    _work(runtime, redis_client)
    assert len([m for m in feishu.sent if m.parent_id == message_id]) == 1


async def test_the_webhook_and_the_long_connection_share_one_dedupe(
    bot: tuple[TestClient, Runtime], ws: FakeFeishuWS, feishu: FakeFeishu, redis_client: redis.Redis
) -> None:
    client, runtime = bot
    event = message_event("我的猫叫橘子", sender=ALICE, app_id=APP)
    message_id = event["event"]["message"]["message_id"]
    frame = await asyncio.to_thread(ws.push, event)
    assert await _ack(ws, frame) == 200
    d = deliver(event)  # the same event reaches a replica in webhook mode too
    resp = await client.post("/feishu/p/events", data=d.body, headers=d.headers)
    assert resp.status == 200 and (await resp.json())["msg"] == "duplicate"
    _work(runtime, redis_client)  # in the main thread: RQ installs signal handlers
    assert len([m for m in feishu.sent if m.parent_id == message_id]) == 1


async def test_a_dropped_socket_is_reconnected_and_counted(
    bot: tuple[TestClient, Runtime], ws: FakeFeishuWS, redis_client: redis.Redis
) -> None:
    client, _ = bot
    ws.drop()
    assert await _until(lambda: len(ws.connections) >= 2 and ws.live != [])
    frame = await asyncio.to_thread(ws.push, message_event("还在吗", sender=ALICE, app_id=APP))
    assert await _ack(ws, frame) == 200
    await asyncio.sleep(1.2)  # the metrics buffer flushes every second
    text = await (await client.get("/metrics")).text()
    assert 'lucid_ws_reconnects_total{persona="p"} 1' in text
    assert 'lucid_ws_connected{persona="p"} 1' in text


async def test_a_half_open_socket_is_found_by_the_watchdog_and_replaced(
    bot: tuple[TestClient, Runtime], ws: FakeFeishuWS
) -> None:
    assert len(ws.connections) == 1
    ws.go_silent()  # the socket stays open, but nothing comes back: no pong, no event
    assert await _until(lambda: len(ws.connections) >= 2, timeout=30)
    ws.speak()
    assert ws.connections[0].socket.closed  # the dead one was let go, not kept beside the new one
    frame = await asyncio.to_thread(ws.push, message_event("你好呀", sender=ALICE, app_id=APP))
    assert await _ack(ws, frame) == 200


async def test_an_event_redis_cannot_take_is_acked_500_so_feishu_pushes_it_again(
    data_dir: Path, ws: FakeFeishuWS, tmp_path: Path, aiohttp_client: Callable[..., Any]
) -> None:
    server = embedded_redis.start(tmp_path / "r", persist=False)
    try:
        runtime = build(_settings(data_dir, ws), redis_url=server.url)
        await aiohttp_client(create_app(runtime))
        assert await _until(lambda: ws.live != [])
        server.stop()
        frame = await asyncio.to_thread(ws.push, message_event("记住我明天出差", sender=ALICE, app_id=APP))
        assert await _ack(ws, frame) == 500
    finally:
        server.stop()


async def test_wrong_credentials_never_crash_the_bot_and_readyz_says_not_connected(
    data_dir: Path, redis_url: str, ws: FakeFeishuWS, aiohttp_client: Callable[..., Any]
) -> None:
    runtime = build(_settings(data_dir, ws, secret="wrong"), redis_url=redis_url)
    client = await aiohttp_client(create_app(runtime))
    assert await _until(lambda: ws.endpoint_calls >= 2)  # it keeps trying, with backoff
    assert ws.connections == []
    ready = await client.get("/readyz")
    body = await ready.json()
    assert ready.status == 503 and body["long_connection"] == {"p": False}
    assert (await client.get("/healthz")).status == 200
