"""Starting the registry: settings validation, the bootstrap admin token, the embedded
NATS, and the operational endpoints (health, readiness, metrics, OpenAPI).
"""

from __future__ import annotations

import gc
import json
import os
import socket
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext
from pydantic import ValidationError

from devharness.adapters import make_base_config
from devharness.registry import RegistryHarness
from devharness.services import (
    NatsService,
    PostgresDatabase,
    SeaweedS3,
    ServiceStartError,
)
from devharness.waiting import eventually
from loraplane.events import STREAM_NAME, parse_event
from loraplane.netutil import free_port
from registry_service.app import create_app
from registry_service.context import RegistryContext
from registry_service.settings import RegistrySettings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets reaches RegistrySettings, whatever the machine exports.

    Only the settings' own variables go: LORAPLANE_TEST_DATABASE_URL and friends stay.
    """
    settings = {"LORAPLANE_" + name.upper() for name in RegistrySettings.model_fields}
    for name in settings & set(os.environ):
        monkeypatch.delenv(name)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def serving(settings: RegistrySettings) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                                     RegistryContext]]:
    """The app with its lifespan (start-up and shut-down) and a client for it."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://registry") as client:
            yield client, app.state.ctx


async def admin_works(client: httpx.AsyncClient, token: str) -> bool:
    """True when ``token`` is accepted as an admin token; False on 401."""
    response = await client.get("/v1/tokens", headers=bearer(token))
    assert response.status_code in (200, 401), response.text
    if response.status_code == 401:
        assert response.json()["error"]["code"] in ("invalid_token", "unauthorized"), \
            response.text
    return response.status_code == 200


# --- settings -----------------------------------------------------------------------


@pytest.mark.parametrize(("values", "field"), [
    ({"database_url": "mysql://user@db/loraplane"}, "database_url"),
    ({"database_url": "http://db/loraplane"}, "database_url"),
    ({"s3_endpoint": "http://s3.example.com:9000"}, "s3_bucket"),
    ({"s3_public_endpoint": "https://s3.example.com"}, "s3_bucket"),
    ({"s3_bucket": "adapters", "s3_endpoint": "minio:9000"}, "s3_endpoint"),
    ({"s3_bucket": "adapters", "s3_public_endpoint": "s3.example.com"}, "s3_public_endpoint"),
    ({"s3_bucket": "adapters", "s3_access_key": "key"}, "s3_secret_key"),
    ({"s3_bucket": "adapters", "s3_secret_key": "secret"}, "s3_access_key"),
    ({"max_file_bytes": 2048, "max_upload_bytes": 1024}, "max_file_bytes"),
    ({"max_file_bytes": 2048, "max_adapter_bytes": 1024}, "max_adapter_bytes"),
    ({"max_archive_expansion_ratio": 0.5}, "max_archive_expansion_ratio"),
    ({"max_json_body_bytes": 10}, "max_json_body_bytes"),
    ({"max_json_body_bytes": 1 << 30}, "max_json_body_bytes"),
    ({"max_uploads_per_token": 0}, "max_uploads_per_token"),
    ({"port": 70000}, "port"),
    ({"port": -1}, "port"),
    ({"embedded_nats_port": 0}, "embedded_nats_port"),
    ({"log_level": "verbose"}, "log_level"),
    ({"relay_publish_timeout_s": 30, "relay_claim_lease_s": 40}, "relay_claim_lease_s"),
    ({"relay_publish_timeout_s": 0}, "relay_publish_timeout_s"),
    ({"blob_gc_interval_s": 0}, "blob_gc_interval_s"),
    ({"blob_gc_grace_s": -1}, "blob_gc_grace_s"),
    ({"blob_upload_lease_s": 0}, "blob_upload_lease_s"),
    ({"fleet_metrics_max_age_s": -1}, "fleet_metrics_max_age_s"),
    ({"blob_gc_busy_share": 0}, "blob_gc_busy_share"),
    ({"blob_gc_busy_share": 1.5}, "blob_gc_busy_share"),
    ({"fleet_metrics_max_age_s": 301}, "fleet_metrics_max_age_s"),
    ({"canary_interval_s": 5, "canary_lease_s": 6}, "canary_lease_s"),
    ({"canary_interval_s": 0}, "canary_interval_s"),
    ({"prometheus_url": "prometheus:9090"}, "prometheus_url"),
    ({"canary_webhook_hosts": "127.0.0.1"}, "canary_webhook_hosts"),
])
def test_bad_settings_are_refused_naming_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        RegistrySettings(**values)
    errors = refused.value.errors()
    # A field's own error carries its name as the location; a cross-field rule says it.
    assert any(field in error["loc"] or field in error["msg"] for error in errors), errors


def test_bad_settings_from_the_environment_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAPLANE_PORT", "65536")
    with pytest.raises(ValidationError) as refused:
        RegistrySettings()
    assert [error["loc"] for error in refused.value.errors()] == [("port",)]
    monkeypatch.setenv("LORAPLANE_PORT", "8081")
    monkeypatch.setenv("LORAPLANE_S3_ENDPOINT", "http://minio:9000")
    with pytest.raises(ValidationError, match="s3_bucket"):
        RegistrySettings()


