"""Issue 35: ``/readyz`` reports the event bus as the relay's real connection, and the
registry warns at start when its admin token is compose.yaml's published default."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Awaitable
from pathlib import Path

import pytest

from devharness.registry import RegistryHarness
from devharness.waiting import eventually
from registry_service.bootstrap import COMPOSE_DEFAULT_ADMIN_TOKEN, prepare_database
from registry_service.settings import RegistrySettings
from tests.compose_support import environment, interpolate, load_compose


async def event_bus(registry: RegistryHarness) -> str:
    ready = await registry.client.get("/readyz")
    # NATS down does not make the registry unready: the outbox keeps every event.
    assert ready.status_code == 200, ready.text
    return str(ready.json()["checks"]["event_bus"])


async def test_readyz_follows_the_nats_connection(embedded_registry: RegistryHarness) -> None:
    registry = embedded_registry
    await eventually(lambda: registry.ctx.relay.connected or None, what="relay connected")
    assert await event_bus(registry) == "ok"
    registry.nats.stop()
    await eventually(lambda: _is(event_bus(registry), "disconnected"), timeout_s=15,
                     what="event_bus disconnected once NATS stopped")
    registry.nats.start()
    await eventually(lambda: _is(event_bus(registry), "ok"), timeout_s=30,
                     what="event_bus ok once NATS is back")


async def test_readyz_sees_a_frozen_nats(embedded_registry: RegistryHarness) -> None:
    """A frozen server (SIGSTOP: the connection stays open, nothing answers) kept the
    client's connected flag up for a minute; readyz pings and says so at once."""
    registry = embedded_registry
    await eventually(lambda: registry.ctx.relay.connected or None, what="relay connected")
    assert await event_bus(registry) == "ok"
    pid = registry.nats.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        assert registry.ctx.relay.connected  # the client has not noticed
        assert await event_bus(registry) == "unresponsive"
    finally:
        os.kill(pid, signal.SIGCONT)
    await eventually(lambda: _is(event_bus(registry), "ok"), timeout_s=30,
                     what="event_bus ok once NATS answers again")


async def _is(value: Awaitable[str], wanted: str) -> bool:
    return await value == wanted


async def test_compose_default_admin_token_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    default = interpolate(environment(load_compose()["services"]["registry"])
                          ["LORAPLANE_ADMIN_TOKEN"])
    assert default == COMPOSE_DEFAULT_ADMIN_TOKEN
    for secret, warned in ((default, True), ("lp_a-secret-of-our-own-0123456789", False)):
        caplog.clear()
        settings = RegistrySettings(data_dir=tmp_path / secret[:8], admin_token=secret)
        settings.data_dir.mkdir()
        with caplog.at_level(logging.WARNING, logger="registry_service.bootstrap"):
            db = await prepare_database(settings)
            await db.close()
        found = [r.getMessage() for r in caplog.records if "published default" in r.getMessage()]
        assert bool(found) is warned, found
        # The warning never prints the whole secret.
        assert all(default not in message for message in found)
