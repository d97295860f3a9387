"""An idle kept-alive connection to the registry is closed by the client first: a
server that closes it first races the client's next request on it ("Server
disconnected"), which httpx does not retry."""

from __future__ import annotations

from typing import Any

import httpx

from loraplane.client._core import KEEPALIVE_EXPIRY_S
from loraplane.client.aio import AsyncRegistryClient
from loraplane.client.sync import RegistryClient
from registry_service.server import KEEP_ALIVE_S


def _expiry(pool: Any) -> float:
    value = pool._keepalive_expiry
    assert isinstance(value, float)
    return value


def test_the_client_drops_idle_connections_before_the_registry_does() -> None:
    assert KEEPALIVE_EXPIRY_S < KEEP_ALIVE_S - 10  # a margin for a slow event loop


def test_both_clients_use_that_expiry() -> None:
    with RegistryClient("http://registry.invalid", token="t") as client:
        assert isinstance(client.http, httpx.Client)
        assert _expiry(client.http._transport._pool) == KEEPALIVE_EXPIRY_S  # type: ignore[attr-defined]


async def test_the_async_client_uses_that_expiry() -> None:
    async with AsyncRegistryClient("http://registry.invalid", token="t") as client:
        assert isinstance(client.http, httpx.AsyncClient)
        assert _expiry(client.http._transport._pool) == KEEPALIVE_EXPIRY_S  # type: ignore[attr-defined]
