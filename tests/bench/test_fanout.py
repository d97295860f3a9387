"""The fan-out benchmark, small: 8 real agents and the stand-in for vLLM against one real
registry (Postgres, SeaweedFS, NATS). It checks the bench works, that a push reaches
every agent with no desired-state read at all, and that a fleet change moves exactly
what rendezvous placement implies. No timing is asserted; bench/fanout.py runs it at
100 agents."""

from __future__ import annotations

from pathlib import Path

from bench.fanout import run


async def test_a_push_reaches_every_agent_without_reads_and_moves_are_minimal(
    tmp_path: Path,
) -> None:
    result = await run(tmp_path, steps=[4, 8], placed=24, replicas=2, change=2)
    assert [p["agents"] for p in result["pushes"]] == [4, 8]
    for push in result["pushes"]:
        # The version and its alias move: two events, whatever the fleet's size.
        assert push["events_published"] == 2
        assert push["desired_reads"] == 0, push["requests"]
        # Each agent fetches the new files (two) and reports; nothing else grows with it.
        files = "GET /v1/adapters/{name}/versions/{version}/files/{filename}"
        assert push["requests"].get(files) == 2 * push["agents"], push["requests"]
    change = result["fleet_change"]
    assert len(change["stopped"]) == len(change["started"]) == 2
    for phase in ("leave", "join"):
        moves = change[phase]
        assert moves["loads"] == moves["min_loads"], change
        assert moves["unloads"] == moves["min_unloads"] == 0, change
    assert change["join"]["min_loads"] > 0
    # Leaves only add owners; what survivors still hold needs no load.
    assert change["leave"]["min_loads"] <= change["leave"]["owner_changes"], change
