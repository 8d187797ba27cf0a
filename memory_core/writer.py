"""The single writer of a namespace: every change to its files goes through here, as a fenced batch and one
git commit (docs/ARCHITECTURE.md, "The writer")."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from .book import Book, collector_paused
from .entry import utcnow
from .errors import ConcurrentChange, ConcurrentEdit, LeaseLost, LucidError
from .forgetting import Forgotten, drawn_on_gone, redact_profile, redact_raw
from .lineformat import (
    MAX_LINE_CHARS,
    META_OPEN,
    RawMessage,
    distinct_ids,
    format_time,
    parse_file,
    parse_time,
    render_file,
    set_aside_note,
)
from .namespace import Namespace
from .ops import (
    Edit,
    Forget,
    Kind,
    Op,
    Outcome,
    Record,
    Remember,
    Share,
    Touch,
    message_from_json,
    op_from_json,
    op_to_json,
)
from .policy import automatic
from .rawindex import RAW_CACHE
from .secretscan import contains_secret, redact, redact_long
from .sharing import share
from .store import (
    ARCHIVE,
    BOOT,
    DREAMS,
    MEMORY,
    PROFILE,
    TRACKED,
    Snapshot,
    Store,
    as_bytes,
    boot_id,
    kill_point,
    version_of,
)
from .vault import seal

log = logging.getLogger(__name__)

MAX_BATCH = 500
#: state.json key: how many times raw lines were rewritten in place (a forget); readers' indexes rebuild.
RAW_REWRITES = "raw_rewrites"
#: The messages whose entries were forgotten (their raw lines are marked), newest last: what an extraction job
#: or a dream planned from such a message before the forget may not bring back. Ids only, at most this many.
FORGOTTEN_FROM, FORGOTTEN_FROM_KEPT = "forgotten_from", 1000
#: The saved entry vectors (`Store.save_cache`), dropped at every forget, and state.json's count of forgets:
#: a reader that saved vectors while one happened drops them again (they may hold the forgotten text's).
VECTOR_CACHE, FORGETS = "vectors", "forgets"
FOLD_WINDOW = 600.0  # seconds: messages and hit counts fold into one commit (a turn) within this window
COMMIT_EVERY = 1.0  # seconds: a leader commits the batches it applied at least this often
TENURE = 10.0  # seconds a leader keeps the lease at most while others' ops keep arriving (then it lets go)
MEND_WAIT = 0.2  # seconds a reader's mend waits for the lease before it looks again whether a holder mended
LINGER = 0.01  # seconds a leader waits for more ops once the queue is empty (they are usually on their way)
_RETRIES = 8
#: Texts a cold leader read that the saved dedup keys lacked before it saves them again (or 1/16 of them).
INDEX_SAVE_EVERY = 256
_INDEX_CACHE, _INDEX_FILE = "dedup", "keys.json"
_TAIL = 1 << 16  # bytes of MEMORY.md an append is checked against (its last line must be in them)


class Lease(Protocol):
    token: int
    pending: list[str] | None  # the namespace's queued ops, read with the lease (None: not read)

    def held(self) -> bool: ...

    def release(self) -> None: ...


class Locker(Protocol):
    def acquire(self, ns: Namespace, wait: float, floor: int, push: Sequence[str] = ()) -> Lease | None:
        """Take the namespace's lease within `wait` seconds, with a fencing token above `floor`; if it is
        not taken, the queued ops `push` are pushed on the op queue (with the last attempt)."""
        ...


class OpQueue(Protocol):
    """Pending ops of every namespace, shared by every process, and the outcomes published back."""

    def push(self, ns: Namespace, ops: Sequence[Op]) -> None: ...

    def pending(self, ns: Namespace, limit: int) -> list[str]: ...

    def finish(
        self,
        ns: Namespace,
        raw_ops: Sequence[str],
        outcomes: Sequence[Outcome],
        own: Sequence[Outcome] = (),
        limit: int = 0,
        let_go: Lease | None = None,
    ) -> list[str] | None:
        """Publish and count the outcome of each of `raw_ops` still queued, dropping it (so twice does nothing
        twice), count `own`; returns the oldest `limit` queued (`let_go`: none left releases the lease)."""

    def results(self, op_ids: Sequence[str], wait: float) -> dict[str, Outcome]: ...


@dataclass
class _LocalLease:
    token: int
    fd: int
    released: bool = False
    pending: list[str] | None = None

    def held(self) -> bool:
        return not self.released

    def release(self) -> None:
        if not self.released:
            self.released = True
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


class LocalLocker:
    """A host-wide `flock` per namespace: the same one-writer guarantee on one machine, without Redis."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def acquire(self, ns: Namespace, wait: float, floor: int, push: Sequence[str] = ()) -> Lease | None:
        if push:
            raise LucidError("a host-local lock has no op queue to push to")
        fd = self.store.open_lock(ns)
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return None
                time.sleep(0.002)
        # Under the flock nobody else writes, so the disk fence + 1 is a valid, monotonic token.
        return _LocalLease(self.store.read_fence(ns) + 1, fd)


@dataclass
class BatchReport:
    """What one batch did: for logs, the git message and tests."""

    outcomes: list[Outcome] = field(default_factory=list)
    manual_edit: bool = False
    redacted: int = 0
    revision: str | None = None
    written: bool = (
        False  # files written (without `revision`: the lease was lost first, the next holder commits)
    )
    queued: list[str] = field(default_factory=list)  # ops others queued meanwhile (the next batch)


