"""The agent's own cost: CPU when idle and when a picker scrapes it, memory over a run.

Two full agents (``loraplane agent --watch-dir``, default settings, log level info) run
side by side: this checkout's and, with ``--also-commit REV``, commit REV's (``git
archive``). Both sit before one stand-in for vLLM (``--serve-upstream``: a few lines of
asyncio answering ``/v1/models``, ``/health``, ``/metrics`` with a page recorded from
the CPU vLLM, ``bench/data/vllm_metrics.txt``, and a 1-token completion), so vLLM's own
work is not in the figures. The bench reads each agent's CPU time (user + system) and
RSS from /proc:

- **idle**: ``--rounds`` windows of ``--idle-s`` with no request and no scrape, as % of
  one core;
- **scraped**: ``--scraped-s`` with ``/metrics/model-server`` scraped ``--scrape-hz``
  times a second (a gateway's endpoint picker), as % of one core;
- **requests**: ``--batches`` batches of ``--batch-requests`` sequential base-model
  completions through each agent (bench/proxy_cpu.py's client), CPU ms per request and
  the RSS after each batch: its growth over the run.

    .venv/bin/python -m bench.agent_cost --also-commit bcbe682
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, ClassVar

import httpx

from bench.agent_setup import MachineLoad
from bench.common import REPO, cpu_seconds, git_commit, proc_status_kb, write_json
from bench.proxy_cpu import _ANSWER, TOKEN, StandIn, _requests
from bench.proxy_stats import commit_line
from bench.proxy_variants import CommitAgentProcess, archive
from devharness.processes import http_probe
from devharness.testbed import AgentProcess, AgentSpec
from loraplane.netutil import free_port
from loraplane.process import ChildProcess

PAGE = Path(__file__).resolve().parent / "data" / "vllm_metrics.txt"
BASE = "tiny-llama"


def _answer(status: str, body: bytes, kind: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + kind
            + b"\r\ncontent-length: %d\r\n\r\n" % len(body)) + body


def _answers() -> dict[bytes, bytes]:

    models = (b'{"object":"list","data":[{"id":"tiny-llama","object":"model",'
              b'"root":"tiny-llama","parent":null}]}')
    return {b"GET /v1/models": _answer("200 OK", models),
            b"GET /health": _answer("200 OK", b""),
            b"GET /metrics": _answer("200 OK", PAGE.read_bytes(), b"text/plain"),
            b"POST /v1/completions": _ANSWER,
            b"POST /v1/load_lora_adapter": _answer("200 OK", b"Success", b"text/plain"),
            b"POST /v1/unload_lora_adapter": _answer("200 OK", b"Success", b"text/plain")}


class RoutedStandIn(StandIn):
    """vLLM's endpoints the agent calls, each with one fixed answer."""

    answers: ClassVar[dict[bytes, bytes]] = {}

    def answer(self, head: bytes) -> bytes:
        method, path = head.split(b"\r\n", 1)[0].split(b" ")[:2]
        key = method + b" " + path.partition(b"?")[0]
        return self.answers.get(key, _answer("404 Not Found", b"{}"))


async def serve_upstream(port: int) -> None:
    RoutedStandIn.answers = _answers()
    server = await asyncio.get_running_loop().create_server(RoutedStandIn, "127.0.0.1",
                                                           port)
    await server.serve_forever()


@contextmanager
def agents(work: Path, upstream_url: str, also: str | None) -> Iterator[dict[str, Any]]:
    """This checkout's agent (and commit ``also``'s), started; name -> AgentProcess."""

    keys, watch = work / "keys", work / "watch"
    keys.write_text(f"local {hashlib.sha256(TOKEN.encode()).hexdigest()}\n")
    watch.mkdir()

    def spec(name: str) -> AgentSpec:
        return AgentSpec(agent_id=name, vllm_url=upstream_url, base_model=BASE,
                         cache_dir=work / f"cache-{name}", watch_dir=watch,
                         settings={"keys_file": str(keys)})

    started: dict[str, Any] = {"agent": AgentProcess(spec("agent"), work)}
    if also is not None:
        commit, source = archive(also, work / "also")
        name = f"agent@{commit[:10]}"
        started[name] = CommitAgentProcess(spec(name.replace("@", "-")), work, source,
                                           commit)
    try:
        for agent in started.values():
            agent.start()
        yield started
    finally:
        for agent in started.values():
            agent.stop()


