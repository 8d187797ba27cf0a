"""Lexical relevance for memory: one tokenizer for Chinese, English and mixed text, and an incremental BM25."""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from array import array
from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import snowballstemmer

from .policy import HAN, KANA

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]
Bag = Mapping[str, float]

#: Bump when `tokenize` changes what it emits: derived indexes built by an older tokenizer are stale.
TOKENIZER_VERSION = 1

#: The 155-word English list of `research/benchmarks.md` §3 (question words and contraction stubs included).
STOPWORDS = frozenset(
    """
a about above after again against all am an and any are as at be because been
before being below between both but by can could did do does doing down during
each few for from further had has have having he her here hers herself him
himself his how i if in into is it its itself just me more most my myself no nor
not of off on once only or other our ours ourselves out over own same she should
so some such than that the their theirs them themselves then there these they
this those through to too under until up very was we were what when where which
while who whom why will with would you your yours yourself yourselves also yet
s t d ll m re ve don didn doesn isn wasn weren hasn haven hadn won wouldn
couldn shouldn im ive id youre its thats whats dont cant
""".split()  # noqa: SIM905 -- the list as printed in benchmarks.md, easy to compare
)

#: The 49 stop characters of the MADial recipe: removed *before* forming n-grams (+7 to +8.5 R@10 on dev).
STOP_CHARS = frozenset(
    "的了是我你他她它们在吗呢啊吧呀哦哈嘛么很也都就和与及或有这那个一不没要会能可以还又再把被给让对着过"
)
_STOP_TABLE = {ord(ch): None for ch in STOP_CHARS}

# Kana is treated like Han (no spaces between words); Hangul and other scripts are space-separated words.
_NGRAM_CHARS = KANA + HAN
_TOKEN_RE = re.compile(rf"([{_NGRAM_CHARS}]+)|([a-z0-9]+)|([^\W_a-z0-9{_NGRAM_CHARS}]+)")
_COMBINING_ACCENTS = re.compile("[\u0300-\u036f]+")
# Snowball on a 5,000-character blob is wasted work and would bloat the stem cache.
_MAX_STEM_LEN = 40

_stemmer = snowballstemmer.stemmer("english")
_stem_lock = threading.Lock()  # a Snowball stemmer object keeps state between calls
_stem_cache: dict[str, str] = {}


def _stem(word: str) -> str:
    # Pure-Python Snowball costs ~27 µs a word; chat vocabulary repeats, so a cache makes it ~free.
    hit = _stem_cache.get(word)
    if hit is not None:
        return hit
    # Snowball keeps digits as they are.
    stemmed = word if len(word) > _MAX_STEM_LEN or word.isdigit() else None
    if stemmed is None:
        with _stem_lock:
            stemmed = str(_stemmer.stemWord(word))
    if len(_stem_cache) >= 200_000:
        _stem_cache.clear()
    _stem_cache[word] = stemmed
    return stemmed


def _fold(text: str) -> str:
    if text.isascii():
        return text.lower()
    # NFKC maps full-width Ａ１ to A1; the NFKD detour drops Latin accents (café → cafe) and then recomposes
    # everything else (kana voicing marks, Hangul) so other scripts keep their characters.
    decomposed = _COMBINING_ACCENTS.sub("", unicodedata.normalize("NFKD", text))
    return unicodedata.normalize("NFKC", decomposed).casefold()


def tokenize(text: str) -> list[str]:
    """Index and query tokens of `text`, in any mix of Chinese, English and other scripts."""
    out: list[str] = []
    for cjk, word, other in _TOKEN_RE.findall(_fold(text)):
        if word:
            if word not in STOPWORDS:
                out.append(_stem(word))
        elif cjk:
            run = cjk.translate(_STOP_TABLE)
            out.extend(run)
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
        else:
            out.append(other)
    return out


@lru_cache(maxsize=8192)
def _cached_tokens(text: str) -> tuple[str, ...]:
    # Memory entries are re-scored on every turn; their text rarely changes.
    return tuple(tokenize(text))


class Embedder(Protocol):
    """A sentence embedder: L2-normalised vectors, one row per text (e5 'query'/'passage' conventions)."""

    def __call__(self, texts: list[str], kind: Literal["query", "passage"]) -> npt.NDArray[np.floating]: ...