def test_good_settings_are_accepted_and_normalized() -> None:
    settings = RegistrySettings(
        database_url="postgres://loraplane@db/loraplane", s3_endpoint="http://minio:9000",
        s3_bucket="adapters", s3_access_key="key", s3_secret_key="s3-secret-value",
        max_file_bytes=1024, max_upload_bytes=1024, port=0, nats_url="nats://nats:4222")
    assert settings.database_url == "postgresql+asyncpg://loraplane@db/loraplane"
    # compose passes an unset public endpoint as empty: it means "the same as s3_endpoint".
    assert settings.s3_public_endpoint is None
    assert RegistrySettings(s3_bucket="b", s3_public_endpoint="").s3_public_endpoint is None
    assert (settings.blob_kind, settings.is_sqlite, settings.uses_embedded_nats) == (
        "s3", False, False)
    assert not settings.should_auto_migrate
    # The secrets stay out of reprs and logs.
    assert "s3-secret-value" not in repr(settings)


# --- the bootstrap admin token ------------------------------------------------------


async def test_embedded_default_creates_the_admin_token_once(
    tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LORAPLANE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LORAPLANE_NATS_URL", nats.url)
    settings = RegistrySettings()
    assert settings.admin_token is None and settings.database_url is None
    token_file = tmp_path / "data" / "admin-token"
    assert not token_file.exists()

    async with serving(settings) as (client, _ctx):
        assert token_file.is_file()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert token.startswith("lp_") and len(token) > 30
        assert await admin_works(client, token)
        assert not await admin_works(client, token + "x")
        anonymous = await client.get("/v1/tokens")
        assert anonymous.status_code == 401, anonymous.text
    first = token_file.stat()

    async with serving(RegistrySettings()) as (client, _ctx):
        assert token_file.read_text().strip() == token
        assert (token_file.stat().st_ino, token_file.stat().st_mtime_ns) == (
            first.st_ino, first.st_mtime_ns)
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert await admin_works(client, token)


async def test_admin_token_from_the_environment_replaces_the_bootstrap_token(
    tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LORAPLANE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LORAPLANE_NATS_URL", nats.url)
    async with serving(RegistrySettings()) as (client, _ctx):
        old = (tmp_path / "data" / "admin-token").read_text().strip()
        assert await admin_works(client, old)
        # A token the admin made is not a bootstrap token: rotation leaves it alone.
        made = await client.post("/v1/tokens", json={"name": "ci", "role": "admin"},
                                 headers=bearer(old))
        assert made.status_code == 201, made.text
        ci_token = made.json()["secret"]

    new = "lp_from-the-environment-0123456789abcdef"
    monkeypatch.setenv("LORAPLANE_ADMIN_TOKEN", new)
    async with serving(RegistrySettings()) as (client, _ctx):
        assert await admin_works(client, new)
        assert not await admin_works(client, old)
        assert await admin_works(client, ci_token)


async def test_admin_token_rotation_on_postgres(
    tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shared database gets no token file; LORAPLANE_ADMIN_TOKEN is the way in."""
    pg = PostgresDatabase()
    try:
        await pg.create()
    except ServiceStartError as exc:
        pytest.fail(f"a required service could not be started:\n{exc}", pytrace=False)
    try:
        monkeypatch.setenv("LORAPLANE_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.setenv("LORAPLANE_NATS_URL", nats.url)
        monkeypatch.setenv("LORAPLANE_DATABASE_URL", pg.url)
        monkeypatch.setenv("LORAPLANE_AUTO_MIGRATE", "true")
        first, second = "lp_first-0123456789abcdef", "lp_second-0123456789abcdef"
        monkeypatch.setenv("LORAPLANE_ADMIN_TOKEN", first)
        async with serving(RegistrySettings()) as (client, _ctx):
            assert await admin_works(client, first)
        assert not (tmp_path / "data" / "admin-token").exists()

        monkeypatch.setenv("LORAPLANE_ADMIN_TOKEN", second)
        async with serving(RegistrySettings()) as (client, _ctx):
            assert await admin_works(client, second)
            assert not await admin_works(client, first)

        monkeypatch.delenv("LORAPLANE_ADMIN_TOKEN")
        async with serving(RegistrySettings()) as (client, _ctx):
            # Without the variable nothing is created or revoked.
            assert await admin_works(client, second)
        assert not (tmp_path / "data" / "admin-token").exists()
    finally:
        await pg.drop()


# --- the embedded NATS --------------------------------------------------------------


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_embedded_default_runs_its_own_nats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setenv("LORAPLANE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LORAPLANE_EMBEDDED_NATS_PORT", str(port))
    settings = RegistrySettings()
    assert settings.nats_url is None and settings.uses_embedded_nats

    async with serving(settings) as (client, ctx):
        assert ctx.embedded_nats is not None
        assert ctx.embedded_nats.url == f"nats://127.0.0.1:{port}"
        assert (tmp_path / "data" / "nats").is_dir()
        await eventually(lambda: ctx.relay.connected, what="relay connected to embedded NATS")
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["checks"]["event_bus"] == "ok"

        admin = bearer((tmp_path / "data" / "admin-token").read_text().strip())
        created = await client.post("/v1/adapters", headers=admin, json={
            "name": "support-bot", "base_model": "tiny-llama", "tenant": "acme"})
        assert created.status_code == 201, created.text
        deleted = await client.delete("/v1/adapters/support-bot", headers=admin)
        assert deleted.status_code == 204, deleted.text

        # The embedded server takes its users only; the registry's may read the stream.
        security = ctx.embedded_nats.security()
        assert security is not None and security.user == "registry"
        reader = NatsClient()
        await reader.connect(ctx.embedded_nats.url, connect_timeout=5,
                             **security.connect_options())
        try:
            js = JetStreamContext(reader)

            async def published() -> bool:
                try:
                    info = await js.stream_info(STREAM_NAME)
                except Exception:  # the relay may not have created the stream yet
                    return False
                return int(info.state.messages) > 0

            await eventually(published, what="an event on the embedded NATS")
            info = await js.stream_info(STREAM_NAME)
            messages = [await js.get_msg(STREAM_NAME, seq)
                        for seq in range(info.state.first_seq, info.state.last_seq + 1)]
        finally:
            await reader.close()
        events = [parse_event(m.data or b"") for m in messages]
        assert [(e.type, e.adapter) for e in events if e.type == "adapter_deleted"] == [
            ("adapter_deleted", "support-bot")]
        assert all(m.subject == "loraplane.events.acme.support-bot" for m in messages)

    # The registry stops the server it started.
    await eventually(lambda: not port_open(port), timeout_s=10, what="embedded NATS stopped")


# --- operational endpoints ----------------------------------------------------------


async def test_health_and_readiness(registry: RegistryHarness) -> None:
    health = await registry.client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    await eventually(lambda: registry.ctx.relay.connected, what="relay connected")
    ready = await registry.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"status": "ready", "checks": {
        "database": "ok", "blob_store": "ok", "event_bus": "ok"}}


async def test_readiness_fails_while_s3_is_down(pg_registry: RegistryHarness,
                                                seaweed: SeaweedS3) -> None:
    client = pg_registry.client
    ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    seaweed.stop()
    try:
        unready = await client.get("/readyz", timeout=60)
        assert unready.status_code == 503, unready.text
        body = unready.json()
        assert body["status"] == "unready"
        assert body["checks"]["blob_store"] == "blob_store_unavailable", body
        assert body["checks"]["database"] == "ok"
        # Liveness is not readiness: the process itself is fine.
        assert (await client.get("/healthz")).status_code == 200
    finally:
        seaweed.start()

    async def ready_again() -> bool:
        return (await client.get("/readyz")).status_code == 200

    await eventually(ready_again, timeout_s=30, what="ready after S3 came back")


async def test_metrics(registry: RegistryHarness) -> None:
    for _ in range(3):
        assert (await registry.client.get("/healthz")).status_code == 200
    response = await registry.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name in ("loraplane_registry_requests_total", "loraplane_registry_request_seconds",
                 "loraplane_registry_outbox_pending", "loraplane_registry_events_published_total",
                 "loraplane_registry_relay_errors_total"):
        assert f"# TYPE {name}" in text, name
    healthz = [line for line in text.splitlines()
               if line.startswith("loraplane_registry_requests_total{")
               and 'route="/healthz"' in line and 'status="200"' in line]
    assert len(healthz) == 1 and float(healthz[0].rsplit(" ", 1)[1]) >= 3, healthz


async def test_openapi_and_docs(registry: RegistryHarness) -> None:
    response = await registry.client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    assert document["info"]["title"] == "loraplane registry"
    for path in ("/healthz", "/readyz", "/metrics", "/v1/adapters", "/v1/tokens"):
        assert path in document["paths"], path
    docs = await registry.client.get("/docs")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower() and "/openapi.json" in docs.text
    json.dumps(document)  # the whole document is plain JSON


def test_base_model_configs_are_read_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_base_config(tmp_path / "tiny.json", hidden=64, intermediate=128)
    monkeypatch.setenv("LORAPLANE_BASE_MODEL_CONFIGS", json.dumps({"tiny-llama": str(config)}))
    shapes = RegistrySettings().base_shapes("tiny-llama")
    assert shapes is not None and shapes.hidden_size == 64
    assert RegistrySettings().base_shapes("other") is None
    missing = str(tmp_path / "nope.json")
    with pytest.raises(ValidationError, match="base_model_configs\\['tiny-llama'\\]"):
        RegistrySettings(base_model_configs={"tiny-llama": missing})


async def test_what_start_up_built_is_frozen_out_of_full_collections(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LORAPLANE_DATA_DIR", str(tmp_path / "data"))
    gc.unfreeze()
    async with serving(RegistrySettings()) as (client, _ctx):
        assert (await client.get("/readyz")).status_code == 200
        assert gc.get_freeze_count() > 0
    # Stopped: its objects can be collected again.
    assert gc.get_freeze_count() == 0
