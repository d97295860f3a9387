"""The registry's one settings class. Bad configuration is refused at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from loraplane.event_signing import InvalidKey, decode_private, decode_public
from loraplane.http_guard import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from loraplane.loop_lag import (
    DEFAULT_INTERVAL_S,
    DEFAULT_SWITCH_INTERVAL_S,
    DEFAULT_WARN_AFTER_S,
    check_loop_lag,
)
from loraplane.lora.base_model import BaseModelShapes, UnsupportedBaseModel
from loraplane.metric_labels import DEFAULT_MAX_ADAPTER_LABELS
from loraplane.nats_auth import NatsSettings

DEFAULT_DATA_DIR = Path.home() / ".loraplane"
ADMIN_TOKEN_FILE = "admin-token"
SIGNING_KEY_FILE = "event-signing-key"
WEBHOOK_SECRET_FILE = "canary-webhook-secret"
DEFAULT_MAX_FILE_BYTES = 2 * 1024**3


def normalize_database_url(url: str) -> str:
    """Accept plain driver URLs and pick the async driver the registry runs on."""
    for plain, async_ in (
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgres://", "postgresql+asyncpg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if url.startswith(plain):
            return async_ + url[len(plain) :]
    if url.startswith(("postgresql+asyncpg://", "sqlite+aiosqlite://")):
        return url
    raise ValueError("database_url must be a postgresql:// or sqlite:// URL")


class RegistrySettings(BaseSettings, NatsSettings):
    """Every ``LORAPLANE_*`` setting; the ``nats_*`` ones come from ``NatsSettings``."""

    # Inputs stay out of error texts: they may hold secrets (S3 keys, NATS password).
    model_config = SettingsConfigDict(env_prefix="LORAPLANE_", extra="ignore",
                                      hide_input_in_errors=True)

    data_dir: Path = DEFAULT_DATA_DIR
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)

    database_url: str | None = None
    auto_migrate: bool | None = None

    s3_endpoint: str | None = None
    # Where clients outside the registry's network reach the same S3 (presigned URLs
    # name it); the default is s3_endpoint.
    s3_public_endpoint: str | None = None
    s3_bucket: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key: SecretStr | None = None
    s3_secret_key: SecretStr | None = None
    s3_path_style: bool = True
    s3_create_bucket: bool = False
    # An upload streams on to S3 in parts of this size, this many on their way at once:
    # the registry holds (in flight + 1) parts of memory per upload. S3's minimum is 5 MiB.
    s3_stream_part_mb: int = Field(default=5, ge=5, le=1024)
    s3_stream_parts_in_flight: int = Field(default=2, ge=1, le=32)
    # SigV4 payload signing of uploads (a second sha256 of every byte): "auto" signs over
    # plain http:// only (blobs/s3.py: signs_payload); "on" and "off" decide outright.
    s3_payload_signing: Literal["auto", "on", "off"] = "auto"

    # The embedded nats-server's port (LORAPLANE_EMBEDDED_NATS_PORT); unset: a free port
    # chosen at the data folder's first start and recorded in <data_dir>/nats/port.
    # A forced port that is taken fails the start.
    embedded_nats_port: int | None = Field(default=None, ge=1, le=65535)

    admin_token: SecretStr | None = None

    # The Ed25519 key (its 32-byte seed, base64) that signs every published event;
    # registry replicas share it. Or a file holding it. Neither: <data_dir>/
    # event-signing-key, made at first start (loraplane/event_signing.py).
    event_signing_key: SecretStr | None = None
    event_signing_key_file: Path | None = None
    # Public keys (base64, comma-separated) agents still accept besides the signing
    # key's: the key a rotation replaces, until every event it signed is consumed.
    event_verify_keys: str = ""

    max_file_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES, gt=0)
    max_upload_bytes: int = Field(default=4 * 1024**3, gt=0)
    # What an archive may expand to in all: the largest adapter the registry takes (its
    # weights file at max_file_bytes, with room for the config and a README).
    max_adapter_bytes: int = Field(default=DEFAULT_MAX_FILE_BYTES + 64 * 1024**2, gt=0)
    # Decompressed bytes per compressed byte, per zip member and per archive.
    max_archive_expansion_ratio: float = Field(default=100.0, ge=1, le=10_000)
    max_archive_members: int = Field(default=16, gt=0)
    # Every request body but an upload's (JSON), refused with 413 before it is parsed.
    max_json_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # A client must send a whole request head within this; a connection accepted while
    # max_connections are open is answered 503 at once (loraplane/http_guard.py).
    header_timeout_s: float = Field(default=DEFAULT_HEADER_TIMEOUT_S, gt=0, le=600)
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1, le=1_000_000)
    # Uploads one token may have in flight on one registry process; one more gets 429.
    max_uploads_per_token: int = Field(default=4, ge=1, le=1024)
    max_header_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    presign_expires_s: int = Field(default=300, gt=0, le=7 * 24 * 3600)
    # Presigned blob URLs in published events (agents skip the registry's 307): "auto"
    # only when the registry authenticates to an external NATS; see events/file_links.py.
    event_file_urls: Literal["auto", "on", "off"] = "auto"
    relay_poll_interval_s: float = Field(default=1.0, gt=0)
    relay_batch_size: int = Field(default=100, gt=0)
    # How often each open /ui live stream looks for changes (one short read per look).
    ui_poll_interval_s: float = Field(default=1.0, gt=0, le=60)
    # Live /ui streams one token may hold open on one registry process; one more: 429.
    ui_max_streams_per_token: int = Field(default=8, ge=1, le=1000)
    # How long one publish waits for JetStream's ack.
    relay_publish_timeout_s: float = Field(default=5.0, gt=0)
    # A relay's lease on the outbox rows it is publishing; one that dies loses it then.
    relay_claim_lease_s: float = Field(default=60.0, gt=0)
    # The canary analyst looks for due steps every canary_interval_s; its lease on a
    # canary lasts canary_lease_s, after which another replica may take it over.
    canary_interval_s: float = Field(default=1.0, gt=0, le=60)
    canary_lease_s: float = Field(default=30.0, gt=0, le=3600)
    # A Prometheus that scrapes the agents: canary analyses whose source is "auto" or
    # "prometheus" read their metrics there (PromQL) instead of the agents' reports.
    prometheus_url: str | None = Field(default=None, max_length=2000,
                                       pattern=r"^https?://[^\s]+$")
    # The hosts canary webhook gates may name (exact names, JSON list): the registry
    # POSTs to them, so a publisher cannot aim it anywhere else. Empty: no webhooks.
    canary_webhook_hosts: list[str] = Field(default_factory=list, max_length=100)
    # The HMAC-SHA256 key webhook calls are signed with; replicas share it. Unset:
    # <data_dir>/canary-webhook-secret, made at first use.
    canary_webhook_secret: SecretStr | None = None
    # Unreferenced blobs are collected at start-up and then every blob_gc_interval_s;
    # one is only taken once the store wrote it blob_gc_grace_s ago.
    blob_gc_interval_s: float = Field(default=3600.0, gt=0)
    blob_gc_grace_s: float = Field(default=3600.0, ge=0)
    # A pass works at most this share of its time: after each page of the listing it
    # rests in proportion, so its steps leave the event loop and the database to
    # requests. 1: no rest.
    blob_gc_busy_share: float = Field(default=0.25, gt=0, le=1)
    # How long an upload may take from storing its blobs to its commit.
    blob_upload_lease_s: float = Field(default=3600.0, gt=0)
    # An agent without a report for this long is out of the live fleet that adapters
    # are placed over (and shown stale); set it above twice the agents' heartbeat
    # interval (30 s by default). A leave is published within 4/3 of it.
    agent_stale_after_s: float = Field(default=90.0, ge=1, le=7 * 24 * 3600)
    # /metrics recomputes the fleet's gauges (every agent's report parsed) at most once
    # per fleet_metrics_max_age_s; scrapes in between read the last values. 0: each.
    fleet_metrics_max_age_s: float = Field(default=10.0, ge=0, le=300)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # The event loop's lag is measured by a tick every loop_lag_interval_s; a tick
    # loop_lag_warn_s overdue logs who holds the loop (loraplane/loop_lag.py).
    loop_lag_interval_s: float = Field(default=DEFAULT_INTERVAL_S, gt=0, le=60)
    loop_lag_warn_s: float = Field(default=DEFAULT_WARN_AFTER_S, gt=0, le=600)
    # Longest a thread holds the GIL while the event loop waits for it (loop_lag.py).
    gil_switch_interval_s: float = Field(default=DEFAULT_SWITCH_INTERVAL_S, ge=0.0001, le=0.1)
    # Distinct adapter names exported as metric label values; later ones become "_other"
    # (loraplane/metric_labels.py), so thousands of adapters cannot flood Prometheus.
    metrics_max_adapters: int = Field(default=DEFAULT_MAX_ADAPTER_LABELS, ge=0, le=100_000)
    # Registered base model name -> its HF config.json (or the folder holding it).
    # Uploads for a base model named here are judged by tensor shapes; see
    # loraplane/lora/validate.py. A JSON object in LORAPLANE_BASE_MODEL_CONFIGS.
    base_model_configs: dict[str, Path] = Field(default_factory=dict)

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        return None if value in (None, "") else normalize_database_url(value)

    @field_validator("s3_endpoint", "s3_public_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("an S3 endpoint must be an http:// or https:// URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> RegistrySettings:
        keys = (self.s3_access_key is None, self.s3_secret_key is None)
        if keys[0] != keys[1]:
            raise ValueError("set both s3_access_key and s3_secret_key, or neither")
        for endpoint in ("s3_endpoint", "s3_public_endpoint"):
            if getattr(self, endpoint) and not self.s3_bucket:
                raise ValueError(f"{endpoint} is set but s3_bucket is not")
        if self.relay_claim_lease_s < 2 * self.relay_publish_timeout_s:
            raise ValueError("relay_claim_lease_s must be at least twice "
                             "relay_publish_timeout_s")
        if self.canary_lease_s < 2 * self.canary_interval_s:
            raise ValueError("canary_lease_s must be at least twice canary_interval_s")
        if self.max_file_bytes > self.max_upload_bytes:
            raise ValueError("max_file_bytes must not exceed max_upload_bytes")
        if self.max_file_bytes > self.max_adapter_bytes:
            raise ValueError("max_file_bytes must not exceed max_adapter_bytes")
        for name in self.base_model_configs:
            self.base_shapes(name)
        self._check_signing_keys()
        return self

    @model_validator(mode="after")
    def _loop_lag(self) -> RegistrySettings:
        check_loop_lag(self.loop_lag_interval_s, self.loop_lag_warn_s)
        return self

    def _check_signing_keys(self) -> None:
        if self.event_signing_key is not None and self.event_signing_key_file is not None:
            raise ValueError("set event_signing_key or event_signing_key_file, not both")
        try:
            if self.event_signing_key is not None:
                decode_private(self.event_signing_key.get_secret_value())
            for text in self.verify_key_texts:
                decode_public(text)
        except InvalidKey as exc:
            raise ValueError(str(exc)) from None

    @property
    def verify_key_texts(self) -> list[str]:
        return [part.strip() for part in self.event_verify_keys.split(",") if part.strip()]

    @property
    def signing_key_file(self) -> Path:
        """Where the signing key is read from, or kept when the registry makes it."""
        return self.event_signing_key_file or self.data_dir / SIGNING_KEY_FILE

    def base_shapes(self, base_model: str) -> BaseModelShapes | None:
        """The shapes of ``base_model`` when its config is configured, else None.

        Read per upload (a few KB), so an edited config needs no restart; a
        config that became unreadable fails that upload, not silently passes it.
        """
        path = self.base_model_configs.get(base_model)
        if path is None:
            return None
        try:
            return BaseModelShapes.from_hf_config(path)
        except UnsupportedBaseModel as exc:
            raise ValueError(f"base_model_configs[{base_model!r}]: {exc}") from None

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / 'registry.db'}"

    @property
    def is_sqlite(self) -> bool:
        return self.effective_database_url.startswith("sqlite")

    @property
    def should_auto_migrate(self) -> bool:
        # The embedded default migrates itself; a shared database is migrated on purpose.
        return self.auto_migrate if self.auto_migrate is not None else self.database_url is None

    @property
    def blob_kind(self) -> Literal["local", "s3"]:
        return "s3" if self.s3_bucket else "local"

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def staging_dir(self) -> Path:
        return self.data_dir / "staging"

    @property
    def uses_embedded_nats(self) -> bool:
        return not self.nats_url

    @property
    def embedded_nats_dir(self) -> Path:
        """The embedded NATS's store, log, port file, config and user passwords."""
        return self.data_dir / "nats"

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / ADMIN_TOKEN_FILE
