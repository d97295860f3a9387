"""A registry killed with SIGKILL mid-upload leaves nothing behind once restarted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from devharness.waiting import eventually
from loraplane.netutil import free_ports
from loraplane.process import ChildProcess
from tests.cli.conftest import CLI, ServedRegistry, _wait_ready, clean_env

BOUNDARY = "crash-test-boundary"


def start(root: Path, data_dir: Path, attempt: int) -> ServedRegistry:
    port, nats_port = free_ports(2)
    process = ChildProcess(
        "loraplane registry serve",
        [*CLI, "registry", "serve", "--port", str(port), "--data-dir", str(data_dir)],
        log_path=root / f"serve-{attempt}.log",
        env=clean_env(LORAPLANE_EMBEDDED_NATS_PORT=str(nats_port)))
    process.start()
    served = ServedRegistry(f"http://127.0.0.1:{port}", data_dir, process.log_path, process)
    failure = _wait_ready(served)
    assert failure is None, f"{failure}:\n{served.log()}"
    return served


def stalled_upload(url: str, token: str, hold: threading.Event) -> None:
    def body() -> Iterator[bytes]:
        yield (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"files\"; "
               f"filename=\"adapter_model.safetensors\"\r\n"
               f"Content-Type: application/octet-stream\r\n\r\n").encode()
        yield b"\0" * (5 * 1024 * 1024)
        hold.wait(60)

    headers = {"Authorization": f"Bearer {token}",
               "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    # The registry is killed under it.
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{url}/v1/adapters/bot/versions", content=body(), headers=headers,
                   timeout=60)


def test_a_registry_killed_mid_upload_is_swept_at_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = start(tmp_path, data_dir, 1)
    token = (data_dir / "admin-token").read_text().strip()
    created = httpx.post(f"{first.url}/v1/adapters", json={
        "name": "bot", "base_model": "tiny-llama", "tenant": "acme"},
        headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert created.status_code == 201, created.text
    staging, blobs = data_dir / "staging", data_dir / "blobs"
    hold = threading.Event()
    upload = threading.Thread(target=stalled_upload, args=(first.url, token, hold))
    upload.start()
    try:
        # The weights stream to a .tmp file of the blob store, beside the upload's folder
        # in staging.
        asyncio.run(eventually(
            lambda: any(staging.iterdir()) and any(blobs.glob(".upload.*.tmp")),
            timeout_s=30, what="the upload to reach staging and the blob store"))
        first.process.stop(grace_s=30, sig=signal.SIGKILL)
    finally:
        hold.set()
        upload.join(60)
    assert any(staging.iterdir())
    [killed] = blobs.glob(".upload.*.tmp")
    # A blob write cut short long ago, and one that may still be in flight.
    shard = data_dir / "blobs" / "sha256" / "ab" / "ab"  # where a blob is put
    shard.mkdir(parents=True, exist_ok=True)
    stale, fresh = shard / f".{'ab' * 32}.dead.tmp", shard / f".{'ab' * 32}.live.tmp"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))

    second = start(tmp_path, data_dir, 2)
    try:
        assert list(staging.iterdir()) == []
        assert not stale.exists()
        assert fresh.exists()  # inside the grace period: maybe a live writer's
        assert killed.exists()  # the same; the blob collector takes it once it is old
    finally:
        second.process.stop(grace_s=30, sig=signal.SIGINT)