def top_slots(scores: FloatArray, k: int) -> IndexArray:
    """Positions of the `k` highest positive scores, best first, ties to the lower position."""
    cand = np.flatnonzero(scores > 0)
    if k <= 0 or cand.size == 0:
        return np.empty(0, dtype=np.intp)
    if cand.size > k:
        vals = scores[cand]
        kth = np.partition(vals, vals.size - k)[vals.size - k]
        cand = cand[vals >= kth]
    order = np.lexsort((cand, -scores[cand]))
    return cand[order][:k]


def normalised(scores: npt.ArrayLike) -> FloatArray:
    """BM25 scores → relevance in [0, 1], dividing by the best score among the candidates."""
    s = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    s = np.clip(s, 0.0, None)
    top = float(s.max()) if s.size else 0.0
    return s / top if top > 0 else np.zeros_like(s)


def minmax(values: npt.ArrayLike) -> FloatArray:
    """Scale to [0, 1] over the candidates; a constant input maps to 1 where positive, else 0."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return v
    lo, hi = float(v.min()), float(v.max())
    if hi > lo:
        return (v - lo) / (hi - lo)
    return np.where(v > 0, 1.0, 0.0)


#: Reciprocal rank fusion constant: a candidate's share from one list is 1 / (RRF_K + rank).
RRF_K = 60.0
Fusion = Literal["minmax", "rrf"]


def rrf(lists: Sequence[npt.ArrayLike], weights: Sequence[float], k: float = RRF_K) -> FloatArray:
    """Reciprocal rank fusion of score lists over the same candidates, scaled to [0, 1]. Equal scores share
    a rank (the best of their places): a tie in one list is left for the others to decide, not decided by
    the candidates' order."""
    out: FloatArray | None = None
    for values, w in zip(lists, weights, strict=True):
        v = np.asarray(values, dtype=np.float64)
        if out is None:
            out = np.zeros(v.size, dtype=np.float64)
        present = np.isfinite(v)
        order = np.argsort(-np.where(present, v, -np.inf), kind="stable")
        ordered = v[order]
        first = np.r_[True, ordered[1:] != ordered[:-1]] if v.size else np.zeros(0, dtype=bool)
        rank = np.empty(v.size, dtype=np.float64)
        rank[order] = np.maximum.accumulate(np.where(first, np.arange(v.size), 0)) + 1
        out += np.where(present, w / (k + rank), 0.0)
    if out is None:
        return np.zeros(0, dtype=np.float64)
    best = sum(weights) / (k + 1.0)
    return out / best if best > 0 else out


#: Memory-relevance BM25 parameters, chosen on MADial zh dev (M2): long queries against one-line memories.
ENTRY_K1 = 1.0
ENTRY_B = 0.3
#: Cosine weight when vectors are given (DESIGN §5: 0.7 × cosine + 0.3 × BM25).
ENTRY_DENSE_WEIGHT = 0.7


def entry_relevance(
    query: str,
    texts: Sequence[str],
    *,
    query_vector: npt.ArrayLike | None = None,
    entry_vectors: npt.ArrayLike | None = None,
    dense_weight: float = ENTRY_DENSE_WEIGHT,
    fusion: Fusion = "minmax",
) -> list[float]:
    """Relevance in [0, 1] of each memory text to `query`: the relevance term of memory recall."""
    if not texts:
        return []
    index = BM25Index(k1=ENTRY_K1, b=ENTRY_B)
    for i, text in enumerate(texts):
        index.add(i, Counter(_cached_tokens(text)))
    lexical = normalised(index.score_array(_cached_tokens(query)))
    if query_vector is None or entry_vectors is None:
        return [float(x) for x in lexical]
    mat = np.asarray(entry_vectors, dtype=np.float64).reshape(len(texts), -1)
    cosine = mat @ np.asarray(query_vector, dtype=np.float64).reshape(-1)
    if fusion == "rrf":
        lex = np.where(lexical > 0, lexical, -np.inf)
        mixed = rrf([cosine, lex], [dense_weight, 1.0 - dense_weight])
    else:
        mixed = dense_weight * minmax(cosine) + (1.0 - dense_weight) * lexical
    return [float(x) for x in mixed]


def _ints(buf: bytes | bytearray) -> memoryview:
    """A document's int32 column as ints (writable for a bytearray)."""
    return memoryview(buf).cast("i")


