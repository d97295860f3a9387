"""Which stored blobs versions name, asked of ``version_blobs`` one page at a time.

The collector never reads the versions themselves: for a page of the store's listing
the database answers which digests no row names, one indexed probe per digest (the
table's key leads with the digest; ``NOT EXISTS`` stops at the first row, however many
versions share a blob). Memory and event-loop time go with the page, not with the
number of versions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import bindparam, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import String

from registry_service.blobs.models import VersionBlob

# The page travels as one parameter: an array (Postgres) or a JSON list (SQLite).
_UNNAMED_SQL = {
    "postgresql": text(
        "SELECT page.sha FROM unnest(:shas) AS page(sha) WHERE NOT EXISTS "
        "(SELECT 1 FROM version_blobs AS vb WHERE vb.sha256 = page.sha)"
    ).bindparams(bindparam("shas", type_=ARRAY(String(64)))),
    "sqlite": text(
        "SELECT page.value FROM json_each(:shas) AS page WHERE NOT EXISTS "
        "(SELECT 1 FROM version_blobs AS vb WHERE vb.sha256 = page.value)"
    ),
}


async def unnamed(session: AsyncSession, shas: Sequence[str]) -> set[str]:
    """Those of ``shas`` that no version names."""
    if not shas:
        return set()
    dialect = session.get_bind().dialect.name
    shas_param: object = list(shas) if dialect == "postgresql" else json.dumps(list(shas))
    rows = await session.scalars(_UNNAMED_SQL[dialect], {"shas": shas_param})
    return set(rows)


async def is_named(session: AsyncSession, sha: str) -> bool:
    """Whether any version names ``sha``: one probe of the table's key."""
    query = select(VersionBlob.version_id).where(VersionBlob.sha256 == sha).limit(1)
    return await session.scalar(query) is not None
