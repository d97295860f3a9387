"""``bench/proxy_stats.py``: what a proxy spends idle, net of the paths through it, and
one row per path through a proxy, each against vLLM directly."""

from __future__ import annotations

import pytest

from bench.proxy_stats import DIRECT, Window, cell_row, idle_cpu_rate, summarize


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


def test_every_path_through_a_proxy_is_a_row_against_vllm() -> None:
    windows = [window(DIRECT, {}, 500), window("agent", {}, 450), window("relay", {}, 500),
               window(DIRECT, {}, 50, "long-streamed"), window("agent", {}, 45, "long-streamed")]
    rows = {(r["workload"], r["target"]): r for r in summarize(windows)}
    # The direct path is the baseline, not a row.
    assert set(rows) == {("short", "agent"), ("short", "relay"), ("long-streamed", "agent")}
    assert rows[("short", "agent")]["rps_ratio_mean"] == pytest.approx(0.9)
    assert rows[("short", "agent")]["requests"] == [450, 500]
