"""The registry image on Postgres, NATS and S3 containers, driven from the host."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from devharness.adapters import make_adapter
from devharness.containers import ADMIN_TOKEN, ContainerStack
from devharness.processes import clean_env, loraplane_command
from devharness.uploads import adapter_parts, stream_events
from devharness.waiting import eventually
from tests.containers.conftest import registry_ready

TENANT = "acme"
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def cli(stack: ContainerStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env({"LORAPLANE_REGISTRY": stack.registry_url, "LORAPLANE_TOKEN": ADMIN_TOKEN})
    return subprocess.run([*loraplane_command(), *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


async def published(stack: ContainerStack, adapter: str) -> list[dict[str, Any]]:
    return [e for e in await stream_events(stack.nats_url)
            if e.get("type") == "version_published" and e.get("adapter") == adapter]


async def some_published(stack: ContainerStack,
                             adapter: str) -> list[dict[str, Any]] | None:
    """For ``eventually``: the version_published events of ``adapter``, None while none."""
    return await published(stack, adapter) or None


async def rows(stack: ContainerStack, adapter: str) -> tuple[int, int]:
    """(versions, events) of ``adapter`` in the registry's database."""
    conn = await asyncpg.connect(stack.database_dsn)
    try:
        versions = await conn.fetchval(
            "SELECT count(*) FROM versions v JOIN adapters a ON a.id = v.adapter_id "
            "WHERE a.name = $1", adapter)
        events = await conn.fetchval("SELECT count(*) FROM events WHERE adapter = $1", adapter)
    finally:
        await conn.close()
    return int(versions), int(events)


async def create_adapter(stack: ContainerStack, name: str) -> None:
    result = cli(stack, "adapters", "create", name, "--base-model", "tiny-llama",
                 "--tenant", TENANT)
    assert result.returncode == 0, result.stderr


async def upload(stack: ContainerStack, name: str, folder: Path,
                 timeout_s: float = 120) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.registry_url, headers=HEADERS,
                                 timeout=timeout_s) as client:
        return await client.post(f"/v1/adapters/{name}/versions", files=adapter_parts(folder),
                                 data={"aliases": "live"})


async def test_a_cli_push_reaches_nats_and_downloads_through_the_public_s3_address(
        stack: ContainerStack, tmp_path: Path) -> None:
    await create_adapter(stack, "cli-push")
    folder = make_adapter(tmp_path / "a", seed=1)
    result = cli(stack, "push", "cli-push", str(folder), "--alias", "live")
    assert result.returncode == 0, result.stderr

    events = await eventually(lambda: some_published(stack, "cli-push"), timeout_s=60,
                              what="version_published of cli-push on NATS")
    assert events[0]["target"]["version"] == 1
    # An agent outside the network downloads through the presigned URL, which names the
    # S3 address published to the host (LORAPLANE_S3_PUBLIC_ENDPOINT).
    async with httpx.AsyncClient(base_url=stack.registry_url, headers=HEADERS,
                                 timeout=30) as client:
        redirect = await client.get("/v1/adapters/cli-push/versions/1/files/adapter_config.json")
        assert redirect.status_code == 307, redirect.text
        location = redirect.headers["location"]
        assert location.startswith(stack.s3_url), location
        blob = await client.get(location, headers={"Authorization": ""})
    assert blob.status_code == 200, blob.text
    assert blob.content == (folder / "adapter_config.json").read_bytes()


async def test_upload_while_s3_is_paused_answers_503_then_the_next_works(
        stack: ContainerStack, tmp_path: Path) -> None:
    await create_adapter(stack, "s3-paused")
    folder = make_adapter(tmp_path / "a", seed=2)
    s3 = stack.s3.get_wrapped_container()
    s3.pause()
    try:
        response = await upload(stack, "s3-paused", folder)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "blob_store_unavailable"
        assert await rows(stack, "s3-paused") == (0, 1)  # adapter_created only
    finally:
        s3.unpause()
    assert await published(stack, "s3-paused") == []
    again = await eventually(lambda: _created(upload(stack, "s3-paused", folder)),
                             timeout_s=60, what="an upload after S3 came back")
    assert again.json()["version"] == 1
    await eventually(lambda: some_published(stack, "s3-paused"), timeout_s=60,
                     what="version_published of s3-paused on NATS")


async def _created(response: Any) -> httpx.Response | None:
    answer: httpx.Response = await response
    if answer.status_code == 503:
        return None  # S3 still waking up: not yet
    assert answer.status_code == 201, answer.text
    return answer


async def test_postgres_restart_answers_503_then_recovers_by_itself(
        stack: ContainerStack, tmp_path: Path) -> None:
    postgres = stack.postgres.get_wrapped_container()
    postgres.stop(timeout=20)
    try:
        async def unready() -> bool | None:
            async with httpx.AsyncClient(timeout=10) as client:
                response = await client.get(f"{stack.registry_url}/readyz")
            return response.status_code == 503 or None

        await eventually(unready, timeout_s=60, what="/readyz answers 503 without Postgres")
        async with httpx.AsyncClient(base_url=stack.registry_url, headers=HEADERS,
                                     timeout=60) as client:
            listing = await client.get("/v1/adapters")
        assert listing.status_code == 503, listing.text
    finally:
        postgres.start()
    await eventually(lambda: registry_ready(stack.registry_url), timeout_s=120,
                     what="/readyz answers 200 again after Postgres came back")
    await create_adapter(stack, "after-restart")
    folder = make_adapter(tmp_path / "a", seed=3)
    response = await upload(stack, "after-restart", folder)
    assert response.status_code == 201, response.text
