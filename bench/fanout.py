"""Fan-out: one push reaching every agent of a fleet, and a fleet change, against one
registry; what the registry spends per event as the fleet grows.

The fleet (``bench/fanout_fleet.py``): one registry on Postgres, SeaweedFS and NATS,
real ``loraplane agent`` processes, and one **stand-in for vLLM**
(``devharness/vllm_standin.py``: only list, load and unload, no model) with one port
per agent. Agents start in steps (``--steps 25,50,100``); at each size:

- **Push:** a routing rule is changed (``customer`` ``c<size>`` -> ``fanout-all``; its
  event carries the change, so no agent re-reads the rules), then a new version of
  ``fanout-all`` (placed on every agent: replicas 1000) is uploaded with ``live``.
  Per agent, from the push being sent: when the stand-in
  answered the agent's load of the new version (``loaded``), and when the registry
  received the agent's report listing it loaded (``reported``: the row's
  ``last_seen_at``, read from the database, so watching costs the registry nothing).
  Also the registry's CPU time over the push (``/proc``), the events it published and
  the requests it served, by route, from its own ``/metrics``.

Then, at the last size, **a fleet change:** ``--change`` agents stop (SIGTERM: each
tells the registry it leaves), and once the fleet has settled, as many new agents start.
``--placed`` adapters with ``--replicas`` each are placed by rendezvous hashing; after
each phase the loads and unloads the stand-in answered are counted against the minimum
the placement implies (every adapter an agent newly owns is loaded once; nothing needs
unloading), once every live agent has its owned adapters loaded and has reported them.

    .venv/bin/python -m bench.fanout --steps 25,50,100 --placed 100 --replicas 2 --change 10

**Two versions in one run** (``--also-commit REV``, ``bench/fanout_versus.py``): every
other agent runs commit REV's code (``git archive``) against this checkout's registry;
each push is then summed up per version (loaded and reported p50, p99 and max, the
agents' CPU per agent), and at the end the per-push ratios this checkout / REV.

    .venv/bin/python -m bench.fanout --steps 100,100,100 --change 0 \
        --also-commit HEAD

``tests/bench/test_fanout.py`` runs a small version (8 agents) in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import git_commit, machine_summary, percentile, run_in_work_dir
from bench.fanout_fleet import BASE_MODEL, Fleet, agent_reports, requests_by_route, running_fleet
from bench.fanout_versus import push_groups, render, versus
from bench.profiling import inclusive, recording
from bench.sched_probe import SchedProbe, difference, machine_busy_s
from devharness.adapters import make_adapter
from devharness.testbed import metric
from devharness.waiting import eventually
from loraplane.client import AsyncRegistryClient
from loraplane.placement import assignment

PUSHED = "fanout-all"
EVERY_AGENT = 1000  # replicas above any fleet here: every agent owns it
TENANT = "bench"
SETTLE_TIMEOUT_S = 900.0
FILES_ROUTE = "GET /v1/adapters/{name}/versions/{version}/files/{filename}"
STATUS_ROUTE = "POST /v1/agents/{agent_id}/status"


def adapter_folder(work: Path, seed: int) -> Path:
    return make_adapter(work / "adapters" / f"seed-{seed}", rank=4, alpha=8,
                        targets=("q_proj", "v_proj"), base_model=BASE_MODEL, seed=seed)


@dataclass
class PushResult:
    agents: int
    version: int
    answered_s: float
    loaded_s: list[float]
    reported_s: list[float]
    registry_cpu_s: float
    events_published: float
    requests: dict[str, float]
    fetches: dict[str, float]
    stage_ms: dict[str, float]
    cpu: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] | None = None
    # The registry's transactions for the window's status reports (its batches).
    report_transactions: float = 0.0
    # With --also-commit: per version (bench/fanout_versus.py: push_groups).
    by_group: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        return {"agents": self.agents, "push_answered_ms": round(self.answered_s * 1000, 1),
                "loaded_p50_ms": round(percentile(self.loaded_s, 50) * 1000, 1),
                "loaded_p99_ms": round(percentile(self.loaded_s, 99) * 1000, 1),
                "reported_p50_ms": round(percentile(self.reported_s, 50) * 1000, 1),
                "reported_p99_ms": round(percentile(self.reported_s, 99) * 1000, 1),
                "reported_max_ms": round(max(self.reported_s) * 1000, 1),
                "registry_cpu_s": round(self.registry_cpu_s, 3),
                "events_published": self.events_published,
                "desired_reads": self.requests.get("GET /v1/desired", 0.0),
                "file_requests": self.requests.get(FILES_ROUTE, 0.0),
                "status_reports": self.requests.get(STATUS_ROUTE, 0.0),
                "report_transactions": self.report_transactions,
                "agent_file_fetches": self.fetches, "agent_stage_mean_ms": self.stage_ms,
                "requests": self.requests, "window_cpu": self.cpu,
                "agent_profile": self.profile,
                **({} if self.by_group is None else {"by_group": self.by_group})}


def _delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in sorted(after.items())
            if v - before.get(k, 0.0) > 0}


# The agents not yet seen whose row changed since the push (the report's ``loaded`` list
# only): a report is read once or twice, not at every look.
_LISTING = ("SELECT agent_id, last_seen_at, status->'loaded' AS loaded FROM agents "
            "WHERE agent_id = ANY($1::text[]) AND NOT agent_id = ANY($2::text[]) "
            "AND last_seen_at >= $3")


async def reported_by(fleet: Fleet, agents: Sequence[str], name: str,
                      since: float) -> dict[str, float]:
    """agent -> when the registry received its report listing ``name`` loaded, for
    reports received after ``since`` (a Unix time before the push was sent).

    Looked for 20 times a second on one connection, asking only for the rows of agents
    still missing that changed since the push: the watch shares the two cores with the
    fleet it measures, so it must cost next to nothing (0.2 ms a look).
    """
    seen: dict[str, float] = {}
    after = datetime.fromtimestamp(since, UTC)
    connection = await asyncpg.connect(fleet.database.url)

    async def everyone() -> bool:
        rows = await connection.fetch(_LISTING, list(agents), list(seen), after)
        for row in rows:
            if name in json.loads(row["loaded"]):
                seen[row["agent_id"]] = row["last_seen_at"].timestamp()
        return len(seen) == len(agents)

    try:
        await eventually(everyone, timeout_s=SETTLE_TIMEOUT_S, interval_s=0.05,
                         what=f"every agent reporting {name} loaded")
    finally:
        await connection.close()
    return seen


async def push_once(fleet: Fleet, api: AsyncRegistryClient, folder: Path,
                    profile: int = 0) -> PushResult:
    """One push; with ``profile``, py-spy on that many agents through it."""
    pids = [p for a in fleet.live()[:profile] if (p := fleet.agents[a].process.pid)]
    outputs = {pid: fleet.work / "profiles" / f"agent-{pid}.txt" for pid in pids}
    with recording(outputs, idle=False):
        result = await _push(fleet, api, folder)
    if profile:
        result.profile = inclusive(list(outputs.values()))
    return result


async def _push(fleet: Fleet, api: AsyncRegistryClient, folder: Path) -> PushResult:
    agents = fleet.live()
    ports = {fleet.port_of(a): a for a in agents}
    mark = len(fleet.standin.state()["calls"])
    metrics_before = fleet.registry.metrics()
    sums_before = await fleet.agent_sums()
    window = WindowCpu(fleet.process_groups())
    # In the window: its event reaches every agent before the push's do, so every
    # agent has acted on it once all have reported the push.
    await api.put_route("customer", f"c{len(agents)}", PUSHED, tenant=TENANT)
    sent = time.time()
    pushed = await api.push(PUSHED, folder, aliases=["live"])
    answered = time.time() - sent
    name = f"{PUSHED}@{pushed.version}"
    reported = await reported_by(fleet, agents, name, sent)
    spent = window.spent(sent, max(reported.values()))
    cpu = spent["groups"]["registry"]["cpu_ms"] / 1000
    metrics_after = fleet.registry.metrics()
    loads = {ports[c["port"]]: c["at"] for c in fleet.standin.state(mark)["calls"]
             if c["action"] == "load" and c["name"] == name and c["port"] in ports}
    assert set(loads) == set(agents), f"stand-in saw no load of {name} from some agents"
    requests = _delta(requests_by_route(metrics_after), requests_by_route(metrics_before))
    requests["GET /metrics"] = requests.get("GET /metrics", 1.0) - 1  # the bench's own
    events, transactions = (
        metric(metrics_after, series) - metric(metrics_before, series)
        for series in ("loraplane_registry_events_published_total",
                       "loraplane_registry_report_batch_size_count"))
    sums = _delta(await fleet.agent_sums(), sums_before)
    fetches = {k.removeprefix("files "): v for k, v in sums.items() if k.startswith("files ")}
    times = {"loaded": {a: loads[a] - sent for a in agents},
             "reported": {a: reported[a] - sent for a in agents}}
    return PushResult(len(agents), pushed.version, answered,
                      list(times["loaded"].values()), list(times["reported"].values()), cpu,
                      events, requests, fetches, stage_means_ms(sums), spent,
                      report_transactions=transactions,
                      by_group=None if fleet.also is None else
                      push_groups(times, fleet.group_of, spent["groups"]))


class WindowCpu:
    """CPU spent and waited for, by process group and machine-wide, from before a push
    to its last report: the work a push makes the machine do, against its two cores."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self.before = SchedProbe.read(groups)
        self.machine = machine_busy_s()
        self.started = time.time()

    def spent(self, sent: float, last_report: float) -> dict[str, Any]:
        """Per group, CPU and run-queue ms; the machine's busy CPU seconds over the
        window; and how long the push's CPU alone would keep every core busy."""
        busy = machine_busy_s() - self.machine
        wall = time.time() - self.started
        cores = len(os.sched_getaffinity(0))
        return {"groups": difference(SchedProbe.read(self.groups), self.before),
                "window_s": round(wall, 3), "machine_busy_s": round(busy, 2),
                "cores": cores, "busy_share": round(busy / (wall * cores), 3),
                "sent_to_last_report_s": round(last_report - sent, 3)}


