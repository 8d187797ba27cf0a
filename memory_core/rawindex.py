"""Full-text search over the raw archive: the LoCoMo-tuned recipe (B5) as an incremental index."""

from __future__ import annotations

import io
import json
import re
import zipfile
from bisect import bisect_left, bisect_right
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from .entry import as_utc
from .errors import StaleIndex
from .lineformat import RawMessage
from .policy import HAN, KANA
from .textindex import (
    RRF_K,
    TOKENIZER_VERSION,
    BM25Index,
    Embedder,
    FloatArray,
    Fusion,
    minmax,
    rrf,
    tokenize,
    top_slots,
)
from .timeexpr import asks_when, date_words, resolved_dates, says_when, written_dates

FORMAT_VERSION = 1
RAW_CACHE = "raw"  # the saved index's cache name (`Store.save_cache`)
K1, B = 0.9, 0.5  # LoCoMo B5; once the context is in, the whole k1/b grid lies within ±0.7 R@10
PREV_WEIGHT, NEXT_WEIGHT, WINDOW = 0.6, 0.3, 2
SPEAKER_BOOST = 0.3  # × the best score; the gain flattens from 0.2 up
#: × the best score, for turns that say when ("last week") under a question that asks "when"; chosen on
#: LoCoMo's training folds (docs/BENCHMARKS.md, "Temporal expressions"), 0.5 loses what 0.2 gains.
TIME_BOOST = 0.2
#: How `own_bag` reads dates (2: Chinese; 3: 上上周, 半年; 4: May 2, 6号; 5: 2023-05-02), in the cache recipe:
#: a change rebuilds.
DATES_VERSION = 5
#: Hybrid mix: w·minmax(cosine) + (1−w)·minmax(bm25). Lexical is the stronger signal on raw turns, so
#: the vector only corrects it: w 0.2–0.4 is a plateau on LoCoMo dev, 0.5 loses R@5; 0.3 is its middle.
DENSE_WEIGHT = 0.3
#: How the two rankings are mixed: "minmax" (the weighted sum above) or "rrf" (textindex.rrf, ranks only).
FUSION: Fusion = "minmax"
DENSE_CONTEXT = 0.3  # a vector is mixed with its ±1 neighbours' vectors: context without re-embedding
CANDIDATES = 100
BULK_CHUNK = 16_384
_WORD = re.compile(r"[a-z0-9]+")
#: A `RawMessage`'s fields in order (`RawMessage(*row)` makes it again).
_Row = tuple[str, datetime, str, str, str, str, str, str, tuple[tuple[str, str], ...]]
_NGRAM = re.compile(f"[{KANA}{HAN}]+")


@dataclass(frozen=True)
class RawHit:
    id: str
    score: float
    speaker: str
    ts: datetime
    text: str
    chat: str
    chat_type: str
    session: str


def session_key(msg: RawMessage) -> str:
    """The session a message belongs to: its own, else its chat and UTC calendar day."""
    return msg.session or f"{msg.chat}@{as_utc(msg.ts):%Y-%m-%d}"


def own_bag(msg: RawMessage) -> Counter[str]:
    """A message's own terms: its text, speaker and date, plus the dates its text writes or its relative
    expressions point at (`timeexpr.date_words`), so "in June" or 5月2日 questions find it."""
    ts = as_utc(msg.ts)
    bag = Counter(tokenize(msg.text))
    bag.update(tokenize(msg.speaker))
    bag.update(tokenize(date_words(ts)))
    for when in resolved_dates(msg.text, ts):
        bag.update(tokenize(date_words(when, day=False)))
    for written in written_dates(msg.text, ts):
        bag.update(tokenize(written))
    return bag


def query_terms(query: str) -> list[str]:
    """A query's tokens plus the canonical words of the dates it writes (5月2日, May 2nd → may, 2),
    each added once and only if the query's own tokens lack it."""
    terms = tokenize(query)
    seen = set(terms)
    for written in written_dates(query):
        for word in tokenize(written):
            if word not in seen:
                seen.add(word)
                terms.append(word)
    return terms


class _Grow:
    """A numpy int32 column that grows by doubling, parallel to index slots."""

    def __init__(self) -> None:
        self.data = np.full(1024, -1, dtype=np.int32)

    def set(self, i: int, value: int) -> None:
        if i >= self.data.size:
            self.data = np.concatenate([self.data, np.full(self.data.size, -1, dtype=np.int32)])
        self.data[i] = value


