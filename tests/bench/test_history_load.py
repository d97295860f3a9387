"""The history-under-load benchmark, small: 4,000 versions on both backends (a private
Postgres cluster and the embedded SQLite default), one cold round per query, one quiet
and one pushing phase of at least 3 s (and two pushes). It checks the benchmark works
end to end: the seeded history is what the alias moves imply, the caches really were
emptied, every query was read in both phases, and the pushes went through. No timing
is asserted; bench/history_load.py runs it at 1,000,000 versions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.history_data import History
from bench.history_load import main
from bench.history_readers import PUSHING, QUIET, LoadRun, _PhaseEnd, queries


def test_seeded_history_counts_the_moves_pushes_and_promotions_make() -> None:
    history = History(4000, 10, seed=3)
    rows = [row for batch in history.batches(size=700) for row in batch.moves]
    assert history.move_count("bench-hot", "latest") == 400
    # Every 10th hot version goes live, every 20th promotion is rolled back.
    assert history.move_count("bench-hot", "live") == 40 + 2
    assert history.move_count("bench-hot", "canary") == 100
    assert len(rows) == history.moves == 4000 + 42 + 100 + 9 * (400 // 50)
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    # Each alias's revisions count up from 1 in move order.
    by_alias: dict[int, list[int]] = {}
    for row in rows:
        by_alias.setdefault(row[1], []).append(row[2])
    assert all(revs == list(range(1, len(revs) + 1)) for revs in by_alias.values())


async def test_a_phase_ends_once_every_query_was_read_and_its_pushes_ended() -> None:
    specs = queries(History(4000, 10, seed=3).hot_versions)
    run = LoadRun()
    run.reads[(QUIET, specs[0].label)].append(1.0)  # an earlier quiet phase's
    end = _PhaseEnd(run, QUIET, specs, pushes=0)
    for spec in specs[:-1]:
        run.reads[(QUIET, spec.label)].append(1.0)
    assert not end.reached()
    run.reads[(QUIET, specs[-1].label)].append(1.0)
    assert end.reached()
    pushing = _PhaseEnd(run, PUSHING, specs, pushes=2)
    for spec in specs:
        run.reads[(PUSHING, spec.label)].append(1.0)
    run.pushes.append(10.0)
    assert not pushing.reached()
    run.push_errors.append("refused")  # a failed push ended too, and is reported
    assert pushing.reached()


async def test_a_phase_does_not_wait_on_a_reader_that_failed() -> None:
    specs = queries(History(4000, 10, seed=3).hot_versions)

    async def failing() -> None:
        raise ConnectionError("the registry went away")

    task = asyncio.create_task(failing())
    await asyncio.wait([task])
    with pytest.raises(ConnectionError):
        await _PhaseEnd(LoadRun(), QUIET, specs, pushes=0).wait([task])


def _check(result: dict[str, Any]) -> None:
    labels = [q.label for q in queries(result["hot_versions"])]
    assert [c["query"] for c in result["cold"]] == labels
    for cold in result["cold"]:
        assert cold["rounds"] == 1 and cold["cold_ms"][0] > 0 and cold["warm_ms"][0] > 0
        # fincore saw nothing of the database left in the page cache.
        assert cold["cached_bytes_left"] == [0], cold
    assert [s["n"] for s in result["alias_history_shapes"]] == [2, 2]
    load = result["load"]
    assert [r["query"] for r in load["reads"]] == labels
    for read in load["reads"]:
        assert read["n_quiet"] > 0 and read["n_pushing"] > 0, read
    pushes = load["pushes"]
    assert pushes["error_count"] == 0, pushes["errors"]
    assert pushes["n"] >= 2


def test_history_load_small_on_both_backends() -> None:
    document = main(["--versions", "4000", "--adapters", "20", "--cold-rounds", "1",
                     "--shape-samples", "2", "--phases", "1", "--phase-seconds", "3",
                     "--push-interval", "0.5"])
    assert document["commit"] and document["options"]["versions"] == 4000
    assert [r["backend"] for r in document["results"]] == ["postgres", "sqlite"]
    for result in document["results"]:
        assert result["alias_moves"] > result["versions"]
        _check(result)
