"""A registry killed with SIGKILL at each step of an upload, then restarted: the upload
ends as a complete version with its blobs, or as no version and no blob at all.

Each step is reached by holding something the upload waits on, never by timing:
the request body (still streaming into staging), a table lock on ``blob_leases``
(staged and validated, about to lease and store its blobs), the adapter's row lock
(blobs leased and stored, about to commit), or nothing (committed). The database locks
need Postgres; SQLite has one lock for everything, so the embedded default is killed
mid-stream and after the commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from devharness.adapters import make_adapter
from devharness.registry import waiting_on_a_lock
from devharness.services import PostgresDatabase, SeaweedS3
from devharness.uploads import ADAPTER_FILES, adapter_parts
from devharness.waiting import eventually
from loraplane.netutil import free_ports
from loraplane.process import ChildProcess
from tests.cli.conftest import CLI, START_TIMEOUT_S, ServedRegistry, clean_env
from tests.conftest import fresh_postgres

ADMIN_TOKEN = "lp_crash-gc-admin-token-0123456789abcdef"
# (backend, step). Steps: streaming, leasing (after staging), stored (after the blob
# store, before the commit), committed.
CASES = [
    ("embedded", "streaming"), ("embedded", "committed"),
    ("pg_local", "leasing"), ("pg_local", "stored"),
    ("pg_s3", "streaming"), ("pg_s3", "leasing"), ("pg_s3", "stored"), ("pg_s3", "committed"),
]


@dataclass
class Setup:
    root: Path
    env: dict[str, str]
    s3: SeaweedS3 | None = None
    bucket: str | None = None
    pg: PostgresDatabase | None = None
    runs: list[ServedRegistry] = field(default_factory=list)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def start(self, **env: str) -> ServedRegistry:
        port, nats_port = free_ports(2)
        attempt = len(self.runs) + 1
        process = ChildProcess(
            "loraplane registry serve",
            [*CLI, "registry", "serve", "--port", str(port), "--data-dir", str(self.data_dir)],
            log_path=self.root / f"serve-{attempt}.log",
            env=clean_env(LORAPLANE_EMBEDDED_NATS_PORT=str(nats_port), **self.env, **env))
        process.start()
        served = ServedRegistry(f"http://127.0.0.1:{port}", self.data_dir, process.log_path,
                                process)
        self.runs.append(served)

        def probe() -> str | None:
            try:
                status = httpx.get(served.url + "/readyz", timeout=2).status_code
            except httpx.TransportError as exc:
                return f"{type(exc).__name__}: {exc}"
            return None if status == 200 else f"/readyz answered {status}"

        process.wait_ready(probe, START_TIMEOUT_S, interval_s=0.2)
        return served

    def blobs(self) -> set[str]:
        if self.s3 is None:
            root = self.data_dir / "blobs"
            return {p.name for p in root.rglob("*") if p.is_file() and
                    not p.name.startswith(".")} if root.exists() else set()
        client = self.s3.client()
        listing = client.list_objects_v2(Bucket=self.bucket or "")
        return {obj["Key"].rsplit("/", 1)[-1] for obj in listing.get("Contents", [])}

    def incomplete(self) -> list[str]:
        """Uploads never finished: open multipart uploads, or the local store's .tmp."""
        if self.s3 is None:
            root = self.data_dir / "blobs"
            return sorted(p.name for p in root.rglob(".*.tmp")) if root.exists() else []
        listing = self.s3.client().list_multipart_uploads(Bucket=self.bucket or "")
        return sorted(u["Key"] for u in listing.get("Uploads", []))


