"""Publish to served: from a push being sent to the first response from the new version.

One host (``bench/agent_setup.py``): Postgres (or, with ``--sqlite``, an SQLite file,
the registry's embedded default) + SeaweedFS + NATS, ``loraplane registry serve``, one
CPU vLLM with the tiny model, one ``loraplane agent``. The adapter is hot: probers send
back-to-back one-token completions to it through the agent the whole time, so every
push takes the swap path that loads the new version before the flip.

Each push is new content: a rank-8 q/k/v/o LoRA for the tiny Llama (hidden 128,
intermediate 256, 2 layers, 4 heads) made by ``devharness/adapters.py:
make_adapter`` with a seed of its own, pushed with ``aliases=live``. Pushes are
sequential: the next starts once the old version was unloaded.

Each push is cut into parts on one timeline that add up to the total (see
``bench/publish_timeline.py`` for the marks). ``--py-spy DIR`` records the registry's
and the agent's stacks for the whole run and dumps both while any push is slower than
``--stall-ms`` (``bench/profiling.py``). Prerequisites as for the other benchmarks, plus the
vLLM venv (``bash scripts/vllm/install.sh``).

    .venv/bin/python -m bench.agent_publish_to_served --pushes 200
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from bench.agent_setup import (
    ADAPTER,
    BASE_MODEL,
    MachineLoad,
    bench_testbed,
    by_label,
    cpu_list,
    event_delays,
    events_received,
    flips,
    log_lines,
    materialized,
    mean_event_delay,
    pin_cpus,
    stage_totals,
    wait_served,
)
from bench.common import git_commit, table
from bench.profiling import StallDumps, recording, require_py_spy
from bench.publish_timeline import COLUMNS, Push, cells, slowest, slowest_requests, summarize
from bench.sched_probe import PushProbe, SchedProbe, named, tree
from devharness.adapters import ATTENTION_MODULES, make_adapter
from devharness.openai_client import OpenAIClient
from devharness.testbed import E2E_TENANT, AgentProcess, Testbed, metric
from loraplane.client import AsyncRegistryClient
from loraplane.events import STREAM_SUBJECTS, AdapterUpdated, parse_event

SERVED_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 30.0
SEED_BASE = 5000


class Prober:
    """Back-to-back one-token completions on ``model``; for each version, the first
    answer from it and the send time of the earliest probe it answered."""

    def __init__(self, client: OpenAIClient, model: str, workers: int) -> None:
        self.client = client
        self.model = model
        self.workers = workers
        self.first_seen: dict[str, float] = {}
        self.first_sent: dict[str, float] = {}
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self._news = asyncio.Event()

    async def run(self) -> None:
        await asyncio.gather(*(self._worker(i) for i in range(self.workers)))

    async def _worker(self, index: int) -> None:
        await asyncio.sleep(index * 0.01)  # staggered: finer resolution of "first"
        while True:
            sent = time.time()
            result = await self.client.complete(self.model, max_tokens=1)
            now = time.time()
            self.latencies.append(now - sent)
            if not result.ok or result.adapter is None:
                self.failures.append(str(result))
                continue
            name = result.adapter
            self.first_sent[name] = min(sent, self.first_sent.get(name, sent))
            if name not in self.first_seen:
                self.first_seen[name] = now
                self._news.set()

    async def wait_for(self, name: str, timeout_s: float) -> float:
        """When the first response naming ``name`` arrived (wall clock)."""
        deadline = time.monotonic() + timeout_s
        while name not in self.first_seen:
            self._news.clear()
            await asyncio.wait_for(self._news.wait(), max(0.0, deadline - time.monotonic()))
        return self.first_seen[name]


class EventTimes:
    """Per version of one adapter: the alias move's own time (its outbox row, written
    right before the push commits) and its arrival at a core NATS subscriber here."""

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self.arrived: dict[int, float] = {}
        self.written: dict[int, float] = {}
        self._client: NatsClient | None = None

    async def start(self, url: str) -> None:
        self._client = await nats.connect(url)
        await self._client.subscribe(STREAM_SUBJECTS, cb=self._on_message)

    async def _on_message(self, message: Msg) -> None:
        now = time.time()
        event = parse_event(message.data)
        if isinstance(event, AdapterUpdated) and event.adapter == self.adapter and \
                event.version is not None:
            self.arrived.setdefault(event.version, now)
            self.written.setdefault(event.version, event.time.timestamp())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


@contextlib.asynccontextmanager
async def no_watch(_label: str, _started: float) -> AsyncIterator[None]:
    yield


async def push_once(api: AsyncRegistryClient, agent: AgentProcess, prober: Prober,
                    folder: Path, stalls: StallDumps | None, inside: PushProbe) -> Push:
    """Push ``folder``; wait for its first response, then for the old version's unload."""
    text = agent.metrics()
    before, delays_before = stage_totals(text), event_delays(text)
    watch = stalls.watching if stalls is not None else no_watch
    await inside.before()
    sent = time.time()
    async with watch(folder.name, sent):
        pushed = await api.push(prober.model, folder, aliases=["live"])
        answered = time.time()
        await inside.answered()
        name = f"{prober.model}@{pushed.version}"
        first = await prober.wait_for(name, SERVED_TIMEOUT_S)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        text = agent.metrics()
        delta = stage_totals(text).minus(before)
        if delta.counts["unload"] >= 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    push = Push(pushed.version, sent, answered, first, prober.first_sent[name], delta.sums,
                delta.counts)
    push.event_delay_s = mean_event_delay(delays_before, event_delays(text))
    push.registry_phases, push.sched = await inside.phases(), inside.request
    return push


