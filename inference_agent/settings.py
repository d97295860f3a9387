"""The agent's one settings class (flags or LORAPLANE_* variables); refuses bad input."""

from __future__ import annotations

import math
import re
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from loraplane.event_signing import EventKeys, InvalidKey
from loraplane.http_guard import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from loraplane.loop_lag import (
    DEFAULT_INTERVAL_S,
    DEFAULT_SWITCH_INTERVAL_S,
    DEFAULT_WARN_AFTER_S,
    check_loop_lag,
)
from loraplane.metric_labels import DEFAULT_MAX_ADAPTER_LABELS
from loraplane.naming import is_slug
from loraplane.nats_auth import NatsSettings

# What the registry accepts in POST /v1/agents/{agent_id}/status.
AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,254}$"
_AGENT_ID = re.compile(AGENT_ID_PATTERN)
_SCHEMES = {
    "registry": ("http://", "https://"),
    "vllm_url": ("http://", "https://"),
    "nats_url": ("nats://", "tls://", "ws://", "wss://"),
}
LogLevel = Literal["debug", "info", "warning", "error"]


class AgentSettings(BaseSettings, NatsSettings):
    """Every agent setting; the ``nats_*`` ones (URL, credentials, TLS) are ``NatsSettings``."""

    # Inputs stay out of error texts: they may hold secrets (tokens, NATS password).
    model_config = SettingsConfigDict(env_prefix="LORAPLANE_", extra="ignore",
                                      hide_input_in_errors=True)

    # Where desired state comes from. Without a registry the agent serves --watch-dir only.
    registry: str | None = None
    token: SecretStr | None = None
    # The token read from a file (a container secret); never together with ``token``.
    token_file: Path | None = None
    vllm_url: str = "http://127.0.0.1:8000"

    base_model: str = Field(min_length=1)
    base_model_config: Path | None = None
    max_lora_rank: int = Field(default=16, gt=0)

    cache_dir: Path = Path.home() / ".loraplane" / "agent-cache"
    cache_max_bytes: int = Field(default=20 * 1024**3, gt=0)
    max_loaded: int = Field(default=8, gt=0)
    pin: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # The registry's event keys (Ed25519 public keys, base64), pinned: the agent then
    # believes events signed by these only and never asks the registry for its keys.
    # Empty: read from the registry (GET /v1/events/keys) at start and on rotation.
    event_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    prewarm: Annotated[list[str], NoDecode] = Field(default_factory=list)

    host: str = "127.0.0.1"
    port: int = Field(default=9000, ge=0, le=65535)
    # A client must send a whole request head within this (loraplane/http_guard.py);
    # a connection accepted while max_connections are open is answered 503 at once
    # (the cap is lowered to fit the process's descriptor limit).
    header_timeout_s: float = Field(default=DEFAULT_HEADER_TIMEOUT_S, gt=0, le=600)
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1, le=1_000_000)
    # The largest generation request body read (413 body_too_large beyond); read only
    # after the request's token was checked.
    max_body_bytes: int = Field(default=16 * 1024**2, ge=1024, le=1024**3)
    # How long a request waits for a loaded-adapter slot (every one held by requests in
    # flight) before it is answered 503 capacity_exhausted with Retry-After.
    slot_wait_s: float = Field(default=5.0, gt=0, le=600)
    # The share of max_loaded one tenant's requests in flight may hold (at least one
    # slot): a request that would take one more is answered 503 tenant_slots_full.
    # 1 lets one tenant hold every slot (a single-tenant agent).
    tenant_slot_share: float = Field(default=0.75, gt=0, le=1)
    agent_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=255)
    watch_dir: Path | None = None
    # The tenant every --watch-dir adapter belongs to.
    watch_tenant: str = "local"
    # Inference credentials beyond the registry's: lines of "<tenant> <sha256 hex>".
    keys_file: Path | None = None
    # How often the registry's inference credentials are re-read even without an event:
    # the longest a revocation waits when its event is lost.
    credentials_refresh_s: float = Field(default=5.0, gt=0, le=3600)

    drain_timeout_s: float = Field(default=300.0, gt=0)
    resync_interval_s: float = Field(default=30.0, gt=0)
    heartbeat_interval_s: float = Field(default=30.0, gt=0)
    # How long a status report waits for a move or an idle drain under way, so that one
    # push is one report (see node/status.py); the fleet view lags by at most this.
    status_settle_max_s: float = Field(default=5.0, ge=0, le=600)
    # How long a change with no move under way waits for more before its report goes
    # out: the settle above holds the report through a move (a move's report skips
    # this), so this only gathers other changes that come together.
    status_debounce_s: float = Field(default=0.1, ge=0, le=60)
    # While a canary runs here and its traffic counts moved, a status report goes out
    # at least this often (instead of at the heartbeat only): the registry judges the
    # canary from them. Nothing is posted when they did not move.
    canary_report_interval_s: float = Field(default=5.0, gt=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    vllm_ready_timeout_s: float = Field(default=600.0, gt=0)
    # The oldest copy of vLLM's queue and KV-cache series a scrape of the agent is
    # answered from; an older one is taken again first, so vLLM is asked at most once
    # per interval however often the agent is scraped, and never while nobody scrapes.
    vllm_metrics_interval_s: float = Field(default=0.25, gt=0, le=60)
    load_wait_timeout_s: float = Field(default=120.0, gt=0)
    max_attempts: int = Field(default=5, gt=0)
    retry_base_s: float = Field(default=0.5, gt=0)
    retry_max_s: float = Field(default=30.0, gt=0)
    reconcile_workers: int = Field(default=4, gt=0, le=64)
    # Distinct adapter names exported as metric label values; later ones become "_other"
    # (loraplane/metric_labels.py), so thousands of adapters cannot flood Prometheus.
    metrics_max_adapters: int = Field(default=DEFAULT_MAX_ADAPTER_LABELS, ge=0, le=100_000)
    log_level: LogLevel = "info"
    # The event loop's lag is measured by a tick every loop_lag_interval_s; a tick
    # loop_lag_warn_s overdue logs who holds the loop (loraplane/loop_lag.py).
    loop_lag_interval_s: float = Field(default=DEFAULT_INTERVAL_S, gt=0, le=60)
    loop_lag_warn_s: float = Field(default=DEFAULT_WARN_AFTER_S, gt=0, le=600)
    # Longest a thread holds the GIL while the event loop waits for it (loop_lag.py).
    gil_switch_interval_s: float = Field(default=DEFAULT_SWITCH_INTERVAL_S, ge=0.0001, le=0.1)

    @field_validator("registry", "vllm_url", "nats_url")
    @classmethod
    def _url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        schemes = _SCHEMES[str(info.field_name)]
        rest = next((value[len(s):] for s in schemes if value.lower().startswith(s)), None)
        if not rest or rest.startswith("/"):
            raise ValueError(f"must be a URL starting with {' or '.join(schemes)}")
        return value.rstrip("/")

    @field_validator("agent_id")
    @classmethod
    def _agent_id(cls, value: str) -> str:
        if not _AGENT_ID.fullmatch(value):
            raise ValueError("must be letters, digits and . _ : - (starting with a letter "
                             "or digit), at most 255 characters")
        return value

    @field_validator("watch_tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        if not is_slug(value):
            raise ValueError("must be a tenant name (a slug)")
        return value

    @field_validator("pin", "prewarm", "event_keys", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        # "a,b" from the environment, or a list from flags.
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("pin", "prewarm")
    @classmethod
    def _slugs(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not is_slug(v.partition("@")[0])]
        if bad:
            raise ValueError(f"not adapter names: {', '.join(bad)}")
        return value

    @field_validator("event_keys")
    @classmethod
    def _event_keys(cls, value: list[str]) -> list[str]:
        try:
            EventKeys.from_public(value)
        except InvalidKey as exc:
            raise ValueError(f"an event key is not an Ed25519 public key: {exc}") from None
        return value

    @property
    def tenant_slots(self) -> int:
        """Loaded-adapter slots one tenant's requests in flight may hold."""
        return max(1, math.floor(self.tenant_slot_share * self.max_loaded))

    @model_validator(mode="after")
    def _read_token_file(self) -> AgentSettings:
        if self.token_file is None:
            return self
        if self.token is not None:
            raise ValueError("give --token or --token-file, not both")
        try:
            secret = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--token-file {self.token_file}: cannot read it "
                             f"({type(exc).__name__})") from None
        if not secret or any(c.isspace() for c in secret):
            raise ValueError(f"--token-file {self.token_file} must hold one token on one line")
        self.token = SecretStr(secret)
        return self

    @model_validator(mode="after")
    def _loop_lag(self) -> AgentSettings:
        check_loop_lag(self.loop_lag_interval_s, self.loop_lag_warn_s)
        return self

    @model_validator(mode="after")
    def _sources(self) -> AgentSettings:
        if self.registry is None and self.watch_dir is None:
            raise ValueError("give --registry or --watch-dir (or both): nothing to serve")
        if self.nats_url is not None and self.registry is None:
            raise ValueError("--nats-url needs --registry (events only say what to re-read)")
        if self.registry is not None and self.token is None:
            raise ValueError("--registry needs --token or --token-file (an agent or admin "
                             "token)")
        if self.base_model_config is not None and not self.base_model_config.is_file():
            raise ValueError(f"--base-model-config {self.base_model_config} is not a file")
        if self.watch_dir is not None and not self.watch_dir.is_dir():
            raise ValueError(f"--watch-dir {self.watch_dir} is not a directory")
        if self.registry is None and self.keys_file is None:
            raise ValueError("--watch-dir without --registry needs --keys-file: the OpenAI "
                             "API answers only requests with an inference token")
        if self.keys_file is not None and not self.keys_file.is_file():
            raise ValueError(f"--keys-file {self.keys_file} is not a file")
        if self.retry_max_s < self.retry_base_s:
            raise ValueError("--retry-max-s must be at least --retry-base-s")
        if len(self.pin) > self.max_loaded:
            raise ValueError("more pinned adapters than --max-loaded")
        return self
