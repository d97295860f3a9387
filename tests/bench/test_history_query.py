"""The short version of ``bench/history_query.py``, on the machine's Postgres: it still
loads a history and its blob store, times every page at every layer while the registry's
collector passes run and agents report, reads the event-loop lag over the window, judges
the goals and records the commit; how fast anything is stays the bench's to say
(docs/benchmarks.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.background import histogram_quantile, lag_summary, loop_stalls
from bench.history_query import main

LAYERS = {"api", "api, no background", "service", "sql"}
PAGES = {"first page", "middle", "near the end", "typical adapter, first page"}
SMALL = ["--versions", "3000", "--adapters", "5", "--samples", "3", "--orphans", "40",
         "--agents", "3", "--report-interval", "0.1", "--gc-interval", "0.05",
         "--gc-wait", "120"]


def test_the_history_query_benchmark_times_every_page_under_the_background_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    document = main([*SMALL, "--json-out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(document, default=str))
    measured = {(r["layer"], r["position"]) for r in document["results"]}
    assert measured == {(layer, page) for layer in LAYERS for page in PAGES} | {
        ("sql OFFSET (contrast)", "middle")}
    # The OFFSET contrast takes at least 10 samples; two quiet phases take 3 each.
    n = {"sql OFFSET (contrast)": 10, "api, no background": 6}
    for r in document["results"]:
        assert r["n"] == n.get(r["layer"], 3), r
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"], r
    assert document["dataset"]["versions"] == 3000
    assert document["blob_store"] | {"written_s": 0} == {"referenced": 6000, "orphans": 40,
                                                         "written_s": 0}
    assert set(document["plans"]) == PAGES
    assert all(value > 0 for value in document["ratios"].values())
    window = document["background"]["window"]
    # The window opens inside a collector pass, and the pass shows its progress there.
    assert 0 < window["gc_running_share"] <= 1 and window["gc_running_samples"] >= 1
    lag = window["loop_lag"]
    assert lag["ticks"] > 0 and 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_bucket_ms"][1]
    assert lag["p99_bucket_ms"][0] <= lag["p99_ms"] <= lag["p99_bucket_ms"][1]
    agents = document["background"]["agents"]
    assert agents["agents"] == 3 and agents["errors"] == 0 and agents["reports"] > 0
    assert set(document["background"]["stalls"]) == {"count", "longest_s", "seconds_in_all",
                                                     "most_named"}
    quiet = document["background"]["quiet_lag"]
    assert quiet["ticks"] > 0 and 0 <= quiet["p50_ms"] <= quiet["p99_ms"]
    goals = document["goals"]
    assert set(goals) == {"history API p99 (slowest page)", "event-loop lag p99",
                          "history API p99, busy / no background",
                          "event-loop lag p99 / API p50 with no background"}
    for goal in goals.values():
        assert goal["met"] == (goal["value"] < goal["goal"])
    p99 = {r["layer"]: r["p99_ms"] for r in document["results"] if r["position"] == "middle"}
    worst = {layer: max(r["p99_ms"] for r in document["results"] if r["layer"] == layer)
             for layer in ("api", "api, no background")}
    assert goals["history API p99, busy / no background"]["value"] == pytest.approx(
        worst["api"] / worst["api, no background"], abs=0.01)
    assert p99["api"] > 0 and p99["api, no background"] > 0
    assert len(document["commit"]["commit"]) == 40
    printed = capsys.readouterr().out
    assert "blob collector: a pass running in " in printed
    assert "event-loop lag (loraplane_registry_event_loop_lag_seconds, " in printed
    assert "goal history API p99 (slowest page) < 10 ms: " in printed
    assert "goal event-loop lag p99 < 5 ms: " in printed
    assert "goal history API p99, busy / no background < 2 x: " in printed
    assert "event-loop lag with no background work (" in printed
    assert f"commit {document['commit']['commit']}" in printed


def test_the_lag_quantile_interpolates_as_prometheus_does() -> None:
    # 50 ticks in (0, 1 ms], 49 in (1, 5 ms], 1 in (5, 10 ms]; none slower.
    buckets = [(0.001, 50.0), (0.005, 99.0), (0.01, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == (0.001, 0.0, 0.001)
    value, lower, upper = histogram_quantile(0.99, buckets)
    assert (lower, upper) == (0.001, 0.005) and value == pytest.approx(0.005)
    assert histogram_quantile(0.995, buckets)[0] == pytest.approx(0.0075)
    # A rank in +Inf answers the highest finite bound, as histogram_quantile does.
    assert histogram_quantile(0.99, [(0.001, 1.0), (math.inf, 100.0)])[0] == 0.001
    summary = lag_summary(buckets)
    assert summary["ticks"] == 100 and summary["max_bucket_ms"] == [5.0, 10.0]
    assert math.isnan(histogram_quantile(0.99, [(0.001, 0.0), (math.inf, 0.0)])[0])


def test_the_stalls_the_watchdog_named_are_counted_from_the_log(tmp_path: Path) -> None:
    log = tmp_path / "registry.log"
    log.write_text(
        "2026-11-29 10:21:46,779 WARNING loraplane.loop_lag: event loop held for 0.28 s so "
        "far by task 'blob-gc' at registry_service/blobs/gc.py:12 (page)\n"
        "2026-11-29 10:21:46,805 WARNING loraplane.loop_lag: event loop was held for 0.29 s "
        "in all (by task 'blob-gc' at registry_service/blobs/gc.py:12 (page))\n"
        "2026-11-29 10:22:00,000 WARNING loraplane.loop_lag: event loop was held for 1.50 s "
        "in all (by task 'Task-7' at x.py:3 (f))\n"
        "2026-11-29 10:23:00,000 WARNING loraplane.loop_lag: event loop was held for 0.20 s "
        "in all (by task 'blob-gc' at registry_service/blobs/gc.py:12 (page))\n")
    stalls = loop_stalls(log)
    assert stalls["count"] == 3 and stalls["longest_s"] == 1.5
    assert stalls["most_named"][0] == ["task 'blob-gc' at registry_service/blobs/gc.py:12 "
                                       "(page)", 2]
    # As JSON has it: a bench's document with a stall in it equals its --json-out.
    assert json.loads(json.dumps(stalls)) == stalls
    assert loop_stalls(tmp_path / "missing.log")["count"] == 0


@pytest.mark.parametrize("argv", [["--versions", "30", "--adapters", "20"],
                                  ["--adapters", "1"], ["--samples", "0"],
                                  ["--agents", "0"], ["--orphans", "-1"]])
def test_a_history_too_small_for_full_pages_is_refused(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "error: --" in capsys.readouterr().err
