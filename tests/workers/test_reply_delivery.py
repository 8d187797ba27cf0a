"""A reply Feishu would not take during its turn is delivered later, exactly once, or given up loudly.

Real parts only: turns run as RQ jobs on a real SimpleWorker (with RQ's scheduler, as `lucid worker` runs it)
against a real Redis; replies go through the real lark-oapi SDK to the fake Feishu open API, which dedups on
`uuid` as Feishu does. What is checked is what a person or an operator would see: the messages in the chat,
the log and the metrics.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from rq.registry import ScheduledJobRegistry

from memory_core.errors import InvalidInput
from tests.fakes.feishu import FakeFeishu, delay, rate_limited, server_error
from workers import embedded_redis
from workers.feishu_send import FeishuSender, Retry
from workers.inbound import Inbound
from workers.mailbox import Intake
from workers.metrics import Metrics
from workers.outbox import Outbox, send_reply
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings, parse_reply_deadline
from workers.worker import Worker

CHAT = "oc_p2p_delivery_chat"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """This file's own redis-server, so no other file's jobs or workers share it."""
    server = embedded_redis.start(tmp_path_factory.mktemp("delivery-redis"), persist=False)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def fake() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id="ou_bot_delivery") as server:
        yield server


def make_runtime(data_dir: Path, redis_url: str, fake: FakeFeishu, deadline: float = 600.0) -> Runtime:
    persona = Persona("p", app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="s")
    settings = Settings(
        data_dir=data_dir, feishu_domain=fake.url, personas={"p": persona}, reply_deadline=deadline
    )
    return build(settings, redis_url, git=False)


@pytest.fixture
def rt(data_dir: Path, redis_url: str, redis_client: redis.Redis, fake: FakeFeishu) -> Runtime:
    return make_runtime(data_dir, redis_url, fake)


_clock = iter(range(10**9))


def message(fake: FakeFeishu, text: str) -> Inbound:
    inbound = Inbound(
        tenant="t1", user="alice", open_id="ou_alice", persona="p", chat_id=CHAT, chat_type="p2p",
        message_id=f"om_{uuid.uuid4().hex}", text=text,
        create_time=int(time.time() * 1000) + next(_clock),
    )  # fmt: skip
    fake.note_message(inbound.message_id, CHAT)
    return inbound


def send(rt: Runtime, *messages: Inbound) -> None:
    """What the webhook does with an accepted message: the person's inbox and a turn job."""
    assert rt.redis is not None
    intake = Intake(rt.redis)
    assert all(intake.accept(m) for m in messages)


def work_until(rt: Runtime, done: Callable[[], bool], timeout: float) -> bool:
    """Run the worker (scheduler included: it enqueues retries that are due) until `done()` or timeout."""
    deadline = time.monotonic() + timeout
    while True:
        Worker(rt, ("chat", "memory")).work(burst=True, with_scheduler=True)
        if done():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def replies(fake: FakeFeishu, message_id: str) -> list[str]:
    return [m.text or "" for m in fake.sent if m.parent_id == message_id]


def reply_calls(fake: FakeFeishu, message_id: str) -> list[str]:
    """The uuid of every reply request Feishu received for `message_id` (posted or not)."""
    return [c.body["uuid"] for c in fake.calls("reply") if c.path.endswith(f"/{message_id}/reply")]


def parked(rt: Runtime) -> list[bytes]:
    assert rt.redis is not None
    return list(rt.redis.scan_iter("lucid:reply:*"))


def scheduled(rt: Runtime) -> int:
    """Jobs waiting for their time (retries): none left means nothing more will be tried."""
    return ScheduledJobRegistry(queue=rt.queue("chat")).count


def metric(rt: Runtime, series: str) -> float:
    """The value of one exposed series. A series that is not exposed fails the test: after a rename of the
    metric or of a label, `== 0` must not pass by default (use `never_counted` to assert a zero)."""
    text = Metrics(rt.redis).render()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    exposed = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    pytest.fail(f"no series {series} in /metrics (renamed?); exposed: {exposed}")


def never_counted(rt: Runtime, family: str) -> bool:
    """True if the counter `family` is declared in /metrics and has no sample yet (never incremented).
    A family that is not declared at all fails, so a renamed counter cannot pass as zero."""
    text = Metrics(rt.redis).render()
    if f"# TYPE {family} counter" not in text.splitlines():
        pytest.fail(f"no counter {family} declared in /metrics (renamed?)")
    return not any(line.startswith((family + " ", family + "{")) for line in text.splitlines())


def said(rt: Runtime, inbound: Inbound) -> str:
    return "".join(p.read_text() for p in (rt.store.path(inbound.ns) / "raw").iterdir())


# ------------------------------------------------------------------------------------------- delivered


