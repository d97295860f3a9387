"""``bench/proxy_stats.py``: what a proxy spends idle, net of the paths through it, and
which direct path each path is compared with."""

from __future__ import annotations

import pytest

from bench.proxy_stats import (
    BASE_DIRECT,
    DIRECT,
    Window,
    baseline_of,
    cell_row,
    idle_cpu_rate,
    summarize,
)


def window(target: str, cpu: dict[str, float], requests: int,
           workload: str = "short") -> Window:
    result = Window(target, workload, 1, 1)
    result.seconds = 10.0
    result.latencies = [0.01] * requests
    result.agent_cpu_s = cpu
    return result


def test_a_path_through_the_same_agent_is_not_its_idle_time() -> None:
    # "agent (rule)" runs in the "agent" process: its CPU is requests, not idle work.
    # The summary once counted it as idle and halved the agent's net CPU per request.
    cell = [window(DIRECT, {"agent": 0.01, "agent@old": 0.01}, 1000),
            window("agent", {"agent": 0.5, "agent@old": 0.01}, 900),
            window("agent (rule)", {"agent": 0.5, "agent@old": 0.01}, 900),
            window("agent@old", {"agent": 0.01, "agent@old": 0.8}, 900)]
    assert idle_cpu_rate(cell, "agent") == pytest.approx(0.02 / 20.0)
    assert idle_cpu_rate(cell, "agent@old") == pytest.approx(0.03 / 30.0)
    row = cell_row(cell, "agent")
    gross, net = row["agent_cpu_ms_per_request"], row["agent_cpu_ms_per_request_net"]
    assert round(gross, 3) == 0.556 and round(net, 3) == 0.544
    rule = cell_row(cell, "agent (rule)")
    assert round(rule["agent_cpu_ms_per_request_net"], 3) == 0.544


def test_base_model_paths_are_compared_with_vllms_base_model() -> None:
    assert baseline_of("bare (base)") == BASE_DIRECT
    assert baseline_of("app (base)") == BASE_DIRECT
    assert baseline_of("agent") == DIRECT and baseline_of("relay") == DIRECT
    cell = [window(DIRECT, {}, 500), window("agent", {}, 450),
            window(BASE_DIRECT, {}, 800), window("bare (base)", {"bare": 0.4}, 720)]
    bare = cell_row(cell, "bare (base)")
    assert bare["baseline"] == BASE_DIRECT
    assert bare["rps_ratio_mean"] == pytest.approx(0.9)
    assert bare["requests"] == [720, 800]
    assert cell_row(cell, "agent")["rps_ratio_mean"] == pytest.approx(0.9)


def test_a_path_that_sits_out_a_cell_gets_no_row_in_it() -> None:
    windows = [window(DIRECT, {}, 500), window(BASE_DIRECT, {}, 800),
               window("bare (base)", {}, 720),
               window(DIRECT, {}, 50, "long-streamed"), window("agent", {}, 45, "long-streamed"),
               window(BASE_DIRECT, {}, 80, "long-streamed")]
    rows = {(r["workload"], r["target"]) for r in summarize(windows)}
    # The direct paths are baselines, not rows.
    assert rows == {("short", "bare (base)"), ("long-streamed", "agent")}
