"""All pairs of bigram sets with Jaccard ≥ t, exactly, without comparing every pair (light and deep
dreaming; the method: `similar_pairs`)."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Collection, Iterator, Sequence

import numpy as np

_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_LATIN = {a + b: i * len(_ALNUM) + j for i, a in enumerate(_ALNUM) for j, b in enumerate(_ALNUM)}
_WORDS = 21  # 21 × 64 = 1,344 bits ≥ 36² Latin bigrams
_EPS = 1e-9


def _row_sums(counts: np.ndarray) -> np.ndarray:
    """Row sums of small per-word popcounts; a float32 matrix product is twice as fast as `sum(axis=1)`
    and exact here (every sum is below 2²⁴)."""
    return counts.astype(np.float32) @ np.ones(counts.shape[1], dtype=np.float32)


def _latin_row(tokens: frozenset[str]) -> np.ndarray:
    bits = np.zeros(_WORDS * 64, dtype=bool)
    bits[[_LATIN[t] for t in tokens if t in _LATIN]] = True
    return np.packbits(bits, bitorder="little").view(np.uint64)


class _LatinRows:
    """The sets whose index prefix reaches Latin tokens, in visiting (size) order, as bit rows."""

    def __init__(self, capacity: int) -> None:
        self.rows = np.zeros((max(capacity, 1), _WORDS), dtype=np.uint64)
        self.others = np.zeros(max(capacity, 1), dtype=np.int64)  # non-Latin token count
        self.size_array = np.zeros(max(capacity, 1), dtype=np.int64)
        self.sizes: list[int] = []
        self.ids: list[int] = []

    def add(self, ident: int, tokens: frozenset[str], row: np.ndarray) -> None:
        k = len(self.ids)
        self.rows[k] = row
        self.others[k] = len(tokens) - int(np.bitwise_count(row).sum())
        self.size_array[k] = len(tokens)
        self.sizes.append(len(tokens))
        self.ids.append(ident)

    def candidates(self, tokens: frozenset[str], row: np.ndarray, threshold: float) -> list[int]:
        """Members y with |y| ≥ t·|x| whose overlap with x can still reach α (upper bound)."""
        n = len(tokens)
        lo, hi = bisect_left(self.sizes, math.ceil(threshold * n - _EPS)), len(self.ids)
        if lo >= hi:
            return []
        latin = _row_sums(np.bitwise_count(self.rows[lo:hi] & row))
        other_x = n - int(np.bitwise_count(row).sum())
        bound = latin + np.minimum(self.others[lo:hi], other_x)
        alpha = np.ceil(threshold / (1 + threshold) * (n + self.size_array[lo:hi]) - _EPS)
        return [self.ids[lo + k] for k in np.flatnonzero(bound >= alpha)]


class _Verifier:
    """Candidate pairs are checked in batches: a vectorised upper bound first, then exact set overlap."""

    BITS = 2048
    BATCH = 65536

    def __init__(self, sets: Sequence[frozenset[str]], ranked: Sequence[list[int]], threshold: float) -> None:
        self.sets = sets
        self.threshold = threshold
        self.sizes = np.fromiter((len(r) for r in ranked), dtype=np.int64, count=len(ranked))
        flat = np.fromiter((t for r in ranked for t in r), dtype=np.int64, count=int(self.sizes.sum()))
        owner = np.repeat(np.arange(len(ranked)), self.sizes)
        bit = flat % self.BITS
        octets = np.zeros((len(ranked), self.BITS // 8), dtype=np.uint8)
        np.bitwise_or.at(octets, (owner, bit >> 3), np.left_shift(1, bit & 7).astype(np.uint8))
        self.rows = octets.view(np.uint64)
        self.collisions = self.sizes - np.bitwise_count(self.rows).sum(axis=1, dtype=np.int64)
        self.left: list[int] = []
        self.right: list[int] = []

    def add(self, i: int, others: Collection[int]) -> None:
        self.left.extend(itertools.repeat(i, len(others)))
        self.right.extend(others)

    @property
    def full(self) -> bool:
        return len(self.left) >= self.BATCH

    def flush(self) -> Iterator[tuple[int, int, float]]:
        if not self.left:
            return
        a = np.asarray(self.left, dtype=np.int64)
        b = np.asarray(self.right, dtype=np.int64)
        self.left, self.right = [], []
        bound = _row_sums(np.bitwise_count(self.rows[a] & self.rows[b]))
        bound += np.minimum(self.collisions[a], self.collisions[b])
        alpha = np.ceil(self.threshold / (1 + self.threshold) * (self.sizes[a] + self.sizes[b]) - _EPS)
        keep = np.flatnonzero(bound >= alpha)
        for i, j in zip(a[keep].tolist(), b[keep].tolist(), strict=True):
            x, y = self.sets[i], self.sets[j]
            inter = len(x & y)
            score = inter / (len(x) + len(y) - inter)
            if score >= self.threshold:
                yield (min(i, j), max(i, j), score)


def similar_pairs(sets: Sequence[frozenset[str]], threshold: float) -> Iterator[tuple[int, int, float]]:
    """Every pair (i, j, jaccard), i < j, with Jaccard(sets[i], sets[j]) ≥ threshold: the O(n²) pass's result
    at a cost that follows the data (prefix filtering; the method: docs/MEMORY.md, "All similar pairs")."""
    freq = Counter(tok for s in sets for tok in s)
    ordered = sorted(freq, key=lambda tok: (tok in _LATIN, freq[tok]))  # Latin last; ties: first seen
    rank = {tok: r for r, tok in enumerate(ordered)}
    first_latin = next((rank[t] for t in ordered if t in _LATIN), len(ordered))
    ranked = [sorted([rank[tok] for tok in s]) for s in sets]
    sizes = [len(s) for s in sets]
    order = sorted(range(len(sets)), key=sizes.__getitem__)
    members: dict[int, list[int]] = defaultdict(list)
    member_sizes: dict[int, list[int]] = defaultdict(list)
    latin = _LatinRows(sum(1 for r in ranked if r and r[-1] >= first_latin))
    verifier = _Verifier(sets, ranked, threshold)
    for i in order:
        n = sizes[i]
        if n == 0:
            continue
        x = sets[i]
        probe = ranked[i][: n - math.ceil(threshold * n - _EPS) + 1]
        index = ranked[i][: n - math.ceil(2 * threshold / (1 + threshold) * n - _EPS) + 1]
        min_len = math.ceil(threshold * n - _EPS)
        seen: set[int] = set()
        for tok in probe:
            if tok < first_latin and (bucket := members.get(tok)):
                seen.update(bucket[bisect_left(member_sizes[tok], min_len) :])
        if probe[-1] >= first_latin:
            row = _latin_row(x)
            seen.update(latin.candidates(x, row, threshold))
            if index[-1] >= first_latin:
                latin.add(i, x, row)
        for tok in index:
            if tok < first_latin:
                members[tok].append(i)
                member_sizes[tok].append(n)
        verifier.add(i, seen)
        if verifier.full:
            yield from verifier.flush()
    yield from verifier.flush()
