"""The proxy's own CPU per request, against a stand-in for vLLM that answers at once.

vLLM is not in this measurement: a stand-in (``--serve-upstream``, a few lines of
asyncio) answers every POST with a fixed 1-token completion. The agent's proxy app
(``create_proxy_app`` with the agent's real route table, leases, metrics and keys) runs
under uvicorn and uvloop as the agent runs it (``--serve-agent``), each a process of its
own. The bench sends ``--requests`` sequential 1-token completions for the base model
through it and reads its CPU time (user + system) from /proc before and after: CPU time
per request, which the machine's load changes far less than it changes time.

``--upstream-delay-ms MS`` makes the stand-in answer each request MS after it came,
as vLLM does after its inference: the proxy then idles between a request and its
answer, as it does in front of vLLM, and pays what waking up costs the machine.

With ``--also-commit REV`` the proxy app of commit REV (``git archive``) is measured in
the same run, rounds alternating, and the ratio is printed. The base-model path skips
the adapter cache and the lease; bench/agent_proxy_overhead.py measures those, on vLLM.

``--relay`` measures bench/tcp_relay.py in front of the same stand-in in the same
rounds: bytes across on uvloop with no HTTP, the least a hop through Python costs.
``--bare`` measures this checkout's proxy behind bench/bare_front_door.py instead of
uvicorn: what the ASGI server and the front door's layers cost a request. ``--granian``
measures it under granian, an HTTP server in Rust (bench/granian_front_door.py).
``--guest-halt-poll-ns NS`` runs every round twice, once as the machine idles and once
with its idle vCPUs polling up to NS before they halt (bench/haltpoll.py): with
``--upstream-delay-ms`` it shows how much of each wake-up's cost is the halt.

    .venv/bin/python -m bench.proxy_cpu --also-commit 5f6d138
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.haltpoll import HaltPoll

BASE = "tiny-llama"
TOKEN = "lp_bench-proxy-cpu"
_BODY = (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"tiny-llama",'
         b'"choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":"length"}],'
         b'"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}}')
_ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
           % len(_BODY)) + _BODY
REQUEST = (b'{"model":"tiny-llama","prompt":"The registry publishes","max_tokens":1,'
           b'"temperature":0}')


class StandIn(asyncio.Protocol):
    """Answers each HTTP/1.1 request (with a Content-Length body) with ``_ANSWER``,
    ``delay_s`` after it came (vLLM's time for the request; 0: at once)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            if self.delay_s > 0:
                asyncio.get_running_loop().call_later(self.delay_s, self._send,
                                                      self.answer(head))
            else:
                self.transport.write(self.answer(head))

    def _send(self, answer: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(answer)

    def answer(self, head: bytes) -> bytes:
        """The whole HTTP response to the request whose head is ``head``."""
        return _ANSWER


async def serve_upstream(port: int, delay_s: float = 0.0) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: StandIn(delay_s),
                                                           "127.0.0.1", port)
    await server.serve_forever()


def proxy_app(upstream_port: int) -> Any:
    """The agent's proxy app, from whichever ``inference_agent`` is on sys.path."""
    from inference_agent.metrics import AgentMetrics  # noqa: PLC0415
    from inference_agent.serving.auth import InferenceKeys, token_hash  # noqa: PLC0415
    from inference_agent.serving.leases import Leases  # noqa: PLC0415
    from inference_agent.serving.proxy import create_proxy_app  # noqa: PLC0415
    from inference_agent.serving.routes import RouteTable  # noqa: PLC0415

    keys = InferenceKeys()
    keys.replace("bench", {token_hash(TOKEN): "bench"})
    return create_proxy_app(routes=RouteTable(BASE), cache=None,  # type: ignore[arg-type]
                            leases=Leases(), metrics=AgentMetrics(),
                            vllm_url=f"http://127.0.0.1:{upstream_port}", base_model=BASE,
                            registry=None, keys=keys)


def serve_agent(port: int, upstream_port: int) -> None:
    """The proxy app under uvicorn on uvloop, as the agent runs it."""
    import uvicorn  # noqa: PLC0415
    import uvloop  # noqa: PLC0415

    from inference_agent import http_server  # noqa: PLC0415

    # The agent's connection protocol where that commit has one (uvicorn's own before).
    protocol = getattr(http_server, "HTTP_PROTOCOL", "auto")
    config = uvicorn.Config(proxy_app(upstream_port), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="on", access_log=False,
                            http=protocol)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(uvicorn.Server(config).serve())


def serve_bare(port: int, upstream_port: int) -> None:
    """The same proxy's ``generate`` behind bench/bare_front_door.py, on uvloop."""
    import uvloop  # noqa: PLC0415

    from bench.bare_front_door import serve  # noqa: PLC0415

    generate = proxy_app(upstream_port).state.proxy.generate
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(generate, port))


