"""The event and snapshot schema shared by the registry and the agents.

Both sides import this module, so it imports nothing but pydantic and the standard
library. Events are hints: an agent acts on them, but its reconcile loop re-reads the
desired state, so a late, duplicated or out-of-order event changes nothing wrong.
"""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import Base64Bytes, BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from loraplane.naming import SLUG_PATTERN

STREAM_NAME = "LORAPLANE"
SUBJECT_PREFIX = "loraplane.events"
STREAM_SUBJECTS = f"{SUBJECT_PREFIX}.>"


def subject_for(tenant: str, adapter: str) -> str:
    """``loraplane.events.<tenant>.<adapter>``; an event about no adapter (credentials)
    goes to ``loraplane.events.<tenant>``, as an empty token is not a valid subject."""
    if not adapter:
        return f"{SUBJECT_PREFIX}.{tenant}"
    return f"{SUBJECT_PREFIX}.{tenant}.{adapter}"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


# Identifiers are checked as the registry checks them before anything here names a
# path, a vLLM model, a metric label or a routing decision (the snapshot and the
# events both pass through these types).
_SLUG_BODY = SLUG_PATTERN.removeprefix("^").removesuffix("$")
Slug = Annotated[str, Field(pattern=SLUG_PATTERN)]
# An event's adapter: a slug, or "" for an event about no adapter (credentials, fleet).
AdapterField = Annotated[str, Field(pattern=f"^(?:{_SLUG_BODY})?$")]
# An event's tenant: a slug, "_fleet" (FLEET_TENANT), or "" (a global token's audit).
TenantField = Annotated[str, Field(pattern=f"^(?:{_SLUG_BODY}|_fleet)?$")]
VersionNumber = Annotated[int, Field(ge=1, le=2**31 - 1)]
Revision = Annotated[int, Field(ge=0, le=2**63 - 1)]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# A file of a version: it becomes a path in the agent's cache, so no separator, no
# leading dot, no control character.
FileName = Annotated[str, Field(min_length=1, max_length=255,
                                pattern=r"^[^/\\.\x00-\x1f\x7f][^/\\\x00-\x1f\x7f]*$")]


class FileRef(_Frozen):
    name: FileName
    size: int = Field(ge=0)
    sha256: Sha256Hex
    # Path on the registry, e.g. /v1/adapters/a/versions/3/files/adapter_config.json.
    url: str
    # A presigned GET URL of the blob store, added by the registry's relay as it
    # publishes, or to the snapshot as ``GET /v1/desired`` answers (never stored): the
    # agent fetches the bytes straight from the store and falls back to ``url`` when it
    # is missing or refused (expired).
    # It is a credential for one blob until it expires, so it is never dumped or
    # printed: ``exclude`` keeps it out of every ``model_dump``, ``repr`` out of logs.
    direct_url: str | None = Field(default=None, exclude=True, repr=False)
    # The file itself, when it is small (base64 in JSON), added by the same relay on
    # the same terms: the agent writes it without a request, after checking its size
    # and sha256 like any download's. In the message only: never dumped either.
    content: Base64Bytes | None = Field(default=None, exclude=True, repr=False)


class VersionRef(_Frozen):
    """Everything an agent needs to fetch, verify and load one version."""

    adapter: Slug
    version: VersionNumber
    digest: Sha256Hex
    base_model: str
    rank: int = Field(ge=1)
    alpha: float
    target_modules: list[str]
    files: list[FileRef]


class _EventBase(_Frozen):
    event_id: str
    seq: int
    time: datetime
    tenant: TenantField
    adapter: AdapterField


AliasAction = Literal["publish", "promote", "rollback", "delete", "adapter_deleted",
                      "canary_start", "canary_step", "canary_pause", "canary_resume",
                      "canary_promote", "canary_abort"]
# Canary transitions that leave the alias's own version where it was.
CANARY_HOLDS: frozenset[str] = frozenset({"canary_start", "canary_step", "canary_pause",
                                          "canary_resume", "canary_abort"})


class CanaryRoute(_Frozen):
    """The share of an alias's traffic a canary version takes: a request goes to
    ``target`` iff hash(its key, ``id``) falls under ``weight`` percent."""

    id: int = Field(ge=1)
    weight: int = Field(ge=0, le=100)
    target: VersionRef


class AdapterUpdated(_EventBase):
    """An alias moved, or its canary changed. ``target`` is None when the alias was
    removed; ``canary`` is the alias's canary after this revision, None when none runs."""

    type: Literal["adapter_updated"] = "adapter_updated"
    alias: Slug
    revision: Revision
    action: AliasAction
    base_model: str
    version: VersionNumber | None
    previous_version: VersionNumber | None
    digest: Sha256Hex | None
    rank: int | None
    files: list[FileRef]
    target: VersionRef | None
    canary: CanaryRoute | None = None
    # Why, for a canary's transitions: the failing check, or the operator's words.
    reason: str | None = Field(default=None, max_length=1000)


