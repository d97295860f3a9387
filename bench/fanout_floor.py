"""The floor under fan-out on this machine: N idle processes, each receiving one NATS
message and making one HTTP request, and nothing else.

Each child is a Python process with the agent's own stack (asyncio, nats-py, httpx)
that subscribes to one subject, and on every message GETs ``/hit/<child>/<round>`` from
a small HTTP server in the bench process, which notes when each request arrived. The
bench publishes one message per round; from the publish to the last request is what
N processes on this machine's cores take to react to one message at all, before any
agent work (no JetStream consumer, no files, no vLLM, no report). The fan-out bench
runs it with the fleet's size after the fleet stopped, so the two compare in one run.

    .venv/bin/python -m bench.fanout_floor --processes 100 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import nats

from bench.common import REPO, git_commit, machine_summary, percentile
from devharness.processes import clean_env
from devharness.services import NatsService
from devharness.waiting import eventually
from loraplane.process import ChildProcess

SUBJECT = "fanout.floor"


async def child(index: int, nats_url: str, http_url: str) -> None:
    """One child: say ready, then one GET per message, until the bench stops it."""
    connection = await nats.connect(nats_url)
    async with httpx.AsyncClient(base_url=http_url, timeout=60) as client:
        async def on_message(msg: Any) -> None:
            await client.get(f"/hit/{index}/{msg.data.decode()}")

        await connection.subscribe(SUBJECT, cb=on_message)
        await connection.flush()
        await client.get(f"/ready/{index}")
        await asyncio.Event().wait()


class Hits:
    """A minimal HTTP server noting when each child's request arrived."""

    def __init__(self) -> None:
        self.ready: set[int] = set()
        self.hits: dict[tuple[int, int], float] = {}
        self.handlers: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    def count(self, round_: int) -> int:
        return sum(key[1] == round_ for key in self.hits)

    async def close(self) -> None:
        # Closing the connections ends each handler's read; cancelling them instead
        # makes asyncio's stream callback log a traceback on Python 3.11.
        for writer in self.handlers.values():
            writer.transport.abort()
        await asyncio.gather(*self.handlers, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.handlers[task] = writer
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                now = time.time()
                parts = head.split(b" ", 2)[1].decode().strip("/").split("/")
                if parts[0] == "ready":
                    self.ready.add(int(parts[1]))
                elif parts[0] == "hit":
                    self.hits[(int(parts[1]), int(parts[2]))] = now
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def _children(work: Path, count: int, nats_url: str,
                    http_url: str) -> AsyncIterator[list[ChildProcess]]:
    processes = []
    try:
        for index in range(count):
            argv = [sys.executable, "-m", "bench.fanout_floor", "--child", str(index),
                    "--nats", nats_url, "--http", http_url]
            process = ChildProcess(f"floor-{index}", argv, log_path=work / f"child-{index}.log",
                                   env=clean_env({"PYTHONPATH": str(REPO)}), own_group=True)
            process.start()
            processes.append(process)
        yield processes
    finally:
        for process in processes:
            process.stop(5)


async def measure(work: Path, *, processes: int, rounds: int) -> dict[str, Any]:
    """Per round, from the publish to each child's request; the processes' p50/p99."""
    hits = Hits()
    server = await asyncio.start_server(hits.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    service = NatsService(work)
    service.start()
    try:
        async with _children(work, processes, service.url, f"http://127.0.0.1:{port}"):
            await eventually(lambda: len(hits.ready) == processes, timeout_s=600,
                             interval_s=0.2, what="every floor process ready")
            connection = await nats.connect(service.url)
            delays: list[list[float]] = []
            for round_ in range(rounds):
                sent = time.time()
                await connection.publish(SUBJECT, str(round_).encode())
                await connection.flush()
                await _all_hit(hits, round_, processes)
                delays.append([hits.hits[(i, round_)] - sent for i in range(processes)])
            await connection.close()
    finally:
        server.close()
        await hits.close()
        service.stop()
    return _summary(processes, delays)


async def _all_hit(hits: Hits, round_: int, processes: int) -> None:
    await eventually(lambda: hits.count(round_) == processes, timeout_s=300,
                     interval_s=0.02, what=f"round {round_} reaching every process")


def _summary(processes: int, delays: list[list[float]]) -> dict[str, Any]:
    every = [d for round_ in delays for d in round_]
    return {"processes": processes, "rounds": len(delays),
            "p50_ms": round(percentile(every, 50) * 1000, 1),
            "p99_ms": round(percentile(every, 99) * 1000, 1),
            "last_ms_per_round": [round(max(r) * 1000, 1) for r in delays]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="N processes reacting to one message")
    parser.add_argument("--processes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parser.add_argument("--http", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        asyncio.run(child(args.child, args.nats, args.http))
        return
    with tempfile.TemporaryDirectory(prefix="fanout-floor-") as tmp:
        result = asyncio.run(measure(Path(tmp), processes=args.processes, rounds=args.rounds))
    print(json.dumps({**result, **git_commit(), "machine": machine_summary()}, indent=2))


if __name__ == "__main__":
    main()
