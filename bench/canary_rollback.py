"""Canary rollback: from the analysis' failing judgement to weight 0 on every agent.

The fleet is the fan-out benchmark's (``bench/fanout_fleet.py``): one registry on
Postgres, SeaweedFS and NATS, real ``loraplane agent`` processes, and the vLLM stand-in
(``devharness/vllm_standin.py``) with one port per agent. Each round makes an adapter
(version 1 on ``live``, loaded on every agent by one request through each), tells the
stand-in to refuse every load of version 2 (a fault: ``load_status`` 500), and starts a
canary of version 2 at 50 % (``--step-seconds`` long, so every agent has applied it).
Every agent fails to load it and reports the failure; at the step's end the analysis
judges ``load_failures`` failed and rolls the canary back.

Measured per agent, wall clock of this one machine: from the registry's log line of
that judgement (``canary N: stop: rolled back ...``, written once its transaction
committed) to the agent's log line of the move that took the canary off its route
table (``<adapter>@live: canary none``: weight 0, every request on stable), both at
whole milliseconds. The rounds' samples are pooled per fleet size: p50, p99, max.

    .venv/bin/python -m bench.canary_rollback --agents 10,100 --rounds 5

``tests/bench/test_canary_rollback.py`` runs a small version (4 agents) in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.agent_setup import log_time
from bench.common import git_commit, machine_summary, percentile, run_in_work_dir
from bench.fanout import adapter_folder
from bench.fanout_fleet import AGENT_SETTINGS, BASE_MODEL, Fleet, running_fleet
from devharness.openai_client import limits
from devharness.waiting import eventually
from loraplane.api.canaries import CanaryAnalysis
from loraplane.client import AsyncRegistryClient

TENANT = "bench"
# The fan-out's quiet agents, reporting a canary's counts every second.
SETTINGS = {**AGENT_SETTINGS, "canary_report_interval_s": "1"}
SETTLE_TIMEOUT_S = 600.0


def _line_time(log: str, pattern: re.Pattern[str]) -> float | None:
    for line in log.splitlines():
        if pattern.search(line) and (at := log_time(line)) is not None:
            return at
    return None


def rolled_back_at(fleet: Fleet, canary_id: int) -> float | None:
    """When the registry logged the analysis' rollback of ``canary_id`` (committed)."""
    log = (fleet.registry.work_dir / "registry.log").read_text(errors="replace")
    return _line_time(log, re.compile(rf"canaries\.analyst: canary {canary_id}: stop: "
                                      r"rolled back"))


def canary_lines(fleet: Fleet, name: str, what: str) -> dict[str, float]:
    """agent id -> when its log says ``name@live: canary <what>``."""
    pattern = re.compile(rf"control\.swap: {re.escape(name)}@live: canary {re.escape(what)}$")
    found = {}
    for agent_id, agent in fleet.agents.items():
        log = (agent.log_dir / f"{agent_id}.log").read_text(errors="replace")
        at = _line_time(log, pattern)
        if at is not None:
            found[agent_id] = at
    return found


async def make_hot(fleet: Fleet, token: str, name: str) -> None:
    """One request of ``name@live`` through every agent: version 1 loaded everywhere, so
    each agent loads the canary's version before it routes it (and fails)."""
    limit = asyncio.Semaphore(20)
    async with httpx.AsyncClient(timeout=120, limits=limits(),
                                 headers={"Authorization": f"Bearer {token}"}) as client:

        async def ask(url: str) -> None:
            async def ok() -> bool:
                async with limit:
                    response = await client.post(f"{url}/v1/completions", json={
                        "model": f"{name}@live", "prompt": "x", "max_tokens": 1})
                return response.status_code == 200

            await eventually(ok, timeout_s=SETTLE_TIMEOUT_S, interval_s=0.5,
                             what=f"{name}@live served by {url}")

        await asyncio.gather(*(ask(agent.url) for agent in fleet.agents.values()))


