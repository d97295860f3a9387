"""ProxyCall: a request of an alias under canary counts on its side, in the tally and
under the metrics' ``track`` label; any other request only under ``track=""``."""

from __future__ import annotations

from inference_agent.metrics import AgentMetrics
from inference_agent.serving.calls import ProxyCall
from inference_agent.serving.routes import CanarySide, Target
from inference_agent.serving.traffic import TrafficTally
from loraplane.events import TRAFFIC_BUCKETS, VersionRef

INF = len(TRAFFIC_BUCKETS)


def target(version: int, canary: CanarySide | None) -> Target:
    ref = VersionRef(adapter="bot", version=version, digest=f"{version:064x}",
                     base_model="tiny-llama", rank=8, alpha=16, target_modules=["q_proj"],
                     files=[])
    return Target(adapter="bot", ref=ref, model_name=f"bot@{version}", canary=canary)


def sample(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(f"loraplane_agent_{name}", labels)


def test_a_failed_canary_request_is_an_error_of_the_canary_side() -> None:
    metrics, tally = AgentMetrics(), TrafficTally()
    call = ProxyCall(metrics, tally)
    call.bind(target(4, (7, "canary")), None)
    call.done(502, "vllm_502")
    call.done(200, None)  # closed once: a later call counts nothing
    (side,) = tally.snapshot({7})
    assert (side.track, side.requests, side.errors, side.latency[INF]) == ("canary", 1, 1, 1)
    assert side.ttft[INF] == 0  # not streamed
    assert sample(metrics, "requests_total", adapter="bot", status="502",
                  track="canary") == 1
    assert sample(metrics, "request_seconds_count", adapter="bot", track="canary") == 1
    assert sample(metrics, "request_errors_total", adapter="bot", reason="vllm_502") == 1


def test_a_streamed_stable_request_counts_its_first_chunk_once() -> None:
    metrics, tally = AgentMetrics(), TrafficTally()
    call = ProxyCall(metrics, tally)
    call.bind(target(3, (7, "stable")), None)
    call.chunk(b'data: {"choices": []}\n\n')
    call.chunk(b"data: [DONE]\n\n")
    (side,) = tally.snapshot({7})
    assert (side.track, side.requests, side.ttft[INF]) == ("stable", 0, 1)
    call.done(200, None)
    (side,) = tally.snapshot({7})
    assert (side.requests, side.errors, side.ttft[INF], side.latency[INF]) == (1, 0, 1, 1)
    assert sample(metrics, "time_to_first_token_seconds_count", adapter="bot",
                  track="stable") == 1
    assert sample(metrics, "requests_total", adapter="bot", status="200",
                  track="stable") == 1


def test_requests_under_no_canary_count_only_in_the_metrics() -> None:
    metrics, tally = AgentMetrics(), TrafficTally()
    version = tally.version
    by_version = ProxyCall(metrics, tally)
    by_version.bind(target(4, None), None)
    by_version.chunk(b"data: {}\n\n")
    by_version.done(500, "vllm_500")
    refused = ProxyCall(metrics, tally)  # refused before it was resolved
    refused.done(401, "invalid_api_key")
    assert tally.version == version and tally.snapshot({7}) == []
    assert sample(metrics, "requests_total", adapter="bot", status="500", track="") == 1
    assert sample(metrics, "time_to_first_token_seconds_count", adapter="bot",
                  track="") == 1
    assert sample(metrics, "requests_total", adapter="_unresolved", status="401",
                  track="") == 1
    # Without a tally (as before it existed) a canary's request still counts in metrics.
    untallied = ProxyCall(metrics)
    untallied.bind(target(4, (7, "canary")), None)
    untallied.done(200, None)
    assert sample(metrics, "requests_total", adapter="bot", status="200",
                  track="canary") == 1
