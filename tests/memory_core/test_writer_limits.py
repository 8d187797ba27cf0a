"""The writer's limits, with a small tenure against a real redis-server and real files: a leader that keeps
finding others' ops lets the lease go after its tenure (so a dream's transaction is not starved by a busy
chat), commits at least every `commit_every` while it leads, and every op is applied once, in order.
"""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import redis

from memory_core.book import Book
from memory_core.lineformat import parse_file
from memory_core.namespace import Namespace
from memory_core.ops import Remember
from memory_core.store import DREAMS, MEMORY, Snapshot, Store
from memory_core.writer import Writer
from workers.redis_backend import RedisLocker, RedisOpQueue
from workers.redis_keys import Keys

NS = Namespace.of("t1", "u1", "default")
TENURE = 0.2  # seconds: small, so a test sees several tenures
# A pusher stops at this many ops if nothing else stops it first: far more than a tenure's worth (it pushes
# one op every 2 ms), so reaching it means the leader never let go while ops kept arriving.
CAP = 1500


def _texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(12)) for _ in range(n)]


def _writer(data_dir: Path, url: str, tenure: float = TENURE, commit_every: float = 1e9) -> Writer:
    """A writer as another process has it: its own Store and its own Redis connection."""
    client = redis.Redis.from_url(url)
    return Writer(
        Store(data_dir), RedisLocker(client), RedisOpQueue(client), tenure=tenure, commit_every=commit_every
    )


class _Pusher:
    """A busy chat: queues one op every 2 ms without waiting for it (as a reply's record is queued), until
    stopped or CAP ops are queued. `count` is how many it has queued so far."""

    def __init__(self, url: str, seed: int) -> None:
        self.texts = _texts(seed, CAP)
        self.count = 0
        self.stop = threading.Event()
        self._queue = RedisOpQueue(redis.Redis.from_url(url))
        self._thread = threading.Thread(target=self._run, name="pusher", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set() and self.count < CAP:
            self._queue.push(NS, [Remember(text=self.texts[self.count])])
            self.count += 1
            time.sleep(0.002)

    def __enter__(self) -> _Pusher:
        self._thread.start()
        while self.count < 20:  # the leader starts with others' ops already queued
            time.sleep(0.005)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(timeout=30)

    @property
    def pushed(self) -> list[str]:
        return self.texts[: self.count]


def _drain(writer: Writer) -> None:
    """Apply whatever is still queued (as the next submitter would)."""
    assert writer.queue is not None
    while writer.queue.pending(NS, 1):
        writer.flush(NS)
    writer.settle()


def _memories(data_dir: Path) -> list[str]:
    return [e.text for e in parse_file((NS.path(data_dir) / MEMORY).read_text("utf-8")).entries()]


def _added(message: str) -> int:
    m = re.search(r"(\d+) added", message)
    return int(m.group(1)) if m else 0


def _in_order(texts: list[str], subsequence: list[str]) -> bool:
    at = {t: i for i, t in enumerate(texts)}
    return [at[t] for t in subsequence] == sorted(at[t] for t in subsequence)


def _lead_once(data_dir: Path, redis_url: str, redis_client: redis.Redis, commit_every: float) -> None:
    """One leader, a busy chat: the leader's thread must end (lease free, others' ops still queued) while
    the chat is still pushing — it let go after its tenure instead of leading for as long as ops arrive.
    Then its commits: those of one tenure, accounting for every op it applied."""
    a = _writer(data_dir, redis_url, commit_every=commit_every)
    with _Pusher(redis_url, 1) as chat:
        assert a.submit(NS, [Remember(text="我是第一个写的人")])[0].status == "added"
        a.settle()  # joins the leader's thread: it returns once the leader let go
        let_go_at = chat.count
        lease_free = redis_client.exists(Keys.lease(NS.key)) == 0
        still_queued = redis_client.llen(Keys.ops(NS.key))
        leases = int(redis_client.get(Keys.fence(NS.key)) or 0)  # every take draws a token: a's leases
    assert let_go_at < CAP, "the leader kept the lease for as long as ops arrived"
    assert lease_free and still_queued > 0  # it let go with others' ops waiting and did not take it back
    tenure = [r["message"] for r in a.store.history(NS, limit=CAP)]
    applied = len(_memories(data_dir))
    assert sum(_added(m) for m in tenure) == applied and all(_added(m) >= 1 for m in tenure)
    assert applied <= let_go_at + 1 and applied + still_queued <= CAP + 1
    # Usually one lease (one tenure); a chat that paused past LINGER let it go early and it was taken again.
    assert leases >= 1
    if commit_every >= 1e9:  # never due: a tenure is one commit, made when the lease was let go
        assert len(tenure) == leases
    else:  # always due: a commit per batch, so more commits than tenures (each op in exactly one)
        assert leases < len(tenure) <= applied
    _drain(a)
    texts = _memories(data_dir)
    assert sorted(texts) == sorted(["我是第一个写的人", *chat.pushed])  # each op once, none lost
    assert _in_order(texts, chat.pushed)


def test_a_leader_lets_go_after_its_tenure_and_makes_it_one_commit(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    _lead_once(data_dir, redis_url, redis_client, commit_every=1e9)


def test_a_leader_commits_each_batch_when_commit_every_is_always_due(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    _lead_once(data_dir, redis_url, redis_client, commit_every=0.0)


def test_a_dream_gets_the_lease_while_a_busy_chat_keeps_writing(
    data_dir: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    """A dream's transaction waits for the lease while a chat keeps two writers busy (one queues ops without
    waiting, one submits and waits for each): it gets its turn while the chat's ops still arrive — its
    commit has the chat's commits on both sides — and every op is applied once, in each submitter's order."""
    a = _writer(data_dir, redis_url)
    dreamer = _writer(data_dir, redis_url)
    seen: dict[str, int] = {}
    chatty = _texts(2, 60)
    outcomes: list[str] = []

    def dream(book: Book, snap: Snapshot) -> dict[str, str]:
        seen["pushed"] = chat.count  # under the dream's lease: how far the chat had got
        return {DREAMS: "# Dreams\n\n- 梦见了一只橘猫\n"}

    def submitter() -> None:
        c = _writer(data_dir, redis_url)
        for t in chatty:
            outcomes.append(c.submit(NS, [Remember(text=t)])[0].status)
        c.settle()

    with _Pusher(redis_url, 1) as chat:
        assert a.submit(NS, [Remember(text="我是第一个写的人")])[0].status == "added"  # a leads on
        other = threading.Thread(target=submitter, name="submitter")
        other.start()
        report = dreamer.transact(NS, dream, "dream: 一次测试的梦")
        dreamt_at = chat.count
        other.join(timeout=120)
    assert report is not None and report.revision is not None
    assert seen["pushed"] < CAP and dreamt_at < CAP, "the dream waited until the chat stopped"
    a.settle()
    _drain(a)
    assert outcomes == ["added"] * len(chatty)
    texts = _memories(data_dir)
    assert sorted(texts) == sorted(["我是第一个写的人", *chat.pushed, *chatty])  # each op once
    assert _in_order(texts, chat.pushed) and _in_order(texts, chatty)
    subjects = [r["message"] for r in a.store.history(NS, limit=CAP)]
    at = subjects.index("dream: 一次测试的梦")
    assert any(_added(s) for s in subjects[:at]) and any(_added(s) for s in subjects[at + 1 :])
    assert sum(_added(s) for s in subjects) == len(texts)  # each op in exactly one commit
