"""The registry as users deploy it, in containers (see devharness/containers.py).

The images are built first when missing or changed (``devharness.images``; needs a
Docker engine: ``scripts/docker.sh``). One stack serves the whole package; a test that
takes a service down brings it back before it ends.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import asyncpg
import httpx
import nats
import pytest

from devharness import images
from devharness.containers import ContainerStack, container_stack, s3_ready
from devharness.waiting import eventually


@pytest.fixture(scope="session")
def local_images() -> None:
    """Builds (when missing or changed) the local images not replaced by a public one
    through LORAPLANE_IMAGE_<KEY> (see ``devharness.containers.image``)."""
    wanted = [key for key in ("postgres", "nats", "seaweedfs", "loraplane")
              if not os.environ.get(f"LORAPLANE_IMAGE_{key.upper()}")]
    try:
        if wanted:
            images.ensure_images(wanted)
    except images.ImageBuildError as exc:
        pytest.fail(f"{exc}\nStart a Docker engine with scripts/docker.sh.", pytrace=False)


async def postgres_answers(dsn: str) -> bool | None:
    try:
        conn = await asyncpg.connect(dsn, timeout=3)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return None
    await conn.close()
    return True


async def nats_answers(url: str) -> bool | None:
    try:
        client = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0,
                                    allow_reconnect=False)
    except Exception:  # any failure to connect is "not yet"
        return None
    try:
        await client.jetstream().account_info()
    except Exception:
        return None
    finally:
        await client.close()
    return True


async def registry_ready(url: str) -> bool | None:
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(f"{url}/readyz")
    except httpx.TransportError:
        return None
    return response.status_code == 200 or None


async def start_stack(stack: ContainerStack) -> None:
    await eventually(lambda: postgres_answers(stack.database_dsn), timeout_s=120,
                     what="Postgres in its container answers")
    await eventually(lambda: nats_answers(stack.nats_url), timeout_s=60,
                     what="NATS JetStream in its container answers")
    await eventually(lambda: s3_ready(stack) is None, timeout_s=120,
                     what=f"S3 in its container creates the bucket (last: {s3_ready(stack)})")
    code, output = stack.run_once("registry", "migrate")
    assert code == 0, f"registry migrate exited {code}:\n{output}"
    stack.start_registry()
    await eventually(lambda: registry_ready(stack.registry_url), timeout_s=120,
                     what="the registry container answers /readyz with 200")


@pytest.fixture(scope="package")
def _stack(local_images: None) -> Iterator[ContainerStack]:
    with container_stack() as stack:
        yield stack


@pytest.fixture(scope="package")
async def stack(_stack: ContainerStack) -> AsyncIterator[ContainerStack]:
    await start_stack(_stack)
    yield _stack
