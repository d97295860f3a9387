"""The short version of ``bench/proxy_cpu.py``: it still runs, for this checkout's proxy
and another commit's, and gives a CPU figure for each; how large is the bench's to say."""

from __future__ import annotations

import json
from pathlib import Path

from bench.proxy_cpu import main


def test_the_proxy_cpu_benchmark_measures_both_proxies(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = main(["--requests", "50", "--rounds", "2", "--also-commit", "HEAD",
                   "--json-out", str(out)])
    assert json.loads(out.read_text()) == result
    names = list(result["cpu_ms_per_request"])
    assert names[0] == "proxy" and names[1].startswith("proxy@") and len(names) == 2
    for values in result["cpu_ms_per_request"].values():
        # CPU time comes in 10 ms ticks: 50 requests may show none, never less.
        assert len(values) == 2 and all(v >= 0 for v in values)
    assert f"ratio_to_{names[1]}" in result
    assert len(result["commit"]["commit"]) == 40
