"""The summary of ``bench/fanout.py --also-commit``: per push and per version, then the
per-push ratios new / old (no fleet: the numbers are made up)."""

from __future__ import annotations

import pytest

from bench.fanout_versus import NEW, OLD, cpu_group, push_groups, render, versus


def _group_of(agent: str) -> str:
    return OLD if int(agent.rsplit("-", 1)[1]) % 2 else NEW


def test_push_groups_splits_times_and_cpu_by_version() -> None:
    loaded = {f"agent-{i:03d}": 0.1 * (i + 1) for i in range(4)}
    reported = {a: t + 1.0 for a, t in loaded.items()}
    cpu = {cpu_group(NEW): {"cpu_ms": 30.0}, cpu_group(OLD): {"cpu_ms": 20.0},
           "agents": {"cpu_ms": 50.0}}
    groups = push_groups({"loaded": loaded, "reported": reported}, _group_of, cpu)
    # agent-000 and agent-002 are new, agent-001 and agent-003 old.
    assert groups[NEW] == {"agents": 2, "loaded": {"p50": 100.0, "p99": 300.0, "max": 300.0},
                           "reported": {"p50": 1100.0, "p99": 1300.0, "max": 1300.0},
                           "cpu_ms_per_agent": 15.0}
    assert groups[OLD]["loaded"] == {"p50": 200.0, "p99": 400.0, "max": 400.0}
    assert groups[OLD]["cpu_ms_per_agent"] == 10.0


def test_a_group_without_agents_is_left_out() -> None:
    times = {"loaded": {"agent-000": 0.5}, "reported": {"agent-000": 1.0}}
    cpu = {cpu_group(NEW): {"cpu_ms": 8.0}, cpu_group(OLD): {"cpu_ms": 0.0}}
    assert set(push_groups(times, _group_of, cpu)) == {NEW}


def _push(new_ms: float, old_ms: float, new_cpu: float,
          old_cpu: float) -> dict[str, dict[str, object]]:
    def group(ms: float, cpu: float) -> dict[str, object]:
        spread = {"p50": ms, "p99": 2 * ms, "max": 3 * ms}
        return {"agents": 50, "loaded": spread, "reported": spread, "cpu_ms_per_agent": cpu}
    return {NEW: group(new_ms, new_cpu), OLD: group(old_ms, old_cpu)}


def test_versus_gives_per_push_ratios_with_an_interval() -> None:
    rows = versus([_push(110, 100, 12, 10), _push(90, 100, 10, 10), _push(100, 100, 11, 10)])
    by_name = {r["measure"]: r for r in rows}
    assert list(by_name) == ["loaded p50 ms", "loaded p99 ms", "loaded max ms",
                             "reported p50 ms", "reported p99 ms", "reported max ms",
                             "agent CPU ms per push"]
    p50 = by_name["loaded p50 ms"]
    assert p50["ratios"] == [1.1, 0.9, 1.0]
    assert p50["ratio_mean"] == pytest.approx(1.0)
    # 1.96 * stdev (0.1) / sqrt(3)
    assert p50["ratio_ci95"] == pytest.approx(0.1132, abs=1e-4)
    assert (p50["ratio_min"], p50["ratio_max"]) == (0.9, 1.1)
    assert (p50["new_median"], p50["old_median"]) == (100, 100)
    cpu = by_name["agent CPU ms per push"]
    assert cpu["ratio_mean"] == pytest.approx(1.1) and cpu["pushes"] == 3
    text = render(rows, "this checkout", "HEAD")
    assert "old (HEAD), median" in text and "**1.100** ±" in text


def test_versus_of_one_push_has_no_interval_and_skips_a_push_missing_a_version() -> None:
    lone = {NEW: _push(100, 100, 10, 10)[NEW]}
    rows = versus([_push(120, 100, 10, 10), lone])
    assert rows[0]["pushes"] == 1
    assert rows[0]["ratio_mean"] == pytest.approx(1.2) and rows[0]["ratio_ci95"] == 0.0
