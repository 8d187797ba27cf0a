"""The webhook against deliveries built exactly as Feishu sends them (and as the lark-oapi SDK accepts them).

Real aiohttp server (aiohttp_client), real Redis, real RQ queue; nothing of ours is mocked. What a user
would notice: a forged or broken delivery never becomes a turn, a retried one never becomes two, and a
Redis outage makes Feishu deliver again instead of losing the message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lark_oapi as lark
import pytest
import redis
from aiohttp.test_utils import TestClient
from rq import Queue

from bot.app import create_app
from memory_core.namespace import Namespace
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import (
    ALICE,
    BOB,
    VERIFICATION_TOKEN,
    Delivery,
    deliver,
    group_mention_event,
    message_event,
    sign,
    url_verification,
    user,
)
from workers.inbound import Inbound
from workers.mailbox import INBOXES, Intake, turn_job_id
from workers.queues import SERIALIZER, queue
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings

KEY = "test-encrypt-key"
BOT = "ou_bot_webhook_000000000000000000"
ClientFactory = Callable[..., Any]


PERSONAS = {
    "enc": Persona("enc", verification_token=VERIFICATION_TOKEN, encrypt_key=KEY, bot_open_id=BOT),
    "plain": Persona("plain", verification_token=VERIFICATION_TOKEN, bot_open_id=BOT),
    "notoken": Persona("notoken"),
}


def _runtime(data_dir: Path, redis_url: str, **extra: Any) -> Runtime:
    settings = Settings(data_dir=data_dir, personas=PERSONAS, **extra)
    return build(settings, redis_url, git=False)


@pytest.fixture
def runtime(data_dir: Path, redis_url: str, redis_client: redis.Redis) -> Runtime:
    return _runtime(data_dir, redis_url)


@pytest.fixture
async def client(aiohttp_client: ClientFactory, runtime: Runtime) -> TestClient:
    return await aiohttp_client(create_app(runtime))


async def post(client: TestClient, d: Delivery, persona: str = "enc") -> tuple[int, Any]:
    resp = await client.post(f"/feishu/{persona}/events", data=d.body, headers=d.headers)
    return resp.status, await resp.json()


def queued(redis_client: redis.Redis) -> list[Inbound]:
    return [Inbound.from_json(job.args[0]) for job in queue("chat", redis_client).jobs]


# ------------------------------------------------------------------------------------------- happy paths


async def test_url_verification_is_answered_encrypted_or_plain_signed_or_not(client: TestClient) -> None:
    for persona, challenge, d in (
        ("enc", "c-1", deliver(url_verification("c-1"), encrypt_key=KEY, signed=False)),
        ("enc", "c-2", deliver(url_verification("c-2"), encrypt_key=KEY)),
        ("plain", "c-3", deliver(url_verification("c-3"))),
    ):
        status, body = await post(client, d, persona)
        assert (status, body) == (200, {"challenge": challenge})  # Feishu saves the URL only on an echo
    status, _ = await post(client, deliver(url_verification("c-4", token="wrong"), encrypt_key=KEY))
    assert status == 401


async def test_a_signed_encrypted_message_is_queued_once_with_its_namespace(
    client: TestClient, redis_client: redis.Redis
) -> None:
    event = message_event("我住在余杭区", sender=ALICE)
    status, body = await post(client, deliver(event, encrypt_key=KEY))

    assert (status, body["msg"]) == (200, "queued")
    [inbound] = queued(redis_client)
    assert inbound.text == "我住在余杭区" and inbound.chat_type == "p2p"
    assert inbound.ns == Namespace.of(event["header"]["tenant_key"], ALICE.union_id, "enc")
    assert inbound.message_id == event["event"]["message"]["message_id"]


async def test_retries_and_redeliveries_never_queue_a_second_turn(
    client: TestClient, redis_client: redis.Redis
) -> None:
    event = message_event("你好", sender=ALICE)
    same_message_new_event = json.loads(json.dumps(event))
    same_message_new_event["header"]["event_id"] = uuid.uuid4().hex
    same_event_new_message = json.loads(json.dumps(event))
    same_event_new_message["event"]["message"]["message_id"] = "om_" + uuid.uuid4().hex

    answers = [
        await post(client, deliver(e, encrypt_key=KEY))
        for e in (event, event, same_message_new_event, same_event_new_message)
    ]

    assert [a[1]["msg"] for a in answers] == ["queued", "duplicate", "duplicate", "duplicate"]
    assert all(a[0] == 200 for a in answers)  # any 200 stops Feishu's retries
    assert len(queued(redis_client)) == 1


async def test_a_group_message_needs_an_at_mention_of_the_bot_and_loses_the_placeholder(
    client: TestClient, redis_client: redis.Redis
) -> None:
    plain_group = message_event("大家好", sender=ALICE, chat_type="group")
    mentioned = group_mention_event("问问 @_user_2 吧", bot_open_id=BOT, sender=ALICE, mentions=[BOB])
    other_bot = group_mention_event("hi", bot_open_id="ou_someone_else", sender=ALICE)

    results = [await post(client, deliver(e, encrypt_key=KEY)) for e in (plain_group, mentioned, other_bot)]

    assert [r[1]["msg"].split(":")[0] for r in results] == ["ignored", "queued", "ignored"]
    [inbound] = queued(redis_client)
    assert inbound.text == "问问 @Bob 吧" and inbound.mentioned_bot and inbound.chat_type == "group"
    assert [m.open_id for m in inbound.mentions] == [BOB.open_id]


# ------------------------------------------------------------------------------------------- rejections


def _bad_signature() -> Delivery:
    d = deliver(message_event("hi"), encrypt_key=KEY)
    return Delivery(d.body, {**d.headers, "X-Lark-Signature": "0" * 64})


def _bad_ciphertext() -> Delivery:
    return _resign(json.dumps({"encrypt": "bm90IGEgcmVhbCBjaXBoZXJ0ZXh0IGF0IGFsbCEh"}).encode())


def _resign(body: bytes) -> Delivery:
    """A correctly signed delivery of an arbitrary body: only what is inside can be wrong."""
    ts, nonce = str(int(time.time())), uuid.uuid4().hex[:16]
    headers = {
        "Content-Type": "application/json",
        "X-Lark-Request-Timestamp": ts,
        "X-Lark-Request-Nonce": nonce,
    }
    headers["X-Lark-Signature"] = sign(ts, nonce, KEY, body)
    return Delivery(body, headers)


def _deep_bomb() -> Delivery:
    return _resign(b'{"encrypt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")


def _inner_bomb() -> Delivery:
    event = message_event("hi")
    nested: Any = "x"
    for _ in range(100):
        nested = [nested]
    event["event"]["extra"] = nested
    return deliver(event, encrypt_key=KEY)


CASES: dict[str, tuple[Callable[[], Delivery], int]] = {
    "wrong signature": (_bad_signature, 401),
    "missing signature": (lambda: deliver(message_event("hi"), encrypt_key=KEY, signed=False), 401),
    "wrong token": (lambda: deliver(message_event("hi", token="forged"), encrypt_key=KEY), 401),
    "wrong encrypt key": (lambda: deliver(message_event("hi"), encrypt_key="other-key"), 401),
    "bad ciphertext": (_bad_ciphertext, 400),
    "plaintext to an encrypted persona": (lambda: deliver(message_event("hi")), 401),
    "not JSON": (lambda: _resign(b"\xff\xfe not json"), 400),
    "JSON bomb (deep)": (_deep_bomb, 400),
    "JSON bomb inside the ciphertext": (_inner_bomb, 400),
    "oversized body": (lambda: _resign(b'{"encrypt": "' + b"A" * (1024 * 1024 + 10) + b'"}'), 413),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_forged_broken_and_hostile_deliveries_are_rejected_and_logged(
    case: str, client: TestClient, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    make, expected = CASES[case]
    with caplog.at_level(logging.INFO, logger="bot.app"):
        status, _ = await post(client, make())
    assert status == expected
    assert queued(redis_client) == []
    assert any(f"status={expected}" in r.getMessage() for r in caplog.records)


async def test_old_other_event_types_and_v1_events_are_ignored_with_200(
    client: TestClient, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    old = message_event("还记得吗", create_time_ms=int(time.time() * 1000) - 2 * 3600 * 1000)
    read = message_event("x")
    read["header"]["event_type"] = "im.message.message_read_v1"
    v1 = {
        "uuid": "u1",
        "token": VERIFICATION_TOKEN,
        "ts": "1",
        "type": "event_callback",
        "event": {"type": "message"},
    }

    with caplog.at_level(logging.INFO, logger="bot.app"):
        results = [await post(client, deliver(e, encrypt_key=KEY)) for e in (old, read, v1)]

    assert [r[0] for r in results] == [200, 200, 200]
    assert all(r[1]["msg"].startswith("ignored") for r in results)
    assert queued(redis_client) == []
    assert sum("outcome=ignored" in r.getMessage() for r in caplog.records) == 3


async def test_the_stale_window_is_30_minutes_by_the_messages_create_time(
    client: TestClient, redis_client: redis.Redis
) -> None:
    """A redelivery 31 minutes after the message was written is dropped as stale; one 29 minutes after is
    still answered (the SDK's FeishuChannel default, DESIGN: replays stop at the stale window)."""
    now_ms = int(time.time() * 1000)
    fresh = message_event("二十九分钟前", sender=ALICE, create_time_ms=now_ms - 29 * 60 * 1000)
    stale = message_event("三十一分钟前", sender=ALICE, create_time_ms=now_ms - 31 * 60 * 1000)

    answers = [await post(client, deliver(e, encrypt_key=KEY)) for e in (fresh, stale)]

    assert [(status, body["msg"]) for status, body in answers] == [(200, "queued"), (200, "ignored: stale")]
    assert [i.text for i in queued(redis_client)] == ["二十九分钟前"]


async def test_unknown_persona_is_404_and_a_persona_without_token_refuses_everything(
    client: TestClient,
) -> None:
    assert (await post(client, deliver(message_event("hi"), encrypt_key=KEY), "nobody"))[0] == 404
    for payload in (message_event("hi", token=""), url_verification(token="")):
        assert (await post(client, deliver(payload), "notoken"))[0] == 403


async def test_logs_carry_ids_never_text_or_secrets(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    event = message_event("我的秘密是 swordfish-42", sender=ALICE)
    with caplog.at_level(logging.DEBUG):
        await post(client, deliver(event, encrypt_key=KEY))
        await post(client, _bad_signature())
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert event["event"]["message"]["message_id"] in text
    assert "swordfish" not in text and KEY not in text and VERIFICATION_TOKEN not in text


async def test_an_event_id_cannot_forge_a_log_line(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    event = message_event("x", sender=ALICE)
    event["header"]["event_type"] = "im.chat.updated_v1"
    event["header"]["event_id"] = "e1\nevent persona=enc event_id=forged status=200 outcome=queued"
    with caplog.at_level(logging.INFO, logger="bot.app"):
        await post(client, deliver(event, encrypt_key=KEY))
    lines = "\n".join(r.getMessage() for r in caplog.records).splitlines()
    assert not any(line.startswith("event persona=enc event_id=forged") for line in lines), lines


def _with_lone_surrogates(event: dict[str, Any]) -> bytes:
    """A signed-less plain delivery whose mention name and text carry `\\ud800` escapes (valid JSON)."""
    event["event"]["message"]["mentions"][0]["name"] = "M\ud800"
    event["event"]["message"]["content"] = json.dumps({"text": "看 @_user_1 \udfff 这个"})
    return json.dumps(event).encode()


async def test_lone_surrogates_in_any_field_are_answered_and_fail_no_one_else(
    client: TestClient, redis_client: redis.Redis
) -> None:
    """JSON may escape a lone surrogate, which UTF-8 (and so Redis) cannot hold: a mention's name with one
    got a 500 on every redelivery and failed every delivery batched with it."""
    headers = {"Content-Type": "application/json"}
    hostile = message_event("", sender=BOB, mentions=[user("Mallory")])
    innocent = [deliver(message_event(f"我住在{i}号", sender=user(f"u{i}"))) for i in range(6)]
    sent = [client.post("/feishu/plain/events", data=d.body, headers=d.headers) for d in innocent]
    sent.insert(3, client.post("/feishu/plain/events", data=_with_lone_surrogates(hostile), headers=headers))
    statuses = [r.status for r in await asyncio.gather(*sent)]
    assert statuses == [200] * 7, statuses
    texts = {i.text for i in queued(redis_client)}
    assert "看 @M\ufffd \ufffd 这个" in texts and {f"我住在{i}号" for i in range(6)} <= texts


# ------------------------------------------------------------------------------------------- agrees with the SDK


def _sdk_accepts(d: Delivery, encrypt_key: str) -> bool:
    handler = (
        lark.EventDispatcherHandler.builder(encrypt_key, VERIFICATION_TOKEN)
        .register_p2_im_message_receive_v1(lambda _: None)
        .build()
    )
    return handler.do(d.raw_request()).status_code == 200


async def test_the_verifier_accepts_exactly_what_the_sdk_accepts(client: TestClient) -> None:
    deliveries = {
        "good": deliver(message_event("hi"), encrypt_key=KEY),
        "challenge": deliver(url_verification(), encrypt_key=KEY, signed=False),
        "wrong signature": _bad_signature(),
        "wrong token": deliver(message_event("hi", token="forged"), encrypt_key=KEY),
        "missing signature": deliver(message_event("hi"), encrypt_key=KEY, signed=False),
    }
    for name, d in deliveries.items():
        ours = (await post(client, d))[0] == 200
        assert ours == _sdk_accepts(d, KEY), name


# ------------------------------------------------------------------------------------------- availability


async def test_redis_down_answers_503_so_feishu_retries(
    aiohttp_client: ClientFactory, data_dir: Path
) -> None:
    dead = _runtime(data_dir, "redis://127.0.0.1:1/0")
    client = await aiohttp_client(create_app(dead))

    status, _ = await post(client, deliver(message_event("hi"), encrypt_key=KEY))
    health = await client.get("/healthz")
    ready = await client.get("/readyz")

    assert status == 503 and health.status == 200 and ready.status == 503
    assert (await ready.json())["redis"] is False


async def test_readyz_needs_a_worker_on_the_chat_queue(client: TestClient, redis_client: redis.Redis) -> None:
    from rq import Worker

    resp = await client.get("/readyz")
    assert resp.status == 503 and (await resp.json())["workers"] == 0
    worker = Worker([queue("chat", redis_client)], connection=redis_client, serializer=SERIALIZER)
    worker.register_birth()
    try:
        resp = await client.get("/readyz")
        body = await resp.json()
        assert resp.status == 200 and body["workers"] == 1 and body["bot_identity"]["enc"] is True
    finally:
        worker.register_death()


async def test_metrics_count_events_by_outcome(client: TestClient) -> None:
    await post(client, deliver(message_event("hi", message_id="om_m1"), encrypt_key=KEY))
    await post(client, deliver(message_event("hi", message_id="om_m1"), encrypt_key=KEY))
    bad = deliver(message_event("hi"), encrypt_key=KEY)
    await client.post(
        "/feishu/enc/events", data=bad.body, headers={**bad.headers, "X-Lark-Signature": "0" * 64}
    )
    text = await (await client.get("/metrics")).text()
    assert 'lucid_events_received_total{persona="enc"} 3' in text
    assert 'lucid_events_deduplicated_total{persona="enc"} 1' in text
    assert 'lucid_events_rejected_total{persona="enc",reason="bad signature"} 1' in text
    assert 'lucid_queue_depth{queue="chat"} 1' in text


async def test_the_bot_learns_its_open_id_at_startup_and_then_accepts_group_mentions(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with FakeFeishu(bot_open_id=BOT) as fake:
        persona = Persona(
            "fetch",
            app_id=f"cli_{uuid.uuid4().hex[:12]}",
            app_secret="s",
            verification_token=VERIFICATION_TOKEN,
        )
        settings = Settings(data_dir=data_dir, feishu_domain=fake.url, personas={"fetch": persona})
        client = await aiohttp_client(create_app(build(settings, redis_url, git=False)))
        for _ in range(100):
            if (await (await client.get("/readyz")).json())["bot_identity"]["fetch"]:
                break
            await asyncio.sleep(0.02)
        event = group_mention_event("在吗", bot_open_id=BOT)
        status, body = await post(client, deliver(event), "fetch")
    assert (status, body["msg"]) == (200, "queued")
    assert fake.calls("bot_info")


# ------------------------------------------------------------------------------------------- admin API


async def test_admin_api_is_absent_without_a_token_and_guarded_with_one(
    client: TestClient,
    aiohttp_client: ClientFactory,
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
) -> None:
    assert (await client.get("/admin/stats")).status == 404
    guarded = await aiohttp_client(create_app(_runtime(data_dir, redis_url, admin_token="s3cret-admin")))
    assert (await guarded.get("/admin/stats")).status == 401
    assert (await guarded.get("/admin/stats", headers={"Authorization": "Bearer nope"})).status == 401
    ok = await guarded.get(
        "/admin/stats", params={"namespace": "t/u/enc"}, headers={"Authorization": "Bearer s3cret-admin"}
    )
    assert ok.status == 200
    assert (await ok.json())["memory"]["current"] == 0
    auth = {"Authorization": "Bearer s3cret-admin"}
    assert (await guarded.post("/admin/dream", json={"namespace": "nope"}, headers=auth)).status == 400
    assert (
        await guarded.post("/admin/dream", json={"namespace": "t/u/enc", "phase": "nap"}, headers=auth)
    ).status == 400
    queued_dream = await guarded.post(
        "/admin/dream", json={"namespace": "t/u/enc", "phase": "light"}, headers=auth
    )
    assert queued_dream.status == 202 and (await queued_dream.json())["status"] == "queued"
    assert len(Queue("dream", connection=redis_client)) == 1
    status = await guarded.get("/admin/dream/status", params={"namespace": "t/u/enc"}, headers=auth)
    assert (await status.json())["queued"] == 1


async def test_admin_refuses_a_wrong_token_with_a_bearer_challenge_and_logs_the_attempt_not_the_token(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="bot.admin"):
        await aiohttp_client(create_app(_runtime(data_dir, redis_url)))
        admin = await aiohttp_client(create_app(_runtime(data_dir, redis_url, admin_token="s3cret-admin")))
        refused = await admin.get("/admin/stats", headers={"Authorization": "Bearer s3cret-admiN"})
        body = await refused.json()
    assert (refused.status, body, refused.headers.get("WWW-Authenticate")) == (
        401,
        {"error": "unauthorized"},
        "Bearer",
    )
    assert [r.getMessage() for r in caplog.records if r.name == "bot.admin"] == [
        "LUCID_ADMIN_TOKEN not set: the HTTP admin API is disabled",
        "admin GET /admin/stats refused: bad or missing token",
    ]
    assert "s3cret" not in caplog.text
    auth = {"Authorization": "Bearer s3cret-admin"}
    overall = await admin.get("/admin/stats", headers=auth)  # no namespace: the service's stats only
    assert overall.status == 200 and "memory" not in await overall.json()
    nap = await admin.post("/admin/dream", json={"namespace": "t/u/enc", "phase": "nap"}, headers=auth)
    assert nap.status == 400 and (await nap.json())["error"].startswith("unknown dream phase 'nap'")


async def test_admin_refuses_a_malformed_request_with_a_json_error_that_names_the_fault(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    admin = await aiohttp_client(create_app(_runtime(data_dir, redis_url, admin_token="s3cret-admin")))
    auth = {"Authorization": "Bearer s3cret-admin"}
    answers = [
        await admin.post(
            "/admin/dream", data=b"not json", headers={**auth, "Content-Type": "application/json"}
        ),
        await admin.post("/admin/dream", json=["t/u/enc"], headers=auth),
        await admin.post("/admin/dream", json={"phase": "light"}, headers=auth),
        await admin.post("/admin/dream", json={"namespace": "t/u"}, headers=auth),
        await admin.get("/admin/dream/status", headers=auth),
    ]
    assert [(a.status, json.loads(await a.text())) for a in answers] == [
        (400, {"error": "body must be JSON"}),
        (400, {"error": "body must be a JSON object"}),
        (400, {"error": "namespace (tenant/user/persona) is required"}),
        (400, {"error": "namespace must be tenant/user/persona"}),
        (400, {"error": "namespace (tenant/user/persona) is required"}),
    ]
    assert len(Queue("dream", connection=redis_client)) == 0


async def test_admin_dream_is_a_real_light_phase_unless_a_dry_run_is_asked_for_and_is_logged(
    aiohttp_client: ClientFactory,
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = await aiohttp_client(create_app(_runtime(data_dir, redis_url, admin_token="s3cret-admin")))
    auth = {"Authorization": "Bearer s3cret-admin"}
    with caplog.at_level(logging.WARNING, logger="bot.admin"):
        real = await admin.post("/admin/dream", json={"namespace": "t/u/enc"}, headers=auth)
        dry = await admin.post("/admin/dream", json={"namespace": "t/u/enc", "dry_run": True}, headers=auth)
    bodies = [await real.json(), await dry.json()]
    assert [(b["status"], b["phase"], b["dry_run"]) for b in bodies] == [
        ("queued", "light", False),
        ("queued", "light", True),
    ]
    jobs = Queue("dream", connection=redis_client, serializer=SERIALIZER).jobs
    assert sorted(list(job.args) for job in jobs) == [["t/u/enc", False], ["t/u/enc", True]]
    key = Namespace.parse("t/u/enc").key
    assert [r.getMessage() for r in caplog.records if r.name == "bot.admin"] == [
        f"admin API: light dream (dry=False) for ns={key}: queued",
        f"admin API: light dream (dry=True) for ns={key}: queued",
    ]


def _person(data_dir: Path, tenant: str, user: str) -> Path:
    """A person's memory on disk, as the writer leaves it: one persona directory with its MEMORY.md."""
    home = data_dir / tenant / user / "enc"
    home.mkdir(parents=True)
    (home / "MEMORY.md").write_text(f"- {user} 住在西湖区\n", encoding="utf-8")
    return home


async def test_admin_erase_removes_that_person_only_and_names_each_fault(
    aiohttp_client: ClientFactory,
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    carol, dave = _person(data_dir, "t", "ou_carol"), _person(data_dir, "t", "ou_dave")
    admin = await aiohttp_client(create_app(_runtime(data_dir, redis_url, admin_token="s3cret-admin")))
    auth = {"Authorization": "Bearer s3cret-admin"}
    assert (await admin.post("/admin/erase", json={"user": "ou_carol"})).status == 401
    faults = [
        await admin.post("/admin/erase", data=b"{", headers={**auth, "Content-Type": "application/json"}),
        await admin.post("/admin/erase", json=["ou_carol"], headers=auth),
        await admin.post("/admin/erase", json={"user": 7}, headers=auth),
        await admin.post("/admin/erase", json={"user": "  "}, headers=auth),
        await admin.post("/admin/erase", json={"tenant": "t"}, headers=auth),
        await admin.post("/admin/erase", json={"user": "ou_carol", "tenant": 5}, headers=auth),
    ]
    strings = {"error": "user (and optionally tenant) must be strings"}
    assert [(a.status, json.loads(await a.text())) for a in faults] == [
        (400, {"error": "body must be JSON"}),
        *[(400, strings)] * 5,
    ]
    assert carol.is_dir() and dave.is_dir()  # a refused request erases nothing
    elsewhere = await admin.post("/admin/erase", json={"user": "ou_carol", "tenant": "t2"}, headers=auth)
    assert elsewhere.status == 404 and (await elsewhere.json())["namespaces"] == []
    assert carol.is_dir()  # the tenant named is the only one searched
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bot.admin"):
        done = await admin.post("/admin/erase", json={"user": "ou_carol", "tenant": "t"}, headers=auth)
    assert done.status == 200 and (await done.json())["namespaces"] == ["t/ou_carol/enc"]
    assert not (data_dir / "t" / "ou_carol").exists() and (dave / "MEMORY.md").is_file()
    assert [r.getMessage() for r in caplog.records if r.name == "bot.admin"] == [
        "admin API: erased 1 namespace(s) of a user"
    ]
    again = await admin.post("/admin/erase", json={"user": "ou_carol"}, headers=auth)
    assert again.status == 404 and (await again.json())["namespaces"] == []


async def test_admin_erase_while_the_writer_holds_the_namespace_is_a_409_that_says_try_again(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    carol = _person(data_dir, "t", "ou_carol")
    rt = _runtime(data_dir, redis_url, admin_token="s3cret-admin")
    rt.writer.lease_wait = 0.05  # the writer's configured wait, shortened: the holder never lets go
    held = rt.writer.locker.acquire(Namespace.of("t", "ou_carol", "enc"), 1.0, 0)
    assert held is not None
    admin = await aiohttp_client(create_app(rt))
    try:
        busy = await admin.post(
            "/admin/erase", json={"user": "ou_carol"}, headers={"Authorization": "Bearer s3cret-admin"}
        )
    finally:
        held.release()
    assert (busy.status, await busy.json()) == (
        409,
        {"error": "could not take the writer lease of t/ou_carol/enc: try again"},
    )
    assert (carol / "MEMORY.md").is_file()  # nothing erased


async def test_admin_answers_an_authorization_that_is_not_utf8_with_a_400_naming_the_header(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    admin = await aiohttp_client(create_app(_runtime(data_dir, redis_url, admin_token="s3cret-admin")))
    reader, writer = await asyncio.open_connection(admin.server.host, admin.server.port)
    writer.write(
        b"GET /admin/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\nConnection: close\r\n\r\n"
    )
    await writer.drain()
    answer = await reader.read(65536)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head, answer[:300]
    assert json.loads(body) == {"error": "Authorization header is not UTF-8"}


# ------------------------------------------------------------------------------------------- routing


def test_placeholders_resolve_whole_and_the_bots_own_mention_disappears() -> None:
    from bot.routing import resolve_mentions

    mentions = [
        {"key": "@_user_1", "name": "Lucid", "id": {"open_id": BOT}},
        {"key": "@_user_2", "name": "Bob", "id": {"open_id": BOB.open_id, "union_id": BOB.union_id}},
        *({"key": f"@_user_{i}", "name": f"P{i}", "id": {"open_id": f"ou_p{i}"}} for i in range(3, 11)),
    ]
    text, mentioned_bot, others = resolve_mentions(
        "@_user_1 ask @_user_2 about @_user_10 and @_all please\n@_user_1  second   line", mentions, BOT
    )
    assert text == "ask @Bob about @P10 and @所有人 please\nsecond line"
    assert mentioned_bot and [m.name for m in others] == ["Bob", "P10"] and others[0].user == BOB.union_id


# ------------------------------------------------------------------------------------------- verifier's answers


def _signed_plain(payload: dict[str, Any]) -> Delivery:
    """A plaintext body signed with KEY (Feishu signs with the encrypt key even when it sends plaintext)."""
    return _resign(json.dumps(payload).encode())


def _bad_header() -> Delivery:
    d = deliver(message_event("hi"), encrypt_key=KEY)
    return Delivery(d.body, {**d.headers, "X-Lark-Request-Nonce": "\udcff\udcfe"})  # aiohttp's non-UTF-8


VERDICTS: dict[str, tuple[str, Callable[[], Delivery], int, str]] = {
    "persona without a token": ("notoken", lambda: deliver(message_event("hi")), 403,
                                "persona has no verification_token configured"),
    "non-UTF-8 header": ("enc", _bad_header, 400, "X-Lark-Request-Nonce header is not UTF-8"),
    "wrong signature": ("enc", _bad_signature, 401, "bad signature"),
    "ciphertext to a persona without a key": ("plain", lambda: deliver(message_event("hi"), encrypt_key=KEY),
                                              400, "encrypted body but no encrypt_key configured"),
    "encrypt not a string": ("enc", lambda: _resign(b'{"encrypt": ["x"]}'), 400, "encrypt is not a string"),
    "bad ciphertext": ("enc", _bad_ciphertext, 400, "undecryptable body"),
    "plaintext to a persona with a key": ("enc", lambda: _signed_plain(message_event("hi")), 401,
                                          "plaintext body but an encrypt_key is configured"),
    "header not an object": ("plain", lambda: deliver({**message_event("hi"), "header": ["h"]}), 400,
                             "event header is not an object"),
    "wrong token": ("enc", lambda: deliver(message_event("hi", token="forged"), encrypt_key=KEY), 401,
                    "verification token mismatch"),
    "missing signature": ("enc", lambda: deliver(message_event("hi"), encrypt_key=KEY, signed=False), 401,
                          "missing signature headers"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(VERDICTS))
def test_each_refusal_has_its_status_and_the_reason_operators_see(case: str) -> None:
    """The reason is the `reason` label of lucid_events_rejected_total and the log's outcome: an operator
    tells a misconfigured persona (403/400) from a forger (401) by it, and Feishu retries only on 5xx."""
    from lark_oapi.core.utils import AESCipher

    from bot.app import Rejected, open_event

    name, make, status, reason = VERDICTS[case]
    persona = PERSONAS[name]
    d = make()
    with pytest.raises(Rejected) as refused:
        open_event(d.headers, d.body, persona, AESCipher(KEY) if persona.encrypt_key else None)
    assert (refused.value.status, refused.value.reason) == (status, reason)


# ------------------------------------------------------------------------------------------- dedupe


def _inbound(mid: str) -> Inbound:
    return Inbound(
        tenant="t", user="on_" + mid, open_id="ou_" + mid, persona="enc", chat_id="oc_" + mid,
        chat_type="p2p", message_id="om_" + mid, text="你好", create_time=1, event_id="ev_" + mid,
    )  # fmt: skip


def test_a_batch_redis_fails_to_enqueue_keeps_no_claim_so_feishus_retry_is_answered(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Redis refuses the enqueue after the claims were taken (here an ACL without RPUSH, as a replica
    turned read-only would): the webhook answers 503 and Feishu delivers again. That retry must be
    neither a duplicate (the seen-keys) nor wait for a turn job that never reached the queue."""
    name = f"no-enqueue-{uuid.uuid4().hex[:8]}"
    commands = ["+@all", "-rpush", "-lpush"]
    redis_client.acl_setuser(name, enabled=True, nopass=True, keys=["*"], channels=["*"], commands=commands)
    limited = redis.Redis.from_url(redis_url, username=name)
    batch = [_inbound("a"), _inbound("b")]
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            Intake(limited).accept_many(batch)
    finally:
        limited.close()
        redis_client.acl_deluser(name)
    left = [k.decode() for k in redis_client.scan_iter("lucid:*") if k != INBOXES.encode()]
    assert left == []  # no seen-key, no inboxed message, no turn job of the failed batch
    assert Intake(redis_client).accept_many(batch) == [True, True]
    assert sorted(j.id for j in queue("chat", redis_client).jobs) == sorted(map(turn_job_id, batch))


def test_when_redis_refuses_even_the_release_the_operator_is_told_retries_will_look_like_duplicates(
    redis_client: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"no-enqueue-no-release-{uuid.uuid4().hex[:8]}"
    commands = ["+@all", "-rpush", "-lpush", "-del", "-zrem"]
    redis_client.acl_setuser(name, enabled=True, nopass=True, keys=["*"], channels=["*"], commands=commands)
    limited = redis.Redis.from_url(redis_url, username=name)
    try:
        with caplog.at_level(logging.ERROR, logger="workers.mailbox"), pytest.raises(redis.RedisError):
            Intake(limited).accept_many([_inbound("a"), _inbound("b")])
    finally:
        limited.close()
        redis_client.acl_deluser(name)
    assert [r.getMessage() for r in caplog.records if r.name == "workers.mailbox"] == [
        "could not release the claims of 2 message(s); Feishu's retries will look like duplicates"
    ]
