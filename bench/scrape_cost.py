"""Scrape cost: the agent's /metrics at 20 scrapes a second, as a gateway's picker scrapes it.

One host (``bench/agent_setup.py``): one CPU vLLM with the tiny model and one ``loraplane
agent`` in front of it, with three adapters published and loaded, so the agent's page
carries ``vllm:lora_requests_info`` with their names and vLLM's queue, KV-cache and
cache-config series copied from vLLM (every ``LORAPLANE_VLLM_METRICS_INTERVAL_S``).

Windows of ``--window`` seconds take turns, over ``--rounds`` rounds (A B C, then C B A):

- ``agent``: ``--rate`` GETs a second of the agent's ``/metrics``, sent on a fixed
  schedule (open loop: a slow answer does not delay the next scrape);
- ``agent-lean``: the same of ``/metrics/model-server``, the protocol's series alone
  (what deploy/kubernetes/ points llm-d's picker at);
- ``vllm``: the same of vLLM's own ``/metrics``, which the picker would scrape without
  the agent, for comparison;
- ``idle``: no scrape at all, the baseline of both processes' CPU (the agent's copy of
  vLLM's series is refreshed in every window, this one included).

Per window: every scrape's latency to the last byte, the CPU time of the agent and of
vLLM's API server process (``/proc``; vLLM's engine core is another process, busy on its
own), and how often the agent asked vLLM for its series (its own counter). The run
records the commit it measured.

    .venv/bin/python -m bench.scrape_cost --rate 20 --window 20 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.agent_setup import BASE_MODEL, MachineLoad, bench_testbed, wait_served
from bench.common import cpu_seconds, git_commit, percentile, record, table
from devharness.llmd import parse_endpoint
from devharness.openai_client import OpenAIClient, limits
from devharness.testbed import Testbed, metric
from inference_agent.serving.model_server_metrics import MODEL_SERVER_METRICS_PATH
from loraplane.client import AsyncRegistryClient

ADAPTERS = {"scrape-1": "a1", "scrape-2": "a2", "scrape-3": "a3"}
TARGETS = ("agent", "agent-lean", "vllm", "idle")
PATHS = {"agent": "/metrics", "agent-lean": MODEL_SERVER_METRICS_PATH, "vllm": "/metrics"}
VLLM_SCRAPES = "loraplane_agent_vllm_metrics_scrapes_total"


@dataclass
class Window:
    target: str
    round: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    page_bytes: int = 0
    agent_cpu_s: float = 0.0
    vllm_api_cpu_s: float = 0.0
    agent_vllm_scrapes: float = 0.0


async def _scrape(client: httpx.AsyncClient, window: Window) -> None:
    sent = time.perf_counter()
    try:
        response = await client.get(PATHS[window.target])
    except httpx.HTTPError:
        window.failed += 1
        return
    if response.status_code != 200:
        window.failed += 1
        return
    window.latencies.append(time.perf_counter() - sent)
    window.page_bytes = len(response.content)


async def run_window(client: httpx.AsyncClient | None, window: Window, rate: float,
                     seconds: float, pids: tuple[int, int], agent_url: str) -> Window:
    """Scrape ``client`` ``rate`` times a second for ``seconds`` (none for ``idle``)."""
    before = _cpu(pids), metric(_text(agent_url), VLLM_SCRAPES, outcome="ok")
    started = time.perf_counter()
    if client is None:
        await asyncio.sleep(seconds)
    else:
        tasks = []
        for index in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, started + index / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(_scrape(client, window)))
        await asyncio.gather(*tasks)
    window.seconds = time.perf_counter() - started
    after = _cpu(pids), metric(_text(agent_url), VLLM_SCRAPES, outcome="ok")
    window.agent_cpu_s = after[0][0] - before[0][0]
    window.vllm_api_cpu_s = after[0][1] - before[0][1]
    window.agent_vllm_scrapes = after[1] - before[1]
    return window


def _cpu(pids: tuple[int, int]) -> tuple[float, float]:
    agent, vllm = (cpu_seconds(pid) for pid in pids)
    assert agent is not None and vllm is not None, "the agent or vLLM is gone"
    return agent, vllm


def _text(url: str, path: str = "/metrics") -> str:
    """A page, read blocking: only between windows, where nothing else runs."""
    response = httpx.get(f"{url}{path}", timeout=30)
    response.raise_for_status()
    return response.text


async def prepare(testbed: Testbed) -> None:
    """Publish and load the adapters; check the page lists them as llm-d reads it."""
    agent = testbed.agents["a"]
    async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                   timeout_s=120) as api, \
            OpenAIClient(agent.url, token=testbed.inference_token) as client:
        for name, folder in ADAPTERS.items():
            await api.create_adapter(name, BASE_MODEL, tenant="e2e")
            await api.push(name, testbed.adapter_dir(folder), aliases=["live"])
            await wait_served(client, name, f"{name}@1", 60.0)
    seen = parse_endpoint(_text(agent.url))
    lean = _text(agent.url, MODEL_SERVER_METRICS_PATH)
    assert parse_endpoint(lean) == seen, "the lean page says what /metrics says"
    expected = {n for name in ADAPTERS for n in (name, f"{name}@live", f"{name}@1")}
    assert seen.active_models == expected, seen
    assert seen.running_requests is not None and seen.kv_cache_usage is not None, seen


async def measure(testbed: Testbed, args: argparse.Namespace) -> list[Window]:
    agent, vllm = testbed.agents["a"], testbed.vllms["a"]
    assert agent.process.pid is not None and vllm.pid is not None
    pids = (agent.process.pid, vllm.pid)
    await prepare(testbed)
    windows: list[Window] = []
    async with httpx.AsyncClient(base_url=agent.url, timeout=30) as to_agent, \
            httpx.AsyncClient(base_url=vllm.url, timeout=30, limits=limits()) as to_vllm:
        clients = {"agent": to_agent, "agent-lean": to_agent, "vllm": to_vllm, "idle": None}
        for target, client in clients.items():  # warm every path; not counted
            if client is not None:
                await _scrape(client, Window(target, 0))
        for index in range(args.rounds):
            order = TARGETS if index % 2 == 0 else TARGETS[::-1]
            for target in order:
                window = Window(target, index + 1)
                windows.append(await run_window(clients[target], window, args.rate,
                                                args.window, pids, agent.url))
                print(f"  round {index + 1}, {target}: done", file=sys.stderr)
    return windows


def summarize(windows: list[Window]) -> list[dict[str, Any]]:
    rows = []
    for target in TARGETS:
        mine = [w for w in windows if w.target == target]
        seconds = sum(w.seconds for w in mine)
        latencies = [x for w in mine for x in w.latencies]
        rows.append({
            "target": target, "scrapes": len(latencies),
            "failed": sum(w.failed for w in mine),
            "rate": len(latencies) / seconds,
            "p50_ms": percentile(latencies, 50) * 1000 if latencies else None,
            "p99_ms": percentile(latencies, 99) * 1000 if latencies else None,
            "max_ms": max(latencies) * 1000 if latencies else None,
            "page_bytes": max(w.page_bytes for w in mine),
            "agent_cpu_pct": 100 * sum(w.agent_cpu_s for w in mine) / seconds,
            "vllm_api_cpu_pct": 100 * sum(w.vllm_api_cpu_s for w in mine) / seconds,
            "agent_vllm_scrapes_per_s": sum(w.agent_vllm_scrapes for w in mine) / seconds})
    return rows


def _fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def render(rows: list[dict[str, Any]]) -> str:
    body = [[r["target"], r["scrapes"], r["failed"], _fmt(r["rate"], 1), _fmt(r["p50_ms"]),
             _fmt(r["p99_ms"]), _fmt(r["max_ms"]), r["page_bytes"], _fmt(r["agent_cpu_pct"], 1),
             _fmt(r["vllm_api_cpu_pct"], 1), _fmt(r["agent_vllm_scrapes_per_s"])]
            for r in rows]
    return table(["scraped", "scrapes", "failed", "per s", "p50 ms", "p99 ms", "max ms",
                  "page bytes", "agent CPU %", "vLLM API CPU %",
                  "agent's vLLM scrapes per s"], body)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="scrapes a second (20)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per window (20)")
    parser.add_argument("--rounds", type=int, default=3, help="ABC/CBA rounds (3)")
    parser.add_argument("--vllm-metrics-interval", type=float, default=None,
                        help="the agent's LORAPLANE_VLLM_METRICS_INTERVAL_S (its default)")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.window <= 0 or args.rounds < 1:
        parser.error("--rate, --window and --rounds must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    measured = git_commit()
    work = Path(tempfile.mkdtemp(prefix="lp-bench-scrape-", dir=args.work_dir))
    settings = ({"vllm_metrics_interval_s": str(args.vllm_metrics_interval)}
                if args.vllm_metrics_interval is not None else {})
    try:
        with contextlib.ExitStack() as stack:
            testbed = stack.enter_context(bench_testbed(
                work, max_loras=len(ADAPTERS), max_loaded=len(ADAPTERS),
                agent_settings=settings))
            with MachineLoad() as load:
                windows = asyncio.run(measure(testbed, args))
        rows = summarize(windows)
        print(render(rows))
        record("scrape_cost", measured, load.summary, args.json_out,
               args={k: str(v) for k, v in vars(args).items()}, rows=rows,
               windows=[{**asdict(w), "latencies": len(w.latencies)} for w in windows])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