@pytest.fixture
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    backend = request.param
    with contextlib.ExitStack() as stack:
        built = Setup(tmp_path, {"LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN})
        if backend != "embedded":
            built.pg = stack.enter_context(fresh_postgres())
            built.env.update(LORAPLANE_DATABASE_URL=built.pg.url,
                             LORAPLANE_AUTO_MIGRATE="true")
        if backend == "pg_s3":
            s3: SeaweedS3 = request.getfixturevalue("seaweed")
            built.s3, built.bucket = s3, f"crash-{uuid.uuid4().hex[:12]}"
            built.env.update(
                LORAPLANE_S3_ENDPOINT=s3.endpoint_url, LORAPLANE_S3_BUCKET=built.bucket,
                LORAPLANE_S3_ACCESS_KEY=s3.access_key, LORAPLANE_S3_SECRET_KEY=s3.secret_key,
                LORAPLANE_S3_CREATE_BUCKET="true")
        try:
            yield built
        finally:
            for run in built.runs:
                run.process.stop(grace_s=10, sig=signal.SIGKILL)


def token(_served: ServedRegistry) -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


class Upload(threading.Thread):
    """An upload sent from a thread, its body held before its last bytes until told."""

    def __init__(self, served: ServedRegistry, folder: Path) -> None:
        super().__init__(daemon=True)
        request = httpx.Request("POST", "http://x/", files=adapter_parts(folder))
        self.body, self.content_type = request.read(), request.headers["content-type"]
        self.served, self.sent, self.release = served, threading.Event(), threading.Event()
        self.response: httpx.Response | None = None

    def chunks(self) -> Iterator[bytes]:
        yield self.body[:-64]
        self.sent.set()
        self.release.wait(120)
        yield self.body[-64:]

    def run(self) -> None:
        headers = {**token(self.served), "Content-Type": self.content_type}
        with contextlib.suppress(httpx.HTTPError):  # the registry may be killed under it
            self.response = httpx.post(f"{self.served.url}/v1/adapters/bot/versions",
                                       content=self.chunks(), headers=headers, timeout=120)


async def kill_while_locked(setup: Setup, served: ServedRegistry, upload: Upload,
                            lock_sql: str, waiting_query: str) -> None:
    assert setup.pg is not None
    engine = create_async_engine(setup.pg.async_url)
    try:
        async with engine.connect() as conn, conn.begin():
            await conn.execute(text(lock_sql))
            upload.release.set()
            await eventually(lambda: waiting_on_a_lock(conn, waiting_query),
                             what="the upload held at the lock")
            served.process.stop(grace_s=10, sig=signal.SIGKILL)
    finally:
        await engine.dispose()


async def reach_step_and_kill(setup: Setup, served: ServedRegistry, step: str,
                              folder: Path) -> None:
    upload = Upload(served, folder)
    upload.start()
    await eventually(upload.sent.is_set, what="the body sent up to its last bytes")
    staging = served.data_dir / "staging"
    await eventually(lambda: any(p.is_dir() and any(p.iterdir()) for p in staging.iterdir()),
                     what="the upload in staging")
    if step == "streaming":
        served.process.stop(grace_s=10, sig=signal.SIGKILL)
    elif step == "leasing":
        await kill_while_locked(setup, served, upload,
                                "LOCK TABLE blob_leases IN EXCLUSIVE MODE",
                                "INSERT INTO blob_leases%")
        assert setup.blobs() == set()  # killed before any blob was stored
    elif step == "stored":
        await kill_while_locked(setup, served, upload,
                                "SELECT id FROM adapters WHERE name = 'bot' FOR UPDATE",
                                "%FROM adapters%FOR UPDATE%")
        assert setup.blobs() == digests(folder)  # killed after the blobs were stored
    else:
        upload.release.set()
        await asyncio.to_thread(upload.join, 120)
        assert upload.response is not None and upload.response.status_code == 201
        served.process.stop(grace_s=10, sig=signal.SIGKILL)
    upload.release.set()
    await asyncio.to_thread(upload.join, 120)


def digests(folder: Path) -> set[str]:
    return {hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in ADAPTER_FILES}


async def versions(served: ServedRegistry) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(headers=token(served), timeout=30) as client:
        response = await client.get(f"{served.url}/v1/adapters/bot/versions")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["versions"]
    return found


@pytest.mark.parametrize(("setup", "step"), CASES, indirect=["setup"],
                         ids=[f"{b}-{s}" for b, s in CASES])
async def test_a_registry_killed_at_each_step_of_an_upload_leaves_all_or_nothing(
    setup: Setup, step: str, tmp_path: Path,
) -> None:
    # The first run's lease is short, so a killed upload's lease has run out by the time
    # the second run collects; the committed case keeps the default.
    lease = {} if step == "committed" else {"LORAPLANE_BLOB_UPLOAD_LEASE_S": "1"}
    first = setup.start(**lease)
    async with httpx.AsyncClient(headers=token(first), timeout=30) as client:
        created = await client.post(f"{first.url}/v1/adapters", json={
            "name": "bot", "base_model": "tiny-llama", "tenant": "acme"})
    assert created.status_code == 201, created.text
    # Over two 5 MiB parts: killed mid-stream, S3 holds an open multipart upload.
    folder = make_adapter(tmp_path / "adapter", seed=7, hidden=1024, intermediate=2048,
                          rank=64, layers=12)
    await reach_step_and_kill(setup, first, step, folder)

    second = setup.start(LORAPLANE_BLOB_GC_GRACE_S="0", LORAPLANE_BLOB_GC_INTERVAL_S="0.5",
                         **lease)
    found = await versions(second)
    if step == "committed":
        [version] = found
        assert {f["sha256"] for f in version["files"]} == digests(folder)
        async with httpx.AsyncClient(headers=token(second), timeout=30,
                                     follow_redirects=True) as client:
            for entry in version["files"]:
                got = await client.get(
                    f"{second.url}/v1/adapters/bot/versions/1/files/{entry['name']}")
                assert got.status_code == 200, got.text
                assert hashlib.sha256(got.content).hexdigest() == entry["sha256"]
        expected = digests(folder)
    else:
        assert found == []
        expected = set()
    await eventually(lambda: setup.blobs() == expected or None,
                     what=f"the blobs to be exactly {sorted(expected)}")
    # What the killed upload had begun (a .tmp file, an open multipart upload) is swept.
    await eventually(lambda: setup.incomplete() == [] or None,
                     what="no upload left unfinished in the blob store")
    assert list((setup.data_dir / "staging").iterdir()) == []
