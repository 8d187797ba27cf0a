"""One wiring per entry point: jobs get it from the worker or fail loudly, settings are parsed once at start,
and `close()` ends what the runtime started. Real Redis, real RQ workers, real `lucid` processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from rq import SimpleWorker
from rq.registry import FailedJobRegistry

from memory_core.errors import LucidError
from memory_core.lineformat import RawMessage
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from tests.fakes.feishu import FakeFeishu
from tests.fakes.ollama import FakeOllama
from workers.extraction import extract
from workers.inbound import Inbound
from workers.mailbox import Intake, turn_job_id
from workers.memory_service import statement
from workers.queues import SERIALIZER, fetch
from workers.runtime import Runtime, build, current
from workers.scheduler import make_cron
from workers.settings import Persona, Settings
from workers.worker import Worker

ROOT = Path(__file__).resolve().parents[2]
NS = Namespace.of("t1", "alice", "default")


def _runtime(data_dir: Path, redis_url: str, env: dict[str, str] | None = None) -> Runtime:
    settings = replace(Settings.from_env(env or {}), data_dir=data_dir, config_path=data_dir / "none.toml")
    return build(settings, redis_url, git=False)


@pytest.fixture
def feishu() -> Iterator[FakeFeishu]:
    with FakeFeishu(bot_open_id="ou_bot_wiring") as fake:
        yield fake


def _bot(data_dir: Path, redis_url: str, feishu: FakeFeishu) -> Runtime:
    """A memory-only bot (no model) whose replies go to the fake Feishu through the real SDK."""
    persona = Persona("p", app_id=f"cli_{uuid.uuid4().hex[:12]}", app_secret="s")
    settings = Settings(data_dir=data_dir, feishu_domain=feishu.url, personas={"p": persona})
    return build(settings, redis_url, git=False)


_sent = iter(range(10**9))


def _message(feishu: FakeFeishu, text: str, user: str = "alice") -> Inbound:
    inbound = Inbound(
        tenant="t1", user=user, open_id=f"ou_{user}", persona="p", chat_id=f"oc_p2p_{user}",
        chat_type="p2p", message_id=f"om_{uuid.uuid4().hex}", text=text,
        create_time=int(time.time() * 1000) + next(_sent),
    )  # fmt: skip
    feishu.note_message(inbound.message_id, inbound.chat_id)
    return inbound


def _replies(feishu: FakeFeishu, inbound: Inbound) -> list[str]:
    return [m.text or "" for m in feishu.sent if m.parent_id == inbound.message_id]


def test_a_job_run_without_the_wiring_fails_loudly_and_loses_nothing(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    with pytest.raises(LucidError, match="no Lucid runtime is active"):
        current()
    with _runtime(data_dir, redis_url) as rt:
        msg = RawMessage(id="om_1", ts=datetime(2026, 6, 1, tzinfo=UTC), speaker="alice", text="我住在西湖区")
        assert rt.memory.record(NS, msg, wait=False) is None  # queued in Redis, a flush job to apply it
        # A stock RQ worker has no Lucid wiring: the job fails with the reason, it builds nothing itself.
        SimpleWorker([rt.queue("memory")], connection=redis_client, serializer=SERIALIZER).work(burst=True)
        failed = FailedJobRegistry(queue=rt.queue("memory")).get_job_ids()
        assert len(failed) == 1
        result = fetch(failed[0], redis_client).latest_result()
        assert result is not None and "no Lucid runtime is active" in (result.exc_string or "")
        assert not rt.store.raw_days(NS)  # nothing written by a half-wired job
        FailedJobRegistry(queue=rt.queue("memory")).requeue(failed[0])  # the op is still queued in Redis
        Worker(rt, ("memory",)).work(burst=True)  # `lucid worker`'s Worker gives the job its wiring
        assert [m.text for m in rt.store.iter_raw(NS)] == ["我住在西湖区"]


@pytest.mark.parametrize("role", ["worker", "cron", "serve"])
def test_a_bad_dream_switch_stops_the_process_at_start(tmp_path: Path, role: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LUCID_") and k != "REDIS_URL"},
        "LUCID_DATA": str(tmp_path / "data"),
        "LUCID_DREAM_DEEP": "fortnight",
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-m", "bot.cli", role],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "LUCID_DREAM_DEEP" in out.stderr and "fortnight" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_the_tick_uses_the_switches_parsed_at_start_not_the_environment_now(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        _runtime(data_dir, redis_url, {"LUCID_DREAM_LIGHT": "off"}) as off,
        _runtime(data_dir, redis_url) as on,
    ):
        off.writer.submit(NS, [Remember(text="我住在西湖区", source="user")])
        # What the environment says later (a bad value, too) no longer matters to a running process.
        monkeypatch.setenv("LUCID_DREAM_LIGHT", "fortnight")
        queued = []
        for rt in (off, on):
            make_cron(rt).enqueue_jobs()
            Worker(rt, ("memory",)).work(burst=True)
            assert FailedJobRegistry(queue=rt.queue("memory")).get_job_ids() == []
            queued.append(rt.queue("dream").job_ids)
        # `off`'s tick queued nothing (light switched off, no dream model); `on`'s queued light.
        assert queued == [[], [f"dream-light-{NS.key}"]]


def test_close_stops_the_threads_the_runtime_started(data_dir: Path, redis_url: str) -> None:
    before = set(threading.enumerate())  # other tests' runtimes may still have theirs
    rt = _runtime(data_dir, redis_url)
    msg = RawMessage(id="om_1", ts=datetime(2026, 6, 1, tzinfo=UTC), speaker="alice", text="我喜欢喝乌龙茶")
    mem = rt.memory  # held past close(): its threads must stop all the same
    mem.record(NS, msg)
    assert mem.active_recall(NS, "我喜欢喝什么茶", session="s2", chat="oc_alice")
    assert _threads("active-recall", before)
    rt.close()
    deadline = time.monotonic() + 30
    while _threads("active-recall", before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _threads("active-recall", before)


def test_a_worker_stops_at_once_even_when_its_command_listener_saw_the_unsubscribe_first(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """A worker's end (SIGTERM to `lucid worker`, or a burst worker's empty queues) unsubscribes RQ's command
    listener, then stops it and waits for it. When the listener reads the unsubscribe reply first (a busy
    machine, about one stop in seven), it sat out RQ's whole 60 s interval before the worker could exit.
    Here that order is forced: the listener has seen the reply before the worker's teardown starts."""
    with _runtime(data_dir, redis_url) as rt:
        worker = Worker(rt)
        worker.subscribe()  # how `work()` starts
        assert worker.pubsub is not None
        worker.pubsub.unsubscribe()  # how the teardown starts
        deadline = time.monotonic() + 30
        while worker.pubsub.subscribed and time.monotonic() < deadline:  # the listener reads the reply
            time.sleep(0.01)
        assert not worker.pubsub.subscribed
        stopping = threading.Thread(target=worker.teardown, name="worker-teardown")
        stopping.start()
        stopping.join(timeout=30)  # well within the minute it took
        assert not stopping.is_alive()


