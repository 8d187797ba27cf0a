"""The test fakes speak the real clients' protocols: the real `ollama` client and the real lark-oapi
SDK talk to FakeOllama / FakeFeishu over HTTP on 127.0.0.1, and the SDK's own event dispatcher
accepts the deliveries built by `tests.fakes.feishu_events`.

These tests also pin what the SDK does on the error paths our sender must handle (token invalid,
rate limits, non-JSON 5xx, timeouts), so an SDK upgrade that changes them fails here first.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import lark_oapi as lark
import ollama
import pytest
import requests
from lark_oapi.api.im.v1 import (
    CreateMessageReactionRequest,
    CreateMessageReactionRequestBody,
    CreateMessageRequest,
    CreateMessageRequestBody,
    DeleteMessageReactionRequest,
    Emoji,
    P2ImMessageReceiveV1,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
)
from lark_oapi.core.utils import AESCipher

from tests.fakes import feishu_events as fe
from tests.fakes.feishu import (
    RECEIVE_ID_TYPES,
    FakeFeishu,
    chat_rate_limited,
    delay,
    forget_token,
    make_client,
    rate_limited,
    server_error,
    token_invalid,
)
from tests.fakes.ollama import (
    SCRATCHPAD,
    BrokenBody,
    Delay,
    FakeOllama,
    Garbage,
    HttpError,
    ModelNotFound,
    embed_text,
)

BOT_OPEN_ID = "ou_lucidbot000000000000000000000001"
ENCRYPT_KEY = "test-encrypt-key"
TOOL_CALL = {
    "content": "",
    "tool_calls": [
        {"function": {"name": "manage_memory", "arguments": {"action": "add", "text": "喜欢咖啡"}}}
    ],
}
USER_MSG = [{"role": "user", "content": "记住我喜欢咖啡"}]


@pytest.fixture
def fake_ollama() -> Iterator[FakeOllama]:
    """Protocol tests assert exact content: the reasoning scratchpad has tests of its own below."""
    with FakeOllama(models=["qwen3:4b", "nomic-embed-text"], reasoning=False) as fake:
        yield fake


@pytest.fixture
def fake_feishu() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id=BOT_OPEN_ID) as fake:
        yield fake


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) == 0


# -- FakeOllama ----------------------------------------------------------------------------------


def test_sync_chat_returns_scripted_reply_and_records_request(fake_ollama: FakeOllama) -> None:
    fake_ollama.script("好的，我记住了。")
    client = ollama.Client(host=fake_ollama.url)

    resp = client.chat(model="qwen3:4b", messages=USER_MSG, format="json", options={"temperature": 0})

    assert resp.message.role == "assistant"
    assert resp.message.content == "好的，我记住了。"
    assert resp.done and resp.done_reason == "stop"
    assert resp.prompt_eval_count and resp.prompt_eval_count > 0
    assert resp.eval_count and resp.eval_count > 0
    sent = fake_ollama.last_chat
    assert sent["messages"] == USER_MSG
    assert sent["format"] == "json"  # passed through untouched
    assert sent["options"] == {"temperature": 0}
    assert fake_ollama.pending == 0


def test_sync_chat_streams_chunks_then_a_done_chunk(fake_ollama: FakeOllama) -> None:
    reply = "Streaming works: 流式输出没问题。"
    fake_ollama.script(reply)
    client = ollama.Client(host=fake_ollama.url)

    parts = list(client.chat(model="qwen3:4b", messages=USER_MSG, stream=True))

    assert len(parts) > 2
    assert all(not p.done for p in parts[:-1])
    assert parts[-1].done and parts[-1].eval_count
    assert "".join(p.message.content or "" for p in parts) == reply
    assert fake_ollama.last_chat["stream"] is True


def test_sync_chat_returns_tool_calls_plain_and_streamed(fake_ollama: FakeOllama) -> None:
    fake_ollama.script(TOOL_CALL, TOOL_CALL)
    client = ollama.Client(host=fake_ollama.url)
    tools = [{"type": "function", "function": {"name": "manage_memory", "parameters": {"type": "object"}}}]

    resp = client.chat(model="qwen3:4b", messages=USER_MSG, tools=tools)
    streamed = list(client.chat(model="qwen3:4b", messages=USER_MSG, tools=tools, stream=True))

    (call,) = resp.message.tool_calls or []
    assert call.function.name == "manage_memory"
    assert call.function.arguments == {"action": "add", "text": "喜欢咖啡"}
    streamed_calls = [c for p in streamed for c in (p.message.tool_calls or [])]
    assert [c.function.arguments for c in streamed_calls] == [{"action": "add", "text": "喜欢咖啡"}]
    assert fake_ollama.chat_requests[0]["tools"][0]["function"]["name"] == "manage_memory"


def test_responder_computes_replies_from_the_prompt(fake_ollama: FakeOllama) -> None:
    fake_ollama.responder = lambda req: "echo: " + req["messages"][-1]["content"]
    fake_ollama.script("scripted first")
    client = ollama.Client(host=fake_ollama.url)

    first = client.chat(model="qwen3:4b", messages=USER_MSG)
    second = client.chat(model="qwen3:4b", messages=[{"role": "user", "content": "你好"}])

    assert first.message.content == "scripted first"  # the script wins over the responder
    assert second.message.content == "echo: 你好"


def test_unscripted_chat_fails_loudly(fake_ollama: FakeOllama) -> None:
    client = ollama.Client(host=fake_ollama.url)

    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="qwen3:4b", messages=USER_MSG)

    assert err.value.status_code == 500
    assert fake_ollama.errors and "no scripted reply" in fake_ollama.errors[0]


def test_model_not_found_is_a_response_error_404(fake_ollama: FakeOllama) -> None:
    fake_ollama.script(ModelNotFound())
    client = ollama.Client(host=fake_ollama.url)

    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="missing-model", messages=USER_MSG)

    assert err.value.status_code == 404
    assert "missing-model" in err.value.error


def test_strict_models_rejects_unlisted_models() -> None:
    with FakeOllama(models=["qwen3:4b"], default_reply="ok", reasoning=False) as fake:
        client = ollama.Client(host=fake.url)
        assert client.chat(model="qwen3:4b", messages=USER_MSG).message.content == "ok"
        with pytest.raises(ollama.ResponseError) as chat_err:
            client.chat(model="llama3", messages=USER_MSG)
        with pytest.raises(ollama.ResponseError) as embed_err:
            client.embed(model="bge-m3", input="x")
    assert chat_err.value.status_code == embed_err.value.status_code == 404


def test_http_error_garbage_and_broken_body(fake_ollama: FakeOllama) -> None:
    fake_ollama.script(HttpError(500, "boom"), Garbage(), BrokenBody())
    client = ollama.Client(host=fake_ollama.url)

    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="qwen3:4b", messages=USER_MSG)
    garbage = client.chat(model="qwen3:4b", messages=USER_MSG, format="json")
    with pytest.raises(json.JSONDecodeError):  # the client does not wrap a non-JSON 200
        client.chat(model="qwen3:4b", messages=USER_MSG)

    assert (err.value.status_code, err.value.error) == (500, "boom")
    with pytest.raises(json.JSONDecodeError):
        json.loads(garbage.message.content or "")


def test_delay_outlasts_a_client_timeout(fake_ollama: FakeOllama) -> None:
    fake_ollama.script(Delay(1.0, "too late"), "on time")
    client = ollama.Client(host=fake_ollama.url, timeout=0.2)

    with pytest.raises(httpx.TimeoutException):  # the ollama client lets httpx timeouts through
        client.chat(model="qwen3:4b", messages=USER_MSG)
    assert client.chat(model="qwen3:4b", messages=USER_MSG).message.content == "on time"


def test_slow_server_times_out_then_recovers(fake_ollama: FakeOllama) -> None:
    fake_ollama.script("slow", "fast")
    client = ollama.Client(host=fake_ollama.url, timeout=0.2)

    fake_ollama.slow(1.0)
    with pytest.raises(httpx.TimeoutException):
        client.chat(model="qwen3:4b", messages=USER_MSG)
    fake_ollama.slow(0)

    assert client.chat(model="qwen3:4b", messages=USER_MSG).message.content == "fast"


def test_down_server_refuses_connections_until_up(fake_ollama: FakeOllama) -> None:
    client = ollama.Client(host=fake_ollama.url)
    assert client.list().models  # open a keep-alive connection first

    fake_ollama.down()
    with pytest.raises(ConnectionError):
        client.list()
    fake_ollama.up()

    assert [m.model for m in client.list().models] == ["qwen3:4b", "nomic-embed-text"]


def test_embed_is_deterministic_normalised_and_similarity_preserving(fake_ollama: FakeOllama) -> None:
    client = ollama.Client(host=fake_ollama.url)
    texts = ["我喜欢喝咖啡", "我很喜欢喝咖啡", "明天去北京开会", "I like drinking coffee", "I like coffee"]

    vectors = [list(v) for v in client.embed(model="nomic-embed-text", input=texts).embeddings]
    single = client.embed(model="nomic-embed-text", input="我喜欢喝咖啡").embeddings[0]

    assert all(len(v) == 64 and math.isclose(_cosine(v, v), 1.0) for v in vectors)
    assert list(single) == vectors[0] == embed_text("我喜欢喝咖啡")
    assert _cosine(vectors[0], vectors[1]) > 0.6 > abs(_cosine(vectors[0], vectors[2]))
    assert _cosine(vectors[3], vectors[4]) > 0.6
    assert fake_ollama.embed_requests[0]["input"] == texts


def test_embed_faults_are_scripted_separately(fake_ollama: FakeOllama) -> None:
    fake_ollama.fail_embed(HttpError(503, "loading model"))
    client = ollama.Client(host=fake_ollama.url)

    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model="nomic-embed-text", input="x")

    assert err.value.status_code == 503
    assert len(client.embed(model="nomic-embed-text", input="x").embeddings) == 1


def test_tags_and_version(fake_ollama: FakeOllama) -> None:
    models = ollama.Client(host=fake_ollama.url).list().models
    version = httpx.get(f"{fake_ollama.url}/api/version").json()

    assert [m.model for m in models] == ["qwen3:4b", "nomic-embed-text"]
    assert version == {"version": fake_ollama.version}


async def test_async_client_chat_stream_and_embed(fake_ollama: FakeOllama) -> None:
    fake_ollama.script("异步你好", "streamed reply", TOOL_CALL)
    client = ollama.AsyncClient(host=fake_ollama.url)

    resp = await client.chat(model="qwen3:4b", messages=USER_MSG)
    parts = [p async for p in await client.chat(model="qwen3:4b", messages=USER_MSG, stream=True)]
    tool = await client.chat(model="qwen3:4b", messages=USER_MSG)
    embedded = await client.embed(model="nomic-embed-text", input=["a", "b"])

    assert resp.message.content == "异步你好"
    assert "".join(p.message.content or "" for p in parts) == "streamed reply"
    assert (tool.message.tool_calls or [])[0].function.name == "manage_memory"
    assert len(embedded.embeddings) == 2


async def test_async_client_raises_response_error_on_404(fake_ollama: FakeOllama) -> None:
    fake_ollama.script(ModelNotFound())

    with pytest.raises(ollama.ResponseError) as err:
        await ollama.AsyncClient(host=fake_ollama.url).chat(model="nope", messages=USER_MSG)

    assert err.value.status_code == 404


def test_runner_stops_cleanly_and_frees_the_port() -> None:
    before = set(threading.enumerate())
    fake = FakeOllama().start()
    url = fake.url
    assert _port_open(url)

    fake.stop()

    assert not _port_open(url)
    assert set(threading.enumerate()) <= before
    fake.stop()  # idempotent


# -- FakeFeishu with the real lark-oapi SDK ------------------------------------------------------


def _reply(message_id: str, text: str, uuid: str | None = None) -> ReplyMessageRequest:
    body = ReplyMessageRequestBody.builder().msg_type("text").content(json.dumps({"text": text}))
    if uuid is not None:
        body = body.uuid(uuid)  # the SDK's reply builder accepts uuid
    return ReplyMessageRequest.builder().message_id(message_id).request_body(body.build()).build()


def test_reply_with_the_same_uuid_creates_one_message(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    fake_feishu.note_message("om_in_1", "oc_chat_1")

    first = client.im.v1.message.reply(_reply("om_in_1", "你好", uuid="om_in_1"))
    again = client.im.v1.message.reply(_reply("om_in_1", "你好", uuid="om_in_1"))

    assert first.success() and again.success()
    assert first.data.message_id == again.data.message_id
    (sent,) = fake_feishu.sent
    assert (sent.kind, sent.parent_id, sent.chat_id) == ("reply", "om_in_1", "oc_chat_1")
    assert (sent.msg_type, sent.text, sent.uuid) == ("text", "你好", "om_in_1")
    assert len(fake_feishu.calls("reply")) == 2
    assert fake_feishu.calls("reply")[0].headers["Authorization"].startswith("Bearer t-fake")
    assert fake_feishu.token_fetches == 1  # the SDK cached the token for the second call


def test_create_message_passes_receive_id_type(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    body = (
        CreateMessageRequestBody.builder()
        .receive_id("oc_chat_9")
        .msg_type("text")
        .content(json.dumps({"text": "hi"}))
        .uuid("u-1")
        .build()
    )
    req = CreateMessageRequest.builder().receive_id_type("chat_id").request_body(body).build()

    resp = client.im.v1.message.create(req)

    assert resp.success()
    assert fake_feishu.calls("create")[0].query == {"receive_id_type": "chat_id"}
    assert [(m.kind, m.chat_id, m.text) for m in fake_feishu.sent_to("oc_chat_9")] == [
        ("create", "oc_chat_9", "hi")
    ]


def test_reactions_create_and_delete(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    create = (
        CreateMessageReactionRequest.builder()
        .message_id("om_in_2")
        .request_body(
            CreateMessageReactionRequestBody.builder()
            .reaction_type(Emoji.builder().emoji_type("THUMBSUP").build())
            .build()
        )
        .build()
    )

    fake_feishu.note_message("om_in_2", "oc_chat_2")
    made = client.im.v1.message_reaction.create(create)
    reaction_id = made.data.reaction_id
    delete = DeleteMessageReactionRequest.builder().message_id("om_in_2").reaction_id(reaction_id).build()
    removed = client.im.v1.message_reaction.delete(delete)
    removed_twice = client.im.v1.message_reaction.delete(delete)

    assert made.success() and removed.success() and not removed_twice.success()
    (reaction,) = fake_feishu.reactions
    assert (reaction.message_id, reaction.emoji_type, reaction.deleted) == ("om_in_2", "THUMBSUP", True)


def test_bot_info_through_a_raw_sdk_request(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    req = (
        lark.BaseRequest.builder()
        .http_method(lark.HttpMethod.GET)
        .uri("/open-apis/bot/v3/info")
        .token_types({lark.AccessTokenType.TENANT})
        .build()
    )

    resp = client.request(req)

    assert json.loads(resp.raw.content)["bot"]["open_id"] == BOT_OPEN_ID


def test_sdk_keeps_an_invalid_token_until_the_caller_drops_it(fake_feishu: FakeFeishu) -> None:
    # Finding (lark-oapi 1.7.5): on 99991663 the SDK neither refreshes nor drops its cached tenant
    # token (TokenManager has no error path; the cache entry lives until expire - 600 s). Every call
    # keeps failing until the caller clears `self_tenant_token:{app_id}` in TokenManager.cache;
    # then the next call fetches a new token and succeeds. The product must do that and retry once.
    app_id = "cli_token_test_0001"
    forget_token(app_id)
    client = make_client(fake_feishu, app_id=app_id)
    fake_feishu.note_message("om_a", "oc_a")
    assert client.im.v1.message.reply(_reply("om_a", "1")).success()

    fake_feishu.expire_tokens()
    failed = client.im.v1.message.reply(_reply("om_a", "2"))
    still_failing = client.im.v1.message.reply(_reply("om_a", "3"))
    forget_token(app_id)
    retried = client.im.v1.message.reply(_reply("om_a", "3"))

    assert failed.code == still_failing.code == 99991663
    assert retried.success()
    assert fake_feishu.token_fetches == 2
    assert [m.text for m in fake_feishu.sent] == ["1", "3"]


def test_scripted_token_invalid_hits_one_request(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    fake_feishu.fail("reply", token_invalid())
    fake_feishu.note_message("om_b", "oc_b")

    assert client.im.v1.message.reply(_reply("om_b", "x")).code == 99991663
    assert client.im.v1.message.reply(_reply("om_b", "x")).success()


def test_sdk_surfaces_rate_limits_as_codes_without_retrying(fake_feishu: FakeFeishu) -> None:
    # Finding: a 429 with a JSON body does not raise; resp.code carries 99991400 and the
    # x-ogw-ratelimit-* headers are in resp.raw.headers. The SDK never retries by itself.
    client = make_client(fake_feishu)
    fake_feishu.fail("reply", rate_limited(reset_seconds=3), chat_rate_limited())

    gateway = client.im.v1.message.reply(_reply("om_c", "x"))
    per_chat = client.im.v1.message.reply(_reply("om_c", "x"))

    assert (gateway.code, gateway.raw.status_code) == (99991400, 429)
    assert gateway.raw.headers["x-ogw-ratelimit-reset"] == "3"
    assert per_chat.code == 230020
    assert len(fake_feishu.calls("reply")) == 2 and fake_feishu.sent == []


def test_sdk_raises_on_a_non_json_5xx(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    fake_feishu.fail("reply", server_error(502))

    with pytest.raises(json.JSONDecodeError):
        client.im.v1.message.reply(_reply("om_d", "x"))


def test_timed_out_send_retried_with_its_uuid_posts_once(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu, timeout=0.2)
    client.request(  # warm the token cache so the timeout hits the reply, not the token fetch
        lark.BaseRequest.builder()
        .http_method(lark.HttpMethod.GET)
        .uri("/open-apis/bot/v3/info")
        .token_types({lark.AccessTokenType.TENANT})
        .build()
    )
    fake_feishu.fail("reply", delay(0.5))
    fake_feishu.note_message("om_e", "oc_e")

    with pytest.raises(requests.exceptions.Timeout):
        client.im.v1.message.reply(_reply("om_e", "answer", uuid="om_e:0"))
    retried = client.im.v1.message.reply(_reply("om_e", "answer", uuid="om_e:0"))
    time.sleep(0.6)  # let the abandoned first attempt finish on the server

    assert retried.success()
    assert [m.uuid for m in fake_feishu.sent] == ["om_e:0"]  # the slow first attempt landed too


def test_chat_qps_limit_answers_230020() -> None:
    with FakeFeishu(chat_qps=2) as fake:
        client = make_client(fake)
        fake.note_message("om_f", "oc_busy")
        codes = [client.im.v1.message.reply(_reply("om_f", str(i))).code for i in range(3)]
    assert codes == [0, 0, 230020]


async def test_async_sdk_call_against_the_threaded_fake(fake_feishu: FakeFeishu) -> None:
    # The fake has its own loop, so even a cold-cache `areply` (blocking token fetch) cannot deadlock.
    client = make_client(fake_feishu)
    fake_feishu.note_message("om_g", "oc_g")

    resp = await client.im.v1.message.areply(_reply("om_g", "async"))

    assert resp.success() and fake_feishu.sent[0].text == "async"


# -- feishu_events against the SDK's EventDispatcherHandler --------------------------------------


def _dispatcher(encrypt_key: str, received: list[P2ImMessageReceiveV1]) -> Any:
    return (
        lark.EventDispatcherHandler.builder(encrypt_key, fe.VERIFICATION_TOKEN)
        .register_p2_im_message_receive_v1(received.append)
        .build()
    )


def test_encrypted_signed_group_event_is_accepted_by_the_sdk() -> None:
    received: list[P2ImMessageReceiveV1] = []
    event = fe.group_mention_event("记住我喜欢咖啡", bot_open_id=BOT_OPEN_ID, sender=fe.BOB)
    delivery = fe.deliver(event, encrypt_key=ENCRYPT_KEY)

    resp = _dispatcher(ENCRYPT_KEY, received).do(delivery.raw_request())

    assert resp.status_code == 200, resp.content
    assert set(delivery.json()) == {"encrypt"}
    (data,) = received
    message = data.event.message
    assert json.loads(message.content) == {"text": "@_user_1 记住我喜欢咖啡"}
    assert (message.chat_type, message.chat_id) == ("group", fe.GROUP_CHAT_ID)
    assert message.mentions[0].key == "@_user_1"
    assert message.mentions[0].id.open_id == BOT_OPEN_ID
    assert data.event.sender.sender_id.open_id == fe.BOB.open_id
    assert data.event.sender.sender_id.union_id == fe.BOB.union_id
    assert data.header.tenant_key == fe.TENANT_KEY
    assert data.header.event_id == event["header"]["event_id"]
    assert message.message_id == event["event"]["message"]["message_id"]


def test_plain_p2p_event_is_accepted_without_an_encrypt_key() -> None:
    received: list[P2ImMessageReceiveV1] = []
    event = fe.message_event("hello", sender=fe.ALICE, create_time_ms=1_700_000_000_000)

    resp = _dispatcher("", received).do(fe.deliver(event).raw_request())

    assert resp.status_code == 200, resp.content
    message = received[0].event.message
    assert (message.chat_type, message.chat_id) == ("p2p", fe.p2p_chat_id(fe.ALICE))
    assert json.loads(message.content)["text"] == "hello"
    assert message.create_time == "1700000000000"  # typed int in the model, a str at runtime


def test_sdk_rejects_a_forged_signature_and_a_wrong_token() -> None:
    received: list[P2ImMessageReceiveV1] = []
    dispatcher = _dispatcher(ENCRYPT_KEY, received)
    good = fe.deliver(fe.message_event("x"), encrypt_key=ENCRYPT_KEY)
    forged = fe.Delivery(good.body, {**good.headers, "X-Lark-Signature": "0" * 64})
    wrong_token = fe.deliver(fe.message_event("x", token="not-the-token"), encrypt_key=ENCRYPT_KEY)

    assert dispatcher.do(forged.raw_request()).status_code == 500
    assert dispatcher.do(wrong_token.raw_request()).status_code == 500
    assert received == []


def test_url_verification_challenge_is_answered_by_the_sdk() -> None:
    challenge = fe.url_verification("chal-123")
    dispatcher = _dispatcher(ENCRYPT_KEY, [])

    encrypted = dispatcher.do(fe.deliver(challenge, encrypt_key=ENCRYPT_KEY, signed=False).raw_request())
    plain = _dispatcher("", []).do(fe.deliver(challenge).raw_request())

    assert json.loads(encrypted.content) == json.loads(plain.content) == {"challenge": "chal-123"}


def test_crypto_matches_the_documented_vector_and_the_sdk() -> None:
    assert fe.decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=", "test key") == "hello world"
    blob = fe.encrypt("你好 world", ENCRYPT_KEY)
    assert AESCipher(ENCRYPT_KEY).decrypt_str(blob) == "你好 world"
    assert fe.encrypt("same", ENCRYPT_KEY) != fe.encrypt("same", ENCRYPT_KEY)  # random IV


# -- conformance: FakeOllama refuses what Ollama refuses ----------------------------------------
# Source: Ollama's API docs (github.com/ollama/ollama docs/api.md: /api/chat, /api/generate,
# /api/embed, /api/tags, /api/show) and its server's answers for the same requests.


def _refusal(url: str, **kwargs: Any) -> tuple[int, str]:
    """POST /api/chat as raw JSON (the client would reject some of these bodies before sending)."""
    body = {"model": "qwen3:4b", "messages": USER_MSG, "think": False, "stream": False, **kwargs}
    resp = httpx.post(f"{url}/api/chat", json=body)
    return resp.status_code, resp.json().get("error", "")


def test_ollama_refuses_a_model_that_is_not_pulled_with_404() -> None:
    # docs/api.md: a model that is not present answers 404 {"error": "model \"x\" not found, try
    # pulling it first"}; a name without a tag means ":latest", so "qwen3" is not "qwen3:4b".
    with FakeOllama(default_reply="ok") as fake:
        client = ollama.Client(host=fake.url)
        fake.script("scripted")
        assert _refusal(fake.url, model="llama3") == (404, 'model "llama3" not found, try pulling it first')
        assert _refusal(fake.url, model="qwen3")[0] == 404
        with pytest.raises(ollama.ResponseError) as embed_err:
            client.embed(model="bge-m3", input="x")
        with pytest.raises(ollama.ResponseError) as show_err:
            client.show("llama3")
        assert fake.pending == 1  # a refused request consumes no scripted reply
        assert client.chat(model="qwen3:4b", messages=USER_MSG, think=False).message.content == "scripted"
    assert embed_err.value.status_code == show_err.value.status_code == 404


def test_ollama_refuses_chat_with_an_embedding_model() -> None:
    with FakeOllama(default_reply="ok") as fake:
        status, error = _refusal(fake.url, model="nomic-embed-text")
    assert status == 400 and "does not support chat" in error


def test_ollama_refuses_malformed_tools_and_tools_for_a_model_without_them() -> None:
    # docs/api.md "Chat request (with tools)": tools = [{"type": "function", "function": {"name",
    # "description", "parameters": <JSON schema object>}}]; a model without the "tools" capability
    # answers 400 "<model> does not support tools".
    good = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    bad_tools = [
        [{"function": {"name": "f"}}],  # no "type": "function"
        [{"type": "function", "function": {"parameters": {"type": "object"}}}],  # no name
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
        [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "required": ["x"]}},
            }
        ],
        {"name": "f"},  # not a list
    ]
    with FakeOllama(models=["qwen3:4b", "gemma3:1b"], default_reply="ok") as fake:
        client = ollama.Client(host=fake.url)
        answers = [_refusal(fake.url, tools=tools) for tools in bad_tools]
        gemma = _refusal(fake.url, model="gemma3:1b", tools=[good])
        accepted = client.chat(model="qwen3:4b", messages=USER_MSG, tools=[good], think=False)
    assert [status for status, _ in answers] == [400] * len(bad_tools)
    assert gemma == (400, "registry.ollama.ai/library/gemma3:1b does not support tools")
    assert accepted.message.content == "ok"


def test_ollama_format_is_json_or_a_json_schema() -> None:
    # docs/api.md "Parameters": format is "json" or a JSON schema (structured outputs).
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    with FakeOllama(default_reply="{}", reasoning=False) as fake:
        client = ollama.Client(host=fake.url)
        refused = [_refusal(fake.url, format=fmt)[0] for fmt in ("yaml", 42, {"type": "map"})]
        fine = [client.chat(model="qwen3:4b", messages=USER_MSG, format=fmt) for fmt in ("json", schema)]
    assert refused == [400, 400, 400]
    assert [r.message.content for r in fine] == ["{}", "{}"]


def test_ollama_options_must_be_known_and_typed() -> None:
    # docs/api.md "Generate request (With options)" lists the options; a value of the wrong type is
    # refused. (An unknown name Ollama ignores with the warning "invalid option provided"; the fake
    # refuses it so a misspelt option cannot pass unnoticed.)
    with FakeOllama(default_reply="ok", reasoning=False) as fake:
        client = ollama.Client(host=fake.url)
        refused = [
            _refusal(fake.url, options=opts)
            for opts in ({"temperature": "hot"}, {"num_ctx": 1.5}, {"stop": "x"}, {"temprature": 0})
        ]
        fine = client.chat(
            model="qwen3:4b",
            messages=USER_MSG,
            options={"temperature": 0, "num_ctx": 2048, "stop": ["\n\n"], "seed": 7, "top_p": 1},
        )
    assert [status for status, _ in refused] == [400] * 4
    assert "invalid option provided" in refused[-1][1]
    assert fine.message.content == "ok"


def test_ollama_embed_input_is_a_string_or_a_list_of_strings() -> None:
    # docs/api.md "Generate Embeddings": input is text or a list of text.
    with FakeOllama() as fake:
        url = f"{fake.url}/api/embed"
        refused = [httpx.post(url, json={"model": "nomic-embed-text", "input": bad}) for bad in (5, [1, "a"])]
        fine = httpx.post(url, json={"model": "nomic-embed-text", "input": ["a", "b"]})
    assert [r.status_code for r in refused] == [400, 400]
    assert fine.status_code == 200 and len(fine.json()["embeddings"]) == 2


def test_ollama_think_needs_a_thinking_model() -> None:
    # docs/api.md "think": for thinking models only; others answer 400 "... does not support thinking".
    with FakeOllama(models=["llama3.2:latest"], default_reply="ok") as fake:
        status, error = _refusal(fake.url, model="llama3.2", think=True)
    assert (status, error) == (400, '"llama3.2" does not support thinking')


def test_qwen3_answers_with_a_scratchpad_in_content_or_in_thinking() -> None:
    # qwen3 writes <think>…</think> before its answer; with "think": true Ollama returns it in
    # message.thinking (docs/api.md "Chat request (with thinking)", ollama.com/blog/thinking),
    # streamed before the content; "think": false turns it off.
    with FakeOllama(default_reply="你好！") as fake:
        client = ollama.Client(host=fake.url)
        unset = client.chat(model="qwen3:4b", messages=USER_MSG)
        thinking = client.chat(model="qwen3:4b", messages=USER_MSG, think=True)
        off = client.chat(model="qwen3:4b", messages=USER_MSG, think=False)
        streamed = list(client.chat(model="qwen3:4b", messages=USER_MSG, think=True, stream=True))
        generated = client.generate(model="qwen3:4b", prompt="你好", think=True)
        show = client.show("qwen3:4b")

    assert unset.message.content == f"<think>\n{SCRATCHPAD}\n</think>\n\n你好！"
    assert (thinking.message.thinking, thinking.message.content) == (SCRATCHPAD, "你好！")
    assert (off.message.thinking, off.message.content) == (None, "你好！")
    thought = [p.message.thinking or "" for p in streamed]
    first_content = next(i for i, p in enumerate(streamed) if p.message.content)
    assert "".join(thought) == SCRATCHPAD and not any(thought[first_content:])
    assert (generated.thinking, generated.response) == (SCRATCHPAD, "你好！")
    assert "thinking" in (show.capabilities or []) and "tools" in (show.capabilities or [])


# -- conformance: FakeFeishu refuses what Feishu refuses -----------------------------------------
# Sources: research/feishu.md §3 (IM v1 reply/create docs: uuid "最大长度 50 字符", receive_id_type
# enum, "发送消息内容" content formats, 230001; rate limits: 5 QPS per user or group, 50/s and
# 1000/min per app, 230020 / 429 99991400); the reaction docs (表情文案说明 emoji_type list,
# 231001 invalid reaction type, 231003 message not found); the unknown reply target answers 400
# 99992354 "…not a valid {open_message_id} or not exists" (observed, openclaw/openclaw#135404).


def _send(client: lark.Client, message_id: str, msg_type: str, content: Any, uuid: str | None = None) -> Any:
    body = ReplyMessageRequestBody.builder().msg_type(msg_type)
    body = body.content(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
    if uuid is not None:
        body = body.uuid(uuid)
    req = ReplyMessageRequest.builder().message_id(message_id).request_body(body.build()).build()
    return client.im.v1.message.reply(req)


def _react(client: lark.Client, message_id: str, emoji: str) -> Any:
    body = CreateMessageReactionRequestBody.builder().reaction_type(Emoji.builder().emoji_type(emoji).build())
    req = CreateMessageReactionRequest.builder().message_id(message_id).request_body(body.build()).build()
    return client.im.v1.message_reaction.create(req)


def _create(client: lark.Client, receive_id_type: str, receive_id: str, text: str) -> Any:
    body = CreateMessageRequestBody.builder().receive_id(receive_id).msg_type("text")
    body = body.content(json.dumps({"text": text}))
    req = CreateMessageRequest.builder().receive_id_type(receive_id_type).request_body(body.build()).build()
    return client.im.v1.message.create(req)


def test_feishu_refuses_a_reply_or_reaction_to_an_unknown_message(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)

    reply = _send(client, "om_nobody_sent_this", "text", {"text": "hi"})
    reaction = _react(client, "om_nobody_sent_this", "THUMBSUP")
    fake_feishu.note_message("om_real", "oc_real")
    ok = _send(client, "om_real", "text", {"text": "hi"})
    to_own_reply = _send(client, ok.data.message_id, "text", {"text": "again"})

    assert (reply.code, reply.raw.status_code) == (99992354, 400)
    assert "not exists" in reply.msg
    assert reaction.code == 231003
    assert ok.success() and to_own_reply.success()  # messages the bot sent are known too
    assert [m.text for m in fake_feishu.sent] == ["hi", "again"] and fake_feishu.reactions == []


def test_feishu_uuid_is_at_most_50_characters(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    fake_feishu.note_message("om_u", "oc_u")

    long = _send(client, "om_u", "text", {"text": "long"}, uuid="u" * 51)
    exact = _send(client, "om_u", "text", {"text": "exact"}, uuid="u" * 50)

    assert long.code == 99992402 and "uuid" in long.msg
    assert exact.success()
    assert [m.text for m in fake_feishu.sent] == ["exact"]


def test_feishu_receive_id_type_is_one_of_the_documented_five(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)

    answers = {kind: _create(client, kind, "x_1", kind).code for kind in ("chat", "openid", "OPEN_ID")}
    fine = [_create(client, kind, f"{kind}_1", kind) for kind in sorted(RECEIVE_ID_TYPES)]

    assert answers == {"chat": 99992402, "openid": 99992402, "OPEN_ID": 99992402}
    assert all(r.success() for r in fine)
    assert sorted(m.receive_id_type or "" for m in fake_feishu.sent) == sorted(RECEIVE_ID_TYPES)


def test_feishu_emoji_type_is_from_the_documented_list(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    fake_feishu.note_message("om_r", "oc_r")

    codes = {emoji: _react(client, "om_r", emoji).code for emoji in ("THINKING", "thinking", "🤔", "LIKE")}

    assert codes == {"THINKING": 0, "thinking": 231001, "🤔": 231001, "LIKE": 231001}
    assert [r.emoji_type for r in fake_feishu.reactions] == ["THINKING"]


def test_feishu_post_content_must_follow_the_post_schema(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    fake_feishu.note_message("om_p", "oc_p")
    valid = {
        "zh_cn": {
            "title": "t",
            "content": [
                [{"tag": "text", "text": "a"}, {"tag": "a", "text": "l", "href": "https://x"}],
                [{"tag": "md", "text": "**b**"}],
                [{"tag": "at", "user_id": "ou_1"}, {"tag": "emotion", "emoji_type": "SMILE"}],
            ],
        }
    }
    invalid = [
        {"anything": "goes"},  # any JSON object used to pass
        {},  # no locale
        {"zh_cn": {"title": "", "content": [[{"tag": "bold", "text": "x"}]]}},  # unknown tag
        {"zh_cn": {"content": [[{"tag": "text"}]]}},  # text node without text
        {"zh_cn": {"content": [[{"tag": "a", "text": "l"}]]}},  # link without href
        {"zh_cn": {"content": [{"tag": "text", "text": "x"}]}},  # a paragraph must be a list
        {"zh_cn": {"content": [[{"tag": "md", "text": "x"}, {"tag": "text", "text": "y"}]]}},  # md not alone
        {"title": "t", "content": [[{"tag": "text", "text": "x"}]]},  # the received form, no locale
    ]

    codes = [_send(client, "om_p", "post", post).code for post in invalid]
    ok = _send(client, "om_p", "post", valid)

    assert codes == [230001] * len(invalid)
    assert ok.success() and [m.msg_type for m in fake_feishu.sent] == ["post"]


def test_feishu_content_must_match_msg_type(fake_feishu: FakeFeishu) -> None:
    client = make_client(fake_feishu)
    fake_feishu.note_message("om_t", "oc_t")
    post = {"zh_cn": {"title": "", "content": [[{"tag": "md", "text": "x"}]]}}
    card = {"elements": [{"tag": "markdown", "content": "x"}]}
    mismatched = [
        ("text", post),
        ("text", {"text": 5}),
        ("post", {"text": "x"}),
        ("interactive", {"text": "x"}),
        ("image", {"file_key": "f"}),
        ("share_chat", {}),
        ("markdown", {"text": "x"}),  # not a msg_type
        ("text", "not json"),
    ]

    codes = [_send(client, "om_t", kind, content).code for kind, content in mismatched]
    fine = [
        _send(client, "om_t", kind, content)
        for kind, content in [("interactive", card), ("image", {"image_key": "k"})]
    ]

    assert codes == [230001] * len(mismatched)
    assert all(r.success() for r in fine)


class FrozenClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_feishu_rate_limits_are_on_by_default() -> None:
    # 5 QPS per chat or user (230020) and 50/s per app (HTTP 429, 99991400), without a test asking.
    clock = FrozenClock()
    with FakeFeishu(clock=clock) as fake:
        client = make_client(fake)
        fake.note_message("om_q", "oc_q")
        one_chat = [_send(client, "om_q", "text", {"text": str(i)}).code for i in range(6)]
        one_user = [_create(client, "open_id", "ou_same", str(i)).code for i in range(6)]
        clock.now += 1.0
        after_a_second = _send(client, "om_q", "text", {"text": "later"}).code
        clock.now += 1.0
        spread = [_create(client, "chat_id", f"oc_{i}", "x") for i in range(51)]

    assert (fake.chat_qps, fake.app_limits) == (5.0, ((50, 1.0), (1000, 60.0)))
    assert one_chat == one_user == [0, 0, 0, 0, 0, 230020]
    assert after_a_second == 0
    assert [r.code for r in spread[:50]] == [0] * 50
    assert (spread[50].code, spread[50].raw.status_code) == (99991400, 429)


def test_feishu_app_limit_of_1000_per_minute_is_on_by_default() -> None:
    clock = FrozenClock()
    with FakeFeishu(clock=clock) as fake:
        token = requests.post(f"{fake.url}/open-apis/auth/v3/tenant_access_token/internal", json={}).json()
        headers = {"Authorization": f"Bearer {token['tenant_access_token']}"}
        codes = []
        with requests.Session() as session:
            for i in range(1001):
                if i and i % 50 == 0:
                    clock.now += 1.0  # 50 a second: under the per-second limit, over 1000 a minute
                body = {"receive_id": f"oc_{i}", "msg_type": "text", "content": json.dumps({"text": "x"})}
                url = f"{fake.url}/open-apis/im/v1/messages?receive_id_type=chat_id"
                codes.append(session.post(url, json=body, headers=headers).json()["code"])
    assert codes[:1000] == [0] * 1000 and codes[1000] == 99991400