def serve_granian(port: int, upstream_port: int, interface: str) -> None:
    """The same proxy under granian (bench/granian_front_door.py), ``asgi`` or ``rsgi``."""
    from bench.granian_front_door import serve  # noqa: PLC0415

    serve(proxy_app(upstream_port), port, interface)


def start_role(role: list[str], name: str, source: Path | None, log_dir: Path) -> Any:
    """This file run as a script in ``role``, with ``source`` first on sys.path."""
    from bench.common import REPO  # noqa: PLC0415
    from loraplane.process import ChildProcess  # noqa: PLC0415

    env = {**os.environ, "PYTHONPATH": str(source or REPO)}
    process = ChildProcess(name, [sys.executable, __file__, *role], env=env,
                           cwd=source or REPO, log_path=log_dir / f"{name}.log")
    process.start()
    return process


async def _requests(url: str, count: int, pid: int) -> float:
    """CPU seconds of ``pid`` per request, over ``count`` sequential requests."""
    cpu, _wall = await _timed_requests(url, count, pid)
    return cpu


async def _timed_requests(url: str, count: int, pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid`` per request, and seconds per request on the client's
    clock, over ``count`` sequential requests."""
    import aiohttp  # noqa: PLC0415

    from bench.common import cpu_seconds  # noqa: PLC0415

    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async def one() -> None:
            async with session.post(f"{url}/v1/completions", data=REQUEST,
                                    headers=headers) as response:
                body = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url}: {response.status} {body[:300]!r}")

        for _ in range(min(100, count)):  # warm: connections, caches, lazy imports
            await one()
        before, started = cpu_seconds(pid), time.perf_counter()
        for _ in range(count):
            await one()
        after, wall = cpu_seconds(pid), time.perf_counter() - started
    if before is None or after is None:
        raise RuntimeError(f"the proxy at {url} is gone")
    return (after - before) / count, wall / count


def start_proxy(stack: contextlib.ExitStack, role: str, name: str, upstream_port: int,
                work: Path, source: Path | None = None) -> tuple[str, int]:
    """A proxy of this file's ``role`` in front of ``upstream_port``, ready (its
    ``/healthz`` answers), stopped when ``stack`` closes: its URL and its pid."""
    from devharness.processes import http_probe  # noqa: PLC0415
    from loraplane.netutil import free_port  # noqa: PLC0415

    port = free_port()
    process = start_role([role, str(port), str(upstream_port)], name, source, work)
    stack.callback(process.stop, 10)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(http_probe(f"{url}/healthz"), 60.0, interval_s=0.2)
    return url, process.pid


def _start_proxies(args: argparse.Namespace, work: Path, upstream_port: int,
                   stack: contextlib.ExitStack) -> dict[str, tuple[str, int]]:
    """Each proxy measured (this checkout's, ``--also-commit``'s, ``--bare``, ``--relay``)
    started in front of the stand-in, stopped when ``stack`` closes: name -> (its URL,
    its pid)."""
    from bench.proxy_floor import start_relay  # noqa: PLC0415
    from bench.proxy_variants import archive  # noqa: PLC0415

    sources: dict[str, tuple[str, Path | None]] = {"proxy": ("--serve-agent", None)}
    if args.also_commit is not None:
        commit, folder = archive(args.also_commit, work / "also")
        sources[f"proxy@{commit[:10]}"] = ("--serve-agent", folder)
    if args.bare:
        sources["proxy, bare front door"] = ("--serve-bare", None)
    for interface in ("asgi", "rsgi") if args.granian else ():
        sources[f"proxy, granian {interface}"] = (f"--serve-granian-{interface}", None)
    urls: dict[str, tuple[str, int]] = {}
    for name, (role, source) in sources.items():
        urls[name] = start_proxy(stack, role, name, upstream_port, work, source)
    if args.relay:
        relay = start_relay(stack, f"127.0.0.1:{upstream_port}", work)
        urls["relay"] = (relay.url, relay.pid)
    return urls


def _rounds(args: argparse.Namespace, urls: dict[str, tuple[str, int]],
            halt: HaltPoll | None) -> dict[str, list[tuple[float, float]]]:
    """Per measured name, (CPU s, wall s) per request of each round. With ``halt``,
    each round runs once with the machine's idle setting and once polling
    ``--guest-halt-poll-ns``, in alternating order; those names end in ``, polling``."""
    settings: list[int | None] = [None] if halt is None else [None, args.guest_halt_poll_ns]
    measured: dict[str, list[tuple[float, float]]] = {}
    for index in range(args.rounds):
        for setting in settings if index % 2 == 0 else settings[::-1]:
            if halt is not None and setting is not None:
                halt.poll(setting)
            elif halt is not None:
                halt.restore()
            for name in list(urls) if index % 2 == 0 else list(urls)[::-1]:
                url, pid = urls[name]
                key = name if setting is None else f"{name}, polling"
                measured.setdefault(key, []).append(
                    asyncio.run(_timed_requests(url, args.requests, pid)))
    return measured


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bench.agent_setup import MachineLoad  # noqa: PLC0415
    from bench.common import git_commit  # noqa: PLC0415
    from bench.haltpoll import HaltPoll  # noqa: PLC0415
    from bench.proxy_stats import mean_ci  # noqa: PLC0415
    from loraplane.netutil import free_port  # noqa: PLC0415

    measured = git_commit()  # before anything runs: what is measured is this
    halt = HaltPoll() if args.guest_halt_poll_ns is not None else None
    upstream_port = free_port()
    with contextlib.ExitStack() as stack:  # the processes, stopped last started first
        stand_in = start_role(["--serve-upstream", str(upstream_port), "--upstream-delay-ms",
                               str(args.upstream_delay_ms)], "stand-in", None, work)
        stack.callback(stand_in.stop, 10)
        urls = _start_proxies(args, work, upstream_port, stack)
        with MachineLoad() as load, (halt.restored() if halt else contextlib.nullcontext()):
            per_round = _rounds(args, urls, halt)
    result: dict[str, Any] = {
        "benchmark": "proxy_cpu", "commit": measured, "machine": load.summary,
        "requests": args.requests, "upstream_delay_ms": args.upstream_delay_ms,
        "guest_halt_poll_ns": args.guest_halt_poll_ns,
        "halt_poll_found": halt.found if halt else None,
        "cpu_ms_per_request": {n: [c * 1000 for c, _ in v] for n, v in per_round.items()},
        "wall_ms_per_request": {n: [w * 1000 for _, w in v] for n, v in per_round.items()}}
    cpu = {n: [c for c, _ in v] for n, v in per_round.items()}
    for old in (n for n in cpu if n.startswith("proxy") and n != "proxy"
                and not n.endswith(", polling")):
        ratios = round_ratios(cpu["proxy"], cpu[old])
        result["ratio_to_" + old] = list(mean_ci(ratios)) if ratios else None
        result["rounds_without_ratio"] = max(result.get("rounds_without_ratio", 0),
                                             args.rounds - len(ratios))
    return result


def round_ratios(new: list[float], old: list[float]) -> list[float]:
    """Old CPU per request over new, round by round. CPU time comes in clock ticks
    (10 ms): a short round may read 0 for the new proxy and gives no ratio, so it is
    left out (the caller counts it) rather than divided by."""
    return [o / n for n, o in zip(new, old, strict=True) if n > 0]


def _serve_role(args: argparse.Namespace) -> bool:
    """Serve the role this process was started in (``start_role``), if it was."""
    if args.serve_upstream is not None:
        asyncio.run(serve_upstream(args.serve_upstream, args.upstream_delay_ms / 1000))
        return True
    roles: dict[str, Callable[[int, int], None]] = {
        "serve_agent": serve_agent, "serve_bare": serve_bare,
        "serve_granian_asgi": partial(serve_granian, interface="asgi"),
        "serve_granian_rsgi": partial(serve_granian, interface="rsgi")}
    for attr, serve in roles.items():
        if (ports := getattr(args, attr)) is not None:
            serve(ports[0], ports[1])
            return True
    return False


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per round (2000)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--also-commit", default=None, metavar="REV")
    parser.add_argument("--upstream-delay-ms", type=float, default=0.0, metavar="MS",
                        help="the stand-in answers each request after MS (0: at once), as "
                             "vLLM does after its inference: the proxy then idles between "
                             "the request and the answer")
    parser.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-agent", type=int, nargs=2, default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare", type=int, nargs=2, default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true",
                        help="also measure this checkout's proxy behind "
                             "bench/bare_front_door.py instead of uvicorn: what the ASGI "
                             "server and the front door's layers cost a request")
    parser.add_argument("--granian", action="store_true",
                        help="also measure this checkout's proxy under granian (Rust's "
                             "hyper), its ASGI app and Proxy.generate through RSGI "
                             "(bench/granian_front_door.py)")
    for interface in ("asgi", "rsgi"):
        parser.add_argument(f"--serve-granian-{interface}", type=int, nargs=2,
                            default=None, help=argparse.SUPPRESS)
    parser.add_argument("--relay", action="store_true",
                        help="also measure bench/tcp_relay.py (bytes across, no HTTP) in "
                             "front of the same stand-in: the least a Python hop costs")
    parser.add_argument("--guest-halt-poll-ns", type=int, default=None, metavar="NS",
                        help="run each round also with this machine's idle vCPUs polling "
                             "up to NS before they halt (bench/haltpoll.py; needs root "
                             "and the haltpoll cpuidle driver); the setting found is put "
                             "back at the end")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if _serve_role(args):
        return {}
    if args.requests < 1 or args.rounds < 1 or args.upstream_delay_ms < 0:
        parser.error("--requests and --rounds must be positive, --upstream-delay-ms not "
                     "negative")
    if args.guest_halt_poll_ns is not None and args.guest_halt_poll_ns < 1:
        parser.error("--guest-halt-poll-ns must be positive")
    from bench.common import write_json  # noqa: PLC0415
    from bench.haltpoll import HaltPollUnavailable  # noqa: PLC0415
    from bench.proxy_stats import commit_line  # noqa: PLC0415

    try:
        with tempfile.TemporaryDirectory(prefix="lp-bench-proxy-cpu-") as work:
            result = measure(args, Path(work))
    except HaltPollUnavailable as exc:
        parser.exit(2, f"proxy_cpu: --guest-halt-poll-ns: {exc}\n")
    print(f"the stand-in answered after {result['upstream_delay_ms']} ms")
    for name, values in result["cpu_ms_per_request"].items():
        walls = result["wall_ms_per_request"][name]
        print(f"{name}: CPU ms per request, per round: "
              + " ".join(f"{v:.3f}" for v in values)
              + "; ms per request on the client's clock: "
              + " ".join(f"{w:.3f}" for w in walls))
    for key, value in result.items():
        if key.startswith("ratio_to_") and value is None:
            print(f"{key.removeprefix('ratio_to_')} / proxy: no round long enough to show"
                  " this checkout's CPU time; run more --requests")
        elif key.startswith("ratio_to_"):
            print(f"{key.removeprefix('ratio_to_')} / proxy, CPU per request: "
                  f"{value[0]:.2f} ± {value[1]:.2f} (mean ± 95% CI over rounds)")
    print(commit_line(result))
    write_json(result, args.json_out)
    return result


if __name__ == "__main__":
    if __package__ in (None, ""):
        # Run as a script (the proxy and stand-in processes): their sys.path holds the
        # code under test first, and this file's folder, not the checkout's root.
        sys.path.append(str(Path(__file__).resolve().parents[1]))
    main()
