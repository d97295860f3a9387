"""The short version of ``bench/relay_latency.py`` that CI runs, so a broken benchmark
is noticed. It checks what the benchmark reports, never how fast it was."""

from __future__ import annotations

import json
import re

import pytest

from bench.relay_latency import MODES, main


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
def test_the_relay_benchmark_times_every_commit_in_both_modes(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--rounds", "2", "--commits", "3"] + (["--sqlite"] if database == "sqlite" else [])
    document = main(flags)
    assert re.fullmatch(r"[0-9a-f]{40}", document["commit"])
    assert document["database"] == database
    for mode in MODES:
        assert document[mode]["samples"] == 6
        assert 0 < document[mode]["p50_ms"] <= document[mode]["p95_ms"] <= document[mode]["p99_ms"]
    ratio = document["claim_over_hand_over_median_ratio"]
    assert 0 < ratio["min"] <= ratio["mean"] <= ratio["max"]
    assert json.loads(capsys.readouterr().out) == document
