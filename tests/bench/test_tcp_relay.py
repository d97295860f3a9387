"""The byte relay of ``bench/tcp_relay.py``, run as its own process, in front of an
upstream in this test's event loop: bytes arrive unchanged both ways, more than its
write buffer holds included, and a close on either side reaches the other."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.common import REPO
from devharness.waiting import eventually
from loraplane.netutil import free_port
from loraplane.process import ChildProcess

BIG = 8 * 1024 * 1024  # 32 times the relay's write buffer limit


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # Reads everything first, then answers: the relay must hold a whole 8 MiB in flight.
    data = await reader.readexactly(int((await reader.readline()).decode()))
    if data == b"close":
        writer.close()
        return
    writer.write(data[::-1])
    await writer.drain()
    writer.close()


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[int]:
    upstream = await asyncio.start_server(_echo, "127.0.0.1", 0)
    upstream_port = upstream.sockets[0].getsockname()[1]
    port = free_port()
    process = ChildProcess("relay", [sys.executable, "-m", "bench.tcp_relay", "--port",
                                     str(port), "--upstream", f"127.0.0.1:{upstream_port}"],
                           log_path=tmp_path / "relay.log", cwd=REPO)
    process.start()
    try:
        await eventually(lambda: "relaying" in process.log_text(), timeout_s=30.0,
                         what="the relay listening")
        yield port
    finally:
        process.stop()
        upstream.close()
        await upstream.wait_closed()


async def test_the_relay_carries_more_than_its_buffer_both_ways(relay: int) -> None:
    payload = os.urandom(BIG)
    reader, writer = await asyncio.open_connection("127.0.0.1", relay)
    writer.write(f"{len(payload)}\n".encode() + payload)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=60.0)  # to EOF: the close came
    writer.close()
    assert answer == payload[::-1]


async def test_an_upstream_close_reaches_the_client(relay: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", relay)
    writer.write(b"5\nclose")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), timeout=30.0) == b""
    writer.close()