class BM25Index:
    """Okapi BM25 over weighted term bags, incremental and fast at a few hundred thousand documents."""

    def __init__(
        self, k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25, min_idf: float | None = 1e-3
    ) -> None:
        self.k1 = k1
        self.b = b
        self.epsilon = epsilon
        self.min_idf = min_idf
        self._vocab: dict[str, int] = {}
        self._terms: list[str] = []
        self._p_slot: list[array[int]] = []
        self._p_tf: list[array[float]] = []
        self._p_back: list[array[int]] = []
        self._df = np.zeros(1024, dtype=np.int64)
        self._keys: list[Hashable | None] = []
        self._slot: dict[Hashable, int] = {}
        # A document's term ids and its postings' places, int32 in bytes (terms: replaced whole) and a
        # bytearray (places: moved in place), which the cycle collector does not track; array.array it does
        # (two a document were 45 % of a worker's tracked objects, though cheap to walk: docs/BENCHMARKS.md).
        self._doc_terms: list[bytes | None] = []
        self._doc_pos: list[bytearray | None] = []
        self._dl = np.zeros(1024, dtype=np.float64)
        self._cache: dict[int, tuple[IndexArray, FloatArray]] = {}
        self._cached_postings = 0
        self._version = 0
        self._mean_idf: tuple[int, float] = (-1, 0.0)

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, key: object) -> bool:
        return key in self._slot

    @property
    def slots(self) -> int:
        """Number of slots ever used (removed documents keep theirs, empty)."""
        return len(self._keys)

    @property
    def vocabulary_size(self) -> int:
        """Number of term ids ever issued (ids are dense, 0 ..< vocabulary_size)."""
        return len(self._terms)

    @property
    def terms(self) -> list[str]:
        """The vocabulary in id order (a copy)."""
        return list(self._terms)

    def problems(self) -> list[str]:
        """Broken cross-links between postings and documents (empty when sound): the pairing that keeps a
        removal O(1). Walks the whole index, for tests and doctor-style checks."""
        out: list[str] = []
        seen = 0
        for t, (slots, backs) in enumerate(zip(self._p_slot, self._p_back, strict=True)):
            if len(slots) != len(backs) or len(slots) != len(self._p_tf[t]) or self._df[t] != len(slots):
                out.append(f"term {t}: posting columns disagree")
                continue
            for p, (slot, back) in enumerate(zip(slots, backs, strict=True)):
                doc_terms, doc_pos = self._doc_terms[slot], self._doc_pos[slot]
                if doc_terms is None or doc_pos is None or not 0 <= back < len(doc_terms) // 4:
                    out.append(f"term {t} posting {p}: slot {slot} has no such term position {back}")
                    continue
                if _ints(doc_terms)[back] != t or _ints(doc_pos)[back] != p:
                    out.append(f"term {t} posting {p}: slot {slot} points elsewhere")
            seen += len(slots)
        held = sum(len(a) // 4 for a in self._doc_terms if a is not None)
        if held != seen:
            out.append(f"documents hold {held} postings, terms {seen}")
        return out

    def slot_of(self, key: Hashable) -> int | None:
        return self._slot.get(key)

    def term_id(self, term: str) -> int:
        """The id of `term`, interned on first sight."""
        t = self._vocab.get(term)
        if t is None:
            t = len(self._terms)
            self._vocab[term] = t
            self._terms.append(term)
            self._p_slot.append(array("i"))
            self._p_tf.append(array("f"))
            self._p_back.append(array("i"))
            if t >= self._df.size:
                self._df = np.concatenate([self._df, np.zeros(self._df.size, dtype=np.int64)])
        return t

    def term_ids(self, terms: Sequence[str]) -> npt.NDArray[np.int64]:
        """`term_id` of each of `terms` (one dict lookup each, in C; new terms interned once)."""
        vocab = self._vocab
        for term in dict.fromkeys(terms).keys() - vocab.keys():
            self.term_id(term)
        return np.fromiter(map(vocab.__getitem__, terms), dtype=np.int64, count=len(terms))

    def _new_slots(self, keys: Sequence[Hashable]) -> int:
        """Slots for new documents (their terms are written next); returns the first. Refuses a key already
        indexed or given twice before it changes anything."""
        first = len(self._keys)
        slot = dict(zip(keys, range(first, first + len(keys)), strict=True))
        if len(slot) < len(keys) or not slot.keys().isdisjoint(self._slot):
            raise KeyError("a document is already indexed, or given twice")
        self._slot.update(slot)
        self._keys.extend(keys)
        self._doc_terms.extend([None] * len(keys))
        self._doc_pos.extend([None] * len(keys))
        if len(self._keys) > self._dl.size:
            self._dl = np.concatenate([self._dl, np.zeros(max(self._dl.size, len(keys)), dtype=np.float64)])
        return first

    def _changed(self, t: int) -> None:
        cached = self._cache.pop(t, None)
        if cached is not None:
            self._cached_postings -= cached[0].size

    def add(self, key: Hashable, bag: Bag) -> int:
        """Index a new document; returns its slot. Raises KeyError if `key` is already indexed."""
        slot = self._new_slots([key])
        self._write(slot, bag)
        return slot

    def update(self, key: Hashable, bag: Bag) -> None:
        """Replace a document's bag (same slot). Only the terms whose weight changed are touched."""
        self._write(self._slot[key], bag)

    def remove(self, key: Hashable) -> None:
        """Drop a document. Raises KeyError if it is not indexed."""
        slot = self._slot[key]
        self._write(slot, {})
        del self._slot[key]
        self._keys[slot] = None
        self._doc_terms[slot] = None
        self._doc_pos[slot] = None

    def _write(self, slot: int, bag: Bag) -> None:
        old_terms, old_pos = self._doc_terms[slot], self._doc_pos[slot]
        old = dict(zip(_ints(old_terms), _ints(old_pos), strict=True)) if old_terms and old_pos else {}
        new_terms: array[int] = array("i")
        new_pos: array[int] = array("i")
        length = 0.0
        # The hot loop of every message and of its neighbours' updates: locals, no per-term method calls.
        vocab, p_slot, p_tf, p_back, isinf = self._vocab, self._p_slot, self._p_tf, self._p_back, math.isinf
        added: list[int] = []
        edited: list[int] = []
        for term, weight in bag.items():
            w = float(weight)
            if not w >= 0.0 or isinf(w):
                raise ValueError(f"term weight must be finite and >= 0, got {weight!r} for {term!r}")
            if w == 0.0:
                continue
            t = vocab.get(term)
            if t is None:
                t = self.term_id(term)
            length += w
            p = old.pop(t, None)
            tfs = p_tf[t]
            if p is None:
                p = len(tfs)
                p_slot[t].append(slot)
                tfs.append(w)
                p_back[t].append(len(new_terms))
                added.append(t)
            else:
                p_back[t][p] = len(new_terms)
                if abs(tfs[p] - w) > 1e-6 * w:  # tf is stored as float32
                    tfs[p] = w
                    edited.append(t)
            new_terms.append(t)
            new_pos.append(p)
        if added:
            self._df[added] += 1  # a document holds a term once: no repeats in `added`
        if self._cache:
            for t in added + edited:
                self._changed(t)
        for t, p in old.items():
            self._drop_posting(t, p)
        self._doc_terms[slot] = new_terms.tobytes()
        self._doc_pos[slot] = bytearray(new_pos)
        self._dl[slot] = length
        self._version += 1

    def _drop_posting(self, t: int, p: int) -> None:
        # O(1): the back pointer says where the moved posting sits in its document (a search of that
        # document's terms made an out-of-order insert of a long message quadratic: issue 15).
        slots, tfs, backs = self._p_slot[t], self._p_tf[t], self._p_back[t]
        last = len(slots) - 1
        if p != last:
            moved, back = slots[last], backs[last]
            slots[p] = moved
            tfs[p] = tfs[last]
            backs[p] = back
            pos = self._doc_pos[moved]
            assert pos is not None
            _ints(pos)[back] = p
        slots.pop()
        tfs.pop()
        backs.pop()
        self._df[t] -= 1
        self._changed(t)

    def add_flat(
        self,
        keys: Sequence[Hashable],
        doc: npt.NDArray[np.integer],
        term: npt.NDArray[np.integer],
        weight: npt.NDArray[np.floating],
    ) -> int:
        """Bulk-index new documents given as (doc, term id, weight) rows, summed per (doc, term); returns the
        first slot. ~10× faster than `add`: a 200,000-message archive rebuilds in seconds."""
        first = self._new_slots(keys)
        if not keys:
            return first
        order = np.lexsort((doc, term))
        d = np.asarray(doc, dtype=np.int64)[order]
        t = np.asarray(term, dtype=np.int64)[order]
        w = np.asarray(weight, dtype=np.float64)[order]
        keep = w > 0
        d, t, w = d[keep], t[keep], w[keep]
        uniq, starts, counts = np.unique(t, return_index=True, return_counts=True)
        slot32 = (d + first).astype(np.int32)
        tf32 = w.astype(np.float32)
        by_doc = np.argsort(d, kind="stable")
        bounds = np.searchsorted(d[by_doc], np.arange(len(keys) + 1))
        back32 = np.empty(t.size, dtype=np.int32)  # each row's place in its document's term list
        back32[by_doc] = np.arange(t.size) - bounds[d[by_doc]]
        base = np.empty(uniq.size, dtype=np.int64)
        for i, (tid, s, c) in enumerate(zip(uniq.tolist(), starts.tolist(), counts.tolist(), strict=True)):
            base[i] = len(self._p_slot[tid])
            self._p_slot[tid].frombytes(slot32[s : s + c].tobytes())
            self._p_tf[tid].frombytes(tf32[s : s + c].tobytes())
            self._p_back[tid].frombytes(back32[s : s + c].tobytes())
            self._changed(tid)
        self._df[uniq] += counts
        pos = (np.repeat(base - starts, counts) + np.arange(t.size)).astype(np.int32)
        t32, pos32 = t.astype(np.int32)[by_doc], pos[by_doc]
        for i in range(len(keys)):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            self._doc_terms[first + i] = t32[lo:hi].tobytes()
            self._doc_pos[first + i] = bytearray(pos32[lo:hi].tobytes())
        self._dl[first : first + len(keys)] = np.bincount(d, weights=w, minlength=len(keys))
        self._version += 1
        return first

    def _postings(self, t: int) -> tuple[IndexArray, FloatArray]:
        hit = self._cache.get(t)
        if hit is None:
            slots = np.frombuffer(self._p_slot[t], dtype=np.int32).astype(np.intp)
            tfs = np.frombuffer(self._p_tf[t], dtype=np.float32).astype(np.float64)
            if self._cached_postings > 4_000_000:  # bound the mirror: ~64 MB
                self._cache.clear()
                self._cached_postings = 0
            hit = self._cache[t] = (slots, tfs)
            self._cached_postings += slots.size
        return hit

    def _floor_idf(self) -> float:
        # The mean idf over the vocabulary changes with every write; compute it only when a query needs it.
        version, value = self._mean_idf
        if version != self._version:
            df = self._df[: len(self._terms)]
            df = df[df > 0].astype(np.float64)
            n = len(self._slot)
            value = float(np.mean(np.log(n - df + 0.5) - np.log(df + 0.5))) if df.size else 0.0
            self._mean_idf = (self._version, value)
        return self.epsilon * value

    def idf(self, term: str) -> float:
        t = self._vocab.get(term)
        df = int(self._df[t]) if t is not None else 0
        if df == 0:
            return 0.0
        n = len(self._slot)
        value = math.log(n - df + 0.5) - math.log(df + 0.5)
        if value < 0:
            value = self._floor_idf()
        return value if self.min_idf is None else max(value, self.min_idf)

    def score_array(self, query_tokens: Iterable[str]) -> FloatArray:
        """BM25 score of every slot (removed slots score 0). Repeated query terms count repeatedly."""
        scores = np.zeros(len(self._keys), dtype=np.float64)
        n = len(self._slot)
        if n == 0:
            return scores
        avgdl = float(self._dl[: len(self._keys)].sum()) / n
        if avgdl <= 0:
            return scores
        k1, b = self.k1, self.b
        for term, count in Counter(query_tokens).items():
            t = self._vocab.get(term)
            if t is None or self._df[t] == 0:
                continue
            slots, tfs = self._postings(t)
            gain = count * self.idf(term) * (k1 + 1.0)
            scores[slots] += gain * tfs / (tfs + k1 * (1.0 - b + b * self._dl[slots] / avgdl))
        return scores

    def having(self, terms: Iterable[str]) -> npt.NDArray[np.bool_]:
        """Per slot: the document holds at least one of `terms`."""
        out = np.zeros(len(self._keys), dtype=bool)
        for t in {self._vocab.get(term) for term in terms}:
            if t is not None:
                out[self._postings(t)[0]] = True
        return out

    def scores(self, query_tokens: Iterable[str]) -> dict[Hashable, float]:
        """Positive scores by document key (documents without evidence are absent)."""
        arr = self.score_array(query_tokens)
        return {self._keys[int(s)]: float(arr[s]) for s in np.flatnonzero(arr > 0)}

    def top(
        self, query_tokens: Iterable[str], k: int, exclude: Collection[Hashable] = ()
    ) -> list[tuple[Hashable, float]]:
        """The `k` best documents with evidence, best first, ties to the earlier-added document."""
        arr = self.score_array(query_tokens)
        for key in exclude:
            slot = self._slot.get(key)
            if slot is not None:
                arr[slot] = 0.0
        return [(self._keys[int(s)], float(arr[s])) for s in top_slots(arr, k)]

    # -- persistence support (the file format is the caller's; see rawindex)

    def export_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        """Flat arrays of the whole index: enough for `from_arrays` to rebuild it without re-tokenising."""
        lengths = np.fromiter((len(a) for a in self._p_slot), dtype=np.int64, count=len(self._p_slot))
        ptr = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=ptr[1:])
        return {
            "term_ptr": ptr,
            "post_slot": np.frombuffer(b"".join(a.tobytes() for a in self._p_slot), dtype=np.int32),
            "post_tf": np.frombuffer(b"".join(a.tobytes() for a in self._p_tf), dtype=np.float32),
            "dl": self._dl[: len(self._keys)].copy(),
            "params": np.array(
                [self.k1, self.b, self.epsilon, math.nan if self.min_idf is None else self.min_idf],
                dtype=np.float64,
            ),
        }

    @classmethod
    def from_arrays(
        cls,
        terms: Sequence[str],
        keys: Sequence[Hashable | None],
        arrays: Mapping[str, npt.NDArray[np.generic]],
    ) -> BM25Index:
        """Inverse of `export_arrays` (`keys[slot]` is None for a removed slot). Raises ValueError on
        arrays that do not fit together."""
        k1, b, eps, min_idf = (float(x) for x in arrays["params"])
        index = cls(k1=k1, b=b, epsilon=eps, min_idf=None if math.isnan(min_idf) else min_idf)
        ptr = np.asarray(arrays["term_ptr"], dtype=np.int64)
        post_slot = np.asarray(arrays["post_slot"], dtype=np.int32)
        post_tf = np.asarray(arrays["post_tf"], dtype=np.float32)
        dl = np.asarray(arrays["dl"], dtype=np.float64)
        if ptr.size != len(terms) + 1 or ptr[-1] != post_slot.size or post_tf.size != post_slot.size:
            raise ValueError("postings do not match the vocabulary")
        if dl.size != len(keys) or (post_slot.size and int(post_slot.max()) >= len(keys)):
            raise ValueError("postings refer to slots that do not exist")
        for key in keys:
            slot = len(index._keys)
            index._keys.append(key)
            index._doc_terms.append(b"" if key is not None else None)
            index._doc_pos.append(bytearray() if key is not None else None)
            if key is not None:
                index._slot[key] = slot
        index._dl = np.concatenate([dl, np.zeros(max(1024, dl.size), dtype=np.float64)])
        for term in terms:
            index.term_id(term)
        if index.vocabulary_size != len(terms):
            raise ValueError("the vocabulary repeats a term")
        lengths = np.diff(ptr)
        index._df[: len(terms)] = lengths
        for t in np.flatnonzero(lengths).tolist():
            lo, hi = int(ptr[t]), int(ptr[t + 1])
            index._p_slot[t] = array("i", post_slot[lo:hi].tobytes())
            index._p_tf[t] = array("f", post_tf[lo:hi].tobytes())
        term_of = np.repeat(np.arange(len(terms), dtype=np.int32), lengths)
        pos_of = (np.arange(post_slot.size) - np.repeat(ptr[:-1], lengths)).astype(np.int32)
        by_doc = np.argsort(post_slot, kind="stable")
        bounds = np.searchsorted(post_slot[by_doc], np.arange(len(keys) + 1))
        back = np.empty(post_slot.size, dtype=np.int32)
        back[by_doc] = np.arange(post_slot.size) - bounds[post_slot[by_doc]]
        for t in np.flatnonzero(lengths).tolist():
            index._p_back[t] = array("i", back[int(ptr[t]) : int(ptr[t + 1])].tobytes())
        t_sorted, p_sorted = term_of[by_doc], pos_of[by_doc]
        for slot in range(len(keys)):
            lo, hi = int(bounds[slot]), int(bounds[slot + 1])
            if hi > lo:
                if keys[slot] is None:
                    raise ValueError(f"removed slot {slot} still has postings")
                index._doc_terms[slot] = t_sorted[lo:hi].tobytes()
                index._doc_pos[slot] = bytearray(p_sorted[lo:hi].tobytes())
        return index
