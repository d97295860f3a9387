"""Proxy overhead: the same requests through the agent and straight to vLLM, in one run.

One host (``bench/agent_setup.py``): one CPU vLLM with the tiny model and one
``loraplane agent`` in front of it. One adapter (the tiny model's ``a1``) is published
as ``bench@1``, a customer routing rule sends ``X-Customer-Id: alice`` to it, and the
agent loads it. Every window sends the same completions along one path:

- ``vllm``: to vLLM itself, ``model=bench@1`` (the very name the agent loaded);
- ``agent``: to the agent, ``model=bench``;
- ``agent (rule)``: to the agent with no model, resolved by the routing rule;
- ``agent@REV`` (``--also-commit REV``): a second agent beside the first, on the same
  vLLM, run from the code of commit REV (say, the one before a change);
- with ``--canary WEIGHT``, version 2 runs a canary on that share of the alias (never
  judged) and the agents' requests name a customer the split keeps on version 1: the
  split and its counting are on the agent's path, the answers stay version 1's (against
  an ``agent@REV`` from before canaries, the split's cost);
- ``relay`` and ``nginx`` (``--floor-proxies``, ``bench/proxy_floor.py``): a byte relay
  on uvloop and nginx, each in front of the same vLLM, sent vLLM's name for the adapter:
  what one more hop costs here with no HTTP work in Python at all, and through a C proxy;

Workloads: ``short`` (max_tokens 1, so the proxy's share shows), ``long-prompt``
(max_tokens 1 after a prompt of ``--long-prompt-chars``), ``long`` (128 tokens) and
``long-streamed``; each at every ``--concurrency`` (closed loops of clients). A cell
runs ``--rounds`` rounds; each round runs one window per path, back to back, in an
order that turns from round to round, so the machine's noise falls on every path alike.
A round's ratio is a path's requests per second over vLLM's in that round; the table
gives their mean with its 95% confidence interval, which must be narrower than the gap
a claim rests on. Latency is per request to the last byte (p50 and p99, pooled); for
streams also to the first text. The agents' CPU time is read from /proc for every
window, so CPU per proxied request can be given net of what an agent spends idle.

    .venv/bin/python -m bench.agent_proxy_overhead --also-commit HEAD~3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.agent_setup import (
    ADAPTER,
    BASE_MODEL,
    MachineLoad,
    bench_testbed,
    cpu_list,
    pin_cpus,
    wait_served,
)
from bench.commits import CommitAgentProcess
from bench.common import GaugeSampler, cpu_seconds, git_commit, write_json
from bench.profiling import profile_summary, recording
from bench.proxy_floor import FloorProxy, floor_proxies
from bench.proxy_stats import (
    DIRECT,
    Window,
    commit_line,
    render,
    summarize,
)
from devharness.openai_client import RETRY_OVER_HTTP, Completion, OpenAIClient
from devharness.testbed import E2E_TENANT, AgentProcess, Testbed
from devharness.waiting import eventually
from loraplane.api.canaries import WEEK_S, CanaryAnalysis
from loraplane.canary_split import takes_canary
from loraplane.client import AsyncRegistryClient

PROMPTS = ("The registry publishes", "An adapter version is", "Every request holds",
           "The agent follows the stream", "Swaps happen while", "Old weights drain",
           "A cold adapter loads", "Routing rules pick")
# name -> (max_tokens, streamed, long prompt)
WORKLOADS = {"short": (1, False, False), "long-prompt": (1, False, True),
             "long": (128, False, False), "long-streamed": (128, True, False)}
RULE_CUSTOMER = "alice"
RUNNING = "vllm:num_requests_running"


@dataclass(frozen=True)
class Names:
    """The adapter the bench publishes and the customer its routing rule routes."""

    adapter: str = ADAPTER
    customer: str = RULE_CUSTOMER
    # With a weight: version 2 runs a canary on that share of ``live`` (never judged),
    # and the agents' requests name a customer the split keeps on version 1.
    canary_weight: int = 0

    @property
    def version_name(self) -> str:
        return f"{self.adapter}@1"


@dataclass(frozen=True)
class Target:
    name: str
    client: OpenAIClient
    model: str | None
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    max_tokens: int
    stream: bool
    prompts: tuple[str, ...]
    seconds: float


class Stamp(asyncio.Event):
    """An event that remembers when it was first set (the first streamed text)."""

    at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.perf_counter()
        super().set()


async def _one(target: Target, prompt: str, work: Workload,
               first: Stamp | None = None) -> Completion:
    if work.stream:
        return await target.client.stream(target.model, prompt=prompt,
                                          max_tokens=work.max_tokens,
                                          headers=target.headers, first_chunk=first)
    return await target.client.complete(target.model, prompt=prompt,
                                        max_tokens=work.max_tokens, headers=target.headers)


async def run_window(target: Target, work: Workload, window: Window,
                     agents: Mapping[str, int], vllm_metrics: str) -> Window:
    """Closed loops of ``window.concurrency`` clients for the workload's seconds, while
    vLLM's batch size is sampled and every agent's CPU time is read."""
    deadline = time.monotonic() + work.seconds

    async def loop(worker: int) -> None:
        turn = worker
        # Every client sends at least once: on a loaded machine the set-up below can
        # outlast a short window, which would otherwise measure nothing.
        while turn == worker or time.monotonic() < deadline:
            prompt = work.prompts[turn % len(work.prompts)]
            turn += window.concurrency
            sent, first = time.perf_counter(), Stamp()
            try:
                result = await _one(target, prompt, work, first)
            except httpx.TransportError as exc:
                # Counted, not fatal: a keep-alive connection the server closed as it
                # was reused (uvicorn's 5 s idle timeout, on any path) ends up here.
                window.failed.append(f"{target.name}: {exc!r}")
                continue
            if not result.ok or result.finish_reason not in ("length", "done"):
                window.failed.append(f"{target.name}: {result}")
                continue
            window.latencies.append(time.perf_counter() - sent)
            if first.at is not None:
                window.first_chunk.append(first.at - sent)
            window.texts.setdefault(prompt[:40], set()).add(result.text)

    before = {name: cpu_seconds(pid) for name, pid in agents.items()}
    started = time.perf_counter()
    with GaugeSampler(vllm_metrics, RUNNING) as running:
        await asyncio.gather(*(loop(i) for i in range(window.concurrency)))
    window.seconds = time.perf_counter() - started
    window.vllm_running = running.mean
    for name, pid in agents.items():
        start, end = before[name], cpu_seconds(pid)
        if start is not None and end is not None:
            window.agent_cpu_s[name] = end - start
    return window


async def measure_cell(targets: list[Target], work: Workload, concurrency: int,
                       rounds: int, agents: Mapping[str, int],
                       vllm_metrics: str) -> list[Window]:
    for target in targets:  # warm every path; not counted
        await _one(target, work.prompts[0], work)
    windows = []
    for index in range(rounds):
        # Turn the order each round (A B C, B C A, ..., then reversed): every path gets
        # every slot of a round alike, and no path always follows the same one.
        shift = index % len(targets)
        order = targets[shift:] + targets[:shift]
        if (index // len(targets)) % 2:
            order = order[::-1]
        for target in order:
            window = Window(target.name, work.name, concurrency, index + 1)
            windows.append(await run_window(target, work, window, agents, vllm_metrics))
    return windows


def long_prompt(chars: int) -> str:
    """Words the tiny model's tokenizer knows, repeated to ``chars`` characters."""
    text = " ".join(PROMPTS)
    return (text + " ") * (chars // (len(text) + 1)) + text[: chars % (len(text) + 1)]


def workloads(args: argparse.Namespace) -> list[Workload]:
    chosen = []
    for name in args.workloads:
        max_tokens, stream, is_long = WORKLOADS[name]
        prompts = tuple(f"{p} {long_prompt(args.long_prompt_chars)}" for p in PROMPTS) \
            if is_long else PROMPTS
        seconds = args.window if max_tokens == 1 else args.long_window
        chosen.append(Workload(name, max_tokens, stream, prompts, seconds))
    return chosen


async def setup_targets(testbed: Testbed, stack: contextlib.AsyncExitStack,
                        extra: Mapping[str, AgentProcess], names: Names,
                        floors: list[FloorProxy]) -> list[Target]:
    """Publish the adapter and the routing rule; a target per path, each serving it."""
    api = await stack.enter_async_context(
        AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token, timeout_s=120))
    await api.create_adapter(names.adapter, BASE_MODEL, tenant=E2E_TENANT)
    await api.push(names.adapter, testbed.adapter_dir("a1"), aliases=["live"])
    await api.put_route("customer", names.customer, names.adapter)
    vllm = await stack.enter_async_context(OpenAIClient(testbed.vllms["a"].url))
    targets = [Target(DIRECT, vllm, names.version_name)]
    rule = {"X-Customer-Id": names.customer}
    split = await start_canary(testbed, api, names) if names.canary_weight else None
    for name, process in {"agent": testbed.agents["a"], **extra}.items():
        client = await stack.enter_async_context(
            OpenAIClient(process.url, token=testbed.inference_token))
        await wait_served(client, names.adapter, names.version_name, 60.0)
        if split is not None and name == "agent":
            await wait_split(client, names.adapter, split)
        targets.append(Target(name, client, names.adapter, split and split[0]))
        if name == "agent" and split is None:  # the rule's customer may take the canary
            await wait_rule(client, rule, names.version_name)
            targets.append(Target("agent (rule)", client, None, rule))
    for floor in floors:  # no routing: vLLM's own name, as on the direct path
        client = await stack.enter_async_context(OpenAIClient(floor.url))
        targets.append(Target(floor.name, client, names.version_name))
    return targets


