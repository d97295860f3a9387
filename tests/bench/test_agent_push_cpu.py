"""The short version of ``bench/agent_push_cpu.py``: it runs and reports, never how fast."""

from __future__ import annotations

from pathlib import Path

from bench.agent_push_cpu import main


def test_the_push_cpu_benchmark_counts_both_processes(tmp_path: Path) -> None:
    document = main(["--pushes", "3", "--warmup", "1", "--work-dir", str(tmp_path),
                     "--json-out", str(tmp_path / "out.json")])
    assert document["pushes"] == 3
    # Each push reached the agent and the registry: both spent CPU on it.
    assert document["agent_cpu_ms_per_push"] > 0 and document["registry_cpu_ms_per_push"] > 0
    # At least the event, the two files, the load and the report each woke the agent.
    assert document["agent_runs_per_push"] >= 5
    assert 0 < document["push_wall_ms"]["p50"] <= document["push_wall_ms"]["p99"]
    assert len(document["commit"]) == 40 and (tmp_path / "out.json").is_file()
