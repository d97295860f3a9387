"""What one push costs one agent in CPU, with nothing else in its way: the number that
bounds fan-out (``bench/fanout.py``: a hundred agents on two cores pay it a hundred
times) and a part of publish-to-served.

The fan-out fleet (``bench/fanout_fleet.py``: a registry on Postgres, SeaweedFS and
NATS, a stand-in for vLLM with only list, load and unload) with **one** agent. An
adapter placed on every agent is pushed ``--warmup`` times, then ``--pushes`` times, each
a new version uploaded with ``live``; a push is done when the registry holds the
agent's report listing the new version loaded (read from the database, so watching
costs the agent nothing). Reported: the agent's and the registry's CPU per push
(schedstat of every thread, over all the pushes), and the wall time per push. The
agent's ``/metrics`` is not scraped while it is measured.

    .venv/bin/python -m bench.agent_push_cpu --pushes 100 [--py-spy DIR]

``--py-spy DIR`` samples the agent (100 Hz) through the measured pushes and prints its
busy functions, inclusive; py-spy's own cost falls on the agent's CPU figure, so take
that figure from a run without it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.agent_setup import MachineLoad
from bench.common import git_commit, percentile, record, table
from bench.fanout import PUSHED, adapter_folder, prepare, reported_by, settled
from bench.fanout_fleet import Fleet, running_fleet
from bench.fanout_profile import inclusive, profiled
from bench.sched_probe import cpu_ms, runs
from loraplane.client import AsyncRegistryClient
from loraplane.placement import assignment


async def push(fleet: Fleet, api: AsyncRegistryClient, folder: Path) -> float:
    """One push, until the agent's report of it is in; its wall time in s."""
    started, sent = time.perf_counter(), time.time()
    pushed = await api.push(PUSHED, folder, aliases=["live"])
    await reported_by(fleet, fleet.live(), f"{PUSHED}@{pushed.version}", sent)
    return time.perf_counter() - started


async def measure(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    async with running_fleet(work, ports=1) as fleet:
        api = AsyncRegistryClient(fleet.registry.url, fleet.registry.admin_token)
        try:
            setting, versions = await prepare(fleet, api, work, placed=0, replicas=1)
            fleet.add_agents(1)
            await settled(fleet, assignment(fleet.live(), setting), versions)
            # Built before the clock starts: a new seed each, so each is a new version.
            folders = [adapter_folder(work, 2000 + i)
                       for i in range(args.warmup + args.pushes)]
            for folder in folders[:args.warmup]:
                await push(fleet, api, folder)
            agent = fleet.agents[fleet.live()[0]].process.pid
            registry = fleet.registry_pid()
            assert agent is not None
            spied = [agent] if args.py_spy is not None else []
            with profiled(spied, args.py_spy or work / "profiles") as outputs:
                before = cpu_ms(agent), cpu_ms(registry), runs(agent)
                walls = [await push(fleet, api, f) for f in folders[args.warmup:]]
                after = cpu_ms(agent), cpu_ms(registry), runs(agent)
        finally:
            await api.aclose()
    result: dict[str, Any] = {
        "agent_cpu_ms_per_push": round((after[0] - before[0]) / args.pushes, 2),
        "registry_cpu_ms_per_push": round((after[1] - before[1]) / args.pushes, 2),
        "agent_runs_per_push": round((after[2] - before[2]) / args.pushes, 1),
        "push_wall_ms": {f"p{p}": round(percentile(walls, p) * 1000, 1) for p in (50, 99)}}
    if spied:
        result["profile"] = inclusive(outputs)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=100, help="measured pushes (100)")
    parser.add_argument("--warmup", type=int, default=3, help="pushes before them (3)")
    parser.add_argument("--py-spy", dest="py_spy", type=Path, default=None, metavar="DIR",
                        help="sample the agent with py-spy; its busy functions, inclusive")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.pushes < 1 or args.warmup < 0:
        parser.error("--pushes must be positive, --warmup not negative")
    commit = git_commit()
    with tempfile.TemporaryDirectory(prefix="lp-bench-push-cpu-", dir=args.work_dir) as work, \
            MachineLoad() as load:
        result = asyncio.run(measure(Path(work), args))
    print(table(["pushes", "agent CPU ms/push", "agent wake-ups/push", "registry CPU ms/push",
                 "push → reported p50 ms", "p99 ms"],
                [[args.pushes, result["agent_cpu_ms_per_push"], result["agent_runs_per_push"],
                  result["registry_cpu_ms_per_push"], result["push_wall_ms"]["p50"],
                  result["push_wall_ms"]["p99"]]]))
    for name, share in result.get("profile", {}).get("inclusive_pct", []):
        print(f"{share:5.1f}%  {name}")
    return record("agent_push_cpu", commit, load.summary, args.json_out,
                  pushes=args.pushes, **result)


if __name__ == "__main__":
    main()