def test_a_reply_refused_by_every_try_of_its_turn_is_delivered_later_once(
    rt: Runtime, fake: FakeFeishu
) -> None:
    first = message(fake, "记住我的工牌在抽屉里")
    fake.fail("reply", *[rate_limited(reset_seconds=0)] * 4)  # the turn's four tries, all refused
    send(rt, first)

    assert work_until(rt, lambda: bool(replies(fake, first.message_id)), timeout=30)

    [answer] = replies(fake, first.message_id)
    assert "工牌在抽屉里" in answer
    assert reply_calls(fake, first.message_id) == [first.message_id] * 5  # one uuid: Feishu dedups
    assert parked(rt) == [] and scheduled(rt) == 0
    assert metric(rt, "lucid_replies_parked_total") == 1
    assert metric(rt, "lucid_replies_delivered_late_total") == 1
    assert f"{first.message_id}:reply" in said(rt, first)  # the conversation goes on from it


def test_feishu_down_then_back_delivers_parked_replies_oldest_first_and_never_twice(
    rt: Runtime, fake: FakeFeishu
) -> None:
    warm = message(fake, "你好")
    send(rt, warm)
    assert work_until(rt, lambda: bool(replies(fake, warm.message_id)), timeout=30)
    a, b = message(fake, "记住我住在余杭区"), message(fake, "记住我喜欢喝咖啡")
    fake.down()
    send(rt, a, b)
    assert work_until(rt, lambda: len(parked(rt)) == 2, timeout=30)  # both turns done, both parked
    work_until(rt, lambda: False, timeout=2.5)  # a retry or two while Feishu is still down
    fake.up()
    c = message(fake, "我在哪")
    send(rt, c)

    ids = [a.message_id, b.message_id, c.message_id]
    assert work_until(rt, lambda: all(replies(fake, i) for i in ids), timeout=30)
    # C's turn sent A and B first; their own retry jobs, still scheduled, run and find nothing to send
    assert work_until(rt, lambda: scheduled(rt) == 0, timeout=30)

    assert [m.parent_id for m in fake.sent if m.parent_id in ids] == ids  # in the person's order
    assert all(len(replies(fake, i)) == 1 for i in ids)
    assert all(set(reply_calls(fake, i)) == {i} for i in ids)
    assert parked(rt) == [] and scheduled(rt) == 0
    assert metric(rt, "lucid_replies_delivered_late_total") == 2


def test_a_long_reply_cut_off_mid_way_resumes_where_it_stopped(rt: Runtime, fake: FakeFeishu) -> None:
    assert rt.redis is not None
    persona = rt.settings.personas["p"]
    sender = FeishuSender(persona, fake.url, rt.redis, retry=Retry(attempts=4, backoff=0.01, max_wait=0.05))
    inbound = message(fake, "讲个长故事")
    text = "\n\n".join(f"第{i}段。" + "内容" * 300 for i in range(12))
    fake.fail("reply", delay(0), *[server_error(502)] * 4)  # the first chunk lands, the second does not

    assert send_reply(rt, sender, inbound, text) == "parked"
    assert work_until(rt, lambda: not parked(rt), timeout=30)

    chunks = replies(fake, inbound.message_id)
    assert "\n\n".join(chunks) == text and len(chunks) >= 3
    uuids = reply_calls(fake, inbound.message_id)
    assert uuids.count(inbound.message_id) == 1  # the chunk already posted was not sent again
    assert [m.uuid for m in fake.sent] == [inbound.message_id] + [
        f"{inbound.message_id}:{i}" for i in range(1, len(chunks))
    ]


# ------------------------------------------------------------------------------------------- given up


