"""TrafficTally: each side's counts, cumulative buckets, snapshots of running canaries
only; TrafficReports: news since the last report, polled only while a canary runs."""

from __future__ import annotations

import pytest

from inference_agent.serving.routes import RouteTable
from inference_agent.serving.traffic import TrafficReports, TrafficTally, bucket_of
from loraplane.events import MAX_TRAFFIC_ENTRIES, TRAFFIC_BUCKETS, CanaryRoute, VersionRef

INF = len(TRAFFIC_BUCKETS)  # the +Inf bucket's index


def ref(version: int) -> VersionRef:
    return VersionRef(adapter="bot", version=version, digest=f"{version:064x}",
                      base_model="tiny-llama", rank=8, alpha=16, target_modules=["q_proj"],
                      files=[])


@pytest.mark.parametrize(("seconds", "bucket"), [
    (0.0, 0), (0.005, 0), (0.0051, 1), (1.0, 7), (1.5, 8), (300.0, INF - 1),
    (300.1, INF), (1e9, INF)])
def test_an_observation_falls_in_the_first_bucket_whose_bound_is_not_below_it(
        seconds: float, bucket: int) -> None:
    assert bucket_of(seconds) == bucket


def test_counts_and_cumulative_buckets_per_side() -> None:
    tally = TrafficTally()
    tally.record((7, "canary"), 200, 0.003)
    tally.record((7, "canary"), 503, 0.2)
    tally.record((7, "canary"), 504, 400.0)  # the agent's timeout: an error, past +Inf's edge
    tally.record((7, "canary"), 404, 0.2)  # a client error is no error of the version's
    tally.record((7, "stable"), 200, 1.0)
    tally.first_token((7, "canary"), 0.05)
    tally.first_token((7, "canary"), 0.3)
    canary, stable = tally.snapshot({7})
    assert (canary.canary_id, canary.track, canary.requests, canary.errors) == (
        7, "canary", 4, 2)
    bounds = dict(zip(TRAFFIC_BUCKETS, canary.latency, strict=False))
    assert bounds[0.005] == 1 and bounds[0.1] == 1 and bounds[0.25] == 3
    assert bounds[300.0] == 3 and canary.latency[INF] == 4
    assert canary.latency == sorted(canary.latency)  # cumulative: never decreasing
    ttft = dict(zip(TRAFFIC_BUCKETS, canary.ttft, strict=False))
    assert ttft[0.025] == 0 and ttft[0.05] == 1 and ttft[0.25] == 1 and ttft[0.5] == 2
    assert canary.ttft[INF] == 2 and canary.load_failures == 0
    assert (stable.track, stable.requests, stable.errors) == ("stable", 1, 0)
    assert stable.latency[:7] == [0] * 7 and stable.latency[7:] == [1] * (INF - 6)
    assert stable.ttft == [0] * (INF + 1)
    # Counts go on from where they were: cumulative since the canary was first counted.
    tally.record((7, "stable"), 500, 0.001)
    stable = tally.snapshot({7})[1]
    assert (stable.requests, stable.errors, stable.latency[0], stable.latency[INF]) == (
        2, 1, 1, 2)


def test_a_load_failure_is_the_canary_sides_even_without_requests() -> None:
    tally = TrafficTally()
    tally.load_failed(9)
    (side,) = tally.snapshot({9})
    assert (side.canary_id, side.track, side.requests, side.load_failures) == (
        9, "canary", 0, 1)
    tally.load_failed(9)
    assert tally.snapshot({9})[0].load_failures == 2


def test_a_snapshot_has_only_running_canaries_and_forgets_the_others() -> None:
    tally = TrafficTally()
    for canary_id in (3, 1, 2):
        tally.record((canary_id, "stable"), 200, 0.1)
        tally.record((canary_id, "canary"), 200, 0.1)
    assert [(t.canary_id, t.track) for t in tally.snapshot({1, 3})] == [
        (1, "canary"), (1, "stable"), (3, "canary"), (3, "stable")]
    # Canary 2 ended: forgotten, so counting it again starts from zero.
    tally.record((2, "stable"), 200, 0.1)
    assert [t.requests for t in tally.snapshot({2})] == [1]
    assert tally.snapshot(set()) == [] and tally.snapshot({1, 2, 3}) == []


def test_a_snapshot_is_bounded() -> None:
    tally = TrafficTally()
    canaries = range(1, MAX_TRAFFIC_ENTRIES)  # twice as many sides as a report may hold
    for canary_id in canaries:
        tally.record((canary_id, "stable"), 200, 0.1)
        tally.record((canary_id, "canary"), 200, 0.1)
    snapshot = tally.snapshot(set(canaries))
    assert len(snapshot) == MAX_TRAFFIC_ENTRIES
    # Both sides of a canary together: the first half of the canaries, whole.
    assert {t.canary_id for t in snapshot} == set(range(1, MAX_TRAFFIC_ENTRIES // 2 + 1))


def test_the_version_moves_with_every_count_and_only_then() -> None:
    tally = TrafficTally()
    seen = [tally.version]
    tally.record((1, "stable"), 200, 0.1)
    seen.append(tally.version)
    tally.first_token((1, "stable"), 0.1)
    seen.append(tally.version)
    tally.load_failed(1)
    seen.append(tally.version)
    tally.snapshot({1})
    tally.snapshot(set())  # forgetting is no news
    seen.append(tally.version)
    assert seen[0] < seen[1] < seen[2] < seen[3] == seen[4]


def test_reports_tell_news_since_the_last_report_sent() -> None:
    routes, tally = RouteTable("tiny-llama"), TrafficTally()
    routes.set_owner("bot", "acme")
    routes.set_alias("bot", "live", 1, ref(1))
    reports = TrafficReports(tally, routes, interval_s=5.0)
    assert reports.poll_s() is None  # no canary here: nothing to look for
    assert not reports.news()
    routes.set_canary("bot", "live", CanaryRoute(id=4, weight=10, target=ref(2)))
    assert reports.poll_s() == 5.0
    tally.record((4, "canary"), 200, 0.1)
    tally.record((5, "canary"), 200, 0.1)  # a canary no longer here
    assert reports.news()
    taken = reports.take()
    assert [(t.canary_id, t.requests) for t in taken] == [(4, 1)]
    tally.record((4, "stable"), 200, 0.1)  # counted after the snapshot: still news
    reports.sent()
    assert reports.news()
    reports.take()
    assert reports.news()  # taken, not sent (a post that failed)
    reports.sent()
    assert not reports.news()
