"""The short version of ``bench/http_client_cpu.py``: it runs and reports, never how fast."""

from __future__ import annotations

from pathlib import Path

from bench.http_client_cpu import KINDS, main


def test_the_client_benchmark_times_every_kind_in_every_round(tmp_path: Path) -> None:
    document = main(["--requests", "20", "--rounds", "2",
                     "--json-out", str(tmp_path / "out.json")])
    assert document is not None
    assert set(document["us_per_request"]) == set(KINDS)
    assert all(len(v) == 2 and min(v) > 0 for v in document["us_per_request"].values())
    assert set(document["httpx_over_aiohttp"]) == {"POST", "streamed GET"}
    assert document["aiohttp_over_proxy_client"] > 0
    # The agent's clients depend on it (tests/agent/test_httpx_per_request.py).
    assert document["sniffio_installed"] is True
    assert len(document["commit"]) == 40 and (tmp_path / "out.json").is_file()