async def one_round(fleet: Fleet, api: AsyncRegistryClient, token: str, work: Path,
                    index: int, step_seconds: int) -> dict[str, Any]:
    name = f"rollback-{len(fleet.agents)}-{index}"
    await api.create_adapter(name, BASE_MODEL, tenant=TENANT)
    await api.push(name, adapter_folder(work, 1), aliases=["live"])
    await api.push(name, adapter_folder(work, 2))
    await make_hot(fleet, token, name)
    await asyncio.to_thread(fleet.standin.set_fault, f"{name}@2", load_status=500)
    canary = await api.start_canary(name, 2, steps=[50], step_seconds=step_seconds,
                                    analysis=CanaryAnalysis())

    async def aborted() -> bool:
        return (await api.list_canaries(name)).canaries[0].state == "aborted"

    await eventually(aborted, timeout_s=SETTLE_TIMEOUT_S, interval_s=0.2,
                     what=f"canary {canary.id} rolled back")
    started = await eventually(lambda: rolled_back_at(fleet, canary.id),
                               timeout_s=60, what="the rollback's log line")
    on_canary = canary_lines(fleet, name, "2 at 50%")

    def taken_off() -> dict[str, float] | None:
        found = canary_lines(fleet, name, "none")
        return found if found.keys() >= on_canary.keys() else None

    applied = await eventually(taken_off, timeout_s=SETTLE_TIMEOUT_S, interval_s=0.2,
                               what="every agent that had the canary taking it off")
    await asyncio.to_thread(fleet.standin.clear_faults)
    delays = sorted(applied[agent_id] - started for agent_id in on_canary)
    live = next(a.version for a in (await api.get_adapter(name)).aliases if a.alias == "live")
    return {"agents": len(fleet.agents), "adapter": name, "canary_id": canary.id,
            "live_version": live, "agents_with_canary": len(on_canary),
            "delays_s": [round(d, 3) for d in delays]}


def summary(delays: Sequence[float]) -> dict[str, float]:
    return {"samples": len(delays), "p50_ms": round(percentile(delays, 50) * 1000, 1),
            "p99_ms": round(percentile(delays, 99) * 1000, 1),
            "max_ms": round(max(delays) * 1000, 1)}


async def run(work: Path, *, sizes: Sequence[int], rounds: int,
              step_seconds: int) -> dict[str, Any]:
    result: dict[str, Any] = {"machine": machine_summary(), **git_commit(),
                              "sizes": list(sizes), "rounds": rounds, "results": []}
    async with running_fleet(work, ports=max(sizes)) as fleet:
        token = fleet.registry.create_token("inference", "bench-client", tenant=TENANT)
        async with AsyncRegistryClient(fleet.registry.url, fleet.registry.admin_token,
                                       timeout_s=300) as api:
            for size in sizes:
                fleet.add_agents(size - len(fleet.agents), settings=SETTINGS)
                done = [await one_round(fleet, api, token, work, i, step_seconds)
                        for i in range(rounds)]
                pooled = [d for r in done for d in r["delays_s"]]
                row = {"agents": size, **summary(pooled), "rounds": done}
                result["results"].append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="canary rollback to every agent")
    parser.add_argument("--agents", default="10,100",
                        help="fleet sizes, comma-separated, not shrinking")
    parser.add_argument("--rounds", type=int, default=5, help="rollbacks at each size")
    parser.add_argument("--step-seconds", type=int, default=10,
                        help="the canary's step: every agent has applied it by its end")
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.agents.split(",")]
    result = run_in_work_dir("canary-rollback-", args.work_dir, lambda tmp: run(
        tmp, sizes=sizes, rounds=args.rounds, step_seconds=args.step_seconds))
    text = json.dumps(result, indent=2, default=str)
    if args.json_out is not None:
        args.json_out.write_text(text)
    print(json.dumps([{k: v for k, v in r.items() if k != "rounds"}
                      for r in result["results"]], indent=2))


if __name__ == "__main__":
    main()