def stage_means_ms(sums: Mapping[str, float]) -> dict[str, float]:
    """stage -> its mean time in ms over the window, from ``Fleet.agent_sums`` deltas."""
    return {key.removesuffix(" count"): round(sums.get(
                key.replace(" count", " sum"), 0.0) / count * 1000, 1)
            for key, count in sorted(sums.items()) if key.endswith(" count") and count}


# --- the fleet change --------------------------------------------------------------------


def owned_by(owners: Mapping[str, set[str]], agent_id: str) -> set[str]:
    return {adapter for adapter, agents in owners.items() if agent_id in agents}


def owner_changes(before: Mapping[str, set[str]], after: Mapping[str, set[str]],
                  live: Sequence[str]) -> int:
    """(adapter, agent) pairs rendezvous placement adds: each adapter a live agent newly
    owns."""
    return sum(len(owned_by(after, a) - owned_by(before, a)) for a in live)


def minimum_loads(loaded: Mapping[str, set[str]], fleets: Sequence[Sequence[str]],
                  replicas: Mapping[str, int | None]) -> int:
    """The fewest loads that take the fleet through ``fleets`` (one after the other),
    each agent keeping its owned adapters loaded: a newly owned adapter is loaded once,
    unless the agent still has it loaded (an owner that lost it keeps it until LRU needs
    the slot). Nothing needs unloading."""
    held = {agent: set(adapters) for agent, adapters in loaded.items()}
    total = 0
    for fleet in fleets:
        owners = assignment(fleet, replicas)
        for agent in fleet:
            gained = owned_by(owners, agent) - held.setdefault(agent, set())
            total += len(gained)
            held[agent] |= gained
    return total


