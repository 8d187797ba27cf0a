"""`lucid worker`: an RQ worker on the chat, memory and dream queues, in that priority order.

Chat turns come first, background extraction second, dreaming last: a long deep dream never delays a
reply for longer than the job it is already running. The worker runs rq's scheduler too, so retries with
an interval (dream jobs retry after 30 s and 120 s) and jobs whose worker died are picked up again.
Jobs run in this process (SimpleWorker), so caches stay warm between jobs; job modules are imported here.

Each worker also runs the inbox sweeper in a thread (`mailbox.Sweeper`; one worker sweeps per interval):
a message whose worker was killed mid-turn is answered about 15 s (the turn lease) + a few seconds later,
even if the person never writes again. The same thread rescues parked replies whose retry job is overdue
(`outbox.Outbox.rescue`: the job's worker died, or the worker holding RQ's scheduler lock did). No extra
process: every deployment that runs a worker has it.
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
