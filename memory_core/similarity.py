"""Text similarity for duplicates and clusters: character-bigram Jaccard, as in the reference system."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

DUPLICATE = 0.65  # at or above: the same memory said again
RELATED = 0.35  # at or above: the same topic (deep-dream clusters)


def char_class(codepoints: Iterable[int]) -> str:
    """A regex character class of `codepoints` (ascending), written as ranges: a regex scan for one is
    twice as fast as `str.translate` with a 65,536-key table."""
    ranges: list[list[int]] = []
    for cp in codepoints:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]"


# White space and punctuation of the Basic Multilingual Plane (the index reads every line through it).
_DROP = re.compile(
    char_class(
        cp for cp in range(0x10000) if chr(cp).isspace() or unicodedata.category(chr(cp)).startswith("P")
    )
    + "+"
)
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")  # outside the class: checked one by one


# A mark that is part of a number: 1.5 is not 15, -500 not 500, 10:30 not 1030, 1/2 not 12.
_NUMERIC_MARK = re.compile(r"((?<=\d)[.:/](?=\d)|-(?=\d))")


@lru_cache(maxsize=200_000)
def normalise(text: str) -> str:
    """Works for Chinese and English without a tokenizer. Texts are NFKC-normalised, lower-cased and stripped of
    white space and punctuation first (but for the marks inside numbers), so full-width and half-width forms
    compare equal."""
    t = unicodedata.normalize("NFKC", text).lower()
    if _NUMERIC_MARK.search(t) is None:
        return _stripped(t)
    parts = _NUMERIC_MARK.split(t)  # text, mark, text, …
    return "".join(p if i % 2 else _stripped(p) for i, p in enumerate(parts))


def _stripped(t: str) -> str:
    t = _DROP.sub("", t)
    if t.isascii() or _ASTRAL.search(t) is None:
        return t
    return "".join(ch for ch in t if not (ch.isspace() or unicodedata.category(ch).startswith("P")))


@lru_cache(maxsize=65536)
def bigrams(text: str) -> frozenset[str]:
    return grams(normalise(text))


def grams(t: str) -> frozenset[str]:
    """The character bigrams of a text already normalised."""
    if len(t) < 2:
        return frozenset([t]) if t else frozenset()
    return frozenset(map(str.__add__, t, t[1:]))  # t[i] + t[i + 1]: the bigram at i, made in C


def jaccard(a: str, b: str) -> float:
    x, y = bigrams(a), bigrams(b)
    if not x or not y:
        return 0.0
    inter = len(x & y)
    return inter / (len(x) + len(y) - inter)


# A number as stated: signed (-500 is not 500; a hyphen after a digit is a range or a date), Arabic or Chinese.
NUMBER = r"(?:(?<!\d)-)?\d+(?:[.,:/]\d+)*|[零〇一二两三四五六七八九十百千万亿]+"
_NUMBER = re.compile(NUMBER)


@lru_cache(maxsize=65536)
def numbers(text: str) -> Counter[str]:
    """The numbers a text states, Arabic or Chinese, as a multiset ("周三下午3点" → {三, 3})."""
    return Counter(_NUMBER.findall(unicodedata.normalize("NFKC", text)))


def numbers_agree(a: str, b: str) -> bool:
    """True when one text states no number the other contradicts: the numbers of the one with fewer are
    all among the other's ("我有孩子" / "我有2个孩子" agree; "房间2" / "房间20" and "3点" / "4点" do not)."""
    x, y = numbers(a), numbers(b)
    if x == y:
        return True
    small, big = (x, y) if x.total() <= y.total() else (y, x)
    return not (small - big)
