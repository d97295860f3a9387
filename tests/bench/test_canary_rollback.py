"""The canary-rollback benchmark, small: 4 real agents and the vLLM stand-in against one
real registry (Postgres, SeaweedFS, NATS), two rollbacks. It checks the bench works:
every agent applied the canary, failed to load its version (the stand-in's fault), and
took it off its routes after the analysis rolled it back, the alias staying on version
1. No timing is asserted; bench/canary_rollback.py runs it at 10 and 100 agents."""

from __future__ import annotations

from pathlib import Path

from bench.canary_rollback import run


async def test_every_agent_takes_a_rolled_back_canary_off(tmp_path: Path) -> None:
    result = await run(tmp_path, sizes=[2, 4], rounds=2, step_seconds=3)
    assert result["commit"]
    assert [row["agents"] for row in result["results"]] == [2, 4]
    for row in result["results"]:
        assert row["samples"] == 2 * row["agents"], row
        assert row["p50_ms"] <= row["p99_ms"] <= row["max_ms"], row
        for done in row["rounds"]:
            assert done["agents_with_canary"] == done["agents"] == row["agents"], done
            assert len(done["delays_s"]) == row["agents"], done
            assert done["live_version"] == 1, done
