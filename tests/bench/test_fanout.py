"""The fan-out benchmark, small: 8 real agents and the stand-in for vLLM against one real
registry (Postgres, SeaweedFS, NATS). It checks the bench works; that a push (with a
routing change) reaches every agent with no desired-state read at all, no file request
to the registry (the events' presigned URLs and small files are used) and one status
report per agent;
that starting agents make no file request to the registry either (the snapshot's URLs);
and that a fleet change moves exactly what rendezvous placement implies, a joining
agent fetching only the adapters it owns. No timing is
asserted; bench/fanout.py runs it at 100 agents.

With ``--also-commit`` (8 agents, half of them run from ``git archive HEAD``): each push
is summed up per version and the two compared push by push."""

from __future__ import annotations

from pathlib import Path

from bench.fanout import run
from bench.fanout_versus import NEW, OLD, cpu_group


async def test_a_push_reaches_every_agent_without_reads_and_moves_are_minimal(
    tmp_path: Path,
) -> None:
    result = await run(tmp_path, steps=[4, 8], placed=24, replicas=2, change=2)
    assert [p["agents"] for p in result["pushes"]] == [4, 8]
    assert result["commit"]
    for start in result["starts"]:
        # Starting agents fetched from S3 with the snapshot's URLs: no 307 at all.
        assert start["file_requests"] == 0, start
        assert set(start["agent_file_fetches"]) == {"direct/ok"}, start
        # Each of the four agents the step started reported at least once.
        assert start["status_reports"] >= 4, start
    for push in result["pushes"]:
        # The routing change, the version and its alias move: three events, whatever
        # the fleet's size.
        assert push["events_published"] == 3
        # Neither the rule nor the alias move made any agent read the registry.
        assert push["desired_reads"] == 0, push["requests"]
        # Every agent wrote the new config from the event's bytes and fetched the
        # weights straight from S3 ...
        assert push["agent_file_fetches"] == {"direct/ok": push["agents"],
                                              "inline/ok": push["agents"]}, push
        assert push["file_requests"] == 0, push["requests"]
        # ... and reported the whole swap once.
        assert push["status_reports"] == push["agents"], push["requests"]
        # The registry stored those reports in one to as many transactions.
        assert 1 <= push["report_transactions"] <= push["status_reports"], push
        # Where each agent's time went: the event's delivery and the swap's stages.
        assert {"event_delay", "fetch", "validate", "load", "flip"} <= \
            set(push["agent_stage_mean_ms"]), push["agent_stage_mean_ms"]
        # What the push cost the machine: every agent and the registry ran in the window.
        cpu = push["window_cpu"]
        groups = cpu["groups"]
        assert set(groups) == {"agents", "registry", "vllm stand-in", "seaweedfs", "nats",
                               "postgres", "bench"}, cpu
        assert groups["agents"]["cpu_ms"] > 0 and groups["registry"]["cpu_ms"] > 0, cpu
        # The bench watched the reports come in: its own CPU is counted, not hidden.
        assert groups["bench"]["cpu_ms"] > 0, cpu
        assert 0 < cpu["sent_to_last_report_s"] <= cpu["window_s"], cpu
        assert cpu["machine_busy_s"] > 0 and cpu["cores"] >= 1, cpu
    change = result["fleet_change"]
    assert len(change["stopped"]) == len(change["started"]) == 2
    for phase in ("leave", "join"):
        moves = change[phase]
        assert moves["loads"] == moves["min_loads"], change
        assert moves["unloads"] == moves["min_unloads"] == 0, change
    assert change["join"]["min_loads"] > 0
    # A joining agent sees the whole fleet and fetches only what it owns (two files a
    # version), none of the placed adapters it neither owns nor serves, all from S3.
    join = change["join"]
    assert join["agent_file_fetches"] == {"direct/ok": 2 * join["min_loads"]}, change
    assert join["file_requests"] == 0, change
    # Leaves only add owners; what survivors still hold needs no load.
    assert change["leave"]["min_loads"] <= change["leave"]["owner_changes"], change


async def test_also_commit_runs_every_other_agent_from_that_commit_and_compares(
    tmp_path: Path,
) -> None:
    result = await run(tmp_path, steps=[8, 8], placed=8, replicas=2, change=0,
                       also="HEAD")
    # HEAD, resolved: the commit the run records for this checkout too.
    assert result["also_commit"] == {"rev": "HEAD", "commit": result["commit"],
                                     "agents": [f"agent-{i:03d}" for i in (1, 3, 5, 7)]}
    # The fleet change is skipped with --change 0.
    assert "fleet_change" not in result
    for push in result["pushes"]:
        groups = push["by_group"]
        assert {g["agents"] for g in groups.values()} == {4} and set(groups) == {NEW, OLD}
        for group in groups.values():
            assert 0 < group["loaded"]["p50"] <= group["loaded"]["max"], push
            assert group["loaded"]["max"] < group["reported"]["max"], push
        cpu = push["window_cpu"]["groups"]
        assert cpu[cpu_group(NEW)]["cpu_ms"] > 0 and cpu[cpu_group(OLD)]["cpu_ms"] > 0, cpu
        # Every agent of both versions took the push's files as before: nothing through
        # the registry, one report each.
        assert push["file_requests"] == 0 and push["status_reports"] == 8, push
    rows = {r["measure"]: r for r in result["versus"]}
    assert rows["reported p99 ms"]["pushes"] == 2
    assert rows["agent CPU ms per push"]["ratio_mean"] > 0
