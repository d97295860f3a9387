"""Fixtures for the outbox relay: relays wired like the app's, and a JetStream reader.

The databases they run on come from ``tests/registry/conftest.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext

from registry_service.db.engine import Database
from registry_service.events.relay import EventRelay
from registry_service.metrics import RegistryMetrics
from registry_service.settings import RegistrySettings

RelayFactory = Callable[..., Awaitable[EventRelay]]


@pytest.fixture
async def relays(tmp_path: Path) -> AsyncIterator[RelayFactory]:
    """Starts relays wired like the app does; every one is stopped at the end."""
    async with AsyncExitStack() as stack:

        async def start(db: Database, url: str, *, metrics: RegistryMetrics | None = None,
                        **settings: Any) -> EventRelay:
            config = RegistrySettings(data_dir=tmp_path / "data", **settings)
            relay = EventRelay(db, url, settings=config, metrics=metrics or RegistryMetrics())
            # Fast retries keep outage tests short; the policy itself is unchanged.
            relay.backoff_cap_s = 0.5
            db.on_outbox_commit(relay.notify)
            await relay.start()
            stack.push_async_callback(relay.stop)
            return relay

        yield start


@pytest.fixture
async def js(nats: Any) -> AsyncIterator[JetStreamContext]:
    client = NatsClient()

    async def quiet(_exc: Exception) -> None:
        # This reader lives through the outage tests; its reconnect errors are expected.
        return None

    await client.connect(nats.url, max_reconnect_attempts=-1, reconnect_time_wait=1,
                         error_cb=quiet)
    try:
        yield JetStreamContext(client)
    finally:
        await client.close()


