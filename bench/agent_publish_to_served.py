"""Publish to served: from a push answering to the first response from the new version.

One host (``bench/agent_setup.py``): Postgres + SeaweedFS + NATS, ``loraplane registry
serve``, one CPU vLLM with the tiny model, one ``loraplane agent``. The adapter is hot:
probers send back-to-back one-token completions to it through the agent the whole
time, so every push takes the swap path that loads the new version before the flip.

Each push is new content: a rank-8 q/k/v/o LoRA for the tiny Llama (hidden 128,
intermediate 256, 2 layers, 4 heads) made by ``devharness/adapters.py:
make_adapter`` with a seed of its own, pushed with ``aliases=live``. Pushes are
sequential: the next starts once the old version was unloaded.

Each push is split on one timeline (wall clock, one machine), from the agent's own
marks where it has them:

- ``event + desired read``: push answered -> the agent's ``GET /v1/desired?...&adapter=``
  answered (its log; the first thing it does on an event). For context, a NATS
  subscriber of the bench's own also stamps the event's arrival (it can lag behind the
  agent's when the bench process itself is short of CPU);
- ``to fetch start``: that read -> the fetch starts (queueing, the swap's pre-checks);
- ``fetch``, ``validate``: the agent's ``stage_seconds`` histograms, diffed per push;
- ``load``, ``flip``: the same; ``other``: the rest until the flip (bookkeeping), from
  the ``materialized`` and swap log lines;
- ``first response``: flip -> the first response naming the new version arrives.

For context, two of the agent's own metrics, as a mean per push: ``event_delay_seconds``
(an event's commit in the registry -> its receipt by the agent) and the ``desired``
stage of ``stage_seconds`` (the registry read that starts each reconcile).

The parts add up to the total. Prerequisites as for the other benchmarks, plus the vLLM
venv (``bash scripts/vllm/install.sh``).

    .venv/bin/python -m bench.agent_publish_to_served --pushes 50
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from bench.agent_setup import (
    ADAPTER,
    BASE_MODEL,
    MachineLoad,
    NodelayAgentProcess,
    bench_testbed,
    cells,
    desired_reads,
    flips,
    log_lines,
    materialized,
    stage_totals,
    wait_served,
)
from bench.common import table
from devharness.adapters import ATTENTION_MODULES, make_adapter
from devharness.openai_client import OpenAIClient
from devharness.testbed import AgentProcess, Testbed, metric
from loraplane.client import AsyncRegistryClient
from loraplane.events import STREAM_SUBJECTS, AdapterUpdated, VersionPublished, parse_event

SERVED_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 30.0
SEED_BASE = 5000
PARTS = ("event + desired read", "to fetch start", "fetch", "validate", "load", "flip",
         "other", "first response")


class Prober:
    """Back-to-back one-token completions on ``model``; when each version first answered."""

    def __init__(self, client: OpenAIClient, model: str, workers: int) -> None:
        self.client = client
        self.model = model
        self.workers = workers
        self.first_seen: dict[str, float] = {}
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
            if result.adapter not in self.first_seen:
                self.first_seen[result.adapter] = now
                self._news.set()

    async def wait_for(self, name: str, timeout_s: float) -> float:
        """When the first response naming ``name`` arrived (wall clock)."""
        deadline = time.monotonic() + timeout_s
        while name not in self.first_seen:
            self._news.clear()
            await asyncio.wait_for(self._news.wait(), max(0.0, deadline - time.monotonic()))
        return self.first_seen[name]


class EventTimes:
    """Arrival (wall clock) of the first event naming each version, on core NATS."""

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self.arrived: dict[int, float] = {}
        self.written: dict[int, float] = {}  # the event's own time (the outbox row)
        self._client: NatsClient | None = None

    async def start(self, url: str) -> None:
        self._client = await nats.connect(url)
        await self._client.subscribe(STREAM_SUBJECTS, cb=self._on_message)

    async def _on_message(self, message: Msg) -> None:
        now = time.time()
        event = parse_event(message.data)
        version: int | None = None
        if isinstance(event, AdapterUpdated):
            version = event.version
        elif isinstance(event, VersionPublished):
            version = event.target.version
        if event.adapter == self.adapter and version is not None:
            self.arrived.setdefault(version, now)
            self.written.setdefault(version, event.time.timestamp())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


@dataclass
class Push:
    """One measured push; times are wall clock, ``*_s`` durations."""

    version: int
    sent: float
    answered: float
    first_response: float
    stages: dict[str, float]
    stage_counts: dict[str, int]
    event_arrived: float | None = None
    event_written: float | None = None
    desired_read: float | None = None
    materialized: float | None = None
    flipped: float | None = None
    event_delay_s: float | None = None

    @property
    def total_s(self) -> float:
        return self.first_response - self.answered

    def parts(self) -> dict[str, float] | None:
        """The timeline split (PARTS), or None if a mark is missing."""
        if self.desired_read is None or self.materialized is None or self.flipped is None:
            return None
        fetch, validate = self.stages["fetch"], self.stages["validate"]
        load, flip = self.stages["load"], self.stages["flip"]
        fetch_started = self.materialized - fetch - validate
        return {"event + desired read": self.desired_read - self.answered,
                "to fetch start": fetch_started - self.desired_read,
                "fetch": fetch, "validate": validate, "load": load, "flip": flip,
                "other": self.flipped - self.materialized - load - flip,
                "first response": self.first_response - self.flipped}


async def push_once(api: AsyncRegistryClient, agent: AgentProcess, prober: Prober,
                    folder: Path) -> Push:
    """Push ``folder``; wait for its first response, then for the old version's unload."""
    text = agent.metrics()
    before, delays_before = stage_totals(text), event_delays(text)
    sent = time.time()
    pushed = await api.push(ADAPTER, folder)
    answered = time.time()
    version = pushed.version
    first = await prober.wait_for(f"{ADAPTER}@{version}", SERVED_TIMEOUT_S)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        text = agent.metrics()
        delta = stage_totals(text).minus(before)
        if delta.counts["unload"] >= 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    push = Push(version, sent, answered, first, delta.sums, delta.counts)
    delays = event_delays(text)
    if delays[1] > delays_before[1]:
        push.event_delay_s = (delays[0] - delays_before[0]) / (delays[1] - delays_before[1])
    return push


