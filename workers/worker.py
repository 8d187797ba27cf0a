"""`lucid worker`: an RQ SimpleWorker on the chat, memory and dream queues in that order, with the inbox and
outbox sweeper in a thread.
"""

from __future__ import annotations

import gc
import threading

from rq import SimpleWorker

from memory_core.errors import InvalidInput

from . import dreaming, extraction, scheduler  # noqa: F401  (the job modules, loaded before the first job)
from .mailbox import Sweeper
from .outbox import Outbox
from .queues import SERIALIZER
from .runtime import QUEUES, Runtime, install


def run_worker(runtime: Runtime, burst: bool = False) -> bool:
    """Work the queues until stopped (or, with `burst`, until they are empty); True if it ran any job."""
    if runtime.redis is None:
        raise InvalidInput("`lucid worker` needs Redis: set REDIS_URL or use `lucid serve`")
    install(runtime)
    # SimpleWorker runs each job in this process instead of a fork: the memory service's parsed books,
    # relevance and raw-archive indexes and the Feishu token stay warm between turns (a fork would
    # reload a 200k-message index from disk for every message). Scale out with more worker processes.
    gc.freeze()  # lark-oapi and friends leave ~400k long-lived objects; keep full collections short
    worker = SimpleWorker(
        [runtime.queue(name) for name in QUEUES], connection=runtime.redis, serializer=SERIALIZER
    )
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
