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
