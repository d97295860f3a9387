"""The short version of ``bench/push_alone.py``: it runs and reports, never how fast."""

from __future__ import annotations

from pathlib import Path

from bench.push_alone import main


def test_the_push_alone_benchmark_reports_every_push(tmp_path: Path) -> None:
    document = main(["--pushes", "4", "--warmup", "1", "--busy", "1",
                     "--work-dir", str(tmp_path), "--json-out", str(tmp_path / "out.json")])
    assert document["busy_loops"] == 1 and len(document["samples_ms"]) == 4
    assert all(ms > 0 for ms in document["samples_ms"])
    cells = document["push_ms"]
    assert cells["p50"] <= cells["p90"] <= cells["p99"] <= cells["max"]
    assert len(document["commit"]) == 40 and (tmp_path / "out.json").is_file()
