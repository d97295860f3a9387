"""Tokens: creation (secret shown once), lookup by hash, revocation, bootstrap."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, bindparam, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplane.api.agents import InferenceCredential, InferenceCredentials
from loraplane.events import (
    AgentBindingReleased,
    CredentialsChanged,
    TokenIssued,
    TokenRevoked,
)
from registry_service.auth.models import ApiToken
from registry_service.auth.roles import Principal, Role
from registry_service.db.base import utcnow
from registry_service.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    RegistryError,
    Unauthorized,
)
from registry_service.events.service import envelope, record_audit, record_event
from registry_service.tenants.models import Tenant
from registry_service.tenants.service import get_or_create_tenant

TOKEN_PREFIX = "lp_"
BOOTSTRAP_NAME = "bootstrap-admin"


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class CreatedToken:
    token: ApiToken
    secret: str


# Built once, from the tables (Core, not ORM): every request authenticates, and composing
# the statement and loading an object cost more than running it.
_T = ApiToken.__table__.c
_PRINCIPALS = (
    select(_T.token_hash, _T.id, _T.name, _T.role, _T.tenant_id, _T.agent_id,
           Tenant.__table__.c.name.label("tenant"))
    .outerjoin_from(ApiToken.__table__, Tenant.__table__, Tenant.__table__.c.id == _T.tenant_id)
    .where(_T.revoked_at.is_(None))
)
_BY_HASH = _PRINCIPALS.where(_T.token_hash == bindparam("token_hash"))
_BY_HASHES = _PRINCIPALS.where(_T.token_hash.in_(bindparam("token_hashes", expanding=True)))


async def authenticate(session: AsyncSession, secret: str | None) -> Principal:
    if not secret:
        raise Unauthorized("a bearer token is required", code="missing_token")
    row = (await session.execute(_BY_HASH, {"token_hash": hash_token(secret)})).first()
    return _registry_principal(row)


async def authenticate_many(session: AsyncSession, secrets: Iterable[str | None]
                            ) -> dict[str | None, Principal | RegistryError]:
    """``authenticate`` for many requests in one query: each secret's principal, or the
    error ``authenticate`` would have raised for it."""
    wanted = {secret: hash_token(secret) for secret in set(secrets) if secret}
    rows = await session.execute(_BY_HASHES,
                                 {"token_hashes": sorted(set(wanted.values()))})
    by_hash = {row.token_hash: row for row in rows}
    found: dict[str | None, Principal | RegistryError] = {
        None: Unauthorized("a bearer token is required", code="missing_token")}
    for secret, token_hash in wanted.items():
        try:
            found[secret] = _registry_principal(by_hash.get(token_hash))
        except RegistryError as exc:
            found[secret] = exc
    return found


def _registry_principal(row: Row[*tuple[Any, ...]] | None) -> Principal:
    if row is None:
        raise Unauthorized("the token is unknown or revoked", code="invalid_token")
    if row.role == Role.INFERENCE.value:
        # For the agents' OpenAI port only: no registry call accepts one, reads included.
        raise Forbidden("an inference token is for an agent's OpenAI API, not the registry",
                        code="insufficient_role",
                        detail={"required": "reader", "actual": Role.INFERENCE.value})
    return Principal(token_id=row.id, name=row.name, role=Role(row.role),
                     tenant_id=row.tenant_id, tenant=row.tenant, agent_id=row.agent_id)


async def create_token(
    session: AsyncSession,
    actor: Principal,
    *,
    name: str,
    role: Role,
    tenant: str | None,
    secret: str | None = None,
    agent_id: str | None = None,
) -> CreatedToken:
    """Create a token and commit; the secret is in the result and nowhere else."""
    actor.require(Role.ADMIN)
    _check_new_token(actor, name=name, role=role, tenant=tenant)
    if agent_id is not None and role is not Role.AGENT:
        raise BadRequest("only an agent token is bound to an agent id",
                         code="agent_id_needs_agent_role")
    tenant_row = await get_or_create_tenant(session, tenant) if tenant else None
    if agent_id is not None:
        await _take_agent_id(session, agent_id)
    secret = secret or new_secret()
    token = ApiToken(
        name=name.strip(),
        token_hash=hash_token(secret),
        prefix=secret[: len(TOKEN_PREFIX) + 6],
        role=role.value,
        tenant_id=tenant_row.id if tenant_row else None,
        tenant=tenant_row,
        agent_id=agent_id,
    )
    session.add(token)
    try:
        await session.flush()
    except IntegrityError as exc:  # another token bound the id meanwhile
        await session.rollback()
        raise _agent_id_taken(agent_id or "") from exc
    _audit(session, token, TokenIssued, actor=actor)
    _credentials_changed(session, token, actor=actor)
    await session.commit()
    return CreatedToken(token=token, secret=secret)


def _agent_id_taken(agent_id: str) -> Conflict:
    return Conflict(f"agent id {agent_id!r} is bound to a live token; revoke it first",
                    code="agent_id_taken", detail={"agent_id": agent_id})


async def _take_agent_id(session: AsyncSession, agent_id: str) -> None:
    """Make ``agent_id`` free for a token being created for it: a revoked token's
    binding is handed over (a global admin names the id on purpose), a live one's never."""
    holder = await session.scalar(select(ApiToken).where(ApiToken.agent_id == agent_id)
                                  .with_for_update(of=ApiToken))
    if holder is None:
        return
    if holder.revoked_at is None:
        raise _agent_id_taken(agent_id)
    holder.agent_id = None
    await session.flush()


