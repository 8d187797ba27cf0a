"""Sending through the real lark-oapi client against the fake Feishu open API, with its faults.

What a user would notice: every answer arrives exactly once, threaded to their message, whatever the API
does in between (rate limits, 5xx pages, timeouts, an expired token); long answers arrive whole.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.fakes.feishu import (
    FakeFeishu,
    api_error,
    chat_rate_limited,
    delay,
    rate_limited,
    server_error,
    token_invalid,
)
from workers.feishu_send import FeishuError, FeishuSender, Pacer, Retry, split
from workers.runtime import build
from workers.settings import Persona, Settings

CHAT = "oc_send_test_chat"


@pytest.fixture
def fake() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id="ou_bot_sender") as server:
        yield server


def sender(fake: FakeFeishu, client: redis.Redis | None = None, timeout: float = 5.0) -> FeishuSender:
    persona = Persona("p", app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="s")
    retry = Retry(attempts=4, backoff=0.01, max_wait=0.05)
    return FeishuSender(persona, fake.url, client, timeout=timeout, retry=retry)


def inbound(fake: FakeFeishu, chat: str = CHAT) -> str:
    message_id = "om_" + uuid.uuid4().hex
    fake.note_message(message_id, chat)
    return message_id


def test_a_reply_is_threaded_to_the_message_with_its_id_as_uuid(fake: FakeFeishu) -> None:
    s, mid = sender(fake), inbound(fake)
    s.reply(mid, "你好")
    [msg] = fake.sent
    assert (msg.parent_id, msg.uuid, msg.msg_type, msg.text) == (mid, mid, "text", "你好")


@pytest.mark.parametrize(
    "faults",
    [
        [rate_limited(reset_seconds=0)],
        [chat_rate_limited(), chat_rate_limited()],
        [server_error(502), server_error(503)],
        [api_error(99991400, status=429)],
        [token_invalid()],
    ],
    ids=["gateway 429", "per-chat 230020", "HTML 5xx", "429 without headers", "token invalid"],
)
def test_transient_failures_are_retried_and_post_exactly_once(fake: FakeFeishu, faults: list) -> None:  # type: ignore[type-arg]
    s, mid = sender(fake), inbound(fake)
    fake.fail("reply", *faults)
    s.reply(mid, "answer")
    assert [m.text for m in fake.sent] == ["answer"]
    assert len(fake.calls("reply")) == len(faults) + 1


def test_a_timed_out_send_is_retried_with_the_same_uuid_and_lands_once(fake: FakeFeishu) -> None:
    s, mid = sender(fake, timeout=0.3), inbound(fake)
    s.reply(mid, "warm")  # a cached token, so the timeout hits the send itself
    mid2 = inbound(fake)
    fake.fail("reply", delay(0.6))
    s.reply(mid2, "slow answer")
    time.sleep(0.5)  # the abandoned first attempt completes on the server too
    assert [m.text for m in fake.sent if m.parent_id == mid2] == ["slow answer"]


def test_an_expired_token_is_dropped_from_the_sdk_cache_and_refetched_once(fake: FakeFeishu) -> None:
    s = sender(fake)
    s.reply(inbound(fake), "one")
    fake.expire_tokens()
    s.reply(inbound(fake), "two")
    assert [m.text for m in fake.sent] == ["one", "two"]
    assert fake.token_fetches == 2


def test_a_permanent_refusal_raises_without_retrying(fake: FakeFeishu) -> None:
    s, mid = sender(fake), inbound(fake)
    fake.fail("reply", api_error(230002, "Bot is not in the chat"))
    with pytest.raises(FeishuError) as err:
        s.reply(mid, "x")
    assert err.value.code == 230002 and len(fake.calls("reply")) == 1 and fake.sent == []


def test_retries_give_up_after_the_budget_with_a_retryable_error(fake: FakeFeishu) -> None:
    s, mid = sender(fake), inbound(fake)
    fake.fail("reply", *[server_error(502)] * 4)
    with pytest.raises(FeishuError) as err:
        s.reply(mid, "x")
    assert err.value.retryable and fake.sent == []


def test_markdown_goes_out_as_a_post_and_falls_back_to_text_when_refused(fake: FakeFeishu) -> None:
    s = sender(fake)
    s.reply(inbound(fake), "**要点**\n- 一\n- 二")
    fake.fail("reply", api_error(230001, "invalid message content"))
    s.reply(inbound(fake), "## 标题\n正文")
    first, second = fake.sent
    assert first.msg_type == "post"
    assert first.body["zh_cn"]["content"][0][0] == {"tag": "md", "text": "**要点**\n- 一\n- 二"}
    assert (second.msg_type, second.text) == ("text", "## 标题\n正文")


def test_a_long_answer_arrives_whole_in_chunks_with_distinct_uuids(fake: FakeFeishu) -> None:
    s, mid = sender(fake), inbound(fake)
    paragraphs = [f"第{i}段。" + "内容" * 300 for i in range(12)]
    text = "\n\n".join(paragraphs)
    s.reply(mid, text)
    s.reply(mid, text)  # a re-run turn: every chunk's uuid was seen, nothing new is posted
    chunks = [m.text or "" for m in fake.sent]
    assert len(chunks) > 1 and all(len(c) <= 3000 for c in chunks)
    assert [m.uuid for m in fake.sent] == [mid] + [f"{mid}:{i}" for i in range(1, len(chunks))]
    assert "\n\n".join(chunks) == text


def test_split_keeps_code_fences_balanced() -> None:
    code = "```python\n" + "\n".join(f"x{i} = {i}" for i in range(900)) + "\n```"
    chunks = split("intro\n\n" + code, limit=2000)
    assert len(chunks) > 2
    assert all(c.count("```") % 2 == 0 for c in chunks)


def most_in_any_window(times: list[float], seconds: float) -> int:
    """The largest number of `times` inside any half-open window of `seconds` (the fake's receive times)."""
    ordered = sorted(times)
    return max(
        (sum(1 for t in ordered[i:] if t - start < seconds) for i, start in enumerate(ordered)), default=0
    )


def test_sends_to_one_chat_are_paced_under_its_limit(fake: FakeFeishu, redis_client: redis.Redis) -> None:
    with FakeFeishu(chat_qps=5) as strict:
        s = FeishuSender(
            Persona("p", app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="s"),
            strict.url,
            redis_client,
            retry=Retry(attempts=1),
            pacer=Pacer(redis_client, chat_qps=4),
        )
        mids = [inbound(strict) for _ in range(6)]
        for mid in mids:
            s.reply(mid, "hi", chat_id=CHAT)  # attempts=1: a 230020 would raise
    # By the times the fake received them: slots 250 ms apart, so no 0.9 s holds 5 (0.1 s for the network).
    assert len(strict.sent) == 6
    assert most_in_any_window([m.time for m in strict.sent], 0.9) <= 4


def test_sends_of_one_app_stay_under_its_quota_per_window(redis_client: redis.Redis) -> None:
    """Feishu's "1000 per minute" per app, scaled down to 20 per 2 s so it runs in seconds: a burst of 40
    replies to 40 chats from two senders (two workers) is paced so that Feishu refuses none of them."""
    app = f"cli_{uuid.uuid4().hex[:12]}"
    with FakeFeishu(app_limits=[(20, 2.0)]) as strict:
        senders = [
            FeishuSender(
                Persona("p", app_id=app, app_secret="s"),
                strict.url,
                redis_client,
                retry=Retry(attempts=1),
                pacer=Pacer(redis_client, app_limit=(20, 2.0)),
            )
            for _ in range(2)
        ]
        mids = [inbound(strict, chat=f"oc_quota_{i:02d}") for i in range(40)]
        for i, mid in enumerate(mids):
            senders[i % 2].reply(mid, "hi", chat_id=f"oc_quota_{i:02d}")  # attempts=1: a 429 would raise
        unpaced = FeishuSender(
            Persona("p", app_id=app, app_secret="s"),
            strict.url,
            redis_client,
            retry=Retry(attempts=1),
            pacer=Pacer(None, app_qps=10_000, app_limit=(100_000, 1.0)),
        )
        with pytest.raises(FeishuError):  # the fake does enforce it: without the pacer the quota trips
            for i in range(25):
                unpaced.reply(
                    inbound(strict, chat=f"oc_unpaced_{i:02d}"), "hi", chat_id=f"oc_unpaced_{i:02d}"
                )
    paced = [m.time for m in strict.sent if (m.chat_id or "").startswith("oc_quota_")]
    assert len(paced) == 40
    # By the fake's receive times, both senders together: 20 slots span 2 s (0.1 s left for the network).
    assert most_in_any_window(paced, 1.9) <= 20


def test_one_chats_pacing_never_holds_back_another_chats_reply(redis_client: redis.Redis) -> None:
    """One worker sends a long answer in three parts to chat A (paced 2/s here: parts 0.5 s apart); while
    its second part waits for A's slot, another worker replies to chat B. By the order the fake received
    them, B's reply comes before A's second part. (It came after: A's future slot was taken in the app's
    own buckets too, and a GCRA slot only moves forward, so every chat of the app waited for A's.)"""
    app = f"cli_{uuid.uuid4().hex[:12]}"
    with FakeFeishu() as strict:

        def a_sender() -> FeishuSender:
            return FeishuSender(
                Persona("p", app_id=app, app_secret="s"),
                strict.url,
                redis_client,
                retry=Retry(attempts=1),
                pacer=Pacer(redis_client, chat_qps=2),
            )

        long_mid, other_mid = inbound(strict, chat="oc_pace_a"), inbound(strict, chat="oc_pace_b")
        first, second = a_sender(), a_sender()
        first.reply(inbound(strict, chat="oc_pace_b"), "warm the token")  # both senders' tokens cached
        second.reply(inbound(strict, chat="oc_pace_a"), "and the chats")
        strict.sent.clear()
        text = "\n\n".join(f"第{i}段：" + "很长的回答。" * 400 for i in range(3))
        assert len(split(text)) == 3
        worker = threading.Thread(target=first.reply, args=(long_mid, text), kwargs={"chat_id": "oc_pace_a"})
        worker.start()
        try:  # until part 2 has taken its slot in chat A (A's next free slot is then ~1 s off)
            assert wait_until(lambda: first.pacer.ahead("oc_pace_a") > 0.6, 10)
            second.reply(other_mid, "别人的回答", chat_id="oc_pace_b")
        finally:
            worker.join(10)
    order = [(m.parent_id, m.uuid) for m in strict.sent]
    assert order == [
        (long_mid, long_mid), (other_mid, other_mid), (long_mid, f"{long_mid}:1"), (long_mid, f"{long_mid}:2")
    ]  # fmt: skip


def wait_until(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_a_bigger_quota_raises_the_per_second_cap_too(redis_url: str, tmp_path: Path) -> None:
    """An app granted more than 1000 per minute is not held at the default 40/s: the schedule the pacer
    hands out for 120 replies to 120 chats spans over 3 s at the default quota (40/s, and 1000/min after
    a burst of 33) and a fraction of a second at 12,000 per minute (480/s)."""

    def span(rate: int) -> float:
        persona = Persona("p", app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="s")
        settings = Settings(data_dir=tmp_path, feishu_domain="http://127.0.0.1:9", send_rate=rate)
        with build(settings, redis_url, git=False) as runtime:  # the sender the wiring gives a worker
            pacer = runtime.sender(persona).pacer
            slots = [pacer.reserve(persona.app_id, None) for _ in range(120)]
        return max(slots)

    assert span(1000) >= 2.9  # 40/s: 120 sends need ~3 s
    assert span(12_000) < 0.5


def test_the_thinking_reaction_is_added_and_removed(fake: FakeFeishu) -> None:
    s, mid = sender(fake), inbound(fake)
    reaction = s.react(mid)
    s.unreact(mid, reaction)
    [r] = fake.reactions
    assert r.message_id == mid and r.deleted


def test_a_failing_reaction_never_raises(fake: FakeFeishu) -> None:
    s, mid = sender(fake), inbound(fake)
    fake.fail("reaction_create", api_error(231001, "reaction type invalid"))
    assert s.react(mid) is None


def test_the_bot_open_id_comes_from_bot_info(fake: FakeFeishu) -> None:
    assert sender(fake).bot_open_id() == "ou_bot_sender"


def test_content_is_sent_without_ascii_escapes(fake: FakeFeishu) -> None:
    sender(fake).reply(inbound(fake), "中文" * 10)
    [call] = fake.calls("reply")
    assert "\\u" not in json.dumps(call.body, ensure_ascii=False)


def test_token_trouble_is_retryable_but_a_wrong_app_secret_is_not(fake: FakeFeishu) -> None:
    s, mid = sender(fake), inbound(fake)
    fake.fail("token", *[api_error(99991400, "token endpoint rate limited", status=429)] * 4)
    with pytest.raises(FeishuError) as limited:
        s.reply(mid, "x")
    assert limited.value.retryable and fake.sent == []  # parked and sent again later (workers.outbox)
    with FakeFeishu(app_secret="the-right-secret") as strict, pytest.raises(FeishuError) as wrong:
        sender(strict).reply(inbound(strict), "x")
    assert not wrong.value.retryable and wrong.value.code == 10014 and strict.token_fetches == 1
