"""Redis is data, not code (issue 15, finding 4): a job whose `data` or `meta` someone replaced with a pickle
payload is refused by a live `lucid worker`, nothing of it runs, the log says why, and the worker goes on
answering people. (The embedded Redis's socket and password: tests/workers/test_embedded_redis.py; compose's
password: tests/test_deploy.py.)"""

from __future__ import annotations

import os
import pickle
import time
import zlib
from pathlib import Path

from rq.job import JobStatus

from tests.fakes.feishu_events import message_event, user
from tests.reliability.conftest import Figures, Shared
from tests.reliability.harness import (
    await_for,
    converse,
    log_mark,
    logs_since,
    reply_text,
    wait_for,
)
from workers.mailbox import handle_message
from workers.queues import fetch, queue


class Payload:
    """What an attacker with write access to Redis plants: unpickling it runs a shell command."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.target}",))


async def test_a_pickle_payload_planted_in_a_job_is_refused_and_runs_nothing(
    shared: Shared, figures: Figures, tmp_path: Path
) -> None:
    stack, feishu = shared.stack, shared.feishu
    client = stack.client
    mark = log_mark(stack)
    targets = {field: tmp_path / f"pwned-{field}" for field in ("data", "meta")}
    chat = queue("chat", client)
    planted = []
    for field, target in targets.items():
        # A real-looking turn job, its stored `data` (zlib'd, as RQ keeps it) or `meta` replaced, and only
        # then put on the queue (enqueued first, the live worker could take it before the payload lands).
        job = chat.create_job(handle_message, args=({"persona": "x"},), job_id=f"planted-{field}")
        job.save()
        evil = pickle.dumps(Payload(target))
        client.hset(job.key, field, zlib.compress(evil) if field == "data" else evil)
        chat.push_job_id(job.id, at_front=True)
        planted.append(job.id)
    assert await await_for(
        lambda: all(fetch(j, client).get_status(refresh=True) == JobStatus.FAILED for j in planted), 60
    ), logs_since(stack, mark)[-3000:]

    assert [t for t in targets.values() if t.exists()] == []  # no code ran
    refusal = "refused a job payload that is not JSON"
    assert await await_for(lambda: logs_since(stack, mark).count(refusal) >= 2, 30), logs_since(stack, mark)[
        -3000:
    ]
    assert stack.live_workers  # the worker survived it ...

    who = user("redis-data-after")  # ... and still answers people
    event = message_event("你好", sender=who, create_time_ms=int(time.time() * 1000))
    feishu.note_message(event["event"]["message"]["message_id"], event["event"]["message"]["chat_id"])
    await converse(stack, [event])
    message_id = event["event"]["message"]["message_id"]
    assert wait_for(lambda: reply_text(feishu, message_id) != "", 60)
    figures.update(planted=len(planted), executed=0, failed=len(planted))