def test_a_refusal_no_retry_cures_is_not_retried_and_is_counted(
    rt: Runtime, fake: FakeFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    gone = message(fake, "你好")
    fake.recall(gone.message_id)  # the person withdrew their message: 230011
    send(rt, gone)
    assert work_until(rt, lambda: bool(reply_calls(fake, gone.message_id)), timeout=30)

    assert replies(fake, gone.message_id) == [] and len(reply_calls(fake, gone.message_id)) == 1
    assert parked(rt) == [] and scheduled(rt) == 0
    assert metric(rt, 'lucid_replies_undelivered_total{reason="refused"}') == 1
    assert "reply not delivered" in caplog.text


def test_a_parked_reply_whose_message_is_withdrawn_is_dropped_at_its_next_try(
    rt: Runtime, fake: FakeFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    msg = message(fake, "记住明天开会")
    fake.fail("reply", *[server_error(503)] * 4)
    send(rt, msg)
    assert work_until(rt, lambda: bool(parked(rt)), timeout=30)
    fake.recall(msg.message_id)
    with caplog.at_level(logging.ERROR, logger="workers.outbox"):
        assert work_until(rt, lambda: not parked(rt), timeout=30)

    assert replies(fake, msg.message_id) == [] and len(reply_calls(fake, msg.message_id)) == 5
    assert scheduled(rt) == 0
    assert metric(rt, 'lucid_replies_undelivered_total{reason="refused"}') == 1
    assert f"reply to message={msg.message_id}" in caplog.text and "NOT delivered" in caplog.text


def test_a_reply_still_undeliverable_at_the_deadline_is_given_up_logged_and_counted(
    data_dir: Path,
    redis_url: str,
    redis_client: redis.Redis,
    fake: FakeFeishu,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = make_runtime(data_dir, redis_url, fake, deadline=7.0)
    msg = message(fake, "记住我的车停在B2层")
    fake.down()
    send(rt, msg)
    with caplog.at_level(logging.ERROR, logger="workers.outbox"):
        assert work_until(rt, lambda: bool(parked(rt)), timeout=30)
        assert work_until(rt, lambda: not parked(rt), timeout=30)
    fake.up()
    work_until(rt, lambda: False, timeout=2.5)  # Feishu is back, but the reply was given up

    assert fake.sent == [] and scheduled(rt) == 0
    assert metric(rt, 'lucid_replies_undelivered_total{reason="deadline"}') == 1
    assert never_counted(rt, "lucid_replies_delivered_late_total")
    assert "NOT delivered: still failing at the deadline" in caplog.text


# ------------------------------------------------------------------------------------------- settings


def test_the_deadline_is_configurable_and_kept_inside_feishus_uuid_hour() -> None:
    assert Settings.from_env({}).reply_deadline == 50 * 60
    assert parse_reply_deadline("20m") == 1200 and parse_reply_deadline("90") == 90
    for bad in ("2h", "0", "soon", "-5m"):
        with pytest.raises(InvalidInput):
            parse_reply_deadline(bad)


def test_nothing_is_parked_without_a_failure(rt: Runtime, fake: FakeFeishu) -> None:
    msg = message(fake, "你好")
    send(rt, msg)
    assert work_until(rt, lambda: bool(replies(fake, msg.message_id)), timeout=30)
    assert parked(rt) == [] and scheduled(rt) == 0 and Outbox(rt.redis).pending("p", CHAT) == []  # type: ignore[arg-type]


def test_a_parked_reply_whose_retry_job_never_runs_is_rescued_by_the_sweeper(
    rt: Runtime, fake: FakeFeishu
) -> None:
    """The worker holding RQ's scheduler lock was SIGKILLed (others take the scheduler over only at their
    10-minute maintenance), so the scheduled retry never becomes a job: the workers' sweeper queues one."""
    from workers.mailbox import Sweeper

    assert rt.redis is not None
    first = message(fake, "记住我的车停在B2层")
    fake.fail("reply", *[rate_limited(reset_seconds=0)] * 4)
    send(rt, first)

    def work_without_scheduler() -> None:
        Worker(rt, ("chat", "memory")).work(burst=True, with_scheduler=False)

    work_without_scheduler()
    assert len(parked(rt)) == 1 and scheduled(rt) == 1 and not replies(fake, first.message_id)
    sweeper = Sweeper(rt.redis, also=[Outbox(rt.redis, overdue_ms=0).rescue])
    assert sweeper.sweep_if_due() == [] and not replies(fake, first.message_id)  # not due yet: 2 s backoff
    time.sleep(2.2)
    rt.redis.delete(Sweeper.LOCK)  # the next tick of the sweep
    sweeper.sweep_if_due()
    work_without_scheduler()

    assert len(replies(fake, first.message_id)) == 1
    assert parked(rt) == [] and rt.redis.zcard("lucid:replies:due") == 0
    assert reply_calls(fake, first.message_id) == [first.message_id] * 5  # one uuid throughout
    assert metric(rt, "lucid_replies_rescued_total") == 1


def test_a_parked_reply_that_quoted_a_fact_forgotten_since_goes_out_without_it(
    rt: Runtime, fake: FakeFeishu
) -> None:
    """Found by a privacy review: a reply parked while Feishu was down kept its text in Redis after the
    person forgot the fact it quoted (from another chat, a card, the CLI), and was delivered as it was."""
    from memory_core.forgetting import FORGOTTEN
    from memory_core.namespace import Namespace
    from memory_core.ops import Forget

    told = message(fake, "记住我对花生过敏")
    send(rt, told)
    assert work_until(rt, lambda: bool(replies(fake, told.message_id)), timeout=30)
    asked = message(fake, "我对什么过敏")
    fake.down()
    send(rt, asked)
    assert work_until(rt, lambda: len(parked(rt)) == 1, timeout=30)
    assert rt.redis is not None and "花生" in rt.redis.hget(parked(rt)[0], "text").decode()

    ns = Namespace.of("t1", "alice", "p")
    ident = next(e.id for e in rt.memory.book(ns).entries() if "花生" in e.text)
    assert rt.memory.apply(ns, [Forget(id=ident)])[0].status == "forgotten"
    fake.up()
    assert work_until(rt, lambda: bool(replies(fake, asked.message_id)), timeout=30)
    [answer] = replies(fake, asked.message_id)
    assert "花生" not in answer and FORGOTTEN in answer  # delivered, honestly marked
    assert parked(rt) == []
