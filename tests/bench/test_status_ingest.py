"""The short version of ``bench/status_ingest.py``: it runs and reports, never how fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.status_ingest import main


@pytest.mark.parametrize("answer", ["minimal", "full"])
def test_the_status_ingest_benchmark_times_every_round(tmp_path: Path, answer: str) -> None:
    document = main(["--agents", "4", "--adapters", "10", "--rounds", "2", "--answer", answer,
                     "--work-dir", str(tmp_path), "--json-out", str(tmp_path / "out.json")])
    assert document["agents"] == 4 and document["adapters"] == 10
    assert document["answer"] == answer
    assert len(document["round_wall_ms"]) == len(document["cpu_ms_per_report"]) == 2
    # The registry handled every report: its CPU moved in each round.
    assert all(ms > 0 for ms in document["cpu_ms_per_report"] + document["round_wall_ms"])
    assert 0 < document["report_ms"]["p50"] <= document["report_ms"]["p99"]
    # Eight reports stored, in one to eight transactions.
    assert 1 <= document["reports_per_transaction"] <= 8
    assert len(document["commit"]) == 40 and (tmp_path / "out.json").is_file()