def loaded_adapters(fleet: Fleet, versions: Mapping[str, int]) -> dict[str, set[str]]:
    """agent -> the adapters whose current version the stand-in has loaded for it."""
    loaded = fleet.standin.state(10**9)["loaded"]
    current = {f"{a}@{v}": a for a, v in versions.items()}
    return {agent: {current[n] for n in loaded.get(str(fleet.port_of(agent)), [])
                    if n in current} for agent in fleet.live()}


async def settled(fleet: Fleet, owners: Mapping[str, set[str]],
                   versions: Mapping[str, int]) -> None:
    """Every live agent has its owned adapters loaded and has reported owning them."""
    live = fleet.live()

    async def done() -> bool:
        loaded = fleet.standin.state(10**9)["loaded"]
        reports = await agent_reports(fleet.database)
        for agent_id in live:
            mine = owned_by(owners, agent_id)
            names = {f"{a}@{versions[a]}" for a in mine}
            if not names <= set(loaded.get(str(fleet.port_of(agent_id)), [])):
                return False
            tiers = reports.get(agent_id, {}).get("tiers", [])
            if {t["adapter"] for t in tiers if t["owned"]} != mine:
                return False
        return True

    await eventually(done, timeout_s=SETTLE_TIMEOUT_S, interval_s=0.2,
                     what="the fleet settling on its placement")


