"""An adapter's version history, a page at a time, written straight to JSON.

The admin history is read far more often than versions are written, so its page is a
keyset statement whose rows become the answer's bytes without an ORM object or a model
per row: both were most of the request's CPU (docs/decisions.md).
The bytes are the ``VersionPage`` the API documents; a test holds them equal to it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Row, Text, bindparam, cast, select
from sqlalchemy.ext.asyncio import AsyncSession

from registry_service.adapters.lookup import visible_adapter_row
from registry_service.auth.roles import Principal, Role
from registry_service.cursors import int_cursor
from registry_service.versions.models import Version
from registry_service.versions.refs import file_url

# Built once, from the table (Core, not ORM): composing the statement, and the ORM's
# handling of its rows, each cost as much CPU as running it.
_V = Version.__table__.c
# By adapter id, not joined to the adapter's name: the planner then walks the keyset
# index backwards for any adapter, where the join sorted a hot adapter's whole history.
_PAGE = (
    select(_V.number, _V.digest, _V.rank, _V.alpha,
           # As text, read by orjson: the JSON columns' own decoder took a tenth of the call.
           cast(_V.target_modules, Text).label("target_modules"),
           cast(_V.files, Text).label("files"), _V.total_size, _V.uploader, _V.notes,
           _V.created_at)
    .where(_V.adapter_id == bindparam("adapter_id"))
    .order_by(_V.number.desc()).limit(bindparam("rows"))
)
_PAGE_BELOW = _PAGE.where(_V.number < bindparam("before"))


async def history_page(session: AsyncSession, principal: Principal, name: str, *,
                       limit: int, cursor: str | None) -> bytes:
    """The adapter's versions below ``cursor`` (all when None), newest first, ``limit`` of
    them, and the cursor of the next page: a ``VersionPage`` as JSON."""
    principal.require(Role.READER)
    params: dict[str, Any] = {"rows": limit + 1}
    if cursor is not None:
        params["before"] = int_cursor(cursor)
    adapter = await visible_adapter_row(session, principal, name)
    params["adapter_id"] = adapter.id
    rows = list(await session.execute(_PAGE if cursor is None else _PAGE_BELOW, params))
    next_cursor = str(rows[limit - 1].number) if len(rows) > limit else None
    versions = [_version(name, adapter.base_model, row) for row in rows[:limit]]
    return orjson.dumps({"versions": versions, "next_cursor": next_cursor},
                        default=_unexpected)


def _version(name: str, base_model: str, row: Row[*tuple[Any, ...]]) -> dict[str, Any]:
    return {
        "adapter": name, "version": row.number, "digest": row.digest,
        "base_model": base_model, "rank": row.rank, "alpha": float(row.alpha),
        "target_modules": orjson.loads(row.target_modules),
        "files": [{"name": f["name"], "size": f["size"], "sha256": f["sha256"],
                   "url": file_url(name, row.number, f["name"])}
                  for f in orjson.loads(row.files)],
        "total_size": row.total_size, "uploader": row.uploader, "notes": row.notes,
        "created_at": _timestamp(row.created_at),
    }


def _timestamp(value: datetime) -> str:
    # As pydantic writes a UTC time: ISO 8601 with "Z".
    return value.isoformat().replace("+00:00", "Z")


def _unexpected(value: object) -> Any:
    raise TypeError(f"{type(value).__name__} in a version row")
