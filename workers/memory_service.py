"""The memory service: what a turn, the CLI and the viewer call to read and write a namespace's memory."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from memory_core.book import Book
from memory_core.entry import Entry
from memory_core.errors import LineError, StaleIndex, StoreError
from memory_core.explain import Why, explain
from memory_core.floor import REFERENCE, evidence_query
from memory_core.forgetting import checked_profile
from memory_core.history import Undone, undo
from memory_core.ids import pin_refusal, successor_of
from memory_core.intents import classify_type
from memory_core.lineformat import RawMessage, format_time, parse_file, parse_raw
from memory_core.namespace import Namespace
from memory_core.ops import Forget, Kind, Op, Outcome, Record, Remember, Touch, message_to_json
from memory_core.rawindex import RAW_CACHE, RawHit, RawIndex
from memory_core.recall import (
    RESIDENT_BUDGET,
    RelevanceIndex,
    Scored,
    Snippet,
    VectorTable,
    memory_block,
    pulls_memory,
    recall,
    resident_snapshot,
    shows,
    strong_terms,
    visible_in,
)
from memory_core.store import ARCHIVE, MEMORY, PROFILE
from memory_core.subjects import recognise
from memory_core.textindex import STOP_CHARS
from memory_core.writer import FORGETS, RAW_REWRITES, VECTOR_CACHE

from .embedding import VECTORS_FILE, Embeddings, from_settings
from .erasure import forget_since, forgotten_from, purge
from .metrics import Metrics
from .redis_backend import WRITES
from .redis_keys import Keys

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)

SESSION_IDLE = 30 * 60
ACTIVE_RECALL_BUDGET = 1.5
# 4: a 4th line buys 2.1 points of LoCoMo gold evidence per 100 characters of block, a 5th 1.0, a 6th
# 0.4 (held out, `bench/recall_candidates.py --family snippets`; docs/BENCHMARKS.md, issue 17).
ACTIVE_RECALL_SNIPPETS = 4
BREAKER_FAILURES = 3
BREAKER_COOLDOWN = 60.0
SNIPPET_CHARS = 160  # one snippet, a pair included
SEARCH_TOOL_HITS = 5  # the most lines one session_search call returns
SEARCH_TOOL_POOL = 50  # searched before the p2p filter
_SAVE_EVERY = 2000
RAW_EMBED_PASS = 256  # raw messages a background pass reads for embedding at a time
#: Entries embedded between two looks at the namespace's saved vectors: processes filling the same namespace
#: (`lucid serve --workers N`, a restart) take each other's vectors instead of embedding them all again.
ENTRY_EMBED_PASS = 32


@dataclass(frozen=True)
class SnippetRule:
    """How much past conversation active recall shows: at most `count` snippets and `chars` characters;
    with `pairs`, a line admitted through the turn next to it is shown with that turn."""

    count: int = ACTIVE_RECALL_SNIPPETS
    chars: int | None = None
    pairs: bool = True

    def full(self, taken: Sequence[Snippet], text: str) -> bool:
        """Whether `text` would be one snippet too many after `taken`."""
        if len(taken) >= self.count:
            return True
        return self.chars is not None and sum(len(s.text) for s in taken) + len(text) > self.chars


@dataclass
class Assembly:
    """Everything a turn shows the model about this person, and what it came from."""

    block: str
    resident: list[Entry]
    recalled: list[Scored]
    snippets: list[Snippet]
    profile: str | None = None


@dataclass
class _BookCache:
    key: tuple[tuple[int, int], ...]
    book: Book
    index: RelevanceIndex = field(default_factory=RelevanceIndex)
    entries: list[Entry] = field(default_factory=list)  # one stable list per load: the index syncs once


@dataclass
class _RawCache:
    index: RawIndex
    offsets: dict[str, int]
    unsaved: int = 0  # messages and vectors added since the index was last saved
    rewrites: int = 0  # the namespace's raw-rewrite count this index was built at (a forget bumps it)


@dataclass
class _Breaker:
    failures: int = 0
    opened: float | None = None

    def open(self, now: float) -> bool:
        if self.opened is None:
            return False
        if now - self.opened >= BREAKER_COOLDOWN:
            self.opened, self.failures = None, 0  # half-open: try again
            return False
        return True

    def record(self, ok: bool, now: float) -> None:
        if ok:
            self.failures = 0
            return
        self.failures += 1
        if self.failures >= BREAKER_FAILURES:
            self.opened = now


class MemoryService:
    """Reads through per-process caches (the parsed book, its relevance index, the raw search index) and
    writes through the single writer; the resident tier is frozen per session to keep the prompt stable."""

    def __init__(
        self,
        runtime: Runtime,
        active_budget: float = ACTIVE_RECALL_BUDGET,
        embeddings: Embeddings | None = None,
        snippets: SnippetRule | None = None,
    ) -> None:
        self.runtime = runtime
        self.active_budget = active_budget
        self.snippets = snippets if snippets is not None else SnippetRule()
        self.embeddings = (
            embeddings if embeddings is not None else from_settings(runtime.settings.embed_model, runtime.llm)
        )
        self._books: dict[Namespace, _BookCache] = {}
        self._raw: dict[Namespace, _RawCache] = {}
        self._breakers: dict[Namespace, _Breaker] = {}
        self._frozen: dict[tuple[Namespace, str], tuple[float, list[str]]] = {}
        self._profiles: dict[Namespace, tuple[object, str | None]] = {}
        self._lock = threading.RLock()
        self._raw_lock = threading.RLock()  # the raw-archive index: a slow search never holds up reading
        self._searching: dict[Namespace, Future[list[RawHit]]] = {}
        self._tables: dict[Namespace, tuple[tuple[int, int], list[Entry], VectorTable]] = {}
        self._embedding: dict[Namespace, threading.Thread] = {}
        self._raw_embedding: dict[Namespace, threading.Thread] = {}
        self._vectors_seen: dict[Namespace, str] = {}  # the saved vectors' generation last adopted
        self._vectors_unsaved: dict[Namespace, int] = {}
        # Active-recall searches run here so that the turn can stop waiting at its budget; one at a time
        # per namespace, so a stuck index costs one thread, not one per message.
        self._searchers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="active-recall")

    def close(self) -> None:
        """Stop the search threads and background embedding (at its next batch; a later process resumes
        it from the raw index saved here)."""
        self._searchers.shutdown(wait=False, cancel_futures=True)
        if self.embeddings is not None:
            self.embeddings.close()
        self.wait_for_embeddings(timeout=5.0)
        for ns in [ns for ns, n in self._vectors_unsaved.items() if n]:
            self._save_vectors(ns, self._vector_scope(ns))

    def _cache(self, ns: Namespace) -> _BookCache:
        with self._lock:
            key = self.runtime.store.stamps(ns, (MEMORY, ARCHIVE))
            cached = self._books.get(ns)
            if cached is None or cached.key != key:
                mem = self.runtime.store.read_text(ns, MEMORY)
                arc = self.runtime.store.read_text(ns, ARCHIVE)
                book = Book(parse_file(mem) if mem else None, parse_file(arc) if arc else None)
                index = cached.index if cached is not None else RelevanceIndex()
                cached = _BookCache(key, book, index, book.entries())
                self._books[ns] = cached
            return cached

    def book(self, ns: Namespace) -> Book:
        """The namespace as last written (read-only: change it through `apply`)."""
        return self._cache(ns).book

    def profile(self, ns: Namespace) -> str | None:
        """PROFILE.md as it may be shown: its digest checked against the current facts, stale lines out."""
        text = self.runtime.store.read_text(ns, PROFILE)
        if not text:
            return None
        cache = self._cache(ns)
        key = (cache.key, hash(text))
        held = self._profiles.get(ns)
        if held is None or held[0] != key:
            held = (key, checked_profile(text, cache.entries, self.runtime.clock()))
            self._profiles[ns] = held
        return held[1]

    def recall(
        self,
        ns: Namespace,
        query: str,
        now: datetime,
        *,
        k: int = 5,
        as_of: datetime | None = None,
        chat_type: str = "p2p",
        chat: str | None = None,
        gate: bool = True,
        context: Sequence[str] = (),
    ) -> list[Scored]:
        cache = self._cache(ns)
        # What was true at `as_of` may since have been archived by light dreaming: read ARCHIVE.md too
        # (a fresh index: such questions are rare, the hot path keeps its own).
        pool = cache.entries if as_of is None else [*cache.entries, *cache.book.archived()]
        index = cache.index if as_of is None else RelevanceIndex()
        qvec: npt.NDArray[np.float32] | None = None
        vectors: VectorTable | None = None
        floor: float | None = None
        reference = self.embeddings.dense_floor(embed=False) if self.embeddings is not None else None
        if self.embeddings is not None and reference is None and query.strip():
            self.embed_soon(ns, pool)  # the floor's reference set, then the entries: off the turn
        if self.embeddings is not None and reference is not None and query.strip():
            qvec = self.embeddings.query(query)
            if qvec is not None:
                floor = reference.floor(qvec.astype(np.float64))
                vectors = self._vector_table(ns, pool, cached=as_of is None)
                if len(vectors.ids) < len(pool):
                    self.embed_soon(ns, pool)
        with self._lock:
            return recall(
                pool,
                query,
                now,
                k=k,
                as_of=as_of,
                chat_type=chat_type,
                chat=chat,
                index=index,
                gate=gate,
                query_vector=qvec,
                vectors=vectors,
                dense_floor=floor,
                context=context,
            )

    def _vector_table(self, ns: Namespace, pool: list[Entry], cached: bool) -> VectorTable:
        """The pool's vectors as one matrix, rebuilt only when the pool or the vectors changed."""
        assert self.embeddings is not None
        key = (id(pool), self.embeddings.version)
        held = self._tables.get(ns) if cached else None
        if held is not None and held[0] == key and held[1] is pool:
            return held[2]
        table = self.embeddings.table([e.id for e in pool], [e.text for e in pool])
        if cached:
            self._tables[ns] = (key, pool, table)
        return table

    def embed_soon(self, ns: Namespace, pool: Sequence[Entry] | None = None) -> None:
        """Embed this namespace's entries that lack a vector, on the background thread (one job at a
        time per namespace): never on a turn's critical path."""
        if self.embeddings is None:
            return
        with self._lock:
            if _running(self._embedding, ns):
                return
            texts = [e.text for e in (pool if pool is not None else self._cache(ns).entries)]
            if self.embeddings.dense_floor(embed=False) is not None and not self.embeddings.missing(texts):
                return
            _start(self._embedding, ns, f"lucid-embed-{ns.key}", self._fill, ns, texts)

    def _fill(self, ns: Namespace, texts: list[str]) -> None:
        assert self.embeddings is not None
        try:
            self._adopt_vectors(ns, texts)  # the floor's reference vectors are saved with the entries'
            missing = len(self.embeddings.missing(REFERENCE))
            for _ in range(len(REFERENCE) + 1):  # the floor first, a few reference lines per call
                if self.embeddings.dense_floor() is not None or not self.embeddings.available():
                    break
            floor_added = missing - len(self.embeddings.missing(REFERENCE))  # saved below, or at close
            self._vectors_unsaved[ns] = self._vectors_unsaved.get(ns, 0) + floor_added
            every = max(1, len(texts) // 16)  # saves of a big namespace's vectors: at most ~16 per full fill
            while True:
                scope = self._vector_scope(ns)
                self._adopt_vectors(ns, texts)
                todo = self.embeddings.missing(texts)
                if not todo:
                    if floor_added and self._vectors_unsaved.get(ns):
                        self._save_vectors(ns, scope)  # the floor's vectors: the next process adopts them
                    break
                random.shuffle(todo)  # two processes filling one namespace mostly embed different entries
                added = self.embeddings.fill(todo, limit=ENTRY_EMBED_PASS)
                unsaved = self._vectors_unsaved[ns] = self._vectors_unsaved.get(ns, 0) + added
                if unsaved and (unsaved >= every or added < min(ENTRY_EMBED_PASS, len(todo))):
                    self._save_vectors(ns, scope)
                if added < min(ENTRY_EMBED_PASS, len(todo)):
                    break  # the embedder is down or closing: the next recall tries again
        except Exception:
            log.exception("background embedding failed")

    def _adopt_vectors(self, ns: Namespace, texts: list[str]) -> None:
        """Take the saved vectors of `texts` this process lacks (read again only when another save came)."""
        assert self.embeddings is not None
        try:
            held = self.runtime.store.load_cache(ns, VECTOR_CACHE)
            if held is None or held[0].get("embedder") != self.embeddings.name:
                return
            gen = str(held[0].get("generation"))
            if self._vectors_seen.get(ns) != gen:
                self.embeddings.adopt(held[1](VECTORS_FILE), [*REFERENCE, *texts])
                self._vectors_seen[ns] = gen
        except (OSError, ValueError, StoreError) as exc:  # a cache: without it the entries are embedded
            log.warning("unusable saved vectors of %s (%s); embedding instead", ns.key, exc)

    def _vector_scope(self, ns: Namespace) -> tuple[object, list[str]]:
        """The count of forgets, then the texts whose vectors may be saved: read in this order, a forget
        after the texts were read shows in the count (see `_save_vectors`)."""
        forgets = self.runtime.store.state_value(ns, FORGETS)
        cache = self._cache(ns)
        return forgets, [*REFERENCE, *(e.text for e in [*cache.entries, *cache.book.archived()])]

    def _save_vectors(self, ns: Namespace, scope: tuple[object, list[str]]) -> None:
        """Save the held vectors of the texts in `scope`. A forget since the scope was read drops the file
        again (the writer's drop may have come first): it may hold the forgotten text's vector."""
        assert self.embeddings is not None
        store = self.runtime.store
        forgets, texts = scope
        try:
            data, n = self.embeddings.dump(texts)
            if n:
                meta = {"embedder": self.embeddings.name}
                self._vectors_seen[ns] = store.save_cache(ns, VECTOR_CACHE, {VECTORS_FILE: data}, meta)
            if store.state_value(ns, FORGETS) != forgets:
                store.drop_cache(ns, VECTOR_CACHE)
                return  # still unsaved: saved at the next pass or at close
            self._vectors_unsaved[ns] = 0
        except (OSError, StoreError) as exc:
            log.warning("could not save the entry vectors of %s: %s", ns.key, exc)

    def wait_for_embeddings(self, timeout: float = 30.0) -> None:
        """Block until the queued background embedding is done (benchmarks, tests, shutdown)."""
        deadline = time.monotonic() + timeout
        for job in [*self._embedding.values(), *self._raw_embedding.values()]:
            job.join(max(0.0, deadline - time.monotonic()))

    def settle(self, ns: Namespace, timeout: float, raw: bool = False, archived: bool = False) -> bool:
        """Embed what a recall of `ns` (`archived`: one `as_of`, which reads ARCHIVE.md too; `raw`: a search)
        ranks with, waiting at most `timeout` seconds, so that a CLI command ranks as the long-running bot
        does. True when nothing is left to embed."""
        if self.embeddings is None:
            return True
        cache = self._cache(ns)
        pool = [*cache.entries, *cache.book.archived()] if archived else list(cache.entries)
        self.embed_soon(ns, pool)  # the floor's reference set too, which raw search needs as well
        if raw:
            with self._raw_lock:
                behind = self._raw_cache(ns).index.vectors_held()[1]
            if behind:
                self.embed_raw_soon(ns)
        self.wait_for_embeddings(timeout)
        if self.embeddings.dense_floor(embed=False) is None or self.embeddings.missing(
            [e.text for e in pool]
        ):
            return False
        with self._raw_lock:
            return not raw or not self._raw_cache(ns).index.vectors_held()[1]

    def embed_raw_soon(self, ns: Namespace) -> None:
        """Embed this namespace's raw messages that lack a vector, on a background thread (one per
        namespace), saving the search index as it goes: raw search is hybrid once they have one."""
        if self.embeddings is None:
            return
        with self._lock:
            if not _running(self._raw_embedding, ns):
                _start(self._raw_embedding, ns, f"lucid-embed-raw-{ns.key}", self._fill_raw, ns)

    def _fill_raw(self, ns: Namespace) -> None:
        assert self.embeddings is not None
        try:
            while True:
                with self._raw_lock:
                    cache = self._raw_cache(ns)
                    slots, texts = cache.index.unembedded(RAW_EMBED_PASS)
                if not slots:
                    break
                done = 0
                for lo, got in self.embeddings.passages(texts):
                    with self._raw_lock:
                        if self._raw.get(ns) is not cache:  # rebuilt meanwhile (a forget): the next search
                            return  # starts again on the new index
                        cache.index.set_vectors(slots[lo : lo + len(got)], got)
                        cache.unsaved += len(got)
                        if cache.unsaved >= _SAVE_EVERY:
                            self._save_raw(ns, cache)
                    done += len(got)
                if done < len(slots):  # the embedder is down: the next search tries again
                    break
            with self._raw_lock:
                if self._raw.get(ns) is cache and cache.unsaved:
                    self._save_raw(ns, cache)
        except Exception:
            log.exception("background embedding of the raw archive of %s failed", ns.key)

    def find(self, ns: Namespace, target: str) -> list[Entry]:
        """Resolve a command or tool target: an exact id (or id prefix ≥ 6), else entries containing it."""
        target = target.strip()
        if not target:
            return []
        entries = self.book(ns).entries()
        exact = [e for e in entries if e.id == target or (len(target) >= 6 and e.id.startswith(target))]
        if exact:
            return exact
        now = self.runtime.clock()
        return [e for e in entries if e.current(now) and target in e.text]

    def _raw_cache(self, ns: Namespace) -> _RawCache:
        cache = self._raw.get(ns)
        store = self.runtime.store
        store.file(ns, ".index", RAW_CACHE)  # UnsafePath if .index or its folder is a link
        rewrites = int(store.state_value(ns, RAW_REWRITES) or 0)
        days = store.raw_sizes(ns)
        if cache is None or cache.rewrites != rewrites:  # first read, or a forget since: the saved index
            cache = self._load_raw(ns)
            self._raw[ns] = cache
            if cache.rewrites != rewrites:  # built before the forget: it holds the lines it rewrote
                store.drop_cache(ns, RAW_CACHE)  # (a save that raced the forget's drop, say)
        if cache.rewrites != rewrites or not set(cache.offsets) <= set(days):
            # Lines were rewritten in place (a forget) or days removed (an erase): rebuild from the Markdown.
            cache = _RawCache(RawIndex(), {}, rewrites=rewrites)
            self._raw[ns] = cache
        grew = 0
        for day, seen in days.items():
            done = cache.offsets.get(day, 0)
            if seen == done:  # the listing says this day did not grow: not opened
                continue
            size, chunk = store.read_raw_from(ns, day, done)
            if size < done:  # a day file was rewritten by hand: rebuild from the Markdown
                cache = _RawCache(RawIndex(), {}, rewrites=rewrites)
                self._raw[ns] = cache
                return self._raw_cache(ns)
            if size == done:
                continue
            end = chunk.rfind(b"\n") + 1  # only whole lines; a line being written is taken next time
            new = []
            for line in chunk[:end].decode("utf-8", errors="surrogateescape").split("\n"):
                if line.startswith("- "):
                    try:
                        new.append(parse_raw(line))
                    except LineError:
                        log.warning("unreadable raw line in %s/raw/%s", ns.key, day)
            grew += cache.index.add_many(new)
            cache.offsets[day] = done + end
        cache.unsaved += grew
        if cache.unsaved >= _SAVE_EVERY:
            self._save_raw(ns, cache)
        return cache

    def _load_raw(self, ns: Namespace) -> _RawCache:
        held = self.runtime.store.load_cache(ns, RAW_CACHE)
        if held is None:
            return _RawCache(RawIndex(), {})
        manifest, read = held
        try:
            index = RawIndex.restore(manifest, read)
            if manifest.get("embedder") != self._embedder_name():
                index.drop_vectors()  # another embedder's vectors (or none now): they are not this one's
            offsets = manifest.get("offsets")
            if not isinstance(offsets, dict):
                raise StaleIndex("no offsets")
            rewrites = int(manifest.get(RAW_REWRITES, 0))
            return _RawCache(index, {str(k): int(v) for k, v in offsets.items()}, rewrites=rewrites)
        except (StaleIndex, ValueError, TypeError, OSError):
            return _RawCache(RawIndex(), {})

    def _save_raw(self, ns: Namespace, cache: _RawCache) -> None:
        """The index and how far into each day file it has read switch together (one manifest). An index
        built before a forget rewrote lines is not saved (it holds them); the forget's count is read again
        after the save, so a forget that lands during it (its own drop first) deletes it again."""
        if int(self.runtime.store.state_value(ns, RAW_REWRITES) or 0) != cache.rewrites:
            return
        meta = {
            **cache.index.manifest(),
            "offsets": cache.offsets,
            RAW_REWRITES: cache.rewrites,
            "embedder": self._embedder_name(),
        }
        try:
            self.runtime.store.save_cache(ns, RAW_CACHE, cache.index.dump(), meta)
            if int(self.runtime.store.state_value(ns, RAW_REWRITES) or 0) != cache.rewrites:
                self.runtime.store.drop_cache(ns, RAW_CACHE)
                return
            cache.unsaved = 0
        except OSError as exc:
            log.warning("could not save the search index cache: %s", exc)

    def _embedder_name(self) -> str | None:
        return self.embeddings.name if self.embeddings is not None else None

    def search(
        self, ns: Namespace, query: str, k: int = 10, exclude_session: str | None = None
    ) -> list[RawHit]:
        """Raw-archive search: lexical, and hybrid for the messages embedded so far (the rest are embedded
        in the background)."""
        hits: list[RawHit] | None = None
        reference = self.embeddings.dense_floor(embed=False) if self.embeddings is not None else None
        with self._raw_lock:
            cache = self._raw_cache(ns)
            vectors, behind = cache.index.vectors_held()
            if not vectors or reference is None:
                hits = cache.index.search(query, k=k, exclude_session=exclude_session)
        if self.embeddings is not None and reference is None:
            self.embed_soon(ns)  # the floor's reference set
        if behind:
            self.embed_raw_soon(ns)
        if hits is not None:
            return hits
        assert self.embeddings is not None and reference is not None
        qvec = self.embeddings.query(query)  # outside the lock: other searches need not wait for it
        floor = reference.floor(qvec.astype(np.float64)) if qvec is not None else None
        rewrites = self.runtime.store.state_value(ns, RAW_REWRITES)
        with self._raw_lock:
            if self._raw.get(ns) is not cache or int(rewrites or 0) != cache.rewrites:
                cache = self._raw_cache(ns)  # a forget rewrote lines meanwhile: never search the old index
            return cache.index.search(
                query, k=k, exclude_session=exclude_session, query_vector=qvec, dense_floor=floor
            )

    def why(self, ns: Namespace, query: str, hit: RawHit) -> Why:
        """Why `hit` matched `query`: its own terms, or the context turn's (memory_core.explain)."""
        with self._raw_lock:
            around = self._raw_cache(ns).index.context(hit.id)
        return explain(query, hit.text, around)

    def active_recall(
        self,
        ns: Namespace,
        query: str,
        session: str,
        chat: str,
        already: str = "",
        covered: Collection[str] = (),
    ) -> list[Snippet]:
        """Snippets of past conversation for `query` (as many as `self.snippets` allows): no LLM, a time
        budget, a breaker. `covered`: messages the block already holds a fact learned from."""
        breaker = self._breakers.setdefault(ns, _Breaker())
        started = time.monotonic()
        if breaker.open(started) or len(query.strip()) < 2 or not pulls_memory(query):
            return []
        with self._lock:
            running = self._searching.get(ns)
            if running is not None and not running.done():
                breaker.record(False, started)  # the last one is still stuck: do not pile up
                return []
            asked = evidence_query(query)  # the relevance floor's lexical rule, as for the recall tier
            future = self._searchers.submit(self.search, ns, asked, 8, session or None)
            self._searching[ns] = future
        try:  # a real timeout: the reply does not wait for a search that overruns its budget
            hits = future.result(timeout=self.active_budget)
        except FutureTimeout:
            hits = None
        except Exception:
            log.exception("active recall failed for %s", ns.key)
            breaker.record(False, time.monotonic())
            return []
        ended = time.monotonic()
        if hits is None or ended - started > self.active_budget:  # timed out, or done but late all the same
            log.warning("active recall over its %.1f s budget for %s; skipped", self.active_budget, ns.key)
            breaker.record(False, ended)
            return []
        breaker.record(True, ended)
        hits = [h for h in hits if h.chat_type == "p2p"]  # a group's lines (others' words) stay in the group
        wanted = _content_terms(asked)
        bare = {h.id for h in hits if wanted and wanted.isdisjoint(_content_terms(h.text))}
        around = self._adjacent(ns, bare)
        rule = self.snippets
        seen: set[str] = set()
        shown: dict[str, int] = {}  # message id -> its place in `out` (a pair's neighbour too)
        out: list[Snippet] = []
        for hit in hits:
            if hit.id in shown or hit.id in covered:
                continue  # already in the block: as another snippet's neighbour, or a fact learned from it
            near = None
            if hit.id in bare:
                # scored by single characters, a name or a date only: no evidence in or next to it
                near = next(
                    (n for n in around[hit.id] if not wanted.isdisjoint(_content_terms(n[0].text))), None
                )
                if near is None:
                    continue
            text = " ".join(hit.text.split())
            if len(text) < 6 or text.lower() == query.strip().lower():
                continue
            probe = text[:24].lower()
            if probe in seen or (already and probe in already.lower()):
                continue
            seen.add(probe)
            place = len(out)
            if near is not None and rule.pairs:
                other, before = near
                text = _pair(text, " ".join(other.text.split()), before)
                alone = shown.get(other.id)
                if alone is not None and out[alone].message_id == other.id:
                    place = alone  # the neighbour was shown alone: the pair takes its place
                shown[other.id] = place
            snippet = Snippet(text=_cut(text, SNIPPET_CHARS), ts=hit.ts, message_id=hit.id)
            if place < len(out):
                out[place] = snippet
            elif rule.full(out, snippet.text):
                break
            else:
                out.append(snippet)
            shown[hit.id] = place
        return out

    def _adjacent(self, ns: Namespace, ids: set[str]) -> dict[str, list[tuple[RawMessage, bool]]]:
        """The turns just before and after each hit, from the index just searched: a reply lacking the
        request's words counts through the question next to it (+3.6 points of LoCoMo evidence, issue 17)."""
        if not ids:
            return {}
        with self._raw_lock:
            cache = self._raw.get(ns)
            return {i: cache.index.adjacent(i) if cache is not None else [] for i in ids}

    def search_conversations(
        self, ns: Namespace, query: str, k: int = SEARCH_TOOL_HITS, exclude: Sequence[str] = ()
    ) -> list[RawHit]:
        """Past one-to-one conversation lines of this namespace for the model's `session_search` tool."""
        if not query.strip():
            return []
        started = time.monotonic()
        hits = self.search(ns, query, k=SEARCH_TOOL_POOL)
        if time.monotonic() - started > self.active_budget:
            log.warning("session search over budget for %s", ns.key)
            return []
        skip = set(exclude)
        return [h for h in hits if h.chat_type == "p2p" and h.id not in skip][
            : max(0, min(k, SEARCH_TOOL_HITS))
        ]

    def resident(self, ns: Namespace, now: datetime, chat_type: str, chat: str, session: str) -> list[Entry]:
        """The resident tier, frozen per session: the same entries for the session's life, minus any the
        person removed, that stopped being current (a forget takes effect at once) or that this chat may no
        longer see."""
        book = self.book(ns)
        ids = self._frozen_ids(ns, chat_type, chat, session)
        if ids is None:
            fresh = resident_snapshot(book.entries(), now, RESIDENT_BUDGET, chat_type, chat)
            ids = self._claim(ns, chat_type, chat, session, [e.id for e in fresh])
        by_id = {e.id: e for e in book.entries()}
        # The group rule again, on every read: an entry unshared or rewritten in private since the session
        # froze its list leaves the group's prompt at once.
        entries = [
            e
            for i in ids
            if (e := by_id.get(i)) is not None and e.current(now) and visible_in(e, chat_type, chat)
        ]
        self._freeze(ns, chat_type, chat, session, [e.id for e in entries])
        return entries

    @staticmethod
    def _frozen_key(ns: Namespace, chat_type: str, chat: str, session: str) -> str:
        return Keys.resident(ns.key, chat_type, chat, session)

    def _frozen_ids(self, ns: Namespace, chat_type: str, chat: str, session: str) -> list[str] | None:
        client = self.runtime.redis
        if client is None:
            held = self._frozen.get((ns, f"{chat_type}:{chat}:{session}"))
            return held[1] if held is not None and time.monotonic() - held[0] < SESSION_IDLE else None
        return _ids(client.get(self._frozen_key(ns, chat_type, chat, session)))

    def _claim(self, ns: Namespace, chat_type: str, chat: str, session: str, ids: list[str]) -> list[str]:
        """Freeze `ids` unless another worker froze this session first: then serve theirs."""
        client = self.runtime.redis
        if client is None:
            return ids
        key = self._frozen_key(ns, chat_type, chat, session)
        pipe = client.pipeline()
        pipe.set(key, json.dumps(ids), nx=True, ex=SESSION_IDLE)
        pipe.get(key)
        held = _ids(pipe.execute()[1])
        return ids if held is None else held

    def _freeze(self, ns: Namespace, chat_type: str, chat: str, session: str, ids: list[str]) -> None:
        client = self.runtime.redis
        if client is None:
            self._frozen[(ns, f"{chat_type}:{chat}:{session}")] = (time.monotonic(), ids)
        else:
            client.set(self._frozen_key(ns, chat_type, chat, session), json.dumps(ids), ex=SESSION_IDLE)

    def assemble(
        self,
        ns: Namespace,
        query: str,
        *,
        chat_type: str,
        chat: str,
        session: str,
        now: datetime,
        k: int = 5,
        context: Sequence[str] = (),
    ) -> Assembly:
        """The turn's memory block; `context`: the conversation's turns before `query` (entry recall
        reads what the talk is about, not only the last message)."""
        resident = self.resident(ns, now, chat_type, chat, session)
        asks = pulls_memory(query)
        recalled = (
            self.recall(ns, query, now, k=k, chat_type=chat_type, chat=chat, context=context) if asks else []
        )
        profile = self.profile(ns) if chat_type != "group" else None
        partial = memory_block(profile, resident, recalled)
        snippets: list[Snippet] = []
        if chat_type != "group" and asks:
            shown = (e for e in (*resident, *(s.entry for s in recalled)) if shows(partial, e))
            covered = {e.origin for e in shown if e.origin}  # only what the budget let into the block
            snippets = self.active_recall(ns, query, session, chat, already=partial, covered=covered)
        block = memory_block(profile, resident, recalled, snippets) if snippets else partial
        return Assembly(block, resident, recalled, snippets, profile)

    def apply(self, ns: Namespace, ops: Sequence[Op], timeout: float = 60.0) -> list[Outcome]:
        """Every write of a chat turn, a card, a tool and the CLI: the writer's rules, then what follows
        from them (a forget drops the short history; new or changed entries get vectors)."""
        forgetting = any(isinstance(op, Forget) for op in ops)
        before = set(forgotten_from(self.runtime, ns)) if forgetting else set()
        outcomes = self.runtime.writer.submit(ns, ops, timeout=timeout)
        if any(o.status == "forgotten" for o in outcomes):
            # every message that said the fact (learned from, said again, a reply that used it): the writer
            # names them in `forgotten_from` as it marks their lines
            forget_since(self.runtime, ns, before)
        if self.embeddings is not None and any(
            o.kind in (Kind.ADDED, Kind.UPDATED, Kind.SUPERSEDED) for o in outcomes
        ):
            self.embed_soon(ns)  # new or changed entries get their vectors off the turn
        return outcomes

    def purge(self, ns: Namespace, entry_id: str) -> Outcome:
        """`forget --purge`: forget `entry_id` as `apply` would, and rewrite the namespace's git history so
        no commit holds it (workers.erasure.purge); counted with the other writes."""
        outcome = purge(self.runtime, ns, entry_id)
        if outcome.ok:
            Metrics(self.runtime.redis).inc(WRITES, {"outcome": "purged"})
        return outcome

    def undo(self, ns: Namespace, rev: str | None = None) -> Undone:
        """Take back one commit (`lucid undo`, the /memory card), entry by entry, as one batch of the writer
        (history.undo); counted with the other writes and the restored entries get their vectors."""
        done = undo(self.runtime.writer, ns, rev)
        Metrics(self.runtime.redis).inc(WRITES, {"outcome": "undone"})
        if done.entries:
            self.embed_soon(ns)
        return done

    def record(self, ns: Namespace, message: RawMessage, wait: bool = True) -> Outcome | None:
        """Archive one message. With `wait=False` (and Redis) the op is queued and a flush job applies it
        moments later, so a turn does not wait for a git commit; the op is durable in Redis meanwhile."""
        op = Record(message=message_to_json(message))
        queue = self.runtime.writer.queue
        if not wait and queue is not None and self.runtime.redis is not None:
            queue.push(ns, [op])
            schedule_flush(self.runtime, ns)
            return None
        outcome = self.apply(ns, [op])[0]
        if outcome.status == "recorded":
            with self._raw_lock:
                self._raw_cache(ns)  # picks the new line up from the day file, as every process does
        return outcome

    def pin_refusal(self, ns: Namespace, entry: Entry) -> str | None:
        """Why `entry` may not be pinned (no longer current: it names its successor), or None."""
        book = self.book(ns)
        return pin_refusal(
            entry, self.runtime.clock(), successor_of(book.entries() + book.archived(), entry.id)
        )

    def feedback(self, ns: Namespace, ids: Sequence[str], now: datetime) -> None:
        """Hit feedback (hits + 1, last = now) without slowing the turn: queued for the next batch."""
        if not ids:
            return
        op = Touch(ids=tuple(ids), at=format_time(now))
        queue = self.runtime.writer.queue
        if queue is not None:
            queue.push(ns, [op])  # applied with the next write of this namespace (the reply's record)
        else:
            self.apply(ns, [op])


def statement(
    text: str,
    *,
    source: str = "user",
    origin: str | None = None,
    scope: str | None = None,
    type: str | None = None,
    subject: str | None = None,
    pinned: bool = False,
) -> Remember:
    """What a person asked to be remembered, as every edge stores it: the type (identity, preference and
    instruction are resident and protected) and the subject read from the words unless given."""
    found = recognise(text) if subject is None else None
    return Remember(
        text,
        type or classify_type(text),
        subject or (found.subject if found else None),
        source,
        origin,
        scope,
        pinned=pinned,
    )


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + "…"


def _pair(line: str, near: str, before: bool) -> str:
    """A line and the turn next to it, in the order they were said, within SNIPPET_CHARS: the neighbour
    gives up characters first, down to half."""
    near = _cut(near, max(SNIPPET_CHARS - len(line) - len(" → …"), SNIPPET_CHARS // 2))
    return f"{near} → {line}" if before else f"{line} → {near}"


def _content_terms(text: str) -> frozenset[str]:
    """Evidence terms without function-character pairs (的是, 了一): what a snippet must share with the query."""
    return frozenset(t for t in strong_terms(text) if not set(t) <= STOP_CHARS)


def _ids(raw: object) -> list[str] | None:
    if not isinstance(raw, (bytes, str)):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return [str(i) for i in value] if isinstance(value, list) else None


def schedule_flush(runtime: Runtime, ns: Namespace) -> None:
    """Queue one flush of `ns` on the "memory" queue (at most one per namespace per half second)."""
    from rq.exceptions import DuplicateJobError

    bucket = int(time.time() * 2)
    with contextlib.suppress(DuplicateJobError):  # one already queued for this half second covers us
        runtime.queue("memory").enqueue(
            flush_namespace,
            str(ns),
            job_id=f"flush-{ns.key}-{bucket}",
            unique=True,
            result_ttl=0,
            failure_ttl=3600,
            job_timeout=120,
        )


def flush_namespace(ns: str) -> None:
    """RQ job: apply the ops queued for `ns` without a waiting submitter."""
    from .runtime import current  # the runtime imports this module

    current().writer.flush(Namespace.parse(ns))


def _running(jobs: dict[Namespace, threading.Thread], ns: Namespace) -> bool:
    job = jobs.get(ns)
    return job is not None and job.is_alive()


def _start(
    jobs: dict[Namespace, threading.Thread], ns: Namespace, name: str, target: Any, *args: Any
) -> None:
    """`target(*args)` on a daemon thread kept in `jobs` (a CLI process exits at once, leaving the rest
    to later runs)."""
    job = threading.Thread(target=target, args=args, name=name, daemon=True)
    jobs[ns] = job
    job.start()
