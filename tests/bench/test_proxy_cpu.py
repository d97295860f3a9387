"""The short version of ``bench/proxy_cpu.py``: it still runs, for this checkout's proxy
and another commit's, and gives a CPU figure for each; how large is the bench's to say."""

from __future__ import annotations

import json
from pathlib import Path

from bench.proxy_cpu import main, round_ratios


def test_the_proxy_cpu_benchmark_measures_both_proxies(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    # 300 requests: about 60 ms of the proxy's CPU, several 10 ms ticks, so a round
    # reads more than nothing on a loaded machine too.
    result = main(["--requests", "300", "--rounds", "2", "--also-commit", "HEAD",
                   "--json-out", str(out)])
    assert json.loads(out.read_text()) == result
    names = list(result["cpu_ms_per_request"])
    assert names[0] == "proxy" and names[1].startswith("proxy@") and len(names) == 2
    for values in result["cpu_ms_per_request"].values():
        assert len(values) == 2 and all(v > 0 for v in values)
    ratio, half_width = result[f"ratio_to_{names[1]}"]
    assert ratio > 0 and half_width >= 0 and result["rounds_without_ratio"] == 0
    assert len(result["commit"]["commit"]) == 40


def test_a_round_that_reads_no_cpu_gives_no_ratio() -> None:
    # CI once divided by a round of 50 requests that read 0 ticks of the proxy's CPU.
    assert round_ratios([0.0, 0.2, 0.1], [0.3, 0.4, 0.0]) == [2.0, 0.0]
    assert round_ratios([0.0], [0.3]) == []
