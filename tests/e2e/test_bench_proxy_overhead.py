"""The short version of ``bench/agent_proxy_overhead.py``, on the end-to-end testbed.

It checks that the benchmark still works (every path, workload and agent it measures,
the agent of another commit and the floor proxies (a byte relay and nginx) included),
not how fast anything is: CI machines are loaded, and the numbers are the benchmark's
to record (docs/benchmarks.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.agent_proxy_overhead import Names, parse_args, run_on
from bench.proxy_stats import render
from devharness.testbed import Testbed
from tests.e2e.steps import delete_adapter

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def test_the_proxy_overhead_benchmark_runs_every_path(testbed: Testbed, unique: str,
                                                      tmp_path: Path) -> None:
    names = Names(adapter=f"bench-{unique}", customer=f"bench-{unique}")
    args = parse_args(["--rounds", "2", "--window", "0.3", "--long-window", "0.2",
                       "--workloads", "short", "long-prompt", "long-streamed",
                       "--concurrency", "2", "--also-commit", "HEAD", "--floor-proxies",
                       # Every CPU this process may use: the path runs, and the shared
                       # testbed's vLLM is left as fast as it was for the tests after.
                       "--vllm-cpus", ",".join(map(str, os.sched_getaffinity(0)))])
    try:
        document = run_on(testbed, args, tmp_path, names)
    finally:
        delete_adapter(testbed, names.adapter)
    rows = document["rows"]
    every = {"agent", "agent (rule)", f"agent@{document['commit']['commit'][:10]}",
             "relay", "nginx"}
    for workload in ("short", "long-prompt", "long-streamed"):
        assert {row["target"] for row in rows if row["workload"] == workload} == every
    cells = {(row["workload"], row["concurrency"]) for row in rows}
    assert cells == {(w, 2) for w in ("short", "long-prompt", "long-streamed")}
    for row in rows:
        assert row["failed"] == [0, 0], document["first_failures"]
        assert min(row["requests"]) > 0 and row["rounds"] == 2, row
        # Greedy on the same weights: every path got the same text for each prompt.
        assert row["max_distinct_outputs_per_prompt"] == 1, row
        # CPU time has 10 ms ticks: a window this short may show none, never less.
        assert row["rps_ratio_mean"] > 0 and row["agent_cpu_ms_per_request"] >= 0, row
        assert (row["first_chunk_p50_ms"] is not None) == (row["workload"] == "long-streamed")
        # The other commit's agent is also compared with the current one, round by round.
        assert (row["current_agent_rps_ratio"] is not None) == ("@" in row["target"]), row
    assert len(document["commit"]["commit"]) == 40
    # vLLM's API server, engine core and their threads: several, each one pinned.
    assert document["vllm_threads_pinned"] > 2
    assert document["machine"]["cpus"] and "cpu_busy_share" in document["machine"]
    table = render(rows)
    assert table.count("\n") == len(rows) + 1 and "agent (rule)" in table


def test_the_benchmark_measures_the_canary_split(testbed: Testbed, unique: str,
                                                 tmp_path: Path) -> None:
    """``--canary``: the agents' path goes through a running canary's split, and the
    answers stay version 1's (its customer is on stable), as vLLM's own."""
    names = Names(adapter=f"split-{unique}", customer=f"split-{unique}", canary_weight=50)
    args = parse_args(["--rounds", "2", "--window", "0.3", "--workloads", "short",
                       "--concurrency", "2", "--canary", "50", "--also-commit", "HEAD"])
    try:
        document = run_on(testbed, args, tmp_path, names)
    finally:
        delete_adapter(testbed, names.adapter)
    rows = document["rows"]
    assert {row["target"] for row in rows} == {
        "agent", f"agent@{document['commit']['commit'][:10]}"}
    for row in rows:
        assert row["failed"] == [0, 0], document["first_failures"]
        assert row["max_distinct_outputs_per_prompt"] == 1, row
    assert document["args"]["canary_weight"] == 50