def event_delays(metrics_text: str) -> tuple[float, int]:
    """Sum and count of the agent's ``event_delay_seconds`` histogram."""
    name = "loraplane_agent_event_delay_seconds"
    return metric(metrics_text, f"{name}_sum"), int(metric(metrics_text, f"{name}_count"))


def make_folders(work: Path, count: int) -> list[Path]:
    return [make_adapter(work / f"push-{i:03d}", rank=8, alpha=16, targets=ATTENTION_MODULES,
                         base_model=BASE_MODEL, seed=SEED_BASE + i) for i in range(count)]


async def measure(testbed: Testbed, folders: list[Path], warmup: int,
                  probers: int) -> tuple[list[Push], Prober]:
    agent = testbed.agents["a"]
    events = EventTimes(ADAPTER)
    await events.start(testbed.nats.url)
    async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                   timeout_s=120) as api, \
            OpenAIClient(agent.url, token=testbed.inference_token) as client:
        await api.create_adapter(ADAPTER, BASE_MODEL, tenant="e2e")
        await api.push(ADAPTER, folders[0])
        await wait_served(client, ADAPTER, f"{ADAPTER}@1", SERVED_TIMEOUT_S)
        prober = Prober(client, ADAPTER, probers)
        probing = asyncio.create_task(prober.run())
        try:
            pushes = []
            for index, folder in enumerate(folders[1:]):
                push = await push_once(api, agent, prober, folder)
                print(f"  push {index + 1 - warmup:3d}: v{push.version} served after "
                      f"{push.total_s * 1000:.0f} ms", file=sys.stderr)
                pushes.append(push)
        finally:
            probing.cancel()
            await asyncio.gather(probing, return_exceptions=True)
            await events.close()
    attach_marks(pushes, events, agent.process.log_text())
    return pushes[warmup:], prober


def attach_marks(pushes: list[Push], events: EventTimes, log_text: str) -> None:
    done = materialized(log_text, ADAPTER)
    flipped = {flip.new: flip.at for flip in flips(log_text, ADAPTER)}
    reads = desired_reads(log_text, ADAPTER)
    for push in pushes:
        push.desired_read = next((at for at in reads if at >= push.sent - 0.001), None)
        push.event_arrived = events.arrived.get(push.version)
        push.event_written = events.written.get(push.version)
        push.materialized = done.get(push.version)
        push.flipped = flipped.get(push.version)


