"""Agents' reports stored many to a transaction: the use case behind the status route.

At a push every agent of the fleet reports within the same second or two. A batch shares
one connection checkout, one BEGIN, one token query and one COMMIT: each row is locked
and written in turn, with one ``fleet_changed`` per base model whose fleet the batch
changed (see ``report_writer.py`` for the batching, and for a batch the database
refuses). Why: docs/decisions.md#reports-are-stored-many-to-a-transaction

Each report keeps its own outcome: one whose token is refused, or whose body breaks a
rule, fails alone while the rest are stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NoReturn

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.events import AgentStatus
from registry_service.agents.fleet import record_fleet_change
from registry_service.agents.reports import upsert_agent_status
from registry_service.agents.schemas import AgentOut
from registry_service.agents.service import agent_out, live_agent_ids
from registry_service.auth.models import ApiToken
from registry_service.auth.roles import Principal, Role
from registry_service.auth.service import authenticate_many
from registry_service.canaries.traffic import record_traffic
from registry_service.db.base import utcnow
from registry_service.errors import Forbidden, InvalidInput, RegistryError

MAX_STATUS_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class ReportIn:
    """One report as the route received it: the bearer secret, the path's agent id."""
    secret: str | None
    agent_id: str
    status: AgentStatus


@dataclass
class Stored:
    """A batch's outcome: per report (in the batch's order) the stored agent or the
    error that refused it, and each fleet the batch changed (base model -> live agents)."""
    outcomes: list[AgentOut | RegistryError]
    fleets: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class _Moves:
    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def check_report(agent_id: str, status: AgentStatus) -> None:
    if status.agent_id != agent_id:
        raise InvalidInput("agent_id in the body does not match the path",
                           code="agent_id_mismatch",
                           detail={"path": agent_id, "body": status.agent_id[:300]})
    if not 0 < len(status.base_model) <= 255:
        raise InvalidInput("base_model must be 1-255 characters", code="invalid_base_model")
    entries = len(status.served) + len(status.failures) + len(status.loaded)
    if entries > MAX_STATUS_ENTRIES:
        raise InvalidInput(f"a status may list at most {MAX_STATUS_ENTRIES} entries",
                           code="status_too_large", detail={"entries": entries})


async def store_reports(session: AsyncSession, batch: list[ReportIn], *,
                        stale_after_s: float) -> Stored:
    """Store each report and mark its agent seen now; the caller commits.

    A join or a leave of the live fleet records ``fleet_changed`` in the same
    transaction. Rows are locked in agent-id order, so that two registry replicas
    writing batches at once cannot deadlock on each other's rows.
    """
    principals = await authenticate_many(session, (report.secret for report in batch))
    outcomes: list[AgentOut | RegistryError | None] = [None] * len(batch)
    moves: dict[str, _Moves] = {}
    for i in sorted(range(len(batch)), key=lambda i: batch[i].agent_id):
        report = batch[i]
        try:
            outcomes[i] = await _store_one(session, principals[report.secret or None],
                                           report, moves, stale_after_s)
        except RegistryError as exc:
            outcomes[i] = exc
    fleets: dict[str, list[str]] = {}
    for base_model, move in sorted(moves.items()):
        fleets[base_model] = await live_agent_ids(session, base_model,
                                                  stale_after_s=stale_after_s)
        record_fleet_change(session, base_model, fleets[base_model],
                            joined=move.joined, left=move.left)
    return Stored([_given(outcome) for outcome in outcomes], fleets)


def _given(outcome: AgentOut | RegistryError | None) -> AgentOut | RegistryError:
    if outcome is None:
        raise RuntimeError("a report of the batch was left without an outcome")
    return outcome


async def _store_one(session: AsyncSession, principal: Principal | RegistryError,
                     report: ReportIn, moves: dict[str, _Moves],
                     stale_after_s: float) -> AgentOut:
    if isinstance(principal, RegistryError):
        raise principal
    principal.require(Role.AGENT)
    check_report(report.agent_id, report.status)
    await _bind_agent_token(session, principal, report.agent_id)
    status = report.status
    seen, was_live, stored = await upsert_agent_status(session, status,
                                                       stale_after_s=stale_after_s)
    if status.traffic:
        await record_traffic(session, report.agent_id, status.traffic)
    if was_live == status.leaving:  # joined, or left
        move = moves.setdefault(status.base_model, _Moves())
        (move.left if status.leaving else move.joined).append(report.agent_id)
    return agent_out(seen, stored, now=utcnow(), stale_after_s=stale_after_s)


async def _bind_agent_token(session: AsyncSession, principal: Principal,
                            agent_id: str) -> None:
    """An agent token reports for one agent, and an agent id is reported for by one
    token: the id the token was made for, or else the first id it reports as, if no
    other token holds that id (a revoked one included, until a global admin frees it).

    Admins may report for any agent. The binding is in the caller's transaction.
    """
    if principal.role is not Role.AGENT or principal.agent_id == agent_id:
        return  # an admin, or a token bound to this agent already: nothing to write
    if principal.agent_id is not None:
        _refuse_binding(agent_id, principal.agent_id)
    holder = await session.scalar(select(ApiToken.id).where(ApiToken.agent_id == agent_id))
    if holder is not None and holder != principal.token_id:
        _refuse_taken(agent_id)
    try:
        # One conditional UPDATE: of two first reports racing, one binds and the other
        # sees it; the unique index refuses two tokens binding one id at once.
        async with session.begin_nested():
            await session.execute(
                update(ApiToken)
                .where(ApiToken.id == principal.token_id, ApiToken.agent_id.is_(None))
                .values(agent_id=agent_id))
    except IntegrityError:
        _refuse_taken(agent_id)
    bound = await session.scalar(select(ApiToken.agent_id)
                                 .where(ApiToken.id == principal.token_id))
    if bound != agent_id:
        _refuse_binding(agent_id, bound)


def _refuse_binding(agent_id: str, bound: str | None) -> NoReturn:
    raise Forbidden(f"this agent token reports for agent {bound!r} only",
                    code="agent_id_forbidden",
                    detail={"agent_id": agent_id, "token_agent_id": bound})


def _refuse_taken(agent_id: str) -> NoReturn:
    raise Forbidden(f"agent id {agent_id!r} is bound to another token; a global admin "
                    f"frees it (DELETE /v1/agents/{agent_id}/binding) once that token is "
                    "revoked", code="agent_id_bound", detail={"agent_id": agent_id})
