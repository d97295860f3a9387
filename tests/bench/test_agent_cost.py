"""The short version of ``bench/agent_cost.py``: it still runs and measures an agent's
idle and scraped CPU, its CPU per request and its memory; how large is the bench's to say."""

from __future__ import annotations

import json
from pathlib import Path

from bench.agent_cost import main


def test_the_agent_cost_benchmark_measures_cpu_and_memory(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = main(["--idle-s", "1", "--rounds", "2", "--scraped-s", "2", "--batches", "2",
                   "--batch-requests", "50", "--settle-s", "0.2", "--json-out", str(out)])
    assert json.loads(out.read_text()) == result
    assert list(result["idle_cpu_pct_of_core"]) == ["agent"]
    # CPU time comes in 10 ms ticks: a short window may show none, never less.
    assert len(result["idle_cpu_pct_of_core"]["agent"]) == 2
    assert all(v >= 0 for v in result["idle_cpu_pct_of_core"]["agent"])
    assert result["scraped_cpu_pct_of_core"]["agent"] >= 0
    # The stand-in's vLLM page reached the scrapes: the picker's series are there.
    assert result["scrapes_answered"]["agent"] >= 1
    requests = result["requests"]["agent"]
    assert len(requests["cpu_ms_per_request"]) == 2 and len(requests["rss_mib"]) == 3
    assert all(rss > 10 for rss in requests["rss_mib"])
    assert len(result["commit"]["commit"]) == 40