class RawIndex:
    """Search index over `RawMessage` values. Not thread-safe: one writer, no query during a write."""

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        dense_weight: float = DENSE_WEIGHT,
        fusion: Fusion = FUSION,
        rrf_k: float = RRF_K,
    ) -> None:
        self.embedder = embedder
        self.dense_weight = dense_weight
        self.fusion: Fusion = fusion
        self.rrf_k = rrf_k
        self._bm25 = BM25Index(k1=K1, b=B)
        # Each message as a plain tuple of its fields: once the cycle collector sees that a tuple holds only
        # strings, times and tuples, it stops tracking it (a RawMessage it would walk at every full
        # collection, with all its fields: two thirds of a worker's objects at 200,000 messages).
        self._msgs: list[_Row | None] = []
        self._session_ids: dict[str, int] = {}
        self._seq: list[list[int]] = []  # per session: slots ordered by (ts, arrival)
        self._seq_ts: list[list[float]] = []
        # slot -> the previous / next slot of its session (-1 at an end): a window is read in O(1), and a
        # late message is linked in without renumbering every later one (that was linear in the session).
        self._prev = _Grow()
        self._next = _Grow()
        self._sess = _Grow()
        self._spk = _Grow()
        self._timed = np.zeros(1024, dtype=bool)  # slot -> its own words say when ("yesterday")
        self._speaker_ids: dict[str, int] = {}
        self._speaker_names: list[tuple[frozenset[str], str]] = []  # (latin words, CJK part)
        self._own: OrderedDict[int, Counter[str]] = OrderedDict()  # LRU: recent messages gain neighbours
        self._vec: npt.NDArray[np.float32] | None = None
        self._has_vec = np.zeros(1024, dtype=bool)
        self.last_id: str | None = None

    def __len__(self) -> int:
        return len(self._bm25)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._bm25

    def _own_bag(self, slot: int) -> Counter[str]:
        bag = self._own.get(slot)
        if bag is None:
            bag = self._own[slot] = own_bag(self._msg(slot))
            if len(self._own) > 4096:
                self._own.popitem(last=False)
        else:
            self._own.move_to_end(slot)
        return bag

    def _window(self, slot: int) -> list[tuple[int, float]]:
        out = [(slot, 1.0)]
        before = after = slot
        for _ in range(WINDOW):
            if before >= 0 and (before := int(self._prev.data[before])) >= 0:
                out.append((before, PREV_WEIGHT))
            if after >= 0 and (after := int(self._next.data[after])) >= 0:
                out.append((after, NEXT_WEIGHT))
        return out

    def _doc_bag(self, slot: int) -> dict[str, float]:
        doc: dict[str, float] = {}
        for other, weight in self._window(slot):
            for term, tf in self._own_bag(other).items():
                doc[term] = doc.get(term, 0.0) + weight * tf
        return doc

    def _place(self, msg: RawMessage) -> int:
        """Record a message and insert it into its session's order; returns its slot."""
        slot = len(self._msgs)
        self._msgs.append(
            (msg.id, msg.ts, msg.speaker, msg.text, msg.chat, msg.chat_type, msg.role, msg.session, msg.extra)
        )
        key = session_key(msg)
        sid = self._session_ids.get(key)
        if sid is None:
            sid = self._session_ids[key] = len(self._seq)
            self._seq.append([])
            self._seq_ts.append([])
        seq, seq_ts = self._seq[sid], self._seq_ts[sid]
        ts = as_utc(msg.ts).timestamp()
        p = bisect_right(seq_ts, ts)
        before, after = (seq[p - 1] if p else -1), (seq[p] if p < len(seq) else -1)
        seq.insert(p, slot)  # a C-level move of pointers; the Python work per insert stays constant
        seq_ts.insert(p, ts)
        self._prev.set(slot, before)
        self._next.set(slot, after)
        if before >= 0:
            self._next.set(before, slot)
        if after >= 0:
            self._prev.set(after, slot)
        self._sess.set(slot, sid)
        self._grow_masks(slot + 1)
        self._timed[slot] = says_when(msg.text)
        name = msg.speaker.strip().casefold()
        spk = self._speaker_ids.get(name)
        if spk is None:
            spk = self._speaker_ids[name] = len(self._speaker_names)
            cjk = "".join(_NGRAM.findall(name))
            self._speaker_names.append((frozenset(_WORD.findall(name)), cjk))
        self._spk.set(slot, spk)
        self.last_id = msg.id
        return slot

    def _grow_masks(self, n: int) -> None:
        self._has_vec, self._timed = _grown(self._has_vec, n), _grown(self._timed, n)

    def _neighbours(self, slot: int) -> list[int]:
        return [other for other, _ in self._window(slot)[1:]]

    def add(self, msg: RawMessage) -> bool:
        """Index one message; its neighbours' documents are updated in place. A known id is ignored (the
        archive is append-only, so the same id means the same message); returns whether it was added."""
        if msg.id in self._bm25:
            return False
        slot = self._place(msg)
        got = self._bm25.add(msg.id, self._doc_bag(slot))
        assert got == slot, "index slots and message slots move together"
        for other in self._neighbours(slot):
            self._bm25.update(self._msg(other).id, self._doc_bag(other))
        return True

    def add_many(self, msgs: Iterable[RawMessage]) -> int:
        """Index a batch (a rebuild or an import) with vectorised bulk inserts; returns how many were new."""
        added = 0
        chunk: list[RawMessage] = []
        for msg in msgs:
            chunk.append(msg)
            if len(chunk) == BULK_CHUNK:
                added += self._add_chunk(chunk)
                chunk = []
        return added + self._add_chunk(chunk)

    def _add_chunk(self, msgs: list[RawMessage]) -> int:
        if len(msgs) < 16:  # a live trickle: the vectorised set-up would cost more than it saves
            return sum(self.add(m) for m in msgs)
        fresh: list[int] = []
        seen: set[str] = set()
        for msg in msgs:
            if msg.id not in self._bm25 and msg.id not in seen:
                seen.add(msg.id)
                fresh.append(self._place(msg))
        if not fresh:
            return 0
        new = set(fresh)
        # Flatten every source bag once (CSR by source), then list (target, source, weight) triples from
        # each new document's window and expand them into rows with numpy.
        src_of: dict[int, int] = {}
        terms: list[npt.NDArray[np.int64]] = []
        tfs: list[FloatArray] = []
        pair_doc: list[int] = []
        pair_src: list[int] = []
        pair_w: list[float] = []
        for col, slot in enumerate(fresh):
            for src, w in self._window(slot):
                si = src_of.get(src)
                if si is None:
                    si = src_of[src] = len(terms)
                    # Bulk messages bypass the LRU, which is for the live tail.
                    bag = own_bag(self._msg(src)) if src in new else self._own_bag(src)
                    terms.append(np.fromiter(map(self._bm25.term_id, bag), dtype=np.int64, count=len(bag)))
                    tfs.append(np.fromiter(bag.values(), dtype=np.float64, count=len(bag)))
                pair_doc.append(col)
                pair_src.append(si)
                pair_w.append(w)
        lengths = np.fromiter((t.size for t in terms), dtype=np.int64, count=len(terms))
        ptr = np.concatenate([[0], np.cumsum(lengths)])
        psrc = np.asarray(pair_src, dtype=np.int64)
        counts = lengths[psrc]
        rows = np.repeat(ptr[psrc] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        rows += np.arange(rows.size)
        vocab = self._bm25.vocabulary_size
        pair_key = (
            np.repeat(np.asarray(pair_doc, dtype=np.int64), counts) * vocab + np.concatenate(terms)[rows]
        )
        weight = np.concatenate(tfs)[rows] * np.repeat(np.asarray(pair_w), counts)
        uniq, inverse = np.unique(pair_key, return_inverse=True)
        first = self._bm25.add_flat(
            [self._msg(s).id for s in fresh],
            uniq // vocab,
            uniq % vocab,
            np.bincount(inverse, weights=weight).astype(np.float64),
        )
        assert fresh == list(range(first, first + len(fresh)))
        for slot in sorted({o for s in fresh for o in self._neighbours(s)} - new):
            self._bm25.update(self._msg(slot).id, self._doc_bag(slot))
        return len(fresh)

    def context(self, msg_id: str) -> list[RawMessage]:
        """The turns around `msg_id` whose words count toward its score (search explains a hit by them)."""
        slot = self._bm25.slot_of(msg_id)
        if slot is None:
            return []
        return [self._msg(other) for other, _ in self._window(slot)[1:]]

    def adjacent(self, msg_id: str) -> list[tuple[RawMessage, bool]]:
        """The turns just before and after `msg_id` in its session, each with whether it came before
        (where active recall looks for the request's words when the line itself lacks them)."""
        slot = self._bm25.slot_of(msg_id)
        if slot is None:
            return []
        around = ((int(self._prev.data[slot]), True), (int(self._next.data[slot]), False))
        return [(self._msg(o), before) for o, before in around if o >= 0]

    def remove(self, msg_id: str) -> bool:
        """Drop a message (a purge); its neighbours close ranks over the gap. Returns whether it was there."""
        slot = self._bm25.slot_of(msg_id)
        if slot is None:
            return False
        neighbours = self._neighbours(slot)
        sid = int(self._sess.data[slot])
        seq, seq_ts = self._seq[sid], self._seq_ts[sid]
        p = seq.index(slot, bisect_left(seq_ts, as_utc(self._msg(slot).ts).timestamp()))
        del seq[p], seq_ts[p]
        before, after = int(self._prev.data[slot]), int(self._next.data[slot])
        if before >= 0:
            self._next.set(before, after)
        if after >= 0:
            self._prev.set(after, before)
        self._bm25.remove(msg_id)
        self._msgs[slot] = None
        self._own.pop(slot, None)
        self._sess.set(slot, -1)
        if slot < self._has_vec.size:
            self._has_vec[slot] = False
        for other in neighbours:
            self._bm25.update(self._msg(other).id, self._doc_bag(other))
        return True

    def problems(self) -> list[str]:
        """Broken links in the structure (empty when sound): session order against prev/next links, and
        every posting linked back to its place in its document."""
        out = self._bm25.problems()
        for sid, seq in enumerate(self._seq):
            for i, slot in enumerate(seq):
                before = seq[i - 1] if i else -1
                after = seq[i + 1] if i + 1 < len(seq) else -1
                if (int(self._prev.data[slot]), int(self._next.data[slot])) != (before, after):
                    out.append(f"session {sid}: slot {slot} is linked out of order")
        return out

    def _msg(self, slot: int) -> RawMessage:
        row = self._msgs[slot]
        assert row is not None
        return RawMessage(*row)

    def _named_speakers(self, query: str) -> list[int]:
        q = query.casefold()
        words = set(_WORD.findall(q))
        return [
            spk
            for spk, (name_words, cjk) in enumerate(self._speaker_names)
            if (name_words or cjk) and name_words <= words and (not cjk or cjk in q)
        ]

    def search(
        self,
        query: str,
        k: int = 10,
        exclude_session: str | None = None,
        query_vector: npt.NDArray[np.float32] | None = None,
        dense_floor: float | None = None,
    ) -> list[RawHit]:
        """The `k` best messages for `query`, best first (ties to the earlier message); hybrid when messages
        have vectors and a `query_vector` is given (or `embedder` makes one). A message found by its
        vector alone must reach `dense_floor` (memory_core.floor)."""
        scores = self._bm25.score_array(query_terms(query))
        n = scores.size
        if exclude_session is not None:
            sid = self._session_ids.get(exclude_session)
            if sid is not None:
                scores[self._sess.data[:n] == sid] = 0.0
        best = float(scores.max()) if n else 0.0
        named = self._named_speakers(query) if best > 0 else []
        if named:
            # Only messages with evidence are lifted, so a name alone never conjures results.
            lift = np.isin(self._spk.data[:n], named) & (scores > 0)
            scores[lift] += SPEAKER_BOOST * best
        if asks_when(query):
            # A "when" question is answered by the turn that says when; again only turns with evidence.
            scores[self._timed[:n] & (scores > 0)] += TIME_BOOST * float(scores.max())
        if self._vec is not None and self._has_vec.any():
            if query_vector is None and self.embedder is not None:
                query_vector = np.asarray(self.embedder([query], "query"), dtype=np.float32)
            if query_vector is not None:
                return self._hybrid(query_vector.reshape(-1), scores, k, exclude_session, dense_floor)
        return [self._hit(int(s), float(scores[s])) for s in top_slots(scores, k)]

    def _hybrid(
        self,
        q: npt.NDArray[np.float32],
        lexical: FloatArray,
        k: int,
        exclude_session: str | None,
        floor: float | None,
    ) -> list[RawHit]:
        assert self._vec is not None
        n = lexical.size
        usable = self._has_vec[:n] & (self._sess.data[:n] >= 0)
        if exclude_session is not None and exclude_session in self._session_ids:
            usable &= self._sess.data[:n] != self._session_ids[exclude_session]
        m = min(n, self._vec.shape[0])
        dense = np.full(n, -np.inf, dtype=np.float32)
        dense[:m] = self._vec[:m] @ q  # one mat-vec over the stored rows: no copy of the matrix
        dense[~usable] = -np.inf
        if floor is not None:
            usable &= dense >= floor
        dense_top = np.argsort(-dense, kind="stable")[: min(CANDIDATES, int(usable.sum()))]
        cand = np.union1d(top_slots(lexical, CANDIDATES), dense_top)
        if cand.size == 0:
            return []
        cosine = self._context_cosines(cand, q)
        if self.fusion == "rrf":
            lex = lexical[cand]
            fused = rrf(
                [np.where(np.isnan(cosine), -np.inf, cosine), np.where(lex > 0, lex, -np.inf)],
                [self.dense_weight, 1.0 - self.dense_weight],
                k=self.rrf_k,
            )
            order = np.lexsort((cand, -fused))[:k]
            return [self._hit(int(cand[i]), float(fused[i])) for i in order]
        cosine = np.where(np.isnan(cosine), np.nanmin(cosine) if np.isfinite(cosine).any() else 0.0, cosine)
        fused = self.dense_weight * minmax(cosine) + (1.0 - self.dense_weight) * minmax(lexical[cand])
        order = np.lexsort((cand, -fused))[:k]
        return [self._hit(int(cand[i]), float(fused[i])) for i in order]

    def _context_cosines(self, slots: npt.NDArray[np.intp], q: npt.NDArray[np.float32]) -> FloatArray:
        """Per slot, the cosine of its vector mixed with its neighbours' (NaN: no vector yet)."""
        assert self._vec is not None
        rows = self._vec.shape[0]
        has = np.zeros(slots.size, dtype=bool)
        inside = slots < rows
        has[inside] = self._has_vec[slots[inside]]
        v = np.zeros((slots.size, self._vec.shape[1]))
        v[has] = self._vec[slots[has]]
        for link in (self._prev, self._next):
            other = link.data[slots].astype(np.intp)
            ok = has & (other >= 0) & (other < rows)
            ok[ok] = self._has_vec[other[ok]]
            v[ok] += DENSE_CONTEXT * self._vec[other[ok]]
        norms = np.linalg.norm(v, axis=1)
        out = (v @ q.astype(np.float64)) / np.where(norms > 0, norms, 1.0)
        out[~has] = np.nan
        return out

    def _hit(self, slot: int, score: float) -> RawHit:
        m = self._msg(slot)
        return RawHit(m.id, score, m.speaker, m.ts, m.text, m.chat, m.chat_type, session_key(m))

    def embed_pending(self, batch: int = 32, limit: int | None = None) -> int:
        """Embed messages that have no vector yet with `embedder` (oldest first); returns how many."""
        if self.embedder is None:
            return 0
        slots, texts = self.unembedded(limit)
        for lo in range(0, len(slots), batch):
            chunk = slots[lo : lo + batch]
            self.set_vectors(chunk, np.asarray(self.embedder(texts[lo : lo + batch], "passage")))
        return len(slots)

    def unembedded(self, limit: int | None = None) -> tuple[list[int], list[str]]:
        """The slots of messages without a vector (oldest first) and the passage text each is embedded as
        (speaker and words); embed them outside any lock, then `set_vectors`."""
        n = len(self._msgs)
        todo = np.flatnonzero(~self._has_vec[:n] & (self._sess.data[:n] >= 0))[:limit].tolist()
        return todo, [f"{self._msg(s).speaker}: {self._msg(s).text}" for s in todo]

    def set_vectors(self, slots: list[int], vecs: npt.ArrayLike) -> None:
        """Vectors for `slots` (as `unembedded` gave them; a slot removed since is skipped)."""
        got = np.asarray(vecs, dtype=np.float32).reshape(len(slots), -1)
        if self._vec is not None and self._vec.shape[1] != got.shape[1]:
            self.drop_vectors()  # another embedder's width: its vectors cannot be mixed with these
        n = len(self._msgs)
        if self._vec is None or self._vec.shape[0] < n:
            rows = max(n, 1024, 2 * (0 if self._vec is None else self._vec.shape[0]))
            grown = np.zeros((rows, got.shape[1]), dtype=np.float32)
            if self._vec is not None:
                grown[: self._vec.shape[0]] = self._vec
            self._vec = grown
        live = [i for i, s in enumerate(slots) if s < n and self._msgs[s] is not None]
        at = np.asarray([slots[i] for i in live], dtype=np.intp)
        self._vec[at] = got[live]
        self._has_vec[at] = True

    def vectors_held(self) -> tuple[bool, bool]:
        """(some messages have a vector, some live ones have none yet)."""
        n = len(self._msgs)
        held = self._has_vec[:n]
        return bool(held.any()), bool((~held & (self._sess.data[:n] >= 0)).any())

    def drop_vectors(self) -> None:
        """Forget every vector (the embedder changed): search is lexical until they are embedded again."""
        self._vec = None
        self._has_vec[:] = False

    def manifest(self) -> dict[str, object]:
        return {
            "format": FORMAT_VERSION,
            "tokenizer": TOKENIZER_VERSION,
            "recipe": [K1, B, PREV_WEIGHT, NEXT_WEIGHT, WINDOW, DATES_VERSION],
            "count": len(self),
            "slots": len(self._msgs),
            "last_id": self.last_id,
        }

    def dump(self) -> dict[str, bytes]:
        """The derived cache as files (JSON + npz, no pickle), for `Store.save_cache` with `manifest()`."""
        msgs = [None if m is None else [m[0], m[1].isoformat(), *m[2:]] for m in self._msgs]
        arrays = self._bm25.export_arrays()
        if self._vec is not None:
            arrays["vectors"] = self._vec[: len(self._msgs)]
            arrays["has_vec"] = self._has_vec[: len(self._msgs)]
        npz = io.BytesIO()
        np.savez(npz, allow_pickle=False, **arrays)
        return {
            "messages.json": json.dumps(msgs).encode("ascii"),
            "terms.json": json.dumps(self._bm25.terms).encode("ascii"),
            "index.npz": npz.getvalue(),
        }

    @classmethod
    def restore(
        cls, manifest: Mapping[str, Any], read: Callable[[str], bytes], embedder: Embedder | None = None
    ) -> RawIndex:
        """The index `dump` wrote, its files read with `read(name)`. Raises StaleIndex if they are missing,
        torn or of another version."""
        fresh = cls(embedder)
        expected = fresh.manifest()
        for field in ("format", "tokenizer", "recipe"):
            if manifest.get(field) != expected[field]:
                raise StaleIndex(f"index cache has another {field}: {manifest.get(field)!r}")
        try:
            msgs = json.loads(read("messages.json").decode("ascii"))
            terms = json.loads(read("terms.json").decode("ascii"))
            with np.load(io.BytesIO(read("index.npz")), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
            for row in msgs:
                if row is None:
                    fresh._place_removed()
                else:
                    mid, ts, speaker, text, chat, chat_type, role, session, extra = row
                    pairs = tuple((str(a), str(b)) for a, b in extra)
                    when = datetime.fromisoformat(ts)
                    fresh._place(RawMessage(mid, when, speaker, text, chat, chat_type, role, session, pairs))
            keys = [None if m is None else m[0] for m in fresh._msgs]
            fresh._bm25 = BM25Index.from_arrays(terms, keys, arrays)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            raise StaleIndex(f"index cache is unreadable: {exc}") from exc
        if len(fresh) != manifest.get("count") or len(fresh._msgs) != manifest.get("slots"):
            raise StaleIndex("index cache does not match its manifest")
        if "vectors" in arrays:
            fresh._vec = np.ascontiguousarray(arrays["vectors"], dtype=np.float32)
            fresh._has_vec = np.asarray(arrays["has_vec"], dtype=bool).copy()
        last = manifest.get("last_id")
        fresh.last_id = last if isinstance(last, str) else None
        if "vectors" in arrays:
            fresh._grow_masks(len(fresh._msgs))
        return fresh

    def _place_removed(self) -> None:
        self._grow_masks(len(self._msgs) + 1)
        self._msgs.append(None)
        self._prev.set(len(self._msgs) - 1, -1)
        self._next.set(len(self._msgs) - 1, -1)
        self._sess.set(len(self._msgs) - 1, -1)
        self._spk.set(len(self._msgs) - 1, -1)


def _grown(mask: npt.NDArray[np.bool_], n: int) -> npt.NDArray[np.bool_]:
    """`mask` with room for `n` slots (doubling, so appends stay amortised O(1))."""
    return mask if n <= mask.size else np.concatenate([mask, np.zeros(max(n, mask.size), dtype=bool)])