Change = Callable[[Book, Snapshot], dict[str, str] | None]


class Writer:
    """Applies ops to namespaces, one batch at a time per namespace, never losing a hand edit."""

    def __init__(
        self,
        store: Store,
        locker: Locker | None = None,
        queue: OpQueue | None = None,
        clock: Callable[[], datetime] = utcnow,
        lease_wait: float = 30.0,
        vault_key: bytes | None = None,
        tenure: float = TENURE,
        commit_every: float = COMMIT_EVERY,
    ) -> None:
        self.store = store
        # How long a leader keeps the lease while others' ops keep arriving, and how often it commits
        # meanwhile (module defaults; the tests' small values are what makes them observable).
        self.tenure = tenure
        self.commit_every = commit_every
        self.vault_key = vault_key
        self.locker: Locker = locker if locker is not None else LocalLocker(store)
        self.queue = queue
        self.clock = clock
        self.lease_wait = lease_wait
        self.problems: list[tuple[str, str]] = []  # malformed lines seen by the last batch
        # The book as this process last committed it, by namespace version: a batch that finds the files
        # as it left them skips parsing (the common case when one process writes a hot namespace).
        self._books: dict[Namespace, tuple[str, Book]] = {}
        self._deferred: dict[Namespace, _Deferred] = {}  # written, not yet committed (this lease)
        self._leaders: dict[Namespace, threading.Thread] = {}  # leading on after this process's op was done

    def submit(self, ns: Namespace, ops: Sequence[Op], timeout: float = 60.0) -> list[Outcome]:
        """Apply `ops` (in order) and return one outcome per op."""
        if not ops:
            return []
        if self.queue is None:
            with self._lease(ns) as lease:
                report = self._batch(ns, lease, [(None, op) for op in ops])
            assert report is not None  # only a version check returns None
            return report.outcomes
        # Secrets never travel through Redis (its AOF is a file too): screen them here, in the submitter.
        screened, early = self._screen(ns, ops)
        if not screened:
            return [early[op.op_id] for op in ops]
        mine = self._lead(ns, screened)
        if mine is not None:
            return [mine.get(op.op_id) or early[op.op_id] for op in ops]
        ids = [op.op_id for op in screened]  # queued: the lease holder applies them
        done: dict[str, Outcome] = {}
        deadline = time.monotonic() + timeout
        while True:
            done.update(self.queue.results([i for i in ids if i not in done], 0.05))
            if len(done) == len(ids):
                done.update(early)
                return [done[op.op_id] for op in ops]
            if time.monotonic() > deadline:
                raise LucidError(f"timed out waiting for the writer of {ns} ({len(done)}/{len(ids)} done)")
            taken = self.locker.acquire(ns, 0.0, self.store.read_fence(ns))
            if taken is not None:  # nobody leads (the leader let go or died): apply the queue
                self._lead_with(ns, taken, _decode(self._queued(ns, taken)))

    def _lead(self, ns: Namespace, ops: list[Op]) -> dict[str, Outcome] | None:
        """If the lease is free, apply the queued ops of others and then `ops` as one batch; None: the lease
        was taken and `ops` queued (same round trip), or it was lost before the write."""
        assert self.queue is not None
        with self.store.held():
            lease = self.locker.acquire(ns, 0.0, self.store.read_fence(ns), push=[op_json(op) for op in ops])
            if lease is None:
                return None
            batch = [*_decode(self._queued(ns, lease)), *((None, op) for op in ops)]
            report = self._lead_with(ns, lease, batch)
        if report is None:
            self.queue.push(ns, ops)
            return None
        return {o.op_id: o for (raw, _), o in zip(batch, report.outcomes, strict=True) if raw is None}

    def _lead_with(
        self, ns: Namespace, lease: Lease, batch: list[tuple[str | None, Op]]
    ) -> BatchReport | None:
        """Apply `batch` under `lease`; then, if others queued ops meanwhile, lead on in a thread (so this
        process's op is answered now, not when the tenure ends), else commit and let go. None: lease lost."""
        # Only this process's ops, nothing pending: commit now and let the lease go with the outcomes (one
        # round trip less), unless others queued ops meanwhile: then lead on, their batches deferred.
        now = all(raw is None for raw, _ in batch) and ns not in self._deferred
        try:
            report = self._batch(ns, lease, batch, defer=not now, let_go=now) if batch else BatchReport()
        except LeaseLost as exc:
            self._release(ns, lease)
            log.warning("lease lost during a batch of %s (%s)", ns.key, exc)
            return None
        except BaseException:
            self._release(ns, lease)
            raise
        assert report is not None
        if not report.queued:
            self._release(ns, lease)
            return report
        leader = threading.Thread(
            target=self._lead_on, args=(ns, lease, report.queued), name=f"writer {ns.key}"
        )
        self._leaders[ns] = leader
        leader.start()
        return report

    def _lead_on(self, ns: Namespace, lease: Lease | None, queued: list[str]) -> None:
        """The leader thread: drain, commit, let go; and lead again while ops are still queued (its book
        stays warm), until another process takes the lease or the queue is empty."""
        try:
            with self.store.held():
                while lease is not None:
                    served = False
                    try:
                        served = self._drain(ns, lease, queued)
                    except LeaseLost as exc:
                        log.warning("lease lost while leading %s (%s)", ns.key, exc)
                    finally:
                        self._release(ns, lease)
                    if served:  # a whole tenure: others (a dream's transaction) get their turn at the lease
                        return
                    queued = self.queue.pending(ns, MAX_BATCH) if self.queue is not None else []
                    lease = self.locker.acquire(ns, 0.0, self.store.read_fence(ns)) if queued else None
                    if lease is not None:
                        queued = self._queued(ns, lease)
        except Exception:  # the ops stay queued: the next holder applies them
            log.exception("the writer thread of %s failed", ns.key)
        finally:
            if self._leaders.get(ns) is threading.current_thread():
                del self._leaders[ns]

    def _queued(self, ns: Namespace, lease: Lease) -> list[str]:
        """The namespace's oldest queued ops: those the lease was taken with, else read now."""
        assert self.queue is not None
        return lease.pending if lease.pending is not None else self.queue.pending(ns, MAX_BATCH)

    def settle(self) -> None:
        """Wait for this process's writer threads to commit and let their leases go (tests, shutdown)."""
        for leader in list(self._leaders.values()):
            leader.join()

    def _screen(self, ns: Namespace, ops: Sequence[Op]) -> tuple[list[Op], dict[str, Outcome]]:
        """Ops safe to queue (raw records redacted), and the outcomes of those refused on the spot."""
        keep: list[Op] = []
        early: dict[str, Outcome] = {}
        for op in ops:
            if isinstance(op, Remember | Edit) and contains_secret(op.text):
                detail = "looks like a secret; not stored"
                if self.vault_key is not None and isinstance(op, Remember):
                    self.store.append_vault(
                        ns,
                        [
                            seal(
                                self.vault_key,
                                {"at": format_time(self.clock()), "text": op.text, "op": op.op_id},
                            )
                        ],
                    )
                    detail = "kept encrypted in the vault, not in memory"
                early[op.op_id] = Outcome(op.op_id, "rejected:secret", detail=detail)
            elif isinstance(op, Record):
                message = dict(op.message)
                for key in ("text", "speaker"):
                    if isinstance(message.get(key), str):
                        message[key] = redact(message[key])
                keep.append(replace(op, message=message))
            else:
                keep.append(op)
        return keep, early

    def submit_then(
        self, ns: Namespace, ops: Sequence[Op], then: Callable[[list[Outcome]], None]
    ) -> list[Outcome]:
        """Apply `ops` as one batch, then run `then(outcomes)` before the lease is released, so no other
        batch lands in between (`forget --purge` rewrites git history there). `then` runs under the fence:
        a holder that lost the lease is refused (LeaseLost), and a newer one waits for it to end."""
        with self._lease(ns) as lease:
            report = self._batch(ns, lease, [(None, op) for op in ops])
            assert report is not None  # only a version check returns None
            kill_point("then")
            with self.store.fenced(ns, lease.token, lease.held):
                then(report.outcomes)
        return report.outcomes

    def flush(self, ns: Namespace) -> None:
        """Apply whatever ops are queued for `ns` (ops pushed without waiting, e.g. a reply's record)."""
        if self.queue is None or not self.queue.pending(ns, 1):
            return
        with self._lease(ns) as lease:
            self._drain(ns, lease, linger=0.0)

    def mend(self, ns: Namespace) -> None:
        """What a batch does first after a boot (`Store.mend_after_boot`), for a reader about to read git
        (history, undo, purge, the dream card, the viewer): after a power cut it reads at once, instead of
        refusing until the namespace's next write. A dict lookup once checked."""
        if not self.store.git_enabled or not self.store.file(ns, ".git").is_dir():
            return
        deadline = time.monotonic() + self.lease_wait
        # In short waits: a leader holding the lease for its tenure has mended first, and says so in
        # `written.json` at its first batch's end; not taken in time, `Store._repo` refuses if git is cut.
        while not self.store.mended(ns) and (left := deadline - time.monotonic()) > 0:
            with self.store.held():
                lease = self.locker.acquire(ns, min(MEND_WAIT, left), self.store.read_fence(ns))
                if lease is None:
                    continue
                try:
                    self.store.claim_fence(ns, lease.token)
                    self.store.mend_after_boot(ns, lease.token, lease.held, record=True)
                finally:
                    self._release(ns, lease)

    def transact(
        self, ns: Namespace, change: Change, message: str, expect_version: str | None = None
    ) -> BatchReport | None:
        """Run `change(book, snapshot)` under the lease and commit what it did as one batch."""
        with self._lease(ns) as lease:
            return self._batch(ns, lease, [], change, message, expect_version)

    def snapshot(self, ns: Namespace) -> tuple[Book, Snapshot]:
        """A read-only view for planning (no lease): the book and the version it was read at."""
        snap = self.store.snapshot(ns)
        return _book(snap), snap

    @contextlib.contextmanager
    def _lease(self, ns: Namespace) -> Iterator[Lease]:
        with self.store.held():
            lease = self.locker.acquire(ns, self.lease_wait, self.store.read_fence(ns))
            if lease is None:
                raise LucidError(f"could not take the writer lease of {ns} within {self.lease_wait:.0f}s")
            try:
                yield lease
            finally:
                self._release(ns, lease)

    def _release(self, ns: Namespace, lease: Lease) -> None:
        """Commit what this tenure's batches wrote (group commit), then let the lease go."""
        try:
            if ns in self._deferred and lease.held():
                self._commit_deferred(ns, lease)
        finally:
            self._deferred.pop(ns, None)  # not committed (lease lost): the journal tells the next holder
            lease.release()

    def _drain(
        self, ns: Namespace, lease: Lease, queued: list[str] | None = None, linger: float = LINGER
    ) -> bool:
        """Apply queued ops batch after batch while more arrive, committing every `commit_every`, to `tenure`
        (then True): one warm leader writes a hot namespace instead of processes re-reading it in turn."""
        assert self.queue is not None
        started = committed = time.monotonic()
        raw_ops = self.queue.pending(ns, MAX_BATCH) if queued is None else queued
        idle = 0.0
        while lease.held() and time.monotonic() - started < self.tenure:
            if not raw_ops:
                if idle >= linger:
                    return False
                time.sleep(linger / 5)
                idle += linger / 5
                raw_ops = self.queue.pending(ns, MAX_BATCH)
                continue
            idle = 0.0
            report = self._batch(ns, lease, _decode(raw_ops), defer=True)
            raw_ops = report.queued if report is not None else []
            if time.monotonic() - committed >= self.commit_every and lease.held():
                self._commit_deferred(ns, lease)
                committed = time.monotonic()
        return lease.held()

    def _batch(
        self,
        ns: Namespace,
        lease: Lease,
        ops: list[tuple[str | None, Op]],
        change: Change | None = None,
        message: str | None = None,
        expect_version: str | None = None,
        defer: bool = False,
        let_go: bool = False,
    ) -> BatchReport | None:
        """Apply one batch; files are written and synced and the journal kept before any outcome is published.
        `defer`: commit at the lease's end; `let_go`: release with the outcomes unless others queued."""
        self.store.claim_fence(ns, lease.token)
        self.store.ensure_repo(ns)
        self.store.mend_after_boot(ns, lease.token, lease.held)  # before anything below reads git
        if ns not in self._deferred:  # else the journal is this tenure's own
            self._recover(ns, lease)
        for _attempt in range(_RETRIES):
            snap = self.store.snapshot(ns)
            report = BatchReport()
            before: Book | None = None
            if snap.hand_edited() and ns in self._deferred:
                self._commit_deferred(ns, lease)  # the writer's own batches first, then the person's edit
            if snap.hand_edited():
                before = self._committed_book(ns, snap)
                snap, report.redacted = self._commit_hand_edit(ns, lease, snap)
                report.manual_edit = True
            if expect_version is not None and snap.version != expect_version:
                return None
            cached = self._books.pop(ns, None)
            if cached is not None and cached[0] == snap.version:
                book = cached[1]
            else:
                with collector_paused():
                    book = _book(snap)
                    if cached is not None:  # another process wrote since: keep what still holds
                        book.reuse_index(cached[1])
                    else:  # this process never read the namespace: the keys saved by whoever did
                        self._load_index(ns, book)
            book.changed = False
            self.problems = book.problems()
            now = self.clock()
            if report.manual_edit:
                _stamp_hand_lines(book, now)
                _strikes_by_hand(before, book, now)
            forgotten = _deleted_by_hand(before, book)
            relearns = change is not None or forgotten or any(_forgets_or_relearns(op) for _, op in ops)
            held_from = list(self.store.state_value(ns, FORGOTTEN_FROM) or ()) if relearns else []
            book.forgotten_from = {*held_from, *(f.origin for f in forgotten if f.origin)}
            report.outcomes, raw = self._apply(ns, book, [op for _, op in ops], now, forgotten)
            extra = change(book, snap) if change is not None else None
            files: dict[str, str | bytes] = {}
            if book.changed:
                data = snap.files.get(MEMORY) or b""
                # Only its end is compared: decoding (then encoding) a file of thousands of lines per batch
                # cost more than the batch's own work. A line longer than the tail renders the whole file.
                tail = data[-_TAIL:].decode("utf-8", errors="surrogateescape")
                more = book.memory_appended(tail) if snap.rendered_memory() else None
                if more is not None:  # only new lines: appended, the rest is not rendered again
                    files[MEMORY] = data + as_bytes(more)
                else:
                    files[MEMORY] = render_file(book.memory_file())
                    if book.archive.entries or snap.files.get(ARCHIVE) is not None:
                        # A new person's archive is made by the first light dream that moves a line there.
                        files[ARCHIVE] = render_file(book.archive_file())
            rendered = MEMORY in files
            rewritten = self._forget_elsewhere(ns, snap, book, forgotten, raw, files, now)
            for name, text in (extra or {}).items():
                files[name] = redact(text) if name in (PROFILE, DREAMS) else text
                rendered = rendered and name != MEMORY
            if not files and not raw:
                report.queued = self._publish(ns, ops, report.outcomes, lease if let_go else None)
                return report
            pending = self._deferred.get(ns)
            msg = message or _message(_counts(report.outcomes) + (pending.counts if pending else Counter()))
            try:
                with self.store.fenced(ns, lease.token, lease.held):
                    journal = {
                        "message": msg,
                        "ops": [r for r, _ in ops if r],
                        "outcomes": [o.to_json() for o in report.outcomes],
                    }
                    hashes = self.store.replace_files(ns, snap, files, raw, journal)
                    # After the files (a crash before leaves the raw marks), under the same fence: a holder
                    # that lost the lease meanwhile never writes back a state older than the new holder's.
                    self._after_files(ns, book, held_from, bool(forgotten), bool(rewritten))
                    mark = (
                        hashes.get(MEMORY) if rendered else snap.rendered if snap.rendered_memory() else None
                    )
                    # BOOT: this boot's writer has checked git (`mend_after_boot`, at the batch's start)
                    written: dict[str, object] = {"hashes": hashes, "rendered": mark, BOOT: boot_id()}
                    # Undeferred, it is recorded with the commit's fold in one write (the journal covers the gap).
                    if defer:
                        self.store.record_written(ns, **written)
            except ConcurrentChange:
                self.store.clear_journal(ns)
                log.info("namespace %s changed under the batch (hand edit); re-reading", ns.key)
                continue
            report.written = True
            exact: dict[str, bytes | None] = {
                name: as_bytes(files[name]) if name in files else snap.files.get(name) for name in TRACKED
            }
            for day, text in raw.items():
                exact[f"raw/{day}"] = as_bytes(text)
            if rendered:
                book.settle()  # the files now hold this book: the next batch may append to them
            if change is None:
                self._books[ns] = (version_of(hashes), book)
            group = self._deferred.setdefault(ns, _Deferred())
            group.add(exact, _counts(report.outcomes), now, change is None and message is None, ops)
            if message is not None or change is not None:
                group.message = msg
            if not defer:
                report.revision = self._commit_deferred(ns, lease, written)
            if forgotten:  # the cache holds no text that was forgotten
                self._save_index(ns, lease, book, 0)
            report.queued = self._publish(ns, ops, report.outcomes, lease if let_go else None)
            if lease.held():  # after the answers: the writers waiting on them do not pay for it
                self._save_index(ns, lease, book, max(INDEX_SAVE_EVERY, len(book.memory.entries) // 16))
            return report
        raise ConcurrentEdit(f"{ns} kept changing during the write; nothing was applied")

    def _after_files(
        self, ns: Namespace, book: Book, held_from: list[str], forgot: bool, rewritten: bool
    ) -> None:
        """The namespace's state that follows from a batch's files (the caller holds `fenced`)."""
        if book.forgotten_from != set(held_from):
            kept = [*held_from, *(book.forgotten_from - set(held_from))]  # it only grows
            self.store.set_state_value(ns, FORGOTTEN_FROM, kept[-FORGOTTEN_FROM_KEPT:])
        if forgot:  # no process may keep a forgotten text's vector or dedup keys on disk (see VECTOR_CACHE)
            self.store.set_state_value(ns, FORGETS, int(self.store.state_value(ns, FORGETS) or 0) + 1)
            self.store.drop_cache(ns, VECTOR_CACHE)
            try:  # the keys hold texts in clear: saved again after the commit, unless the lease is lost
                self.store.drop_cache(ns, _INDEX_CACHE)
            except OSError as exc:
                log.error("the dedup keys of %s may keep a forgotten text: %s", ns.key, exc)
        if rewritten:  # raw lines changed in place: every process's search index must rebuild
            self.store.set_state_value(
                ns, RAW_REWRITES, int(self.store.state_value(ns, RAW_REWRITES) or 0) + 1
            )
            self.store.drop_cache(ns, RAW_CACHE)  # the saved one holds the old lines and their vectors

    def _load_index(self, ns: Namespace, book: Book) -> None:
        held = self.store.load_cache(ns, _INDEX_CACHE)
        if held is not None:
            with contextlib.suppress(OSError):  # no readable cache: the index is built from the text
                book.index_from(held[1](_INDEX_FILE))

    def _save_index(self, ns: Namespace, lease: Lease, book: Book, every: int) -> None:
        """Save the dedup index's keys if building it read `every` texts the saved ones lacked (0: now): the
        next process to lead this namespace then does not read thousands of lines while the others wait.
        Under the fence: keys saved by a holder that lost the lease could hold a text forgotten since."""
        if every and book.index_missed < every:
            return
        try:
            with self.store.fenced(ns, lease.token, lease.held):
                self.store.save_cache(ns, _INDEX_CACHE, {_INDEX_FILE: book.index_bytes()}, {})
            book.index_saved()
        except LeaseLost:
            log.warning("lease of %s lost; its dedup keys are left to the next holder", ns.key)
        except OSError as exc:  # a forget dropped the older keys with its files (`_after_files`)
            log.warning("could not save the dedup index cache of %s: %s", ns.key, exc)

    def _commit_deferred(
        self, ns: Namespace, lease: Lease, written: dict[str, object] | None = None
    ) -> str | None:
        """One git commit of the batches written since the last (their exact bytes); messages and hit counts
        alone fold into such a HEAD of this turn. `written`: the last batch's record, saved after it. Under
        the fence: a holder that lost the lease leaves its journal to the next, which commits the files."""
        group = self._deferred.pop(ns, None)
        if group is None:
            return None
        kill_point("tenure")  # the batches are written and their outcomes published; the commit is not made
        try:
            with self.store.fenced(ns, lease.token, lease.held):
                counts = Counter(group.counts)
                amend, folded = self._foldable(ns, group.now) if group.message is None else (None, Counter())
                if amend is not None:
                    counts.update(folded)
                msg = group.message or _message(counts)
                revision = self.store.commit(ns, msg, group.exact, amend=amend)
                record = {**(written or {}), BOOT: boot_id()}
                if revision is not None:
                    fold = {"rev": revision, "at": format_time(group.now), "counts": dict(counts)}
                    record["fold"] = fold if group.filler else None
                self.store.record_written(ns, **record)
                self.store.clear_journal(ns)
        except LeaseLost as exc:
            log.warning("lease of %s lost before its commit; the next holder commits it (%s)", ns.key, exc)
            return None
        return revision

    def _foldable(self, ns: Namespace, now: datetime) -> tuple[str | None, Counter[str]]:
        """The commit of messages and hit counts this batch folds into its own (HEAD, if it is one made
        within FOLD_WINDOW), and its counts: one commit per turn, not one per recorded message."""
        fold = self.store.written_value(ns, "fold")
        if not isinstance(fold, dict) or not fold.get("rev") or not isinstance(fold.get("counts"), dict):
            return None, Counter()
        try:
            age = (now - parse_time(str(fold.get("at")))).total_seconds()
        except (ValueError, TypeError):
            return None, Counter()
        if not 0 <= age <= FOLD_WINDOW:
            return None, Counter()
        head = self.store.head(ns)
        if head is None or not head.startswith(str(fold["rev"])):
            return None, Counter()  # something else was committed since (a hand edit, a dream)
        return head, Counter({str(k): int(v) for k, v in fold["counts"].items()})

    def _apply(
        self, ns: Namespace, book: Book, ops: list[Op], now: datetime, forgotten: list[Forgotten]
    ) -> tuple[list[Outcome], dict[str, str]]:
        outcomes: list[Outcome] = []
        by_day: dict[str, list[RawMessage]] = {}
        known: dict[str, set[str]] = {}
        sealed: list[str] = []
        for op in ops:
            if isinstance(op, Record):
                outcomes.append(self._record(ns, op, by_day, known, book))
                continue
            if isinstance(op, Share):
                outcomes.append(share(book, op))
                continue
            gone = book.get(op.id) if isinstance(op, Forget) else None
            outcome = book.apply(op, now)
            if gone is not None and outcome.status == "forgotten":
                forgotten.append(Forgotten.of(gone))
            if (
                outcome.status == "rejected:secret"
                and self.vault_key is not None
                and isinstance(op, Remember)
                and contains_secret(op.text)  # a redacted statement holds nothing worth sealing
            ):
                sealed.append(seal(self.vault_key, {"at": format_time(now), "text": op.text, "op": op.op_id}))
                outcome = replace(outcome, detail="kept encrypted in the vault, not in memory")
            outcomes.append(outcome)
        if sealed:
            self.store.append_vault(ns, sealed)
        raw: dict[str, str] = {}
        for day, messages in by_day.items():
            raw[day] = self.store.append_raw_lines(self.store.read_text_raw(ns, day), messages)
        return outcomes, raw

    def _forget_elsewhere(
        self,
        ns: Namespace,
        snap: Snapshot,
        book: Book,
        forgotten: Sequence[Forgotten],
        raw: dict[str, str],
        files: dict[str, str | bytes],
        now: datetime,
    ) -> bool:
        """Forget means forget: the profile and the raw archive lose what drew on a forgotten entry, in
        the same batch (memory_core.forgetting). Returns whether raw lines were rewritten in place."""
        if not forgotten:
            return False
        profile = redact_profile(snap.text(PROFILE), book.entries(), forgotten, now)
        if profile is not None:
            files[PROFILE] = profile
        rewritten = False
        for day in sorted(set(self.store.raw_days(ns)) | set(raw)):
            text = raw.get(day) if day in raw else self.store.read_text_raw(ns, day)
            new, touched, said = redact_raw(text or "", forgotten)
            if touched:
                raw[day] = new
                rewritten = True
                book.forgotten_from.update(said)  # a message that said it again teaches it no more
        return rewritten

    def _record(
        self,
        ns: Namespace,
        op: Record,
        by_day: dict[str, list[RawMessage]],
        known: dict[str, set[str]],
        book: Book,
    ) -> Outcome:
        try:
            msg = message_from_json(op.message)
        except (KeyError, ValueError, TypeError) as exc:
            return Outcome(op.op_id, "rejected:invalid", detail=f"bad message: {exc}")
        if not msg.id or len(msg.id) > 200:
            return Outcome(
                op.op_id, "rejected:invalid", detail="a message needs an id of at most 200 characters"
            )
        day = self.store.raw_day_name(msg.ts)
        ids = known.setdefault(day, self.store.raw_ids(ns, day))
        if msg.id in ids:
            return Outcome(op.op_id, "unchanged", id=msg.id, detail="already recorded")
        ids.add(msg.id)
        msg = drawn_on_gone(msg, book.get)  # a reply written while what it used was forgotten
        clean = replace(msg, text=redact(msg.text), speaker=redact(msg.speaker))
        by_day.setdefault(day, []).append(clean)
        detail = "redacted" if clean.text != msg.text else None
        return Outcome(op.op_id, "recorded", id=msg.id, detail=detail)

    def _publish(
        self, ns: Namespace, ops: list[tuple[str | None, Op]], outcomes: list[Outcome], let_go: Lease | None
    ) -> list[str]:
        """Publish the outcomes; returns the ops queued meanwhile (the next batch), in the same round trip."""
        if self.queue is None:
            return []
        raw = [r for r, _ in ops if r is not None]
        published = [o for (r, _), o in zip(ops, outcomes, strict=True) if r is not None]
        own = [o for (r, _), o in zip(ops, outcomes, strict=True) if r is None]
        return self.queue.finish(ns, raw, published, own, MAX_BATCH, let_go) or []

    def _recover(self, ns: Namespace, lease: Lease) -> None:
        """Finish a batch that crashed between its journal and its commit, or account for one that died
        before it landed. Either way whatever is on disk gets committed, so nothing stays uncommitted. Under
        the fence: a holder that lost the lease first must not commit, record or clear over the next one's."""
        if self.store.read_journal(ns) is None:
            return
        kill_point("recover")
        with self.store.fenced(ns, lease.token, lease.held):
            journal = self.store.read_journal(ns)  # read again: the next holder may have finished it
            if journal is None:
                return
            self.store.undo_cut_appends(ns, journal)
            snap = self.store.snapshot(ns)
            current = snap.hashes
            target = journal.get("target") or {}
            landed = bool(target) and all(current.get(name) == digest for name, digest in target.items())
            self.store.record_written(ns, hashes=current)
            message = str(journal.get("message") or "batch") if landed else "recover an interrupted batch"
            self.store.commit(ns, message)
            if landed and self.queue is not None and journal.get("ops"):
                outcomes = [Outcome.from_json(o) for o in journal.get("outcomes", [])]
                raw_ops = list(journal["ops"])
                if len(outcomes) >= len(raw_ops):
                    self.queue.finish(ns, raw_ops, outcomes[: len(raw_ops)])
            self.store.clear_journal(ns)

    def _committed_book(self, ns: Namespace, snap: Snapshot) -> Book | None:
        """The book as last committed (before a hand edit), if MEMORY.md or ARCHIVE.md was edited."""
        if not {MEMORY, ARCHIVE} & set(snap.hand_edited()):
            return None
        mem, arc = self.store.committed_text(ns, MEMORY), self.store.committed_text(ns, ARCHIVE)
        if mem is None and arc is None:
            return None
        return Book(parse_file(mem) if mem else None, parse_file(arc) if arc else None)

    def _commit_hand_edit(self, ns: Namespace, lease: Lease, snap: Snapshot) -> tuple[Snapshot, int]:
        """Commit a person's edit as `manual edit` before anything is applied on top of it."""
        files: dict[str, str] = {}
        redacted = aside = renamed = 0
        for name in snap.hand_edited():
            text, moved, hidden = self._set_aside(ns, name, snap.text(name) or "")
            copied = 0
            if name in (MEMORY, ARCHIVE):
                text, copied = distinct_ids(text, functools.partial(self.store.committed_text, ns, name))
            clean, n = _scrub(text) if name in (MEMORY, ARCHIVE) else _scrub_plain(text)
            redacted += n + hidden
            aside += moved
            renamed += copied
            if n or moved or copied:
                files[name] = clean
        note = f" ({redacted} secret(s) redacted)" if redacted else ""
        note += f" ({aside} oversized line(s) set aside)" if aside else ""
        note += f" ({renamed} copied line(s) given a new id)" if renamed else ""
        kill_point("hand")
        with self.store.fenced(ns, lease.token, lease.held):  # a holder that lost the lease commits nothing
            if files:
                self.store.replace_files(ns, snap, files)
                snap = self.store.snapshot(ns)
            self.store.record_written(ns, hashes=snap.hashes)
            self.store.commit(ns, f"manual edit{note}")
        log.info("committed a manual edit of %s%s", ns.key, note)
        return self.store.snapshot(ns), redacted

    def _set_aside(self, ns: Namespace, name: str, text: str) -> tuple[str, int, int]:
        """`text` with each line over MAX_LINE_CHARS replaced by a note saying where it is kept (redacted), so
        later writes cost the memory, not a pasted blob. Returns text, lines set aside, secrets they held."""
        lines = text.split("\n")
        long = [i for i, line in enumerate(lines) if len(line) > MAX_LINE_CHARS]
        hidden = 0
        for i in long:
            chars = len(lines[i])
            kept, n = redact_long(lines[i])
            hidden += n
            lines[i] = set_aside_note(chars, self.store.set_aside(ns, name, kept))
            log.warning(
                "set aside a hand-edited line of %d characters in %s/%s%s",
                chars, ns.key, name, f" ({n} secret(s) in it redacted)" if n else "",
            )  # fmt: skip
        return ("\n".join(lines), len(long), hidden) if long else (text, 0, 0)


def _stamp_hand_lines(book: Book, now: datetime) -> None:
    """A line a person added by hand has no `at`: it was recorded when the writer first saw it (else it
    would look new to recall and light dreaming forever). Its source is the person's hand."""
    for e in book.entries():
        if e.at is None and e.valid_from is None:
            book.replace_entry(e.with_changes(at=now, source=e.source or "manual"))


def _strikes_by_hand(before: Book | None, book: Book, now: datetime) -> None:
    """The strike-through is the person's to set (README, "One memory, one line"): a history line
    whose `~~` they removed is current again, as if said now (a light dream's newest-wins keeps it); a
    current line they wrapped in `~~` is history from now. Only against the committed book: a new line
    typed as `~~x~~` is text."""
    if before is None:
        return
    for e in book.entries():
        old = before.get(e.id)
        if old is None or e.valid_to is not None:
            continue
        if old.valid_to is not None and e.text == old.text:  # un-struck: lineformat dropped its vt
            book.replace_entry(e.with_changes(valid_from=now))
        elif (
            old.valid_to is None
            and len(e.text) > 4
            and e.text[2:-2] == old.text
            and e.text[:2] == "~~" == e.text[-2:]
        ):
            book.replace_entry(e.with_changes(text=old.text, valid_to=now))


def _book(snap: Snapshot) -> Book:
    mem = snap.text(MEMORY)
    arc = snap.text(ARCHIVE)
    return Book(parse_file(mem) if mem else None, parse_file(arc) if arc else None)


def _deleted_by_hand(before: Book | None, book: Book) -> list[Forgotten]:
    """Entries a person deleted from MEMORY.md and ARCHIVE.md by hand: a forget like any other. One whose
    text lives on (a line whose comment was removed gets a new id) is not."""
    if before is None:
        return []
    now = [*book.entries(), *book.archived()]
    ids, texts = {e.id for e in now}, {e.text for e in now}
    gone = [e for e in [*before.entries(), *before.archived()] if e.id not in ids and e.text not in texts]
    held = [*before.entries(), *before.archived()]
    for e in gone:
        book.cut_from_predecessors(e)  # as a forget does: a kept remainder leaves its old line too
    return [f for e in gone for f in Forgotten.with_cuts(e, held)]


def _forgets_or_relearns(op: Op) -> bool:
    """Does `op` need the messages whose memories were forgotten (a forget adds one; an automatic remember
    from a message may not bring one back)? The rest of a chat's batches skip reading them."""
    return isinstance(op, Forget) or (isinstance(op, Remember) and bool(op.origin) and automatic(op.source))


def _decode(raw_ops: Sequence[str]) -> list[tuple[str | None, Op]]:
    out: list[tuple[str | None, Op]] = []
    for raw in raw_ops:
        try:
            out.append((raw, op_from_json(json.loads(raw))))
        except (ValueError, LucidError) as exc:
            log.warning("dropping an unreadable queued op: %s", exc)
            out.append((raw, _Broken(op_id=_op_id_of(raw))))  # type: ignore[arg-type]
    return out


def _op_id_of(raw: str) -> str:
    try:
        value = json.loads(raw).get("op_id")
        return str(value) if value else "unknown"
    except (ValueError, AttributeError):
        return "unknown"


@dataclass
class _Deferred:
    """The batches of one lease not yet committed to git: the bytes they wrote, what they did."""

    exact: dict[str, bytes | None] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    now: datetime = field(default_factory=utcnow)
    filler: bool = True  # only messages and hit counts (foldable into the next commit)
    message: str | None = None  # a transaction's own message

    def add(
        self,
        exact: dict[str, bytes | None],
        counts: Counter[str],
        now: datetime,
        plain: bool,
        ops: Sequence[tuple[str | None, Op]],
    ) -> None:
        self.exact.update(exact)
        self.counts.update(counts)
        self.now = now
        self.filler = self.filler and plain and all(isinstance(op, Record | Touch) for _, op in ops)


@dataclass(frozen=True)
class _Broken:
    """Stands for a queued op that could not be decoded: it is rejected, never retried forever."""

    op_id: str
    kind: str = "broken"


def _counts(outcomes: Sequence[Outcome]) -> Counter[str]:
    # superseded:<why> counts as superseded: the why may quote the user's words (slot:前任), not for git
    return Counter(str(o.kind) if o.kind is Kind.SUPERSEDED else o.status for o in outcomes)


def _message(counts: Counter[str]) -> str:
    if not counts:
        return "write"
    parts = [f"{n} {status}" for status, n in sorted(counts.items())]
    return "memory: " + ", ".join(parts)


def _scrub(text: str) -> tuple[str, int]:
    """Redact secrets in every line of a memory file: an entry's words, a heading, any other line, and a
    line's metadata comment only when it holds one (ids and times are left alone)."""
    if not contains_secret(text):
        return text, 0
    count = 0
    out = []
    for line in text.split("\n"):
        idx = line.rfind(META_OPEN)
        visible, meta = (line[:idx], line[idx:]) if idx >= 0 else (line, "")
        clean = (redact(visible) if contains_secret(visible) else visible) + (
            redact(meta) if meta and contains_secret(meta) else meta
        )
        count += clean != line
        out.append(clean)
    return "\n".join(out), count


def _scrub_plain(text: str) -> tuple[str, int]:
    clean = redact(text)
    return clean, int(clean != text)


def op_json(op: Op) -> str:
    """The queued form of an op."""
    return json.dumps(op_to_json(op), ensure_ascii=False)