async def start_canary(testbed: Testbed, api: AsyncRegistryClient,
                       names: Names) -> tuple[dict[str, str], dict[str, str]]:
    """Version 2 on ``canary_weight`` % of ``live``, never judged; the headers of a
    customer the split keeps on version 1, and of one it gives version 2."""
    await api.push(names.adapter, testbed.adapter_dir("a2"))
    never = CanaryAnalysis(min_requests=1_000_000, inconclusive_limit=100)
    canary = await api.start_canary(names.adapter, 2, steps=[names.canary_weight],
                                    step_seconds=WEEK_S, analysis=never)
    sides = {takes_canary(f"bench-{i}", canary.id, names.canary_weight): f"bench-{i}"
             for i in range(1000)}
    return {"X-Customer-Id": sides[False]}, {"X-Customer-Id": sides[True]}


async def wait_split(client: OpenAIClient, model: str,
                     split: tuple[dict[str, str], dict[str, str]]) -> None:
    """The agent applies the canary: its customer gets version 2."""

    async def split_there() -> bool:
        result = await client.complete(model, max_tokens=1, headers=split[1])
        return result.ok and result.adapter == f"{model}@2"

    await eventually(split_there, timeout_s=120.0, retrying=RETRY_OVER_HTTP,
                     what="the agent splitting the canary")


