"""Issue 15 (7): the smaller findings, each as an operator or a stranger would meet it.

Real aiohttp servers (the bot's app), real Redis, real sockets for bytes no HTTP client would send, the real
CLI in a subprocess. What must hold: a non-UTF-8 header is a 400, never a 500 with a traceback; one bad
event never fails the events it was batched with, and never keeps their dedupe claims; the viewer never
stalls the event loop that answers Feishu; its cookie is a session id, not the admin token, and failed logins
are logged and limited; persona names are not served to strangers; a terminal escape in a message reaches
the operator's terminal inert; `lucid doctor` warns about a persona without an encrypt_key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis
from aiohttp.test_utils import TestClient, TestServer
from rq import Queue

from bot import doctor
from bot.app import create_app
from memory_core.namespace import Namespace
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import ALICE, BOB, VERIFICATION_TOKEN, deliver, message_event
from tests.reliability.harness import lucid_cli_batch
from workers.inbound import Inbound
from workers.mailbox import Intake
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings

KEY = "edge-encrypt-key"
BOT = "ou_bot_edges_00000000000000000000"
ADMIN = "a" * 40
ClientFactory = Callable[..., Any]


def _runtime(data_dir: Path, redis_url: str, **extra: Any) -> Runtime:
    personas = {
        "secretpersona": Persona(
            "secretpersona", verification_token=VERIFICATION_TOKEN, encrypt_key=KEY, bot_open_id=BOT
        )
    }
    settings = Settings(data_dir=data_dir, personas=personas, admin_token=ADMIN, **extra)
    return build(settings, redis_url, git=False)


async def _client(aiohttp_client: ClientFactory, data_dir: Path, redis_url: str, **extra: Any) -> TestClient:
    return await aiohttp_client(create_app(_runtime(data_dir, redis_url, **extra)))


async def _raw(client: TestClient, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(request)
    await writer.drain()
    data = await reader.read(65536)
    writer.close()
    return data


# ------------------------------------------------------------------------------------- non-UTF-8 headers


@pytest.mark.parametrize(
    ("path", "header"),
    [
        ("/feishu/secretpersona/events", b"X-Lark-Request-Timestamp"),
        ("/feishu/secretpersona/events", b"X-Lark-Request-Nonce"),
        ("/feishu/secretpersona/events", b"X-Lark-Signature"),
        ("/admin/stats", b"Authorization"),
        ("/admin/api/namespaces", b"Authorization"),
    ],
)
async def test_a_non_utf8_header_is_a_400_not_a_traceback(
    aiohttp_client: ClientFactory,
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,  # an empty Redis: the test counts the chat queue, earlier tests fill it
    caplog: pytest.LogCaptureFixture,
    path: str,
    header: bytes,
) -> None:
    client = await _client(aiohttp_client, data_dir, redis_url)
    d = deliver(message_event("你好"), encrypt_key=KEY)
    fields = {k.encode(): v.encode() for k, v in d.headers.items() if k.lower() != "content-type"}
    fields[header] = b"\xff\xfe\xc3(" + (b"1" * 8)
    method = b"POST" if path.startswith("/feishu") else b"GET"
    body = d.body if method == b"POST" else b""
    head = b"".join(k + b": " + v + b"\r\n" for k, v in fields.items())
    request = (
        method + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + head + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        answer = await _raw(client, request)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert Queue("chat", connection=redis_client).count == 0


# ------------------------------------------------------------------------------------ per-event validation


async def test_one_bad_create_time_never_fails_its_batch(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    client = await _client(aiohttp_client, data_dir, redis_url)
    good = [
        deliver(message_event(f"第{i}条消息", sender=ALICE if i % 2 else BOB), encrypt_key=KEY)
        for i in range(6)
    ]
    bad = deliver(message_event("坏时间", create_time_ms=10**400), encrypt_key=KEY)

    async def post(d: Any) -> tuple[int, str]:
        resp = await client.post("/feishu/secretpersona/events", data=d.body, headers=d.headers)
        return resp.status, (await resp.json())["msg"]

    answers = await asyncio.gather(*(post(d) for d in [*good[:3], bad, *good[3:]]))
    assert answers[3] == (200, "ignored: malformed create_time")
    assert [a for i, a in enumerate(answers) if i != 3] == [(200, "queued")] * 6
    inboxed = sum(int(redis_client.zcard(k)) for k in redis_client.scan_iter("lucid:inbox:*"))
    assert inboxed == 6  # every innocent message queued for its turn ...
    assert len(Queue("chat", connection=redis_client).jobs) == 2  # ... by one turn job per person
    again = await asyncio.gather(*(post(d) for d in good))  # Feishu's retries stay duplicates
    assert again == [(200, "duplicate")] * 6


def test_an_event_redis_refuses_fails_alone_and_keeps_no_claim(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    def inbound(mid: str, created: int) -> Inbound:
        return Inbound(
            tenant="t", user="u" + mid, open_id="ou_" + mid, persona="p", chat_id="oc_" + mid,
            chat_type="p2p", message_id="om_" + mid, text="你好", create_time=created, event_id="ev_" + mid,
        )  # fmt: skip

    intake = Intake(redis_client)
    # A score Redis refuses (past a double's range) stands for any field the route let through by mistake.
    with caplog.at_level(logging.WARNING, logger="workers.mailbox"):
        out = intake.accept_many([inbound("a", 1), inbound("b", 10**400), inbound("c", 2)])
    assert out[0] is True and out[2] is True and isinstance(out[1], redis.ResponseError)
    assert [r.getMessage() for r in caplog.records] == [
        "refused 1 event(s) of a batch of 3: ['ResponseError']"
    ]
    assert len(Queue("chat", connection=redis_client).jobs) == 2
    assert intake.accept(inbound("b", 3)) is True  # its claim was released: the retry is not a duplicate


# -------------------------------------------------------------------------------------------------- viewer


async def test_a_large_namespace_in_the_viewer_never_stalls_the_webhook(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str
) -> None:
    ns = Namespace.of("t", "big", "secretpersona")
    root = ns.path(data_dir)
    root.mkdir(parents=True)
    lines = [f"- 第{i}条：我在第{i % 97}个城市的第{i % 13}家店喝过{i % 7}种咖啡和茶" for i in range(5000)]
    (root / "MEMORY.md").write_text("# Memory\n\n## Resident\n\n## Recall\n\n" + "\n".join(lines) + "\n")
    client = await _client(aiohttp_client, data_dir, redis_url)
    done: list[str] = []

    async def get(path: str, name: str) -> int:
        resp = await client.get(path, headers={"Authorization": f"Bearer {ADMIN}"})
        done.append(name)  # the response's headers are in: the server has finished that handler
        await resp.read()
        return resp.status

    view = asyncio.ensure_future(get("/admin/api/ns/t/big/secretpersona?q=咖啡和茶的城市", "viewer"))
    await asyncio.sleep(0.05)  # the viewer request is in, its work under way
    assert await get("/healthz", "healthz") == 200
    assert await view == 200
    # healthz was answered while the namespace was being read; on the event loop, the viewer's 5,000-entry
    # read would finish (and its headers go out) before healthz could even be accepted.
    assert done == ["healthz", "viewer"]


async def test_the_viewer_cookie_is_a_session_not_the_token(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str
) -> None:
    client = await _client(aiohttp_client, data_dir, redis_url)
    login = await client.get(f"/admin/viewer?token={ADMIN}", allow_redirects=False)
    assert login.status == 302
    cookie = login.cookies["lucid_admin"]
    assert cookie.value and cookie.value != ADMIN and ADMIN not in login.headers["Set-Cookie"]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["max-age"] == str(8 * 3600)
    assert not cookie["secure"]  # plain HTTP here …
    behind_tls = await client.get(
        f"/admin/viewer?token={ADMIN}", allow_redirects=False, headers={"X-Forwarded-Proto": "https"}
    )
    assert behind_tls.cookies["lucid_admin"]["secure"]  # … Secure behind an HTTPS proxy
    session = {"Cookie": f"lucid_admin={cookie.value}"}
    assert (await client.get("/admin/api/namespaces", headers=session)).status == 200
    as_token = {"Cookie": f"lucid_admin={ADMIN}"}  # the old cookie, the token itself, opens nothing
    assert (await client.get("/admin/api/namespaces", headers=as_token)).status == 401


@pytest.fixture
def no_login_failures(redis_url: str) -> Iterator[None]:
    """Failed viewer logins are counted in Redis for 5 minutes: none from another test, none left over."""
    client = redis.Redis.from_url(redis_url)

    def clear() -> None:
        keys = list(client.scan_iter(match="lucid:viewer:failures:*"))
        if keys:
            client.delete(*keys)

    clear()
    yield
    clear()
    client.close()


async def test_failed_viewer_logins_are_logged_without_the_token_and_limited(
    aiohttp_client: ClientFactory,
    data_dir: Path,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
    no_login_failures: None,
) -> None:
    client = await _client(aiohttp_client, data_dir, redis_url)
    with caplog.at_level(logging.INFO, logger="bot.viewer"):
        statuses = [
            (await client.get(f"/admin/viewer?token=guess-{i}", allow_redirects=False)).status
            for i in range(5)
        ]
        blocked = await client.get(f"/admin/viewer?token={ADMIN}", allow_redirects=False)
    assert statuses == [401] * 5 and blocked.status == 429
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert logged.count(" failed (") == 5 and "too many failed logins" in logged
    assert "guess-" not in logged and ADMIN not in logged


@pytest.mark.parametrize("target", ["/admin/api/namespaces", "/admin/stats"])
async def test_bearer_guesses_count_as_failed_logins_on_the_viewer_and_the_admin_api(
    aiohttp_client: ClientFactory,
    data_dir: Path,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
    no_login_failures: None,
    target: str,
) -> None:
    """Only `?token=` was limited: a script could guess the admin token as a Bearer header on the viewer's
    API or the admin API as fast as the server answered, and nothing was logged. Every way in now counts
    against one limit per client."""
    client = await _client(aiohttp_client, data_dir, redis_url)

    def bearer(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    with caplog.at_level(logging.INFO, logger="bot"):
        statuses = [(await client.get(target, headers=bearer(f"guess-{i}"))).status for i in range(5)]
        blocked = await client.get(target, headers=bearer(ADMIN))
        by_login = await client.get(f"/admin/viewer?token={ADMIN}", allow_redirects=False)
    assert statuses == [401] * 5 and blocked.status == 429 and by_login.status == 429
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert logged.count(" failed (") == 5 and "too many failed logins" in logged
    assert "guess-" not in logged and ADMIN not in logged
    assert (await client.get(target)).status == 401  # no token at all is no guess: not counted, still refused


async def test_a_session_opened_under_an_old_admin_token_ends_when_the_token_changes(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str
) -> None:
    """Sessions live in Redis for 8 hours: rotating a leaked admin token (a restart with a new one) left
    every session opened with the old one working."""
    before = await _client(aiohttp_client, data_dir, redis_url)
    login = await before.get(f"/admin/viewer?token={ADMIN}", allow_redirects=False)
    session = {"Cookie": f"lucid_admin={login.cookies['lucid_admin'].value}"}
    assert (await before.get("/admin/api/namespaces", headers=session)).status == 200
    rotated = await aiohttp_client(
        create_app(build(Settings(data_dir=data_dir, admin_token="b" * 40), redis_url, git=False))
    )
    assert (await rotated.get("/admin/api/namespaces", headers=session)).status == 401
    assert (await before.get("/admin/api/namespaces", headers=session)).status == 200  # the old server's own


async def test_failed_logins_are_counted_once_across_replicas_per_client_behind_the_proxy(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str, no_login_failures: None
) -> None:
    """Two `lucid serve` replicas behind one reverse proxy (127.0.0.1 here, listed in trusted_proxies):
    a client's failures on either count together (Redis), per client as the proxy's X-Forwarded-For names
    it, so one guesser is refused everywhere while another person behind the same proxy still logs in. A
    peer that is not a trusted proxy cannot dodge the limit by writing its own X-Forwarded-For."""
    replicas = [
        await _client(aiohttp_client, data_dir, redis_url, trusted_proxies=("127.0.0.1/32",)) for _ in "ab"
    ]
    guesser = {"X-Forwarded-For": "198.51.100.23, 203.0.113.7"}  # what it claims, then what the proxy saw

    async def login(client: TestClient, token: str, headers: dict[str, str]) -> int:
        return int(
            (await client.get(f"/admin/viewer?token={token}", headers=headers, allow_redirects=False)).status
        )

    tries = [
        await login(replicas[i % 2], f"guess-{i}", guesser) for i in range(5)
    ]  # 3 on one, 2 on the other
    assert tries == [401] * 5
    assert [await login(r, ADMIN, guesser) for r in replicas] == [429, 429]  # refused on both replicas
    colleague = {"X-Forwarded-For": "203.0.113.8"}
    assert await login(replicas[1], ADMIN, colleague) == 302  # same proxy, another client: not locked out
    direct = await _client(aiohttp_client, data_dir, redis_url)  # no trusted proxy: the peer is the client
    spoofed = [await login(direct, f"guess-{i}", {"X-Forwarded-For": f"192.0.2.{i}"}) for i in range(5)]
    assert spoofed == [401] * 5 and await login(direct, ADMIN, {"X-Forwarded-For": "192.0.2.99"}) == 429


# ---------------------------------------------------------------------------------------- metrics, readyz


async def test_metrics_and_readyz_need_the_metrics_token_for_persona_names(
    aiohttp_client: ClientFactory, data_dir: Path, redis_url: str
) -> None:
    client = await _client(aiohttp_client, data_dir, redis_url, metrics_token="m" * 32)
    assert (await client.get("/metrics")).status == 401
    assert "secretpersona" not in await (await client.get("/readyz")).text()
    bearer = {"Authorization": "Bearer " + "m" * 32}
    scraped = await client.get("/metrics", headers=bearer)
    assert scraped.status == 200 and "lucid_" in await scraped.text()
    assert "secretpersona" in (await (await client.get("/readyz", headers=bearer)).json())["bot_identity"]


def _lan_address() -> str | None:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.split()
    except OSError:
        return None
    return next((a for a in out if "." in a and not a.startswith("127.")), None)


async def test_without_a_metrics_token_a_remote_client_learns_no_persona_names(
    data_dir: Path, redis_url: str
) -> None:
    address = _lan_address()
    if address is None:
        pytest.skip("no non-loopback IPv4 address to reach the server from")
    server = TestServer(create_app(_runtime(data_dir, redis_url)), host="0.0.0.0")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            base = f"http://{address}:{server.port}"
            async with session.get(base + "/metrics") as resp:
                assert resp.status == 403
            async with session.get(base + "/readyz") as resp:
                assert "secretpersona" not in await resp.text()
            async with session.get(f"http://127.0.0.1:{server.port}/readyz") as resp:
                assert "secretpersona" in await resp.text()  # the operator on the host still sees them
    finally:
        await server.close()


# ------------------------------------------------------------------------------------------------ the CLI

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m红色\x9b1m\u202e反向\r覆盖"


def test_terminal_escapes_in_messages_reach_the_operator_inert(tmp_path: Path) -> None:
    data = tmp_path / "data"
    who = ("--tenant", "t", "--user", "u", "--persona", "p")
    source = tmp_path / "import.jsonl"
    source.write_text(json.dumps({"kind": "message", "id": "m1", "ts": "2026-06-01T09:00:00Z",
                                  "speaker": "u", "text": f"咖啡店 {ESCAPES}", "chat": "c1"}) + "\n")  # fmt: skip
    reads = {
        "show": ["show", "--all"],
        "search": ["search", "咖啡店"],
        "recall": ["recall", "咖啡"],
        "search --json": ["search", "咖啡店", "--json"],
        "history": ["history"],
    }
    # one process for all seven commands (`bot.cli:main` each, output to the process's real stdout)
    remembered, imported, *shown = lucid_cli_batch(
        data,
        [["remember", f"我喜欢{ESCAPES}的咖啡", *who], ["import", str(source), "--quiet", *who]]
        + [[*args, *who] for args in reads.values()],
        check=False,
    )
    assert remembered.returncode == 0 and imported.returncode == 0, (remembered.stderr, imported.stderr)
    assert all(run.returncode == 0 for run in shown), [run.stderr for run in shown]
    outputs = {name: run.stdout for name, run in zip(reads, shown, strict=True)}
    for name, out in outputs.items():
        assert not any(c in out for c in "\x1b\x07\x9b\u202e\r"), name
    assert "\\x1b" in outputs["search"] and "红色" in outputs["search"]
    assert json.loads(outputs["search --json"])["results"][0]["text"].startswith("咖啡店 \x1b")  # data intact


# ------------------------------------------------------------------------------------------------- doctor


def test_doctor_warns_about_a_persona_without_an_encrypt_key(data_dir: Path) -> None:
    with FakeFeishu(app_secret="right") as feishu:
        persona = Persona(
            "open", app_id="cli_ok", app_secret="right", verification_token="v", admins=("ou_1",)
        )
        settings = Settings(data_dir=data_dir, feishu_domain=feishu.url, personas={"open": persona})
        lines = [c.line() for c in doctor.check_feishu(settings)]
    assert any(line.startswith("[warn] persona open encryption: no encrypt_key") for line in lines), lines
