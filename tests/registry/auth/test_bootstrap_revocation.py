"""Revoking the bootstrap admin token is permanent: a restart does not undo it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from devharness.services import NatsService
from registry_service.app import create_app
from registry_service.settings import RegistrySettings


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def serving(settings: RegistrySettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://registry") as client:
            yield client


async def bootstrap_tokens(client: httpx.AsyncClient, admin: str) -> list[dict[str, object]]:
    response = await client.get("/v1/tokens", params={"include_revoked": "true"},
                                headers=bearer(admin))
    assert response.status_code == 200, response.text
    return [t for t in response.json()["tokens"] if t["name"] == "bootstrap-admin"]


@pytest.mark.parametrize("from_env", [False, True], ids=["token-file", "environment"])
async def test_a_revoked_bootstrap_token_stays_revoked_after_a_restart(
    tmp_path: Path, nats: NatsService, caplog: pytest.LogCaptureFixture, from_env: bool,
) -> None:
    secret = "lp_bootstrap-from-env-0123456789abcdef" if from_env else None
    settings = RegistrySettings(data_dir=tmp_path / "data", nats_url=nats.url,
                                admin_token=secret)
    async with serving(settings) as client:
        bootstrap = secret or (tmp_path / "data" / "admin-token").read_text().strip()
        made = await client.post("/v1/tokens", json={"name": "ops", "role": "admin"},
                                 headers=bearer(bootstrap))
        assert made.status_code == 201, made.text
        ops = made.json()["secret"]
        [row] = await bootstrap_tokens(client, ops)
        revoked = await client.delete(f"/v1/tokens/{row['id']}", headers=bearer(ops))
        assert revoked.status_code == 204, revoked.text
        assert (await client.get("/v1/tokens", headers=bearer(bootstrap))).status_code == 401

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="registry_service"):
        async with serving(settings) as client:
            response = await client.get("/v1/tokens", headers=bearer(bootstrap))
            assert response.status_code == 401, response.text
            # Nothing new was made for the same secret either: still the one revoked row.
            rows = await bootstrap_tokens(client, ops)
            assert [(r["id"], r["revoked_at"] is not None) for r in rows] == [(row["id"], True)]
    assert any("revoked" in r.getMessage() and "bootstrap" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