def sched_groups(testbed: Testbed) -> dict[str, Callable[[], list[int]]]:
    """The processes a push request passes through or competes with for the cores."""
    return {"registry": tree(testbed.registry.process.pid),
            "postgres": lambda: named("postgres"), "seaweedfs": lambda: named("weed"),
            "nats": lambda: named("nats-server"),
            "agent": tree(testbed.agents["a"].process.pid),
            "vllm": tree(testbed.vllms["a"].pid), "bench": lambda: [os.getpid()]}


def make_folders(work: Path, count: int) -> list[Path]:
    return [make_adapter(work / f"push-{i:03d}", rank=8, alpha=16, targets=ATTENTION_MODULES,
                         base_model=BASE_MODEL, seed=SEED_BASE + i) for i in range(count)]


async def measure(testbed: Testbed, folders: list[Path], args: argparse.Namespace,
                  stalls: StallDumps | None, adapter: str) -> tuple[list[Push], Prober]:
    agent, warmup = testbed.agents["a"], args.warmup
    inside = PushProbe(testbed.registry.metrics, SchedProbe(sched_groups(testbed)))
    events = EventTimes(adapter)
    await events.start(testbed.nats.url)
    async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                   timeout_s=120) as api, \
            OpenAIClient(agent.url, token=testbed.inference_token) as client:
        await api.create_adapter(adapter, BASE_MODEL, tenant=E2E_TENANT)
        await api.push(adapter, folders[0], aliases=["live"])
        await wait_served(client, adapter, f"{adapter}@1", SERVED_TIMEOUT_S)
        prober = Prober(client, adapter, args.probers)
        probing = asyncio.create_task(prober.run())
        try:
            pushes = []
            for index, folder in enumerate(folders[1:]):
                push = await push_once(api, agent, prober, folder,
                                       stalls if index >= warmup else None, inside)
                print(f"  push {index + 1 - warmup:3d}: v{push.version} served after "
                      f"{push.total_s * 1000:.0f} ms", file=sys.stderr)
                pushes.append(push)
        finally:
            probing.cancel()
            await asyncio.gather(probing, return_exceptions=True)
            await events.close()
    attach_marks(pushes, events, agent.process.log_text())
    return pushes[warmup:], prober


# The push's requests, as the registry's own latency histogram names them: a small push
# is its POST alone, a larger one checks the adapter with the GET first.
PUSH_ROUTES = (("GET", "/v1/adapters/{name}"), ("POST", "/v1/adapters/{name}/versions"))


def registry_times(before: str, after: str) -> dict[str, float | None]:
    """The registry's own mean time (arrival to response start) of the push's requests
    between two scrapes: what the client's time for them includes beyond the server."""
    name = "loraplane_registry_request_seconds"
    out: dict[str, float | None] = {}
    for method, route in PUSH_ROUTES:
        count = (metric(after, f"{name}_count", method=method, route=route)
                 - metric(before, f"{name}_count", method=method, route=route))
        total = (metric(after, f"{name}_sum", method=method, route=route)
                 - metric(before, f"{name}_sum", method=method, route=route))
        out[f"{method} {route}"] = round(total / count * 1000, 1) if count else None
    return out


def attach_marks(pushes: list[Push], events: EventTimes, log_text: str) -> None:
    adapter = events.adapter
    done = materialized(log_text, adapter)
    flipped = {flip.new: flip.at for flip in flips(log_text, adapter)}
    received = events_received(log_text, adapter)
    for push in pushes:
        push.written = events.written.get(push.version)
        push.bench_subscriber = events.arrived.get(push.version)
        push.received = received.get(push.version)
        push.materialized = done.get(push.version)
        push.flipped = flipped.get(push.version)