async def release_agent_binding(session: AsyncSession, actor: Principal,
                                agent_id: str) -> None:
    """Free ``agent_id`` from the revoked token bound to it, and commit (global admins).

    A binding outlives its token's revocation, so that no other agent token can take
    the id over between a revocation and the new token's first report; a new token
    made for the id (``agent_id`` at creation) takes it over without this.
    """
    if not actor.is_global_admin:
        raise Forbidden("only a global admin frees an agent id", code="insufficient_role",
                        detail={"required": "admin (global)", "actual": actor.role.value})
    holder = await session.scalar(select(ApiToken).where(ApiToken.agent_id == agent_id)
                                  .with_for_update(of=ApiToken))
    if holder is None:
        raise NotFound(f"no token is bound to agent id {agent_id!r}",
                       code="agent_binding_not_found", detail={"agent_id": agent_id})
    if holder.revoked_at is None:
        raise Conflict(f"agent id {agent_id!r} is bound to live token {holder.id}; revoke "
                       "it first", code="agent_token_live",
                       detail={"agent_id": agent_id, "token_id": holder.id})
    holder.agent_id = None
    record_audit(session, AgentBindingReleased(**envelope("", ""), agent_id=agent_id,
                                               token_id=holder.id), actor=actor.name)
    await session.commit()


def _audit(session: AsyncSession, token: ApiToken, kind: type[TokenIssued | TokenRevoked], *,
           actor: Principal) -> None:
    tenant = token.tenant.name if token.tenant is not None else ""
    record_audit(session, kind(**envelope(tenant, ""), token_id=token.id, name=token.name,
                               role=token.role), actor=actor.name)


def _credentials_changed(session: AsyncSession, token: ApiToken, *, actor: Principal) -> None:
    """Tell agents, through the outbox in this transaction, to re-read inference hashes.

    Agents also re-read them periodically, so a lost event delays a revocation by one
    refresh interval at most.
    """
    if token.role == Role.INFERENCE.value and token.tenant is not None:
        record_event(session, CredentialsChanged(**envelope(token.tenant.name, "")),
                     actor=actor.name)


async def inference_credentials(session: AsyncSession,
                                actor: Principal) -> InferenceCredentials:
    """Every live inference token's hash and tenant, for agents to check requests by."""
    actor.require(Role.AGENT)
    rows = await session.execute(
        select(ApiToken.token_hash, Tenant.name).join(Tenant, Tenant.id == ApiToken.tenant_id)
        .where(ApiToken.role == Role.INFERENCE.value, ApiToken.revoked_at.is_(None))
        .order_by(ApiToken.id))
    return InferenceCredentials(credentials=[
        InferenceCredential(token_hash=token_hash, tenant=tenant) for token_hash, tenant in rows])


def _check_new_token(actor: Principal, *, name: str, role: Role, tenant: str | None) -> None:
    if not 0 < len(name.strip()) <= 255:
        raise InvalidInput("a token name must be 1-255 characters", code="invalid_name",
                           detail={"field": "name"})
    if tenant is None and role not in (Role.ADMIN, Role.AGENT):
        raise BadRequest("only admin and agent tokens may be global; name a tenant",
                         code="tenant_required")
    if not actor.is_global and (tenant != actor.tenant or role is Role.AGENT):
        raise Forbidden("a tenant admin creates tokens for its own tenant only",
                        code="tenant_forbidden")
    if tenant is not None and role is Role.AGENT:
        # Agents serve every tenant's adapters; a tenant-scoped agent token would
        # still be able to report on them all.
        raise BadRequest("agent tokens are global; omit the tenant", code="agent_token_global")


async def list_tokens(
    session: AsyncSession, actor: Principal, *, include_revoked: bool = True
) -> list[ApiToken]:
    actor.require(Role.ADMIN)
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    if not actor.is_global:
        query = query.where(ApiToken.tenant_id == actor.tenant_id)
    return list(await session.scalars(query))


async def own_token(session: AsyncSession, actor: Principal) -> ApiToken:
    """The token ``actor`` authenticated with: every role may see its own (``whoami``)."""
    token = await session.get(ApiToken, actor.token_id)
    if token is None:
        raise NotFound(f"token {actor.token_id} not found", code="token_not_found")
    return token


async def revoke_token(session: AsyncSession, actor: Principal, token_id: int) -> ApiToken:
    """Revoke and commit; revoking a revoked token changes nothing."""
    actor.require(Role.ADMIN)
    token = await session.get(ApiToken, token_id)
    if token is None or (not actor.is_global and token.tenant_id != actor.tenant_id):
        raise NotFound(f"token {token_id} not found", code="token_not_found")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        _audit(session, token, TokenRevoked, actor=actor)
        _credentials_changed(session, token, actor=actor)
        await session.commit()
    return token


async def ensure_bootstrap_admin(session: AsyncSession, secret: str) -> ApiToken:
    """Make ``secret`` the bootstrap admin token; an older bootstrap secret stops working.

    A revoked token stays revoked: an operator who revoked it meant it, and a restart
    must not hand the old secret its power back. The caller sees ``revoked_at`` set.
    """
    wanted = hash_token(secret)
    await session.execute(
        update(ApiToken)
        .where(ApiToken.name == BOOTSTRAP_NAME, ApiToken.token_hash != wanted,
               ApiToken.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    existing = await session.scalar(select(ApiToken).where(ApiToken.token_hash == wanted))
    if existing is not None:
        return existing
    token = ApiToken(name=BOOTSTRAP_NAME, token_hash=wanted,
                     prefix=secret[: len(TOKEN_PREFIX) + 6], role=Role.ADMIN.value)
    session.add(token)
    return token
