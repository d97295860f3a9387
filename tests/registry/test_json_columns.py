"""JSON columns go through orjson (registry_service/db/engine.py): what the standard
library stored must still store, the same way."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import JSON, Column, Integer, MetaData, Table, insert, select

from registry_service.db.engine import create_engine

_TABLE = Table("doc", MetaData(), Column("id", Integer, primary_key=True),
               Column("body", JSON, nullable=False))


async def test_a_json_column_keeps_what_the_standard_library_kept(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'json.db'}")
    # 2**70: over orjson's 64 bits, as a request may carry (schemathesis sent one).
    body = {1: "naïve ✓", "nested": {"list": [1, 2.5, None, True]}, "big": 2**70}
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_TABLE.metadata.create_all)
            await connection.execute(insert(_TABLE).values(id=1, body=body))
            stored = await connection.scalar(select(_TABLE.c.body))
    finally:
        await engine.dispose()
    # Keys that are not strings become strings, as json.dumps makes them.
    assert stored == {"1": "naïve ✓", "nested": {"list": [1, 2.5, None, True]}, "big": 2**70}
    assert isinstance(stored["big"], int)
