"""Outages of the containers themselves: NATS stopped during a push, the registry killed
in the middle of an upload."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from nats.errors import Error as NatsError

from devharness.adapters import make_adapter
from devharness.containers import ContainerStack
from devharness.uploads import ADAPTER_FILES
from devharness.waiting import eventually
from tests.containers.conftest import registry_ready
from tests.containers.test_registry_stack import (
    HEADERS,
    create_adapter,
    published,
    rows,
    some_published,
    upload,
)

STAGING = "/var/lib/loraplane/staging"


async def test_push_while_nats_is_stopped_is_published_once_nats_is_back(
        stack: ContainerStack, tmp_path: Path) -> None:
    await create_adapter(stack, "nats-stopped")
    nats = stack.nats.get_wrapped_container()
    nats.stop(timeout=10)
    try:
        response = await upload(stack, "nats-stopped", make_adapter(tmp_path / "a", seed=4))
        assert response.status_code == 201, response.text
        assert await rows(stack, "nats-stopped") == (1, 3)  # created, published, alias moved
    finally:
        nats.start()
    # Right after its start NATS may still refuse connections or JetStream requests.
    events = await eventually(lambda: some_published(stack, "nats-stopped"), timeout_s=90,
                              retrying=(NatsError, OSError),
                              what="version_published of nats-stopped after NATS restarted")
    assert [e["target"]["version"] for e in events] == [1]


def staged(stack: ContainerStack) -> list[str]:
    """What the registry container holds in its staging folder right now."""
    assert stack.registry is not None
    result = stack.registry.exec(["find", STAGING, "-mindepth", "1"])
    assert result.exit_code == 0, result.output
    return result.output.decode().split()


async def stalled_body(folder: Path, boundary: str, sent: asyncio.Event,
                       never: asyncio.Event) -> AsyncIterator[bytes]:
    """A multipart upload of ``folder`` that sends all but its last bytes, then waits."""
    body = b""
    for name in ADAPTER_FILES:
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; "
                 f"filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                 ).encode() + (folder / name).read_bytes() + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    yield body[:-64]
    sent.set()
    await never.wait()  # the registry dies before the rest would come
    yield body[-64:]


async def test_registry_killed_mid_upload_leaves_nothing_half_written(
        stack: ContainerStack, tmp_path: Path) -> None:
    await create_adapter(stack, "killed-mid-upload")
    folder = make_adapter(tmp_path / "a", seed=5, hidden=512, layers=4)
    boundary = secrets.token_hex(16)
    sent, never = asyncio.Event(), asyncio.Event()
    async with httpx.AsyncClient(base_url=stack.registry_url, timeout=60) as client:
        request = asyncio.create_task(client.post(
            "/v1/adapters/killed-mid-upload/versions",
            content=stalled_body(folder, boundary, sent, never),
            headers={**HEADERS, "Content-Type": f"multipart/form-data; boundary={boundary}"}))
        await eventually(sent.is_set, timeout_s=60, what="the upload's bytes sent")
        await eventually(lambda: staged(stack), timeout_s=60,
                         what="the upload reaching the registry's staging folder")
        registry = stack.registry
        assert registry is not None
        registry.get_wrapped_container().kill()
        # The client is still waiting on its own body; nothing more will come of it.
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await request
    registry.get_wrapped_container().start()
    await eventually(lambda: registry_ready(stack.registry_url), timeout_s=120,
                     what="the registry container ready again after the kill")
    assert staged(stack) == []
    assert await rows(stack, "killed-mid-upload") == (0, 1)  # adapter_created only
    assert await published(stack, "killed-mid-upload") == []
    again = await upload(stack, "killed-mid-upload", folder)
    assert again.status_code == 201, again.text
