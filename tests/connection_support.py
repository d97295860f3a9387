"""Serving an app on a loopback socket with a given uvicorn server, and raw
connections to it: the connection-limit tests of the agent and the registry."""

from __future__ import annotations

import asyncio
import resource
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn

from devharness.waiting import eventually


def loopback_socket() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


@asynccontextmanager
async def serving_on(server: uvicorn.Server, sock: socket.socket) -> AsyncIterator[str]:
    """``server`` serving on ``sock`` (closed after); yields its base URL."""
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started or task.done(), timeout_s=30,
                         what="uvicorn start", interval_s=0.02)
        assert not task.done()
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def ensure_descriptors(count: int) -> None:
    """Let this process open ``count`` files (raising its soft limit); a machine whose
    hard limit is lower fails the test rather than skipping it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= count:
        return
    assert hard == resource.RLIM_INFINITY or hard >= count, \
        f"this machine lets a process open only {hard} files; the test needs {count}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, hard))


async def outcome(reader: asyncio.StreamReader) -> bytes:
    """The status a connection was answered, or ``reset`` / ``closed``."""
    try:
        answer = await reader.read()
    except ConnectionResetError:
        return b"reset"
    return answer.split(b" ", 2)[1] if answer else b"closed"