def _threads(prefix: str, before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in set(threading.enumerate()) - before if t.name.startswith(prefix) and t.is_alive()]


def test_each_runtime_paces_by_its_own_turn_time_kept_across_its_turn_jobs(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, feishu: FakeFeishu
) -> None:
    """How early a paced turn starts is learnt from the turns of the runtime running them (one estimate per
    runtime, carried from job to job), never from another runtime's turns in the same process."""
    with _bot(data_dir, redis_url, feishu) as worker, _bot(data_dir, redis_url, feishu) as other:
        worker.turn_time.seconds = 100.0  # far from any real turn: each observed turn pulls it down by 30 %
        intake = Intake(redis_client)
        first, second = _message(feishu, "你好"), _message(feishu, "你好", user="bob")
        assert intake.accept(first) and intake.accept(second)
        Worker(worker, ("chat",)).work(burst=True)
        assert _replies(feishu, first) and _replies(feishu, second)  # both answered by `worker`'s jobs
        # 100 → 70 + 0.3 t₁ → 49 + 0.21 t₁ + 0.3 t₂: both turns went into the one estimate
        assert 49.0 <= worker.turn_time.seconds < 70.0
        assert other.turn_time.seconds == 0.05  # untouched by turns it did not run


def test_a_turn_job_queued_by_its_old_name_before_the_upgrade_is_still_answered(
    data_dir: Path, redis_url: str, redis_client: redis.Redis, feishu: FakeFeishu
) -> None:
    """A turn job queued as `workers.turn.handle_message` (the name before the turn job moved to the mailbox)
    by the old version is run by the upgraded worker: the person is answered, nothing fails."""
    with _bot(data_dir, redis_url, feishu) as rt:
        inbound = _message(feishu, "你好")
        assert Intake(redis_client).accept(inbound)
        chat, job_id = rt.queue("chat"), turn_job_id(inbound)
        fetch(job_id, redis_client).delete(remove_from_queue=True)
        chat.enqueue_call(  # as the version before the upgrade queued it
            "workers.turn.handle_message", args=(inbound.to_json(),), job_id=job_id, timeout=600
        )
        Worker(rt, ("chat",)).work(burst=True)
        assert FailedJobRegistry(queue=chat).get_job_ids() == []
        job = fetch(job_id, redis_client)
        assert job.func_name == "workers.turn.handle_message" and job.get_status() == "finished"
        assert len(_replies(feishu, inbound)) == 1