class VersionPublished(_EventBase):
    type: Literal["version_published"] = "version_published"
    base_model: str
    target: VersionRef


class AdapterDeleted(_EventBase):
    type: Literal["adapter_deleted"] = "adapter_deleted"
    base_model: str


class PlacementChanged(_EventBase):
    """The adapter's placement setting changed: agents recompute what they own.

    ``replicas`` None: no placement (every agent serving it, loaded on demand)."""

    type: Literal["placement_changed"] = "placement_changed"
    base_model: str
    replicas: int | None


# The tenant and subject token of fleet events: not a tenant slug (a slug never starts
# with "_"), so no tenant's events and no tenant filter ever meet them.
FLEET_TENANT = "_fleet"


class FleetChanged(_EventBase):
    """The live agents of ``base_model`` changed: an agent joined (its first report, or
    one after it went stale) or left (it said so, or it went stale). ``tenant`` is
    ``FLEET_TENANT`` and ``adapter`` "". ``agents`` is the whole live fleet when the
    change was recorded, so an agent re-places from the event alone."""

    type: Literal["fleet_changed"] = "fleet_changed"
    base_model: str
    agents: list[str]
    joined: list[str] = Field(default_factory=list)
    left: list[str] = Field(default_factory=list)


RouteKind = Literal["customer", "task", "default"]
# The one key of a tenant's ``default`` rule: a tenant has at most one default.
DEFAULT_ROUTE_KEY = "default"


class RouteRule(_Frozen):
    """A rule of one tenant: requests of that tenant only are routed by it."""

    kind: RouteKind
    key: str = Field(min_length=1, max_length=255)
    adapter: Slug
    alias: Slug
    tenant: Slug
    base_model: str


class RouteChanged(_EventBase):
    """A routing rule changed; ``rule`` is None when it was removed.

    ``route_revision`` numbers the rule changes of ``tenant`` without gaps (1, 2, ...):
    an agent that holds revision r of the tenant's rules applies the event in place
    when it is r + 1, ignores it when it is at most r, and re-reads the rules on a gap.
    None (an older registry): the agent re-reads them."""

    type: Literal["route_changed"] = "route_changed"
    kind: RouteKind
    key: str = Field(min_length=1, max_length=255)
    rule: RouteRule | None
    route_revision: Revision | None = None


class CredentialsChanged(_EventBase):
    """An inference token of ``tenant`` was created or revoked (``adapter`` is "").

    Carries no token data: agents re-read ``GET /v1/agents/credentials``.
    """

    type: Literal["credentials_changed"] = "credentials_changed"


