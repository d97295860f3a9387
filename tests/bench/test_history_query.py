"""The short version of ``bench/history_query.py``, on the machine's Postgres: it still
loads a history, times every page at every layer, prints its ratios and records the
commit; how fast anything is stays the bench's to say (docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.history_query import main

LAYERS = {"api", "service", "sql"}
PAGES = {"first page", "middle", "near the end", "typical adapter, first page"}


def test_the_history_query_benchmark_times_every_page_at_every_layer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    document = main(["--versions", "3000", "--adapters", "5", "--samples", "3",
                     "--json-out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(document, default=str))
    measured = {(r["layer"], r["position"]) for r in document["results"]}
    assert measured == {(layer, page) for layer in LAYERS for page in PAGES} | {
        ("sql OFFSET (contrast)", "middle")}
    for r in document["results"]:  # the OFFSET contrast takes at least 10 samples
        assert r["n"] == (10 if "OFFSET" in r["layer"] else 3), r
        assert 0 < r["p50_ms"] <= r["max_ms"], r
    assert document["dataset"]["versions"] == 3000
    assert set(document["plans"]) == PAGES
    assert set(document["ratios"]) == {"middle page, OFFSET / keyset (sql p50)",
                                       "middle page, api / sql (p50)",
                                       "middle page, service / sql (p50)"}
    assert all(value > 0 for value in document["ratios"].values())
    assert len(document["commit"]["commit"]) == 40
    printed = capsys.readouterr().out
    assert "middle page, api / sql (p50): " in printed
    assert f"commit {document['commit']['commit']}" in printed


@pytest.mark.parametrize("argv", [["--versions", "30", "--adapters", "20"],
                                  ["--adapters", "1"], ["--samples", "0"]])
def test_a_history_too_small_for_full_pages_is_refused(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "error: --" in capsys.readouterr().err