def summarize(pushes: list[Push]) -> dict[str, Any]:
    split = [p for p in (push.parts() for push in pushes) if p is not None]
    rows: dict[str, list[str]] = {"total": cells([p.total_s for p in pushes])}
    for part in PARTS:
        rows[part] = cells([s[part] for s in split])
    rows["(push request: sent -> answered)"] = cells([p.answered - p.sent for p in pushes])
    arrived = [p for p in pushes if p.event_arrived is not None]
    if arrived:
        rows["(answered -> event at the bench's NATS subscriber)"] = cells(
            [p.event_arrived - p.answered for p in arrived if p.event_arrived])
        rows["(event's own time -> at the bench's NATS subscriber)"] = cells(
            [p.event_arrived - p.event_written for p in arrived
             if p.event_arrived and p.event_written])
    rows["(event commit -> agent, its event_delay_seconds; mean per push)"] = cells(
        [p.event_delay_s for p in pushes if p.event_delay_s is not None])
    rows["(desired read, its stage_seconds; mean per push)"] = cells(
        [p.stages["desired"] / p.stage_counts["desired"] for p in pushes
         if p.stage_counts["desired"]])
    for stage in ("drain", "unload"):
        rows[f"({stage} of the old version, after the flip)"] = cells(
            [p.stages[stage] for p in pushes])
    odd = [asdict(p) for p in pushes if any(p.stage_counts[s] != 1 for s in
                                            ("fetch", "validate", "load", "flip"))]
    return {"pushes": len(pushes), "split": len(split), "rows": rows,
            "pushes_with_unexpected_stage_counts": odd}


def render(summary: dict[str, Any]) -> str:
    rows = [[name, *values] for name, values in summary["rows"].items()]
    return table(["part", "p50 ms", "p99 ms", "min ms", "max ms"], rows)


def swap_in_nodelay_agent(testbed: Testbed, stack: contextlib.ExitStack) -> None:
    """Replace the testbed's agent by the same one run through bench/agent_nodelay.py."""
    old = testbed.agents["a"]
    old.stop()
    agent = NodelayAgentProcess(old.spec, old.log_dir)
    stack.callback(agent.stop)
    agent.start()
    testbed.agents["a"] = agent


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=50, help="measured pushes (default 50)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="swaps before the measured ones, not counted (default 2)")
    parser.add_argument("--probers", type=int, default=2,
                        help="concurrent back-to-back probe requests (default 2)")
    parser.add_argument("--agent-tcp-nodelay", action="store_true",
                        help="run the agent through bench/agent_nodelay.py (TCP_NODELAY on "
                             "its listening socket, the proposed fix)")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.pushes < 1 or args.warmup < 0 or args.probers < 1:
        parser.error("--pushes and --probers must be positive, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="lp-bench-publish-", dir=args.work_dir))
    try:
        folders = make_folders(work / "adapters", 1 + args.warmup + args.pushes)
        with contextlib.ExitStack() as stack:
            testbed = stack.enter_context(bench_testbed(work, max_loras=3, max_loaded=3))
            if args.agent_tcp_nodelay:
                swap_in_nodelay_agent(testbed, stack)
            with MachineLoad() as load:
                pushes, prober = asyncio.run(measure(testbed, folders, args.warmup,
                                                     args.probers))
            errors = log_lines(testbed.agents["a"].process.log_text(), " WARNING ", " ERROR ")
        summary = summarize(pushes)
        summary["rows"]["(one probe request, for reference)"] = cells(prober.latencies)
        summary.update(probe_requests=len(prober.latencies),
                       probe_failures=prober.failures[:20],
                       probe_failure_count=len(prober.failures), agent_warnings=errors[:20])
        print(render(summary))
        print(f"probe requests {len(prober.latencies)}, failed {len(prober.failures)}; "
              f"agent warnings/errors {len(errors)}")
        print(f"machine: {load.summary}")
        document = {"benchmark": "agent_publish_to_served", "machine": load.summary,
                    "agent_tcp_nodelay": args.agent_tcp_nodelay,
                    "summary": summary, "pushes": [asdict(p) for p in pushes]}
        text = json.dumps(document, indent=2)
        if args.json_out is not None:
            args.json_out.write_text(text + "\n")
        else:
            print(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
