"""The fleet view: ``/v1/agents`` and ``/v1/adapters/{name}/rollout``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from loraplane.events import AgentStatus, ServeState, Tier


class InferenceCredential(BaseModel):
    """An inference token as agents check it: its sha256 and its tenant, never the secret."""

    token_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str


class InferenceCredentials(BaseModel):
    """Every live inference token (``GET /v1/agents/credentials``, agents only)."""

    credentials: list[InferenceCredential]


class AgentOut(BaseModel):
    agent_id: str
    base_model: str
    first_seen_at: datetime
    last_seen_at: datetime
    seconds_since_seen: float
    stale: bool
    status: AgentStatus


class AgentList(BaseModel):
    stale_after_s: float
    agents: list[AgentOut]


class RolloutEntry(BaseModel):
    """One agent's view of one version of the adapter."""

    agent_id: str
    alias: str | None
    version: int
    state: ServeState
    reason: str | None = None
    code: str | None = None
    stale: bool


class AliasRollout(BaseModel):
    alias: str
    version: int | None = Field(description="the alias's target; None once it was removed")
    revision: int
    serving: list[RolloutEntry] = Field(description="entries serving, loading or draining")
    failed: list[RolloutEntry]
    pending: list[str] = Field(
        description="fresh agents of the base model that neither serve nor failed the target"
    )
    converged: bool
    reason: str | None = Field(
        default=None,
        description="why the alias has not converged: 'no agents' (no fresh agent of the "
                    "base model), 'N agent(s) pending' or 'N agent(s) failed'",
    )


class TierOut(BaseModel):
    """Where one version of the adapter sits on one agent."""

    agent_id: str
    version: int
    tier: Tier
    owned: bool
    over_capacity: bool = Field(
        default=False, description="owned, but not kept hot: the agent's slots for owned "
                                   "adapters are full, so it loads this one on demand")
    stale: bool


class RolloutOut(BaseModel):
    adapter: str
    tenant: str
    base_model: str
    deleted: bool
    stale_after_s: float
    agents: int = Field(description="fresh agents of the adapter's base model")
    aliases: list[AliasRollout]
    unaliased: list[RolloutEntry] = Field(
        description="entries not tied to a current alias, e.g. a version pinned by number"
    )
    replicas: int | None = Field(
        default=None, description="how many agents keep it hot; None: no placement")
    placed: list[str] = Field(
        default_factory=list,
        description="the fresh agents that own it by rendezvous placement (empty: none set)")
    hot: list[str] = Field(
        default_factory=list, description="fresh agents with a version of it loaded in vLLM")
    tiers: list[TierOut] = Field(
        default_factory=list, description="each agent's tier of each version it reports")