def test_a_runtime_built_on_a_clock_writes_and_reads_memory_at_that_clock_s_time(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """The clock is injected once, at build: the writer behind the memory service stamps its writes with it
    and the service judges what is current by it (how `lucid demo` tells a story over six weeks)."""
    june = [datetime(2026, 6, 1, 9, tzinfo=UTC), datetime(2026, 6, 10, 9, tzinfo=UTC)]
    moved = datetime(2026, 6, 20, 9, tzinfo=UTC)
    story = [june[0]]
    settings = replace(Settings.from_env({}), data_dir=data_dir, config_path=data_dir / "none.toml")
    with build(settings, redis_url, git=False, clock=lambda: story[0]) as rt:
        rt.memory.apply(NS, [statement("我住在余杭区")])
        story[0] = moved
        [outcome] = rt.memory.apply(NS, [statement("我住在西湖区")])
        assert outcome.kind == "superseded"
        book = rt.memory.book(NS)
        old, new = (next(e for e in book.entries() if e.text == t) for t in ("我住在余杭区", "我住在西湖区"))
        assert (old.at, old.valid_to, new.at) == (june[0], moved, moved)
        story[0] = june[1]  # between the two: 余杭区 was still where they lived
        assert [e.text for e in rt.memory.find(NS, "我住在")] == ["我住在余杭区"]


def test_facts_extracted_after_a_turn_are_written_through_the_memory_service(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """The extraction job writes like every other edge (MemoryService.apply): its new facts get their vectors
    in the background at once, not at the next recall's expense."""
    with FakeOllama() as ollama:
        settings = Settings(
            data_dir=data_dir, chat_model="qwen3:4b", embed_model="nomic-embed-text", ollama_host=ollama.url
        )
        with build(settings, redis_url, git=False) as rt:
            ollama.script("[所在地] 我住在西湖区")
            done = extract(rt, str(NS), "我住在西湖区", "好的")
            assert [o["status"] for o in done["outcomes"]] == ["added"]
            rt.memory.wait_for_embeddings()
            embedded = [t for r in ollama.embed_requests for t in r["input"]]
            assert "我住在西湖区" in embedded
