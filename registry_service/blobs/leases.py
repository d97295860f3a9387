"""Blob leases in the database: what an upload in flight holds, and what the collector
claims. Every function works in the caller's transaction and never commits."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.blobs.models import BlobLease
from registry_service.db.base import utcnow
from registry_service.errors import Unavailable

# A lease that never held anything: what the collector writes for a blob no upload named.
NEVER = datetime(1970, 1, 1, tzinfo=UTC)


def _insert(session: AsyncSession) -> Any:
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(BlobLease)


def _free(now: datetime) -> Any:
    return or_(BlobLease.collecting_until.is_(None), BlobLease.collecting_until <= now)


def _unheld(now: datetime) -> Any:
    # A lease ends when its uploads release it, or when it runs out (an upload that died).
    return or_(BlobLease.holders <= 0, BlobLease.held_until <= now)


async def hold(session: AsyncSession, shas: Iterable[str], lease_s: float) -> list[str]:
    """Lease ``shas`` to an upload; returns those the collector is deleting right now.

    When that list is not empty the caller rolls back and tries again a moment later:
    the blob must not be counted on until its deletion is over.
    """
    now = utcnow()
    until = now + timedelta(seconds=lease_s)
    wanted = sorted(set(shas))  # one lock order for every writer
    for sha in wanted:
        stmt = _insert(session).values(sha256=sha, held_until=until, holders=1,
                                       collecting_until=None)
        await session.execute(stmt.on_conflict_do_update(
            index_elements=[BlobLease.sha256],
            set_={"held_until": stmt.excluded.held_until, "holders": BlobLease.holders + 1}))
    busy = await session.scalars(select(BlobLease.sha256).where(
        BlobLease.sha256.in_(wanted), ~_free(now)))
    return list(busy)


async def release(session: AsyncSession, shas: Iterable[str]) -> None:
    """The upload is over (committed or refused): it needs its blobs kept no longer."""
    await session.execute(
        update(BlobLease)
        .where(BlobLease.sha256.in_(sorted(set(shas))))
        .values(holders=case((BlobLease.holders > 0, BlobLease.holders - 1), else_=0)))


async def require_held(session: AsyncSession, shas: Iterable[str]) -> None:
    """Refuse to reference blobs whose lease ran out: the collector may have taken them.

    The rows stay locked to the end of the caller's transaction (Postgres), so the
    collector cannot claim them between this check and the commit.
    """
    wanted = sorted(set(shas))
    now = utcnow()
    query = select(BlobLease.sha256).where(
        BlobLease.sha256.in_(wanted), BlobLease.holders > 0, BlobLease.held_until > now,
        _free(now))
    if session.bind is not None and session.bind.dialect.name == "postgresql":
        query = query.with_for_update()
    held = set(await session.scalars(query))
    if held != set(wanted):
        raise Unavailable(
            "the upload took longer than its blob lease; send it again",
            code="upload_lease_expired", detail={"files": len(wanted)})


async def claim_for_collection(session: AsyncSession, sha: str, until: datetime) -> bool:
    """Mark ``sha`` as being collected, unless an upload holds it or a collector has it."""
    now = utcnow()
    stmt = _insert(session).values(sha256=sha, held_until=NEVER, holders=0,
                                   collecting_until=until)
    stmt = stmt.on_conflict_do_update(
        index_elements=[BlobLease.sha256],
        set_={"collecting_until": stmt.excluded.collecting_until},
        where=and_(_unheld(now), _free(now)),
    ).returning(BlobLease.sha256)
    return (await session.scalar(stmt)) is not None


async def release_collection(session: AsyncSession, sha: str, until: datetime) -> None:
    await session.execute(delete(BlobLease).where(
        BlobLease.sha256 == sha, BlobLease.collecting_until == until))


async def drop_expired(session: AsyncSession) -> int:
    """Forget leases that protect nothing any more (their upload committed or died)."""
    now = utcnow()
    result = await session.execute(delete(BlobLease).where(_unheld(now), _free(now)))
    return int(getattr(result, "rowcount", 0) or 0)
