"""A person's inbox that nobody drains any more — its worker was SIGKILLed mid-turn, or its job never reached
the queue — is answered without the person writing again: once, in order (`workers.mailbox.Sweeper`, run by
every `lucid worker`).

Real Redis, real RQ workers (`lucid worker` processes where one is killed), Feishu and Ollama as the local
fakes driven by the real lark-oapi and ollama clients. Nothing of ours is patched; where a test skips a wait
(a dead holder's 15 s lease) it says so.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq import Worker as RQWorker
from rq.job import JobStatus

from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import TENANT_KEY, User, p2p_chat_id, user
from tests.fakes.ollama import FakeOllama
from tests.reliability.harness import BOT, Stack, chat_responder, text_of, wait_for
from workers.inbound import Inbound
from workers.mailbox import INBOXES, Intake, Mailbox, Sweeper, turn_job_id
from workers.metrics import Metrics
from workers.queues import fetch
from workers.runtime import Runtime, build
from workers.settings import Persona, Settings
from workers.worker import Worker

MODEL = "qwen3:4b"
_clock = itertools.count(1)


@pytest.fixture
def feishu() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id=BOT) as fake:
        yield fake


def message(who: User, text: str, feishu: FakeFeishu, persona: str = "x") -> Inbound:
    """A direct message to the bot, as the webhook routes it (and Feishu knows its chat)."""
    chat = p2p_chat_id(who)
    item = Inbound(
        tenant=TENANT_KEY, user=who.union_id, open_id=who.open_id, persona=persona, chat_id=chat,
        chat_type="p2p", message_id=f"om_{uuid.uuid4().hex}", text=text,
        create_time=int(time.time() * 1000) + next(_clock),
    )  # fmt: skip
    feishu.note_message(item.message_id, chat)
    return item


def replies(feishu: FakeFeishu, items: list[Inbound]) -> dict[str, list[str]]:
    """What each message got back, in the order Feishu received the replies."""
    out: dict[str, list[str]] = {m.message_id: [] for m in items}
    for sent in list(feishu.sent):
        if sent.parent_id in out:
            out[sent.parent_id].append(text_of(sent))
    return out


def reply_order(feishu: FakeFeishu) -> list[str]:
    return [str(m.parent_id) for m in list(feishu.sent) if m.parent_id]


def busy_workers(client: redis.Redis) -> int:
    return sum(1 for w in RQWorker.all(connection=client) if w.get_current_job_id())


def in_process(tmp_path: Path, redis_url: str, feishu: FakeFeishu) -> Runtime:
    persona = Persona("x", app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="secret", bot_open_id=BOT)
    settings = Settings(data_dir=tmp_path / "data", feishu_domain=feishu.url, personas={"x": persona})
    return build(settings, redis_url, git=False)


def work(runtime: Runtime) -> None:
    Worker(runtime, ("chat",)).work(burst=True)


# ------------------------------------------------------------------------------------------ killed worker


def test_a_turn_whose_workers_were_killed_is_answered_once_in_order_without_a_next_message(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, feishu: FakeFeishu
) -> None:
    """Worker A dies while the model thinks about message 1; message 2 waits in the person's inbox behind it
    (a person has one turn job at a time, A's: no second worker sits waiting for the lease). RQ still lists
    A's job as started: nobody will run it again, the person writes nothing more and no other traffic comes.
    An idle worker answers both."""
    who = user("recovery-killed")
    with (
        FakeOllama(responder=chat_responder(slow_once=["慢跑"], delay=60)) as ollama,
        Stack(
            tmp_path, redis_url, feishu, bots=0, workers=3, ollama_url=ollama.url, chat_model=MODEL
        ) as stack,
    ):
        intake = Intake(redis_client)  # the webhook's side: inbox + turn job
        one = message(who, "记住我喜欢慢跑的时候听播客", feishu)
        two = message(who, "我喜欢什么", feishu)
        assert intake.accept(one)
        assert wait_for(lambda: len(ollama.chat_requests) >= 1, 30)  # a worker is mid-turn on message 1
        assert intake.accept(two)
        assert redis_client.zcard(f"lucid:inbox:{one.ns.key}") == 2
        assert not redis_client.exists(f"rq:job:{turn_job_id(two)}")  # the person's turn job will get to it
        time.sleep(0.5)  # room for a second worker to take up this person, were it going to
        busy = {int(w.pid) for w in RQWorker.all(connection=redis_client) if w.get_current_job_id()}
        assert busy_workers(redis_client) == 1
        for proc in stack.live_workers:
            if proc.popen.pid in busy:
                stack.kill(proc)
        assert len(stack.live_workers) == 2
        status = fetch(turn_job_id(one), redis_client).get_status()
        assert status == JobStatus.STARTED  # abandoned: RQ retries nothing of it for many minutes
        assert replies(feishu, [one, two]) == {one.message_id: [], two.message_id: []}

        # The dead holder's turn lease would expire within 15 s; let it expire now instead of waiting.
        assert redis_client.pexpire(f"lucid:turnlock:{one.ns.key}", 1)
        assert wait_for(lambda: all(replies(feishu, [one, two]).values()), 30), stack.logs_text()[-3000:]
        time.sleep(1.0)  # room for a second answer, were one coming

    got = replies(feishu, [one, two])
    assert [len(got[m.message_id]) for m in (one, two)] == [1, 1], got
    assert [i for i in reply_order(feishu) if i in got] == [one.message_id, two.message_id]
    assert "慢跑" in got[one.message_id][0] and "我喜欢什么" in got[two.message_id][0]
    assert redis_client.zcard(f"lucid:inbox:{one.ns.key}") == 0


# ------------------------------------------------------------------------------------------ the sweep


def test_a_message_whose_job_never_reached_the_queue_is_answered_once_in_order(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, feishu: FakeFeishu
) -> None:
    """The webhook put two messages in the person's inbox, then died before its second round trip to Redis
    (the one that enqueues the jobs); Feishu's redeliveries are duplicates by then. The sweep hands the
    inbox to one job, and only one however often it sweeps."""
    rt = in_process(tmp_path, redis_url, feishu)
    who = user("recovery-lost")
    one, two = message(who, "第一条", feishu), message(who, "第二条", feishu)
    assert Intake(redis_client, grace_ms=0).accept_many([one, two]) == [True, True]
    chat = Queue("chat", connection=redis_client)
    chat.empty()  # the enqueue that never happened
    sweeper = Sweeper(redis_client, recheck_ms=0)

    assert sweeper.sweep() == [one.ns.key]
    assert sweeper.sweep() == []  # its job is queued: nothing more
    assert (
        sweeper.sweep_if_due() == [] and sweeper.sweep_if_due() == []
    )  # (the second: another worker's turn)
    assert chat.count == 1
    work(rt)

    got = replies(feishu, [one, two])
    assert [len(got[m.message_id]) for m in (one, two)] == [1, 1], got
    assert reply_order(feishu) == [one.message_id, two.message_id]
    assert sweeper.sweep() == [] and redis_client.zscore(INBOXES, one.ns.key) is None  # unmarked
    assert chat.count == 0
    recovered = [
        float(line.rsplit(" ", 1)[1])
        for line in Metrics(redis_client).render().splitlines()
        if line.startswith("lucid_turns_recovered_total ")
    ]
    assert recovered == [1.0]  # what an operator sees on /metrics


def test_the_sweep_never_doubles_a_turn_that_is_queued_or_running(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, feishu: FakeFeishu
) -> None:
    """A message waiting in a backlog, and one whose turn runs right now, are nobody's to redo."""
    rt = in_process(tmp_path, redis_url, feishu)
    intake = Intake(redis_client, grace_ms=0)
    sweeper = Sweeper(redis_client, recheck_ms=0)
    chat = Queue("chat", connection=redis_client)

    queued = message(user("recovery-backlog"), "在排队", feishu)
    assert intake.accept(queued)
    assert sweeper.sweep() == [] and chat.count == 1  # its own job will come

    running = message(user("recovery-running"), "正在回答", feishu)
    assert intake.accept(running)
    job = fetch(turn_job_id(running), redis_client)
    chat.remove(job)  # a worker took its job (RQ's bookkeeping as a worker does it) ...
    job.set_status(JobStatus.STARTED)
    inside, release = threading.Event(), threading.Event()
    answered: list[str] = []

    def turn(item: Inbound) -> None:  # ... and is in the middle of its turn (holding the turn lease)
        inside.set()
        assert release.wait(30)
        answered.append(item.message_id)

    holder = threading.Thread(target=Mailbox(redis_client).deliver, args=(running, turn))
    holder.start()
    try:
        assert inside.wait(10)
        assert sweeper.sweep() == [] and sweeper.sweep() == []
        assert chat.count == 1  # still only the backlog's job
    finally:
        release.set()
        holder.join(10)
    assert answered == [running.message_id]

    work(rt)
    got = replies(feishu, [queued, running])
    assert [len(got[m.message_id]) for m in (queued, running)] == [1, 0], got  # `running` was answered above
    assert sweeper.sweep() == [] and chat.count == 0
    assert redis_client.zcard(INBOXES) == 0  # both inboxes empty: unmarked
