"""Metrics recorded in one process are served, aggregated, in Prometheus text."""

from __future__ import annotations

import redis

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