def render(summary: dict[str, Any]) -> str:
    rows = [[name, *values] for name, values in summary["rows"].items()]
    return table(["part", *COLUMNS], rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=200,
                        help="measured pushes (default 200: p99 is then the 2nd largest)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="swaps before the measured ones, not counted (default 2)")
    parser.add_argument("--probers", type=int, default=2,
                        help="concurrent back-to-back probe requests (default 2)")
    parser.add_argument("--sqlite", action="store_true",
                        help="the registry on an SQLite file instead of Postgres")
    parser.add_argument("--py-spy", dest="py_spy", type=Path, default=None, metavar="DIR",
                        help="record the registry's and agent's stacks into DIR, and dump "
                             "them while a push is slower than --stall-ms")
    parser.add_argument("--stall-ms", type=float, default=400.0,
                        help="with --py-spy: dump stacks once a push takes longer (400)")
    parser.add_argument("--vllm-cpus", type=cpu_list, default=None, metavar="LIST",
                        help="keep vLLM (all its processes and threads) on these CPUs, "
                             "e.g. 1: what the push costs when the model's compute is off "
                             "the cores loraplane runs on, as on a GPU host")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.pushes < 1 or args.warmup < 0 or args.probers < 1 or args.stall_ms <= 0:
        parser.error("--pushes, --probers and --stall-ms must be positive, "
                     "--warmup not negative")
    if args.py_spy is not None:
        require_py_spy()
    return args


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Set up this benchmark's own testbed, measure, and return the JSON document."""
    with bench_testbed(work, max_loras=3, max_loaded=3, sqlite=args.sqlite) as testbed:
        return run_on(testbed, args, work, ADAPTER)


def run_on(testbed: Testbed, args: argparse.Namespace, work: Path,
           adapter: str) -> dict[str, Any]:
    """Measure on ``testbed`` (its agent ``a``) with a new adapter named ``adapter``."""
    commit = git_commit()  # before measuring: what this run's code was
    folders = make_folders(work / "adapters", 1 + args.warmup + args.pushes)
    pinned = None
    pid = testbed.vllms["a"].pid
    assert pid is not None
    if args.vllm_cpus is not None:
        pinned = pin_cpus(pid, args.vllm_cpus)
    agent = testbed.agents["a"].process
    with contextlib.ExitStack() as stack:
        stalls = None
        if args.py_spy is not None:
            pids = {"registry": testbed.registry.process.pid, "agent": agent.pid}
            procs = {k: v for k, v in pids.items() if v is not None}
            stack.enter_context(recording({pid: args.py_spy / f"{name}.txt"
                                           for name, pid in procs.items()}))
            stalls = StallDumps(procs, args.py_spy / "stalls.txt",
                                after_s=args.stall_ms / 1000)
        registry_before = testbed.registry.metrics()
        with MachineLoad() as load:
            pushes, prober = asyncio.run(measure(testbed, folders, args, stalls, adapter))
        served = registry_times(registry_before, testbed.registry.metrics())
    errors = log_lines(agent.log_text(), " WARNING ", " ERROR ")
    # Straight from S3 (the event's presigned URLs) or through the registry's 307.
    fetched = by_label(testbed.agents["a"].metrics(), "loraplane_agent_file_fetches_total",
                       "source")
    summary = summarize(pushes)
    summary["rows"]["(one probe request, for reference)"] = cells(prober.latencies)
    summary.update(probe_requests=len(prober.latencies), probe_failures=prober.failures[:20],
                   probe_failure_count=len(prober.failures), agent_warnings=errors[:20],
                   slowest=slowest(pushes), slowest_requests=slowest_requests(pushes),
                   stalls_dumped=stalls.stalls if stalls else None,
                   file_fetches=fetched, registry_mean_ms=served)
    return {"benchmark": "agent_publish_to_served", **commit, "machine": load.summary,
            "database": "sqlite" if args.sqlite else "postgres", "summary": summary,
            "vllm_cpus": sorted(args.vllm_cpus or []), "vllm_threads_pinned": pinned,
            "pushes": [asdict(p) for p in pushes]}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="lp-bench-publish-", dir=args.work_dir))
    try:
        document = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = document["summary"]
    print(render(summary))
    print(f"probe requests {summary['probe_requests']}, failed "
          f"{summary['probe_failure_count']}; agent warnings/errors "
          f"{len(summary['agent_warnings'])}; files fetched by source "
          f"{summary['file_fetches']}")
    print(f"the registry's own mean ms per request of a push: {summary['registry_mean_ms']}")
    print(f"slowest: {json.dumps(summary['slowest'])}")
    print(f"slowest push requests, inside: {json.dumps(summary['slowest_requests'])}")
    print(f"machine: {document['machine']}; database {document['database']}; vLLM "
          f"on CPUs {document['vllm_cpus'] or 'all'} ({document['vllm_threads_pinned']} threads)")
    print(f"commit {document['commit']}{' (dirty)' if document['dirty'] else ''}")
    text = json.dumps(document, indent=2)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")


if __name__ == "__main__":
    main()
