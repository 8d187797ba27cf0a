"""Text similarity for duplicates and clusters: character-bigram Jaccard, as in the reference system.

Works for Chinese and English without a tokenizer. Texts are NFKC-normalised, lower-cased and stripped of
white space and punctuation first, so full-width and half-width forms compare equal.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

DUPLICATE = 0.65  # at or above: the same memory said again
RELATED = 0.35  # at or above: the same topic (deep-dream clusters)


def _drop_table() -> dict[int, None]:
    """White space and punctuation of the Basic Multilingual Plane, for one `str.translate` pass."""
    return {
        cp: None
        for cp in range(0x10000)
        if chr(cp).isspace() or unicodedata.category(chr(cp)).startswith("P")
    }


_TABLE = _drop_table()


@lru_cache(maxsize=200_000)
def normalise(text: str) -> str:
    t = unicodedata.normalize("NFKC", text).lower().translate(_TABLE)
    if t.isascii() or all(ord(ch) < 0x10000 for ch in t):
        return t
    return "".join(ch for ch in t if not (ch.isspace() or unicodedata.category(ch).startswith("P")))


@lru_cache(maxsize=65536)
def bigrams(text: str) -> frozenset[str]:
    t = normalise(text)
    if len(t) < 2:
        return frozenset([t]) if t else frozenset()
    return frozenset(t[i : i + 2] for i in range(len(t) - 1))


def jaccard(a: str, b: str) -> float:
    x, y = bigrams(a), bigrams(b)
    if not x or not y:
        return 0.0
    inter = len(x & y)
    return inter / (len(x) + len(y) - inter)


def same_text(a: str, b: str) -> bool:
    return normalise(a) == normalise(b)