async def wait_rule(client: OpenAIClient, headers: Mapping[str, str], served: str) -> None:
    """The agent learns rules from an event: wait until the rule routes to ``served``."""

    async def routed() -> bool:
        result = await client.complete(None, max_tokens=1, headers=headers)
        return result.ok and result.adapter == served

    await eventually(routed, timeout_s=60.0, retrying=RETRY_OVER_HTTP,
                     what=f"the customer rule routing to {served}")


async def measure(testbed: Testbed, args: argparse.Namespace,
                  extra: Mapping[str, AgentProcess], names: Names,
                  floors: list[FloorProxy]) -> list[Window]:
    agents = {"agent": testbed.agents["a"], **extra}
    pids = {name: agent.process.pid for name, agent in agents.items()
            if agent.process.pid is not None}
    pids.update({floor.name: floor.pid for floor in floors})
    metrics_url = f"{testbed.vllms['a'].url}/metrics"
    async with contextlib.AsyncExitStack() as stack:
        targets = await setup_targets(testbed, stack, extra, names, floors)
        windows: list[Window] = []
        for work in workloads(args):
            for concurrency in args.concurrency:
                windows += await measure_cell(targets, work, concurrency, args.rounds, pids,
                                              metrics_url)
                print(f"  {work.name}, concurrency {concurrency}: done", file=sys.stderr)
        if args.py_spy is not None:
            work = workloads(args)[0]
            with recording({pids["agent"]: args.py_spy}, idle=False):
                await run_window(targets[1], work, Window("agent", work.name, 1, 0), {},
                                 metrics_url)
            print(profile_summary(args.py_spy), file=sys.stderr)
        return windows


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds per cell (20)")
    parser.add_argument("--window", type=float, default=2.0,
                        help="seconds per window, max_tokens 1 (default 2)")
    parser.add_argument("--long-window", type=float, default=10.0,
                        help="seconds per window, max_tokens 128 (default 10)")
    parser.add_argument("--workloads", nargs="+", default=["short", "long-prompt"],
                        choices=list(WORKLOADS))
    parser.add_argument("--long-prompt-chars", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--agent-log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    parser.add_argument("--canary", dest="canary_weight", type=int, default=0,
                        metavar="WEIGHT", help="run a canary of version 2 on WEIGHT %% of "
                        "the alias (1-99): the agents' path goes through the split")
    parser.add_argument("--also-commit", default=None, metavar="REV",
                        help="also measure an agent run from the code of commit REV")
    parser.add_argument("--floor-proxies", action="store_true",
                        help="also measure a byte relay on uvloop and nginx in front of "
                             "vLLM (bench/proxy_floor.py; nginx from ./scripts/ci-tools.sh)")
    parser.add_argument("--py-spy", dest="py_spy", type=Path, default=None, metavar="FILE",
                        help="profile the agent under one more (untimed) short window "
                             "with py-spy (on PyPI) and write its raw stacks to FILE")
    parser.add_argument("--vllm-cpus", type=cpu_list, default=None, metavar="LIST",
                        help="keep vLLM (all its processes and threads) on these CPUs, "
                             "e.g. 1: the proxy with the model's compute off the cores "
                             "the agent runs on, as on a GPU host")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 0 <= args.canary_weight <= 99:
        parser.error("--canary takes a weight in 1-99")
    if args.rounds < 1 or min(args.window, args.long_window) <= 0 or \
            min(args.concurrency) < 1 or args.long_prompt_chars < 1:
        parser.error("--rounds, --window, --long-window, --long-prompt-chars and "
                     "--concurrency must be positive")
    return args


def _window_json(window: Window) -> dict[str, Any]:
    data = {k: v for k, v in asdict(window).items()
            if k not in ("texts", "latencies", "first_chunk")}
    data["requests"] = len(window.latencies)
    return data


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Start the testbed, measure, and return the whole result (rows and windows)."""
    with bench_testbed(work, max_loras=3, max_loaded=3,
                       agent_settings={"log_level": args.agent_log_level}) as testbed:
        return run_on(testbed, args, work, Names(canary_weight=args.canary_weight))


def run_on(testbed: Testbed, args: argparse.Namespace, work: Path,
           names: Names) -> dict[str, Any]:
    """Measure on a running testbed (host ``a``); the result, rows and windows."""
    commit = git_commit()
    pinned = None
    if args.vllm_cpus is not None:
        pid = testbed.vllms["a"].pid
        assert pid is not None
        pinned = pin_cpus(pid, args.vllm_cpus)
    with contextlib.ExitStack() as stack:
        extra = {}
        if args.also_commit is not None:
            process = CommitAgentProcess.beside(testbed.agents["a"], args.also_commit,
                                                work / "also")
            stack.callback(process.stop)
            process.start()
            extra[f"agent@{process.commit[:10]}"] = process
        floors = stack.enter_context(floor_proxies(testbed.vllms["a"].url, work / "floor")) \
            if args.floor_proxies else []
        with MachineLoad() as load:
            windows = asyncio.run(measure(testbed, args, extra, names, floors))
    return {"benchmark": "agent_proxy_overhead", "commit": commit, "machine": load.summary,
            "agent_log_level": args.agent_log_level, "args": {
                k: str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, set) else v
                for k, v in vars(args).items()},
            "vllm_threads_pinned": pinned,
            "rows": summarize(windows),
            "first_failures": [f for w in windows for f in w.failed][:10],
            "windows": [_window_json(w) for w in windows]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="lp-bench-proxy-", dir=args.work_dir))
    try:
        document = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(document["rows"]))
    pinned = "" if args.vllm_cpus is None else \
        f"; vLLM on CPUs {sorted(args.vllm_cpus)} ({document['vllm_threads_pinned']} threads)"
    print(commit_line(document, f"agent log level {args.agent_log_level}{pinned}"))
    write_json(document, args.json_out)
    return document


if __name__ == "__main__":
    main()
