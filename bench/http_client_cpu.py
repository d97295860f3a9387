"""What one small HTTP request costs its client in CPU: httpx against aiohttp, the two
clients the agent has used to talk to vLLM and to S3 (``inference_agent/node/``), and
the proxy's own client to vLLM (``inference_agent/serving/upstream_http.py``, POST only:
it carries the proxied requests).

A local aiohttp server in a process of its own answers every request with 600 bytes
(the size of vLLM's answer to a load). In this process, each client sends
``--requests`` requests of each kind in a round: a JSON POST (as a load or unload) and
a streamed GET read in chunks (as a file fetch), on one kept-alive connection, after
50 unmeasured ones. Rounds alternate the clients' order. Reported: CPU microseconds per
request (``time.process_time``, so the server's work is not counted), the median over
the rounds, httpx's over aiohttp's, and aiohttp's POST over the proxy client's.

    .venv/bin/python -m bench.http_client_cpu --requests 2000 --rounds 4
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import uvloop

from bench.agent_setup import MachineLoad
from bench.common import git_commit, record, table
from devharness.processes import http_probe
from inference_agent.serving.openai_errors import ProxyError
from inference_agent.serving.upstream import Upstream
from loraplane.netutil import free_port
from loraplane.process import ChildProcess

BODY = {"lora_name": "bench", "lora_path": "/adapters/bench"}
ANSWER = b"x" * 600
WARMUP = 50
Kind = Callable[[str, int], Coroutine[Any, Any, float]]


def serve(port: int) -> None:
    from aiohttp import web  # noqa: PLC0415

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


@contextmanager
def server() -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="lp-bench-http-") as work, ChildProcess(
            "http server", [sys.executable, "-m", "bench.http_client_cpu", "--serve",
                            str(port)], log_path=Path(work) / "server.log") as process:
        process.wait_ready(http_probe(f"{url}/ready"), 30, interval_s=0.1)
        yield url


async def _timed(count: int, one: Callable[[], Awaitable[object]]) -> float:
    for _ in range(WARMUP):
        await one()
    started = time.process_time()
    for _ in range(count):
        await one()
    return (time.process_time() - started) / count * 1e6


async def httpx_post(url: str, count: int) -> float:
    async with httpx.AsyncClient() as client:
        async def one() -> bytes:
            return (await client.post(f"{url}/v1/load_lora_adapter", json=BODY)).content
        return await _timed(count, one)


async def httpx_stream(url: str, count: int) -> float:
    async with httpx.AsyncClient() as client:
        async def one() -> int:
            async with client.stream("GET", f"{url}/blob") as response:
                return sum([len(c) async for c in response.aiter_bytes(65536)])
        return await _timed(count, one)


async def aiohttp_post(url: str, count: int) -> float:
    async with aiohttp.ClientSession() as session:
        async def one() -> bytes:
            async with session.post(f"{url}/v1/load_lora_adapter", json=BODY) as response:
                return await response.read()
        return await _timed(count, one)


async def aiohttp_stream(url: str, count: int) -> float:
    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            async with session.get(f"{url}/blob") as response:
                return sum([len(c) async for c in response.content.iter_chunked(65536)])
        return await _timed(count, one)


async def upstream_post(url: str, count: int) -> float:
    """The proxy's call: ``Upstream.post`` (headers in), then the body read whole."""
    upstream = Upstream(url, request_timeout_s=30, connect_timeout_s=5)

    async def one() -> bytes:
        response = await upstream.post("/v1/completions", orjson.dumps(BODY), {})
        if isinstance(response, ProxyError):
            raise RuntimeError(response.message)
        try:
            return await response.read()
        finally:
            response.close()
    try:
        return await _timed(count, one)
    finally:
        await upstream.aclose()


KINDS: dict[str, Kind] = {"httpx POST": httpx_post, "httpx streamed GET": httpx_stream,
                          "aiohttp POST": aiohttp_post,
                          "aiohttp streamed GET": aiohttp_stream,
                          "proxy client POST": upstream_post}


def measure(url: str, requests: int, rounds: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {kind: [] for kind in KINDS}
    names = list(KINDS)
    for number in range(rounds):
        for kind in names if number % 2 == 0 else reversed(names):
            found[kind].append(round(uvloop.run(KINDS[kind](url, requests)), 1))
    return found


def summarize(found: dict[str, list[float]]) -> dict[str, Any]:
    median = {kind: round(statistics.median(values), 1) for kind, values in found.items()}
    return {"us_per_request": found, "median_us": median,
            "httpx_over_aiohttp": {
                "POST": round(median["httpx POST"] / median["aiohttp POST"], 2),
                "streamed GET": round(median["httpx streamed GET"]
                                      / median["aiohttp streamed GET"], 2)},
            "aiohttp_over_proxy_client": round(median["aiohttp POST"]
                                               / median["proxy client POST"], 2)}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per kind and round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.serve is not None:
        serve(args.serve)
        return None
    if min(args.requests, args.rounds) < 1:
        parser.error("--requests and --rounds must be positive")
    commit = git_commit()
    with server() as url, MachineLoad() as load:
        result = summarize(measure(url, args.requests, args.rounds))
    print(table(["kind", "CPU µs per request (median)", "per round"],
                [[kind, value, result["us_per_request"][kind]]
                 for kind, value in result["median_us"].items()]))
    print(f"httpx / aiohttp: {result['httpx_over_aiohttp']}")
    print(f"aiohttp / the proxy's client, POST: {result['aiohttp_over_proxy_client']}")
    sniffio = importlib.util.find_spec("sniffio") is not None
    return record("http_client_cpu", commit, load.summary, args.json_out,
                  requests=args.requests, rounds=args.rounds, sniffio_installed=sniffio,
                  **result)


if __name__ == "__main__":
    main()