Event = Annotated[
    AdapterUpdated | VersionPublished | AdapterDeleted | PlacementChanged | RouteChanged
    | CredentialsChanged | FleetChanged,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


class AdapterCreated(_EventBase):
    """Audit only: recorded in the event table, never published to agents."""

    type: Literal["adapter_created"] = "adapter_created"
    base_model: str


class TokenIssued(_EventBase):
    """Audit only. ``tenant`` is the token's tenant ("" for a global one), ``adapter`` ""."""

    type: Literal["token_created"] = "token_created"
    token_id: int
    name: str
    role: str


class TokenRevoked(_EventBase):
    """Audit only, like :class:`TokenIssued`."""

    type: Literal["token_revoked"] = "token_revoked"
    token_id: int
    name: str
    role: str


class AgentBindingReleased(_EventBase):
    """Audit only: a global admin freed ``agent_id`` from the (revoked) token bound to
    it, so another agent token may bind it. ``tenant`` and ``adapter`` are ""."""

    type: Literal["agent_binding_released"] = "agent_binding_released"
    agent_id: str
    token_id: int


class AdapterNameFreed(_EventBase):
    """Audit only: a global admin freed the retired name ``adapter`` (of a deleted
    adapter of ``tenant``), so that any tenant may create an adapter of that name."""

    type: Literal["adapter_name_freed"] = "adapter_name_freed"


# Everything ``GET /v1/events`` may list: the published events and the audit-only ones.
AuditEvent = Annotated[
    AdapterUpdated | VersionPublished | AdapterDeleted | PlacementChanged | RouteChanged
    | CredentialsChanged | FleetChanged | AdapterCreated | TokenIssued | TokenRevoked
    | AgentBindingReleased | AdapterNameFreed,
    Field(discriminator="type"),
]
AUDIT_ADAPTER: TypeAdapter[AuditEvent] = TypeAdapter(AuditEvent)


def parse_event(raw: bytes | str) -> Event:
    return EVENT_ADAPTER.validate_json(raw)


class DesiredAlias(_Frozen):
    alias: Slug
    revision: Revision
    target: VersionRef
    canary: CanaryRoute | None = None


class DesiredAdapter(_Frozen):
    tenant: Slug
    name: Slug
    base_model: str
    aliases: list[DesiredAlias]
    # How many agents keep it hot (see loraplane.placement); None: no placement.
    replicas: int | None = None


class DesiredState(_Frozen):
    """The registry's snapshot for one base model.

    ``stream_seq`` is the JetStream sequence this snapshot reflects: every event with a
    higher sequence may be newer than the snapshot, so an agent subscribes from
    ``stream_seq + 1``.
    """

    base_model: str
    stream: str = STREAM_NAME
    stream_seq: int
    event_seq: int
    adapters: list[DesiredAdapter]
    routes: list[RouteRule]
    # The live agents of this base model (fresh reports): the fleet placement is
    # computed over. An older registry sends none; the agent then counts only itself.
    agents: list[str] = Field(default_factory=list)
    # tenant -> the revision of its routing rules this snapshot holds (see
    # ``RouteChanged.route_revision``); read before the rules. None: an older registry.
    route_revisions: dict[str, int] | None = None


ServeState = Literal["serving", "loading", "failed", "draining"]


class ServedVersion(_Frozen):
    adapter: str
    alias: str | None
    version: int
    state: ServeState
    reason: str | None = None
    code: str | None = None


# hot: loaded in vLLM; warm: on the agent's disk; cold: only in the blob store.
Tier = Literal["hot", "warm", "cold"]


class TierEntry(_Frozen):
    """Where one version of an adapter sits on one agent, and whether the agent owns
    the adapter (keeps it hot by placement)."""

    adapter: str
    version: int
    tier: Tier
    owned: bool = False
    # Owned, but not kept hot: every slot this agent gives owned adapters is taken.
    over_capacity: bool = False


# The upper bounds (seconds) of the latency buckets an agent counts a canary's requests
# in; a report's counts have one more, for +Inf. Fixed here, so that every agent's
# counts add up bucket by bucket in the registry.
TRAFFIC_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                                      5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
MAX_TRAFFIC_ENTRIES = 200
CanaryTrack = Literal["stable", "canary"]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
BucketCounts = Annotated[list[Count], Field(min_length=len(TRAFFIC_BUCKETS) + 1,
                                            max_length=len(TRAFFIC_BUCKETS) + 1)]


def _empty_buckets() -> list[int]:
    return [0] * (len(TRAFFIC_BUCKETS) + 1)


class CanaryTraffic(_Frozen):
    """One side of a running canary as one agent served it: the requests its split sent
    to the canary version (``canary``) or kept on the alias's own (``stable``).

    Every count is cumulative since the agent first routed the canary, as a Prometheus
    counter is: the registry takes the difference over a step's window, and a count
    lower than the last one (the agent restarted) starts again from zero."""

    canary_id: int = Field(ge=1, le=2**63 - 1)
    track: CanaryTrack
    requests: Count = 0
    errors: Count = 0  # answered 5xx (the agent's or vLLM's), timeouts included
    # Cumulative counts per bucket of TRAFFIC_BUCKETS, +Inf last (Prometheus' ``le``):
    # to the last byte, and to the first streamed chunk.
    latency: BucketCounts = Field(default_factory=_empty_buckets)
    ttft: BucketCounts = Field(default_factory=_empty_buckets)
    # 1 once the canary version failed to load on this agent (``canary`` side only).
    load_failures: Count = 0

    @model_validator(mode="after")
    def _consistent(self) -> CanaryTraffic:
        for name in ("latency", "ttft"):
            counts: list[int] = getattr(self, name)
            if any(b < a for a, b in pairwise(counts)):
                raise ValueError(f"{name} bucket counts must be cumulative (non-decreasing)")
        if self.latency[-1] > self.requests or self.errors > self.requests:
            raise ValueError("more latencies or errors than requests")
        return self


class AgentStatus(_Frozen):
    """What one agent reports: what it serves and what failed, with reasons."""

    agent_id: str
    base_model: str
    time: datetime
    served: list[ServedVersion]
    loaded: list[str] = Field(default_factory=list)
    failures: list[ServedVersion] = Field(default_factory=list)
    tiers: list[TierEntry] = Field(default_factory=list)
    # The agent's last report, sent as it shuts down: the registry takes it out of the
    # live fleet at once instead of after the staleness window.
    leaving: bool = False
    # Per running canary this agent routes, what each side served (the analysis' input).
    traffic: list[CanaryTraffic] = Field(default_factory=list,
                                         max_length=MAX_TRAFFIC_ENTRIES)
