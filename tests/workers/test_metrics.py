"""Metrics recorded in one process are served, aggregated, in Prometheus text."""

from __future__ import annotations

import pytest
import redis

from memory_core.namespace import Namespace
from memory_core.ops import Forget, Remember
from memory_core.writer import Writer
from workers.metrics import Metrics, queue_depths


def test_counters_and_histograms_aggregate_across_clients(redis_client: redis.Redis, redis_url: str) -> None:
    a, b = Metrics(redis_client), Metrics(redis.Redis.from_url(redis_url))
    a.inc("lucid_events_received_total", {"persona": "default"})
    b.inc("lucid_events_received_total", {"persona": "default"})
    a.inc("lucid_events_rejected_total", {"reason": 'bad "signature"'})
    a.observe("lucid_turn_seconds", 0.3)
    b.observe("lucid_turn_seconds", 4.0)
    text = a.render(queue_depths(redis_client, ["chat"]))
    assert 'lucid_events_received_total{persona="default"} 2' in text
    assert 'lucid_events_rejected_total{reason="bad \\"signature\\""} 1' in text
    assert (
        'lucid_turn_seconds_bucket{le="0.5"} 1' in text and 'lucid_turn_seconds_bucket{le="+Inf"} 2' in text
    )
    assert "lucid_turn_seconds_count 2" in text and "lucid_turn_seconds_sum 4.3" in text
    assert 'lucid_queue_depth{queue="chat"} 0' in text
    assert "# TYPE lucid_turn_seconds histogram" in text


def test_metrics_never_raise_without_redis() -> None:
    from workers.runtime import connect

    m = Metrics(connect("redis://127.0.0.1:1/0"))
    m.inc("lucid_turns_total")
    m.observe("lucid_turn_seconds", 1.0)
    assert "# TYPE lucid_turns_total counter" in m.render()


def test_llm_calls_and_tokens_are_counted(redis_client: redis.Redis, redis_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.fakes.ollama import FakeOllama, ModelNotFound
    from workers.llm import LLMError
    from workers.runtime import build
    from workers.settings import Settings

    with FakeOllama(models=["m1"]) as fake:
        fake.script("你好呀", ModelNotFound())
        rt = build(Settings(data_dir=tmp_path, ollama_host=fake.url, chat_model="m1"), redis_url=redis_url)
        assert rt.llm is not None
        rt.llm.chat("m1", [{"role": "user", "content": "hi"}])
        with pytest.raises(LLMError):
            rt.llm.chat("m1", [{"role": "user", "content": "hi"}])
    text = Metrics(redis_client).render()
    assert 'lucid_llm_calls_total{call="chat",model="m1",outcome="ok"} 1' in text
    assert 'lucid_llm_calls_total{call="chat",model="m1",outcome="error"} 1' in text
    assert 'lucid_llm_tokens_total{call="chat",direction="completion",model="m1"}' in text


def test_memory_writes_are_counted_by_outcome(redis_writer: Writer, redis_client: redis.Redis) -> None:
    ns = Namespace.of("t1", "alice", "p")
    redis_writer.submit(ns, [Remember(text="我住在余杭区"), Remember(text="我对花生过敏")])
    redis_writer.submit(
        ns, [Remember(text="我现在住在西湖区"), Remember(text="我对花生过敏"), Forget(id="0" * 16)]
    )
    text = Metrics(redis_client).render()
    assert 'lucid_memory_writes_total{outcome="added"} 2' in text
    assert 'lucid_memory_writes_total{outcome="superseded"} 1' in text  # the why (subject) is not a label
    assert 'lucid_memory_writes_total{outcome="unchanged"} 1' in text
    assert 'lucid_memory_writes_total{outcome="rejected"} 1' in text
