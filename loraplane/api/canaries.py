"""Canaries: a second version on an alias, earning its traffic step by step.

``/v1/adapters/{name}/aliases/{alias}/canary`` and ``…/canaries``. The bounds refuse
what no operator means: a step outside 1-99 or not above the one before, a step
shorter than a second or longer than a week, a threshold that can never fail.
"""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from loraplane.api.bounds import VersionNumber

CanaryState = Literal["progressing", "paused", "promoted", "aborted"]
ACTIVE_STATES: frozenset[str] = frozenset({"progressing", "paused"})
OnFailure = Literal["rollback", "pause"]
CanaryVerb = Literal["pause", "resume", "promote", "abort"]
Verdict = Literal["pass", "fail", "inconclusive"]

MAX_STEPS = 20
WEEK_S = 7 * 24 * 3600
Weight = Annotated[int, Field(ge=1, le=99)]


GatePhase = Literal["pre", "step"]
MAX_WEBHOOKS = 10


class CanaryWebhook(BaseModel):
    """A gate of the user's own: the registry POSTs the canary (JSON, HMAC-signed) to
    ``url``; an answer 2xx within ``timeout_s`` passes, anything else fails the check.
    ``pre`` gates run once before the canary takes any traffic, ``step`` gates at every
    step's judgement."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
    url: Annotated[str, Field(max_length=2000, pattern=r"^https?://[^\s]+$")]
    phase: GatePhase = "step"
    timeout_s: float = Field(default=10.0, ge=0.1, le=60)


MetricSource = Literal["auto", "builtin", "prometheus"]
MAX_QUERIES = 10


class CanaryQuery(BaseModel):
    """A check of the user's own, in PromQL: its value on the canary must be at most
    ``max``. ``{{adapter}}``, ``{{alias}}``, ``{{stable_version}}``,
    ``{{canary_version}}`` and ``{{window}}`` (the step's window, e.g. ``60s``) are
    filled in. No value counts as a failed check (as in Flagger)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
    query: Annotated[str, Field(min_length=1, max_length=4000)]
    max: float


class CanaryAnalysis(BaseModel):
    """What a step must show, canary against stable on the same window.

    ``failure_limit`` failed steps are tolerated (Argo's ``failureLimit``); one more
    fails the canary. ``inconclusive_limit`` steps in a row without enough requests
    are waited out; one more fails it too. Inconclusive never promotes."""

    model_config = ConfigDict(extra="forbid")

    min_requests: int = Field(default=50, ge=1, le=1_000_000)
    max_error_rate: float = Field(default=0.05, ge=0, lt=1)
    max_error_rate_increase: float = Field(default=0.01, ge=0, lt=1)
    max_latency_p95_ratio: float = Field(default=1.25, ge=1, le=100)
    max_ttft_p95_ratio: float = Field(default=1.25, ge=1, le=100)
    max_load_failures: int = Field(default=0, ge=0, le=10_000)
    failure_limit: int = Field(default=0, ge=0, le=100)
    inconclusive_limit: int = Field(default=3, ge=0, le=100)
    webhooks: list[CanaryWebhook] = Field(default_factory=list, max_length=MAX_WEBHOOKS)
    # Where the metrics come from: the agents' reports (builtin), the Prometheus the
    # registry was given (--prometheus-url), or that one when given (auto).
    source: MetricSource = "auto"
    queries: list[CanaryQuery] = Field(default_factory=list, max_length=MAX_QUERIES)

    @field_validator("webhooks", "queries")
    @classmethod
    def _unique_names(cls, named: list[Any], info: ValidationInfo) -> list[Any]:
        if len({item.name for item in named}) != len(named):
            raise ValueError(f"{info.field_name} names must be unique")
        return named


class CanaryStart(BaseModel):
    """``POST …/canary``: the version to try, the weights it goes through, and how long
    each step is watched."""

    model_config = ConfigDict(extra="forbid")

    version: VersionNumber
    steps: list[Weight] = Field(default_factory=lambda: [10, 50], min_length=1,
                                max_length=MAX_STEPS)
    step_seconds: int = Field(default=60, ge=1, le=WEEK_S)
    analysis: CanaryAnalysis = Field(default_factory=CanaryAnalysis)
    on_failure: OnFailure = "rollback"

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[int]) -> list[int]:
        if any(b <= a for a, b in pairwise(steps)):
            raise ValueError("steps must be strictly increasing weights in 1-99")
        return steps


class CanaryAction(BaseModel):
    """``POST …/canary/{pause,resume,promote,abort}``: an optional reason, for the record."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=500)] | None = None


class CanaryCheck(BaseModel):
    """One metric of one step: both versions' values on the same window, and the verdict."""

    metric: str
    stable: float | None
    canary: float | None
    threshold: float
    stable_requests: int
    canary_requests: int
    verdict: Verdict
    # In words, where the values do not say it all (a webhook's answer).
    detail: str | None = None


class Canary(BaseModel):
    id: int
    adapter: str
    alias: str
    stable_version: int
    canary_version: int
    state: CanaryState
    # 1-based index into ``steps`` of the weight being watched; ``weight`` is that
    # percentage while the canary runs, 100 once promoted and 0 once aborted. Step 0
    # (weight 0): the ``pre`` webhook gates run, before any traffic.
    step: int
    weight: int
    steps: list[int]
    step_seconds: int
    analysis: CanaryAnalysis
    on_failure: OnFailure
    # The last judged step's checks (kept once the canary ends).
    checks: list[CanaryCheck]
    # The current step's window so far, as the analysis would judge it now: given by
    # ``GET …/canary`` for a running canary, None elsewhere.
    live_checks: list[CanaryCheck] | None = None
    reason: str | None
    actor: str
    started_at: datetime
    updated_at: datetime


class CanaryList(BaseModel):
    adapter: str
    alias: str
    canaries: list[Canary]
    # The id to pass as ``cursor`` for older canaries; None on the last page.
    next_cursor: str | None = None