def _moves(fleet: Fleet, mark: int) -> dict[str, int]:
    ports = {fleet.port_of(a) for a in fleet.live()}
    calls = [c for c in fleet.standin.state(mark)["calls"] if c["port"] in ports]
    return {"loads": sum(c["action"] == "load" for c in calls),
            "unloads": sum(c["action"] == "unload" for c in calls)}


async def _leave(fleet: Fleet, replicas: Mapping[str, int | None],
                 versions: Mapping[str, int], leaving: Sequence[str]) -> dict[str, Any]:
    """Stop ``leaving`` at once: leaves only add owners, so the order they are seen in
    does not change what the survivors must load."""
    before, loaded = assignment(fleet.live(), replicas), loaded_adapters(fleet, versions)
    mark, started = len(fleet.standin.state()["calls"]), time.time()
    fleet.stop_agents(leaving)
    after = assignment(fleet.live(), replicas)
    await settled(fleet, after, versions)
    return {**_moves(fleet, mark), "owner_changes": owner_changes(before, after, fleet.live()),
            "min_loads": minimum_loads(loaded, [fleet.live()], replicas), "min_unloads": 0,
            "settled_s": round(time.time() - started, 2)}


async def _join(fleet: Fleet, replicas: Mapping[str, int | None],
                versions: Mapping[str, int], count: int) -> dict[str, Any]:
    """Start ``count`` agents one after the other (a rolling join): two agents starting
    at the same moment would not yet see each other, and both load what one will own.

    Also the files fetched meanwhile, by source, and the registry's file requests: a
    joining agent fetches only what it owns (its share of the placed adapters), so
    with two files per version the fetches are twice ``min_loads``."""
    before, loaded = assignment(fleet.live(), replicas), loaded_adapters(fleet, versions)
    mark, started = len(fleet.standin.state()["calls"]), time.time()
    counted = await _fetch_counts(fleet)
    fleets = []
    for _ in range(count):
        fleet.add_agents(1, prefix="joined")
        fleets.append(fleet.live())
    after = assignment(fleet.live(), replicas)
    await settled(fleet, after, versions)
    return {**_moves(fleet, mark), "owner_changes": owner_changes(before, after, fleet.live()),
            "min_loads": minimum_loads(loaded, fleets, replicas), "min_unloads": 0,
            "settled_s": round(time.time() - started, 2),
            **await _fetches_since(fleet, counted)}


async def _fetch_counts(fleet: Fleet) -> tuple[dict[str, float], dict[str, float]]:
    """The live agents' file fetches by source, and the registry's requests by route."""
    return await fleet.agent_fetches(), requests_by_route(fleet.registry.metrics())


async def _fetches_since(fleet: Fleet, counted: tuple[dict[str, float], dict[str, float]]
                         ) -> dict[str, Any]:
    """What agents fetched since ``counted`` (agents started since count from zero), and
    how many of those files the registry served (a 307 each), and the status reports it
    took meanwhile."""
    fetches, requests = await _fetch_counts(fleet)
    served = _delta(requests, counted[1])
    return {"agent_file_fetches": _delta(fetches, counted[0]),
            "file_requests": served.get(FILES_ROUTE, 0.0),
            "status_reports": served.get(STATUS_ROUTE, 0.0)}


