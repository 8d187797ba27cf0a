"""`lucid worker`: an RQ SimpleWorker on the chat, memory and dream queues in that order, with the inbox and
outbox sweeper in a thread."""

from __future__ import annotations

import gc
import threading
from typing import Any

from rq import Queue, SimpleWorker
from rq.job import Job

from memory_core.errors import InvalidInput

from . import dreaming, extraction, mailbox, memory_card, outbox, scheduler  # noqa: F401  (the job modules)
from .mailbox import Sweeper
from .outbox import Outbox
from .queues import SERIALIZER
from .runtime import QUEUES, Runtime

LISTEN_SECONDS = 1.0  # the longest RQ's command listener sleeps (RQ's own: 60): see `Worker.subscribe`


class Worker(SimpleWorker):
    """RQ's in-process worker, running each job with `runtime` as `runtime.current()`: how a job gets its
    wiring (`lucid worker`, and every test that runs jobs)."""

    def __init__(self, runtime: Runtime, queues: tuple[str, ...] = QUEUES, **kwargs: Any) -> None:
        if runtime.redis is None:
            raise InvalidInput("`lucid worker` needs Redis: set REDIS_URL or use `lucid serve`")
        names = [runtime.queue(name) for name in queues]
        super().__init__(names, connection=runtime.redis, serializer=SERIALIZER, **kwargs)
        self.runtime = runtime

    def execute_job(self, job: Job, queue: Queue) -> None:
        with self.runtime.active():
            super().execute_job(job, queue)

    def subscribe(self) -> None:
        """RQ's listener for its worker commands (`rq`'s shutdown, stop-job), waking every LISTEN_SECONDS, not
        RQ's 60. A worker's end sends UNSUBSCRIBE, then stops the listener and waits for it (redis-py 8's
        `stop()` joins with no timeout). A listener that reads the UNSUBSCRIBE reply before that stop then
        waits out its whole interval for a subscription that never comes: `lucid worker` took 60 s to exit on
        SIGTERM about one time in seven, and a burst worker 60 s to return (docs/TESTING.md, "Flaky")."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # rq types it None
            sleep_time=LISTEN_SECONDS, daemon=True, exception_handler=self._pubsub_exception_handler
        )


def run_worker(runtime: Runtime, burst: bool = False) -> bool:
    """Work the queues until stopped (or, with `burst`, until they are empty); True if it ran any job."""
    worker = Worker(runtime)
    # SimpleWorker runs jobs in this process, not a fork: the parsed books, indexes and Feishu token stay
    # warm between turns (a fork would reload a 200k-message index per message). Scale out with processes.
    gc.freeze()  # lark-oapi and friends leave ~400k long-lived objects; keep full collections short
    assert runtime.redis is not None
    stop = threading.Event()
    sweeper = threading.Thread(
        target=Sweeper(runtime.redis, also=[Outbox(runtime.redis).rescue]).run,
        args=(stop,),
        name="lucid-inbox-sweeper",
        daemon=True,
    )
    sweeper.start()
    try:
        return bool(worker.work(burst=burst, with_scheduler=True))
    finally:
        stop.set()
        sweeper.join(timeout=5.0)
