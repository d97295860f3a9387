"""Serving an app on a loopback socket with a given uvicorn server, and raw
connections to it: the connection-limit tests of the agent and the registry."""

from __future__ import annotations

import asyncio
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
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


def few_descriptors(module: str) -> list[str]:
    """argv running ``python -m module`` with RLIMIT_NOFILE lowered to 256 first."""
    code = ("import resource, runpy, sys; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); "
            f"sys.argv[0] = {module!r}; "
            f"runpy.run_module({module!r}, run_name='__main__')")
    return [sys.executable, "-c", code]


@asynccontextmanager
async def process_logged(argv: list[str], env: dict[str, str],
                         log_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``argv`` running with its output in ``log_path``; SIGTERM and waited for after,
    and its log then holds no descriptor error and no traceback."""
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)
    log = await asyncio.to_thread(log_path.read_text, errors="replace")
    assert "Too many open files" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


async def ready(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


@asynccontextmanager
async def half_requests(url: str, head: bytes, count: int) -> AsyncIterator[list[bytes]]:
    """``count`` connections each sending ``head`` and no more; yields how each was
    answered (``outcome``), and closes them after."""
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(count):
            reader, writer = await connect(url)
            writer.write(head)
            connections.append((reader, writer))
        yield await asyncio.wait_for(
            asyncio.gather(*(outcome(reader) for reader, _ in connections)), 60)
    finally:
        for _reader, writer in connections:
            writer.close()