async def change_fleet(fleet: Fleet, replicas: Mapping[str, int | None],
                       versions: Mapping[str, int], change: int) -> dict[str, Any]:
    before = fleet.live()
    leaving = before[::max(1, len(before) // change)][:change]
    left = await _leave(fleet, replicas, versions, leaving)
    joined = await _join(fleet, replicas, versions, change)
    return {"stopped": leaving, "started": sorted(set(fleet.live()) - set(before)),
            "leave": left, "join": joined}


# --- the run -----------------------------------------------------------------------------


async def prepare(fleet: Fleet, api: AsyncRegistryClient, work: Path, placed: int,
                   replicas: int) -> tuple[dict[str, int | None], dict[str, int]]:
    """Create and publish every adapter; adapter -> replicas, adapter -> live version."""
    setting: dict[str, int | None] = {PUSHED: EVERY_AGENT}
    setting.update({f"placed-{i:03d}": replicas for i in range(placed)})
    folder = adapter_folder(work, 0)

    async def publish(name: str) -> int:
        await api.create_adapter(name, BASE_MODEL, tenant=TENANT, replicas=setting[name])
        return (await api.push(name, folder, aliases=["live"])).version

    names = list(setting)
    versions: dict[str, int] = {}
    # Four at a time: the registry's limit of uploads in flight per token.
    for start in range(0, len(names), 4):
        chunk = names[start:start + 4]
        versions.update(zip(chunk, await asyncio.gather(*map(publish, chunk)), strict=True))
    return setting, versions


async def run(work: Path, *, steps: Sequence[int], placed: int, replicas: int,
              change: int, profile: int = 0,
              also: str | None = None) -> dict[str, Any]:
    """``change`` 0: no fleet change; ``also``: every other agent runs commit ``also``."""
    result: dict[str, Any] = {"machine": machine_summary(), **git_commit(),
                              "steps": list(steps),
                              "placed": placed, "replicas": replicas, "change": change,
                              "starts": [], "pushes": []}
    async with running_fleet(work, ports=max(steps) + change, also=also) as fleet:
        if fleet.also is not None:
            result["also_commit"] = {"rev": fleet.also.rev, "commit": fleet.also.commit}
        api = AsyncRegistryClient(fleet.registry.url, fleet.registry.admin_token)
        try:
            setting, versions = await prepare(fleet, api, work, placed, replicas)
            last = max(steps)
            fleet.make_tokens([*(f"agent-{i:03d}" for i in range(last)),
                               *(f"joined-{i:03d}" for i in range(last, last + change))])
            for step, size in enumerate(steps):
                counted, started = await _fetch_counts(fleet), time.time()
                fleet.add_agents(size - len(fleet.agents))
                await settled(fleet, assignment(fleet.live(), setting), versions)
                # Agents starting together: each fetches what it owns (or believes it
                # owns before the others' first reports), from the snapshot's URLs.
                start = {"agents": size, "settled_s": round(time.time() - started, 2),
                         **await _fetches_since(fleet, counted)}
                result["starts"].append(start)
                print(json.dumps(start), flush=True)
                # A new seed per push: the same bytes again would be the same version.
                push = await push_once(fleet, api, adapter_folder(work, 1000 + step),
                                       profile if step == len(steps) - 1 else 0)
                versions[PUSHED] = push.version
                result["pushes"].append(push.row())
                print(json.dumps(push.row()), flush=True)
            if change:
                result["fleet_change"] = await change_fleet(fleet, setting, versions, change)
                print(json.dumps(result["fleet_change"]), flush=True)
        finally:
            await api.aclose()
    if also is not None:
        result["also_commit"]["agents"] = sorted(fleet.old_agents)
        result["versus"] = versus([p["by_group"] for p in result["pushes"]])
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fan-out to many agents")
    parser.add_argument("--steps", default="25,50,100",
                        help="fleet sizes to push at, comma-separated, not shrinking (a size "
                             "repeated pushes again at that size)")
    parser.add_argument("--placed", type=int, default=100, help="adapters with a placement")
    parser.add_argument("--replicas", type=int, default=2, help="replicas of each of them")
    parser.add_argument("--change", type=int, default=10,
                        help="agents stopped, then started (0: no fleet change)")
    parser.add_argument("--py-spy", dest="profile", type=int, default=0, metavar="N",
                        help="profile N agents with py-spy through the last push")
    parser.add_argument("--also-commit", dest="also", metavar="REV",
                        help="run every other agent from commit REV's code and compare "
                             "the two versions push by push")
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    # A SIGTERM ends the run like ^C does: every process stopped, the database dropped.
    result = run_in_work_dir("fanout-", args.work_dir, lambda tmp: run(
        tmp, steps=steps, placed=args.placed, replicas=args.replicas, change=args.change,
        profile=args.profile, also=args.also))
    result["machine_end"] = machine_summary()
    text = json.dumps(result, indent=2, default=str)
    if args.json_out is not None:
        args.json_out.write_text(text)
    print(text)
    if "versus" in result:
        print(versus_line(result))
        print(render(result["versus"], "this checkout", result["also_commit"]["rev"]))


def versus_line(result: Mapping[str, Any]) -> str:
    """The two versions a ``--also-commit`` run compared, and the machine."""
    dirty = " (dirty)" if result["dirty"] else ""
    other = result["also_commit"]
    return (f"new: this checkout, commit {result['commit']}{dirty}; old: {other['rev']} = "
            f"{other['commit']}; machine: {result['machine']}")


if __name__ == "__main__":
    main()