def cpu_share(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """% of one core each process used over the next ``seconds``."""

    before = {name: cpu_seconds(pid) or 0.0 for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {name: round(100 * ((cpu_seconds(pid) or 0.0) - before[name]) / elapsed, 2)
            for name, pid in pids.items()}


@contextmanager
def scraping(urls: list[str], hz: float) -> Iterator[list[int]]:
    """GET ``/metrics/model-server`` of each URL ``hz`` times a second, in threads."""
    stop = threading.Event()
    counts = [0] * len(urls)

    def run(index: int, url: str) -> None:
        with httpx.Client(timeout=10.0) as http:
            while not stop.wait(1 / hz):
                http.get(f"{url}/metrics/model-server").raise_for_status()
                counts[index] += 1

    threads = [threading.Thread(target=run, args=(i, u), daemon=True)
               for i, u in enumerate(urls)]
    for thread in threads:
        thread.start()
    try:
        yield counts
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def request_batches(urls: dict[str, str], pids: dict[str, int],
                    args: argparse.Namespace) -> dict[str, Any]:
    """CPU ms per request and RSS (MiB) after each batch, per agent, batches alternating."""

    out: dict[str, Any] = {n: {"cpu_ms_per_request": [], "rss_mib": []} for n in urls}
    for name in urls:
        out[name]["rss_mib"].append(round((proc_status_kb(pids[name], "VmRSS") or 0) / 1024, 1))
    for _ in range(args.batches):
        for name, url in urls.items():
            per = asyncio.run(_requests(url, args.batch_requests, pids[name]))
            out[name]["cpu_ms_per_request"].append(round(per * 1000, 3))
            rss = proc_status_kb(pids[name], "VmRSS") or 0
            out[name]["rss_mib"].append(round(rss / 1024, 1))
    return out


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:

    measured = git_commit()
    port = free_port()
    upstream = ChildProcess("stand-in", [sys.executable, "-m", "bench.agent_cost",
                                         "--serve-upstream", str(port)],
                            cwd=REPO, log_path=work / "stand-in.log")
    upstream.start()
    upstream_url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        stack.callback(upstream.stop, 10)
        upstream.wait_ready(http_probe(f"{upstream_url}/health"), 60.0, interval_s=0.2)
        started = stack.enter_context(agents(work, upstream_url, args.also_commit))
        pids = {name: agent.process.pid for name, agent in started.items()}
        urls = {name: agent.url for name, agent in started.items()}
        time.sleep(args.settle_s)  # start-up work (imports, first scrape) is not idling
        with MachineLoad() as load:
            idle = [cpu_share(pids, args.idle_s) for _ in range(args.rounds)]
            with scraping(list(urls.values()), args.scrape_hz) as counts:
                scraped = cpu_share(pids, args.scraped_s)
            batches = request_batches(urls, pids, args)
    result: dict[str, Any] = {
        "benchmark": "agent_cost", "commit": measured, "machine": load.summary,
        "settings": {k: v for k, v in vars(args).items() if k != "json_out"},
        "idle_cpu_pct_of_core": {n: [r[n] for r in idle] for n in pids},
        "scraped_cpu_pct_of_core": scraped, "scrapes_answered": dict(zip(urls, counts,
                                                                         strict=True)),
        "requests": batches}
    return result


def _print(result: dict[str, Any]) -> None:
    for name, values in result["idle_cpu_pct_of_core"].items():
        mean = sum(values) / len(values)
        # The rate the agent answered, not the one asked: a busy machine slows the
        # bench's scraping threads down.
        rate = result["scrapes_answered"][name] / result["settings"]["scraped_s"]
        print(f"{name}: idle CPU {mean:.2f}% of a core (windows: "
              + " ".join(f"{v:.2f}" for v in values) + f"); scraped {rate:.1f} times a "
              f"second: {result['scraped_cpu_pct_of_core'][name]:.2f}%")
        batches = result["requests"][name]
        rss = batches["rss_mib"]
        print(f"  CPU ms/request per batch: {batches['cpu_ms_per_request']}; RSS MiB "
              f"after start, then each batch: {rss} (growth {rss[-1] - rss[1]:+.1f} MiB "
              "after the first batch)")
    print(commit_line(result))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--idle-s", type=float, default=30.0, help="per window (30)")
    parser.add_argument("--rounds", type=int, default=3, help="idle windows (3)")
    parser.add_argument("--scraped-s", type=float, default=30.0)
    parser.add_argument("--scrape-hz", type=float, default=20.0)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--batch-requests", type=int, default=4000)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--also-commit", default=None, metavar="REV")
    parser.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.serve_upstream is not None:
        asyncio.run(serve_upstream(args.serve_upstream))
        return {}
    if min(args.idle_s, args.rounds, args.scraped_s, args.scrape_hz, args.batches,
           args.batch_requests) <= 0:
        parser.error("durations, rates and counts must be positive")

    with tempfile.TemporaryDirectory(prefix="lp-bench-agent-cost-") as work:
        result = measure(args, Path(work))
    _print(result)
    write_json(result, args.json_out)
    return result


if __name__ == "__main__":
    main()
