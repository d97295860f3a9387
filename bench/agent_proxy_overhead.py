"""Proxy overhead: the same requests through the agent and straight to vLLM, in one run.

One host (``bench/agent_setup.py``): one CPU vLLM with the tiny model and one
``loraplane agent`` in front of it. One adapter (the tiny model's ``a1``) is published
as ``bench@1`` and loaded by the agent; the bench then sends the same completions to
the agent (``model=bench``) and to vLLM itself (``model=bench@1``, the very name the
agent loaded), so both paths run the same weights on the same server.

For every workload (max_tokens 1, so the proxy's share is visible; 128; 128 streamed)
and concurrency (closed loops of 1 and 8 clients), windows of ``--window`` seconds
(``--long-window`` for 128 tokens) take turns between the targets, A B C then C B A,
over ``--rounds`` rounds, so noise from the shared machine falls on all of them.
Requests per second are the requests finished in a window over its length (the last
in-flight requests included); latencies are per request to the last byte, and for
streams also to the first text. The agent's own CPU time is read from /proc per window.
Every output is kept per prompt: greedy on the same weights, each prompt should get
one text on every path.

``--agent-tcp-nodelay`` adds a third target: a second agent beside the first (same
vLLM, same adapter) run through ``bench/agent_nodelay.py``, i.e. with TCP_NODELAY on
its listening socket.

    .venv/bin/python -m bench.agent_proxy_overhead --agent-tcp-nodelay
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.agent_setup import (
    ADAPTER,
    BASE_MODEL,
    MachineLoad,
    NodelayAgentProcess,
    bench_testbed,
    wait_served,
)
from bench.common import GaugeSampler, cpu_seconds, percentile, table
from devharness.openai_client import Completion, OpenAIClient
from devharness.testbed import AgentProcess, Testbed
from loraplane.client import AsyncRegistryClient

PROMPTS = ("The registry publishes", "An adapter version is", "Every request holds",
           "The agent follows the stream", "Swaps happen while", "Old weights drain",
           "A cold adapter loads", "Routing rules pick")
WORKLOADS = (("short", 1, False), ("long", 128, False), ("long-streamed", 128, True))
DIRECT_MODEL = f"{ADAPTER}@1"
RUNNING = "vllm:num_requests_running"


@dataclass
class Window:
    target: str  # "agent" or "vllm"
    workload: str
    concurrency: int
    round: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    first_chunk: list[float] = field(default_factory=list)  # streams: time to first text
    failed: list[str] = field(default_factory=list)
    agent_cpu_s: float | None = None
    vllm_running: float | None = None  # mean of vLLM's num_requests_running, sampled
    texts: dict[str, set[str]] = field(default_factory=dict)  # prompt -> outputs seen


class Stamp(asyncio.Event):
    """An event that remembers when it was first set (the first streamed text)."""

    at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.perf_counter()
        super().set()


async def _one(client: OpenAIClient, model: str, prompt: str, max_tokens: int,
               stream: bool, first: Stamp | None = None) -> Completion:
    if stream:
        return await client.stream(model, prompt=prompt, max_tokens=max_tokens,
                                    first_chunk=first)
    return await client.complete(model, prompt=prompt, max_tokens=max_tokens)


async def run_window(client: OpenAIClient, model: str, window: Window, max_tokens: int,
                     stream: bool, seconds: float, agent_pid: int | None,
                     vllm_metrics: str) -> Window:
    """Closed loops of ``window.concurrency`` clients for ``seconds``, while vLLM's
    batch size is sampled from ``vllm_metrics``."""
    deadline = time.monotonic() + seconds

    async def loop(worker: int) -> None:
        turn = worker
        while time.monotonic() < deadline:
            prompt = PROMPTS[turn % len(PROMPTS)]
            turn += window.concurrency
            sent, first = time.perf_counter(), Stamp()
            result = await _one(client, model, prompt, max_tokens, stream, first)
            if not result.ok or result.finish_reason not in ("length", "done"):
                window.failed.append(str(result))
                continue
            window.latencies.append(time.perf_counter() - sent)
            if first.at is not None:
                window.first_chunk.append(first.at - sent)
            window.texts.setdefault(prompt, set()).add(result.text)

    cpu_before = cpu_seconds(agent_pid) if agent_pid is not None else None
    started = time.perf_counter()
    with GaugeSampler(vllm_metrics, RUNNING) as running:
        await asyncio.gather(*(loop(i) for i in range(window.concurrency)))
    window.seconds = time.perf_counter() - started
    window.vllm_running = running.mean
    cpu_after = cpu_seconds(agent_pid) if agent_pid is not None else None
    if cpu_before is not None and cpu_after is not None:
        window.agent_cpu_s = cpu_after - cpu_before
    return window


@dataclass(frozen=True)
class Target:
    name: str  # "vllm", "agent" or "agent+nodelay"
    client: OpenAIClient
    model: str
    pid: int | None  # the agent whose CPU is read per window


async def measure(testbed: Testbed, adapter_dir: Path, args: argparse.Namespace,
                  nodelay: AgentProcess | None) -> list[Window]:
    agent = testbed.agents["a"]
    async with contextlib.AsyncExitStack() as stack:
        api = await stack.enter_async_context(
            AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token, timeout_s=120))
        await api.create_adapter(ADAPTER, BASE_MODEL, tenant="e2e")
        await api.push(ADAPTER, adapter_dir)
        targets = [Target("vllm", await stack.enter_async_context(
            OpenAIClient(testbed.vllms["a"].url)), DIRECT_MODEL, None)]
        for name, process in (("agent", agent), ("agent+nodelay", nodelay)):
            if process is not None:
                client = await stack.enter_async_context(
                    OpenAIClient(process.url, token=testbed.inference_token))
                await wait_served(client, ADAPTER, DIRECT_MODEL, 60.0)
                targets.append(Target(name, client, ADAPTER, process.process.pid))
        windows: list[Window] = []
        for workload in (w for w in WORKLOADS if w[0] in args.workloads):
            seconds = args.window if workload[1] == 1 else args.long_window
            for concurrency in args.concurrency:
                windows += await measure_cell(targets, workload, concurrency, args.rounds,
                                              seconds, f"{testbed.vllms['a'].url}/metrics")
                print(f"  {workload[0]}, concurrency {concurrency}: done", file=sys.stderr)
        return windows


async def measure_cell(targets: list[Target], workload: tuple[str, int, bool],
                       concurrency: int, rounds: int, seconds: float,
                       vllm_metrics: str) -> list[Window]:
    name, max_tokens, stream = workload
    for target in targets:  # warm every path; not counted
        await _one(target.client, target.model, PROMPTS[0], max_tokens, stream)
    windows = []
    for index in range(rounds):
        # A B C, then C B A: each target gets the same share of every slot.
        order = targets if index % 2 == 0 else targets[::-1]
        for target in order:
            window = Window(target.name, name, concurrency, index + 1)
            windows.append(await run_window(target.client, target.model, window,
                                            max_tokens, stream, seconds, target.pid,
                                            vllm_metrics))
    return windows


def _pooled(windows: list[Window]) -> dict[str, Any]:
    latencies = [x for w in windows for x in w.latencies]
    first = [x for w in windows for x in w.first_chunk]
    done = len(latencies)
    return {"rps": done / sum(w.seconds for w in windows), "latencies": latencies,
            "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
            "first_p50": percentile(first, 50) if first else None,
            "failed": sum(len(w.failed) for w in windows),
            "cpu_ms_per_request": sum(w.agent_cpu_s or 0.0 for w in windows) / max(1, done)
            * 1000, "vllm_running": _mean([w.vllm_running for w in windows])}


def _mean(values: list[float | None]) -> float | None:
    seen = [v for v in values if v is not None]
    return sum(seen) / len(seen) if seen else None


def _ratios(mine: list[Window], base: list[Window]) -> list[float]:
    return [len(a.latencies) / a.seconds / (len(b.latencies) / b.seconds)
            for a, b in zip(mine, base, strict=True)]


def _distinct_outputs(windows: list[Window]) -> dict[str, int]:
    """prompt -> how many different texts all these requests got (1: deterministic)."""
    seen: dict[str, set[str]] = {}
    for window in windows:
        for prompt, texts in window.texts.items():
            seen.setdefault(prompt, set()).update(texts)
    return {prompt: len(texts) for prompt, texts in sorted(seen.items())}


def summarize(windows: list[Window], concurrencies: list[int]) -> list[dict[str, Any]]:
    rows = []
    agents = sorted({w.target for w in windows} - {"vllm"})
    for name in dict.fromkeys(w.workload for w in windows):
        for concurrency in concurrencies:
            cell = [w for w in windows if w.workload == name and w.concurrency == concurrency]
            base_windows = [w for w in cell if w.target == "vllm"]
            base = _pooled(base_windows)
            for agent in agents:
                mine_windows = [w for w in cell if w.target == agent]
                mine = _pooled(mine_windows)
                outputs = _distinct_outputs(base_windows + mine_windows)
                rows.append({
                    "workload": name, "concurrency": concurrency, "target": agent,
                    "rps": mine["rps"], "vllm_rps": base["rps"],
                    "rps_ratio": mine["rps"] / base["rps"],
                    "rps_ratio_per_round": _ratios(mine_windows, base_windows),
                    "p50_ms": mine["p50"] * 1000, "vllm_p50_ms": base["p50"] * 1000,
                    "p50_ratio": mine["p50"] / base["p50"],
                    "p50_added_ms": (mine["p50"] - base["p50"]) * 1000,
                    "p99_ms": mine["p99"] * 1000, "vllm_p99_ms": base["p99"] * 1000,
                    "first_chunk_p50_ms": _ms_or_none(mine["first_p50"]),
                    "vllm_first_chunk_p50_ms": _ms_or_none(base["first_p50"]),
                    "requests": [len(mine["latencies"]), len(base["latencies"])],
                    "failed": [mine["failed"], base["failed"]],
                    # The agent's CPU per request it proxied, read from /proc.
                    "agent_cpu_ms_per_request": mine["cpu_ms_per_request"],
                    # How many requests vLLM ran at once, on average, on each path.
                    "vllm_running_mean": mine["vllm_running"],
                    "vllm_running_mean_direct": base["vllm_running"],
                    # Greedy, same weights: 1 per prompt unless vLLM is nondeterministic.
                    "distinct_outputs_per_prompt": outputs,
                    "vllm_distinct_outputs_per_prompt": _distinct_outputs(base_windows)})
    return rows


def _ms_or_none(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def render(rows: list[dict[str, Any]]) -> str:
    body = [[r["workload"], r["concurrency"], r["target"], f"{r['rps']:.1f}",
             f"{r['vllm_rps']:.1f}", f"{r['rps_ratio']:.2f}",
             " ".join(f"{x:.2f}" for x in r["rps_ratio_per_round"]),
             f"{r['p50_ms']:.1f}", f"{r['vllm_p50_ms']:.1f}", f"{r['p50_ratio']:.2f}",
             f"{r['p50_added_ms']:+.1f}", f"{r['p99_ms']:.1f}", f"{r['vllm_p99_ms']:.1f}",
             _fmt(r["first_chunk_p50_ms"]), _fmt(r["vllm_first_chunk_p50_ms"]),
             f"{r['agent_cpu_ms_per_request']:.2f}", _fmt(r["vllm_running_mean"]),
             _fmt(r["vllm_running_mean_direct"]), "/".join(map(str, r["requests"])),
             "/".join(map(str, r["failed"])),
             max(r["distinct_outputs_per_prompt"].values())] for r in rows]
    return table(["workload", "conc.", "via", "rps", "vLLM rps", "rps ratio", "per round",
                  "p50 ms", "vLLM p50 ms", "p50 ratio", "added ms", "p99 ms", "vLLM p99 ms",
                  "1st chunk p50", "vLLM 1st chunk", "agent CPU ms/req", "vLLM batch",
                  "vLLM batch direct", "requests",
                  "failed", "max outputs/prompt"], body)


def _window_json(window: Window) -> dict[str, Any]:
    data = {k: v for k, v in asdict(window).items()
            if k not in ("texts", "latencies", "first_chunk")}
    data["requests"] = len(window.latencies)
    return data


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="ABBA rounds per cell")
    parser.add_argument("--window", type=float, default=5.0,
                        help="seconds per window, max_tokens 1 (default 5)")
    parser.add_argument("--long-window", type=float, default=15.0,
                        help="seconds per window, max_tokens 128 (default 15)")
    parser.add_argument("--workloads", nargs="+", default=[w[0] for w in WORKLOADS],
                        choices=[w[0] for w in WORKLOADS])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--agent-log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    parser.add_argument("--agent-tcp-nodelay", action="store_true",
                        help="also measure a second agent run through bench/agent_nodelay.py "
                             "(TCP_NODELAY on its listening socket)")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1 or min(args.window, args.long_window) <= 0 or \
            min(args.concurrency) < 1:
        parser.error("--rounds, --window, --long-window and --concurrency must be positive")
    return args


def start_nodelay_agent(testbed: Testbed, work: Path, stack: contextlib.ExitStack
                        ) -> AgentProcess:
    """A second agent beside the first, on the same vLLM, with TCP_NODELAY."""
    spec = testbed.agents["a"].variant(agent_id="a-nodelay", cache_dir=work / "cache-nodelay")
    agent = NodelayAgentProcess(spec, work / "agents")
    stack.callback(agent.stop)
    agent.start()
    return agent


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="lp-bench-proxy-", dir=args.work_dir))
    try:
        settings = {"log_level": args.agent_log_level}
        with contextlib.ExitStack() as stack:
            testbed = stack.enter_context(bench_testbed(work, max_loras=3, max_loaded=3,
                                                    agent_settings=settings))
            nodelay = (start_nodelay_agent(testbed, work, stack) if args.agent_tcp_nodelay
                       else None)
            with MachineLoad() as load:
                windows = asyncio.run(measure(testbed, testbed.adapter_dir("a1"), args, nodelay))
        rows = summarize(windows, args.concurrency)
        print(render(rows))
        print(f"agent log level {args.agent_log_level}; machine: {load.summary}")
        document = {"benchmark": "agent_proxy_overhead", "machine": load.summary,
                    "agent_log_level": args.agent_log_level, "rows": rows,
                    "first_failures": [f for w in windows for f in w.failed][:10],
                    "windows": [_window_json(w) for w in windows]}
        text = json.dumps(document, indent=2)
        if args.json_out is not None:
            args.json_out.write_text(text + "\n")
        else:
            print(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
