"""The agent's own metric helpers (the metrics themselves are checked where they are set)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from inference_agent.metrics import AgentMetrics

DELAY = "loraplane_agent_event_delay_seconds"


def test_event_delay_is_measured_from_the_commit_and_never_negative() -> None:
    metrics = AgentMetrics()
    now = datetime.now(UTC)
    metrics.event_received(now - timedelta(seconds=3))
    # The registry's clock ahead of ours: counted, as no delay at all.
    metrics.event_received(now + timedelta(seconds=30))
    # A naive time is the registry's UTC.
    metrics.event_received((now - timedelta(seconds=2)).replace(tzinfo=None))
    sample = metrics.registry.get_sample_value
    assert sample(f"{DELAY}_count") == 3
    total = sample(f"{DELAY}_sum")
    assert total is not None and 5.0 <= total < 6.0
    assert sample(f"{DELAY}_bucket", {"le": "0.0005"}) == 1


def test_adapter_labels_past_the_limit_fold_into_other() -> None:
    metrics = AgentMetrics(max_adapters=1)
    metrics.count_tokens("first", {"prompt_tokens": 3, "completion_tokens": 2})
    metrics.count_tokens("second", {"prompt_tokens": 5, "completion_tokens": None})
    metrics.set_loaded_bytes({"first": 10, "second": 20, "third": 30})
    sample = metrics.registry.get_sample_value
    assert sample("loraplane_agent_tokens_total", {"adapter": "first", "kind": "prompt"}) == 3
    assert sample("loraplane_agent_tokens_total", {"adapter": "_other", "kind": "prompt"}) == 5
    assert sample("loraplane_agent_tokens_total",
                  {"adapter": "_other", "kind": "completion"}) is None
    assert sample("loraplane_agent_loaded_adapter_bytes", {"adapter": "first"}) == 10
    assert sample("loraplane_agent_loaded_adapter_bytes", {"adapter": "_other"}) == 50
    # A version unloaded: its series goes, not left at its old size.
    metrics.set_loaded_bytes({"first": 10})
    assert sample("loraplane_agent_loaded_adapter_bytes", {"adapter": "_other"}) is None


def test_a_kept_child_is_the_one_labels_gives_and_counts_in_the_exposition() -> None:
    metrics = AgentMetrics()
    child = metrics.child(metrics.requests, "bot", "200", "")
    assert child is metrics.child(metrics.requests, "bot", "200", "")
    assert child is metrics.requests.labels(adapter="bot", status="200", track="")
    assert metrics.child(metrics.requests, "bot", "500", "") is not child
    assert metrics.child(metrics.requests, "bot", "200", "canary") is not child
    child.inc()
    metrics.child(metrics.requests, "bot", "200", "").inc()
    metrics.count_tokens("bot", {"prompt_tokens": 4})
    metrics.count_tokens("bot", {"prompt_tokens": 6})
    sample = metrics.registry.get_sample_value
    assert sample("loraplane_agent_requests_total",
                  {"adapter": "bot", "status": "200", "track": ""}) == 2
    assert sample("loraplane_agent_tokens_total", {"adapter": "bot", "kind": "prompt"}) == 10
