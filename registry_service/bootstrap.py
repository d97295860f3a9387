"""Start-up steps: data folder, embedded NATS, migrations, bootstrap admin token."""

from __future__ import annotations

import logging
from pathlib import Path

from loraplane.embedded_nats import (
    EmbeddedAuth,
    EmbeddedNats,
    EmbeddedNatsError,
    PortInUse,
    data_dir_port,
)
from loraplane.private_files import private_dir, read_or_create_secret
from registry_service.auth.models import ApiToken
from registry_service.auth.service import ensure_bootstrap_admin, new_secret
from registry_service.blobs.base import BlobStore
from registry_service.blobs.factory import build_blob_store
from registry_service.db import migrate
from registry_service.db.engine import Database
from registry_service.settings import RegistrySettings
from registry_service.sweep import sweep_blob_tmp, sweep_staging

log = logging.getLogger(__name__)


def prepare_data_dir(settings: RegistrySettings) -> None:
    # Token hashes, the audit log, blobs, uploads: for the registry's user only.
    private_dir(settings.data_dir)
    private_dir(settings.staging_dir)
    # Nothing is uploading yet: whatever staging holds, a killed run left behind.
    sweep_staging(settings.staging_dir)
    if settings.blob_kind == "local":
        sweep_blob_tmp(settings.blob_dir)


def read_or_create_token_file(path: Path) -> str:
    """The embedded default's admin token: created once, mode 0600, reused after."""
    secret, made = read_or_create_secret(path, new_secret)
    if made:
        log.info("created the admin token in %s", path)
    return secret


def bootstrap_secret(settings: RegistrySettings) -> str | None:
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value()
    if settings.database_url is None:
        return read_or_create_token_file(settings.admin_token_file)
    return None


# compose.yaml's fallback for LORAPLANE_ADMIN_TOKEN: published in this repository, so
# anyone who reaches a registry started with it is its admin.
COMPOSE_DEFAULT_ADMIN_TOKEN = "lp_local-only-admin-token-change-me"


def warn_if_published_admin_token(settings: RegistrySettings) -> bool:
    """Log a warning when the admin token is compose.yaml's published default."""
    if settings.admin_token is None or \
            settings.admin_token.get_secret_value() != COMPOSE_DEFAULT_ADMIN_TOKEN:
        return False
    log.warning("LORAPLANE_ADMIN_TOKEN is compose.yaml's published default (%s...): anyone "
                "who reaches this registry is its admin. Fine for a laptop demo; anywhere "
                "else set LORAPLANE_ADMIN_TOKEN to a secret of your own and restart",
                COMPOSE_DEFAULT_ADMIN_TOKEN[:9])
    return True


def _warn_if_revoked(settings: RegistrySettings, token: ApiToken) -> None:
    if token.revoked_at is None:
        return
    source = ("LORAPLANE_ADMIN_TOKEN" if settings.admin_token is not None
              else str(settings.admin_token_file))
    log.warning("the bootstrap admin token from %s (prefix %s) was revoked at %s; it stays "
                "revoked. To get a bootstrap admin token again, set a new secret (or "
                "delete the token file of the embedded default) and restart",
                source, token.prefix, token.revoked_at.isoformat())


async def prepare_database(settings: RegistrySettings) -> Database:
    db = Database(settings.effective_database_url)
    try:
        if settings.should_auto_migrate:
            await migrate.upgrade(db)
        else:
            await migrate.ensure_at_head(db)
        secret = bootstrap_secret(settings)
        warn_if_published_admin_token(settings)
        if secret is not None:
            async with db.session() as session:
                token = await ensure_bootstrap_admin(session, secret)
                await session.commit()
            _warn_if_revoked(settings, token)
    except BaseException:
        await db.close()
        raise
    return db


def build_blobs(settings: RegistrySettings) -> BlobStore:
    if settings.blob_kind == "local":
        return build_blob_store("local", root=settings.blob_dir)
    assert settings.s3_bucket is not None
    access, secret = settings.s3_access_key, settings.s3_secret_key
    return build_blob_store(
        "s3", bucket=settings.s3_bucket, endpoint_url=settings.s3_endpoint,
        presign_endpoint_url=settings.s3_public_endpoint,
        region=settings.s3_region, path_style=settings.s3_path_style,
        stream_part_mb=settings.s3_stream_part_mb,
        stream_parts_in_flight=settings.s3_stream_parts_in_flight,
        create_bucket=settings.s3_create_bucket,
        payload_signing=settings.s3_payload_signing,
        access_key=access.get_secret_value() if access else None,
        secret_key=secret.get_secret_value() if secret else None,
    )


def embedded_nats_port(settings: RegistrySettings) -> int:
    """The embedded NATS port of this data folder: forced, recorded, or chosen and recorded."""
    return data_dir_port(settings.embedded_nats_dir, settings.embedded_nats_port)


async def start_embedded_nats(settings: RegistrySettings) -> EmbeddedNats | None:
    """The embedded nats-server of this data folder, started and proven to be the one
    answering on its port; start-up fails with the reason otherwise."""
    if not settings.uses_embedded_nats:
        return None
    store = settings.embedded_nats_dir
    port = embedded_nats_port(settings)
    nats = EmbeddedNats(store, port=port, auth=EmbeddedAuth.load_or_create(store))
    try:
        await nats.start_async()
    except PortInUse as exc:
        how = (f"LORAPLANE_EMBEDDED_NATS_PORT={port} is forced"
               if settings.embedded_nats_port is not None
               else f"port {port} is recorded in {store / 'port'} (delete that file to have "
                    "a free port chosen)")
        raise EmbeddedNatsError(f"{exc}; {how}. Another registry on this host? Each data "
                                "folder needs its own port (LORAPLANE_EMBEDDED_NATS_PORT)") \
            from None
    log.info("embedded NATS at %s", nats.describe())
    return nats
