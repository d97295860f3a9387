"""What an agent's status report costs the registry: the one request per agent per push
that fan-out still has (``bench/fanout.py``), measured alone.

A registry (``loraplane registry serve``) on a fresh Postgres database, SeaweedFS and a
``nats-server``; ``--agents`` agent tokens, each reporting as its own agent a status
the size an agent of the 100-agent fan-out sends (``--adapters`` served aliases and
tier entries, three loaded versions). First every agent reports once (its join), then
``--rounds`` rounds: in each, every agent posts a changed report at once, as a push
makes a fleet do, each with ``Prefer: return=minimal`` as agents send it
(``--answer full``: without it, the stored agent echoed back). Reported: the registry's
CPU (``/proc``) per report, the time until the last report of a round is answered, and
each report's latency.

    .venv/bin/python -m bench.status_ingest --agents 100 --rounds 10 [--answer full] [--py-spy DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.agent_setup import MachineLoad
from bench.common import git_commit, percentile, record, registry_alone, table
from bench.fanout_profile import inclusive, profiled
from bench.sched_probe import cpu_ms
from devharness.testbed import metric
from loraplane.events import AgentStatus, ServedVersion, TierEntry

BASE = "base"


def status(agent_id: str, adapters: int, version: int) -> dict[str, Any]:
    """A report like a fan-out agent's: every adapter's alias served, its tier, and
    three versions loaded; ``version`` is the pushed adapter's new version."""
    served = [ServedVersion(adapter=f"placed-{i:03d}", alias="live", version=1,
                            state="serving") for i in range(adapters)]
    served.append(ServedVersion(adapter="fanout-all", alias="live", version=version,
                                state="serving"))
    tiers = [TierEntry(adapter=s.adapter, version=s.version,
                       tier="hot" if i < 3 else "cold", owned=i < 2)
             for i, s in enumerate(served)]
    loaded = [f"{s.adapter}@{s.version}" for s in served[:2]] + [f"fanout-all@{version}"]
    report = AgentStatus(agent_id=agent_id, base_model=BASE, time=datetime.now(UTC),
                         served=served, loaded=loaded, tiers=tiers)
    return report.model_dump(mode="json")


async def post(client: httpx.AsyncClient, agent_id: str, token: str,
               body: dict[str, Any], minimal: bool = True) -> float:
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"}
    if minimal:  # as agents send it (inference_agent/node/registry_client.py)
        headers["Prefer"] = "return=minimal"
    response = await client.post(f"/v1/agents/{agent_id}/status", json=body, headers=headers)
    if response.status_code != (204 if minimal else 200):
        raise RuntimeError(f"report of {agent_id}: {response.status_code} {response.text}")
    return time.perf_counter() - started


async def batched(client: httpx.AsyncClient) -> tuple[float, float]:
    """Reports the registry has stored, and the transactions it took (its batches)."""
    response = await client.get("/metrics")
    response.raise_for_status()
    name = "loraplane_registry_report_batch_size"
    return metric(response.text, f"{name}_sum"), metric(response.text, f"{name}_count")


async def rounds(url: str, pid: int, tokens: dict[str, str], args: argparse.Namespace
                 ) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=len(tokens), max_keepalive_connections=len(tokens))
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await asyncio.gather(*(post(client, a, t, status(a, args.adapters, 1))
                               for a, t in tokens.items()))  # the joins
        walls, latencies, cpu = [], [], []
        batched_before = await batched(client)
        for number in range(2, args.rounds + 2):
            bodies = {a: status(a, args.adapters, number) for a in tokens}
            before, started = cpu_ms(pid), time.perf_counter()
            latencies += await asyncio.gather(*(post(client, a, t, bodies[a],
                                                     args.answer == "minimal")
                                                for a, t in tokens.items()))
            walls.append(time.perf_counter() - started)
            cpu.append((cpu_ms(pid) - before) / len(tokens))
        reports, transactions = (after - before for after, before
                                 in zip(await batched(client), batched_before, strict=True))
    return {"reports_per_transaction": round(reports / transactions, 2) if transactions else None,
            "round_wall_ms": [round(w * 1000, 1) for w in walls],
            "cpu_ms_per_report": [round(c, 2) for c in cpu],
            "report_ms": {f"p{p}": round(percentile(latencies, p) * 1000, 1)
                          for p in (50, 99)}}


def measure(work: Path, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    with contextlib.ExitStack() as stack:
        registry = registry_alone(stack, work, "status-ingest")
        pid = registry.process.pid
        assert pid is not None
        tokens = {f"agent-{i:03d}": registry.create_token("agent", f"agent-{i:03d}")
                  for i in range(args.agents)}
        spied = [pid] if args.py_spy is not None else []
        with MachineLoad() as load, profiled(spied, args.py_spy or work) as outputs:
            result = asyncio.run(rounds(registry.url, pid, tokens, args))
        if spied:
            result["profile"] = inclusive(outputs)
    return result, load.summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100, help="reporting agents (100)")
    parser.add_argument("--adapters", type=int, default=100,
                        help="placed adapters in each report, besides the pushed one (100)")
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds (10)")
    parser.add_argument("--answer", choices=("minimal", "full"), default="minimal",
                        help="minimal: Prefer: return=minimal, as agents send (204); full: "
                             "the stored agent echoed back (200)")
    parser.add_argument("--py-spy", dest="py_spy", type=Path, default=None, metavar="DIR",
                        help="sample the registry with py-spy; its busy functions, inclusive")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if min(args.agents, args.rounds) < 1 or args.adapters < 0:
        parser.error("--agents and --rounds must be positive, --adapters not negative")
    commit = git_commit()
    with tempfile.TemporaryDirectory(prefix="lp-bench-status-", dir=args.work_dir) as work:
        result, machine = measure(Path(work), args)
    cpu, walls = result["cpu_ms_per_report"], result["round_wall_ms"]
    print(table(["agents", "adapters", "rounds", "registry CPU ms/report (median)",
                 "round wall ms (median)", "report p50 ms", "report p99 ms",
                 "reports per transaction"],
                [[args.agents, args.adapters, args.rounds, percentile(cpu, 50),
                  percentile(walls, 50), result["report_ms"]["p50"],
                  result["report_ms"]["p99"], result["reports_per_transaction"]]]))
    if "profile" in result:
        for name, share in result["profile"]["inclusive_pct"]:
            print(f"{share:5.1f}%  {name}")
    return record("status_ingest", commit, machine, args.json_out, agents=args.agents,
                  adapters=args.adapters, answer=args.answer, **result)


if __name__ == "__main__":
    main()
