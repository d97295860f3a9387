"""The version-history query's layers below the API, for ``bench/history_query.py``:
the data it loads, and the service call, its keyset statement and the same page by
``OFFSET``, each timed in turns; ``EXPLAIN`` of the statement."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench.common import percentile
from bench.history_data import HOT, TENANT, TYPICAL, History, load_postgres

PAGE = 50
WARMUP = 20
INDEX = "uq_versions_adapter_id_number"


# --- data ----------------------------------------------------------------------------------


@dataclass
class Dataset:
    versions: int
    adapters: int
    hot_versions: int
    adapter_ids: dict[str, int]
    seconds: float
    table_mib: float
    index_mib: float


async def load(url: str, versions: int, adapters: int, seed: int) -> Dataset:
    """Fill a migrated, empty database (``bench/history_data.py``: versions and the
    alias moves they imply); every adapter gets at least one version."""
    t0 = time.perf_counter()
    history = History(versions, adapters, seed)
    await load_postgres(url, history)
    conn = await asyncpg.connect(url)
    try:
        table_bytes = await conn.fetchval("SELECT pg_total_relation_size('versions')")
        index_bytes = await conn.fetchval(f"SELECT pg_relation_size('{INDEX}')")
    finally:
        await conn.close()
    return Dataset(versions, adapters, history.hot_versions,
                   dict(zip(history.names, history.ids, strict=True)),
                   time.perf_counter() - t0, table_bytes / 2**20, index_bytes / 2**20)


# --- measuring -----------------------------------------------------------------------------


@dataclass
class Result:
    layer: str
    position: str
    adapter: str
    cursor: int | None
    n: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float


def timed_result(layer: str, position: str, adapter: str, cursor: int | None,
            times_s: list[float]) -> Result:
    ms = [t * 1000 for t in times_s]
    return Result(layer, position, adapter, cursor, len(ms), percentile(ms, 50),
                  percentile(ms, 99), statistics.fmean(ms), max(ms))


async def _round_robin(calls: list[Callable[[], Awaitable[object]]], samples: int,
                       warmup: int = WARMUP) -> list[list[float]]:
    """Time each call ``samples`` times, taking turns, so noise from other processes on
    a shared machine falls on every call alike; seconds per call."""
    for call in calls:
        for _ in range(warmup):
            await call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(samples):
        for call, spent in zip(calls, times, strict=True):
            t0 = time.perf_counter()
            await call()
            spent.append(time.perf_counter() - t0)
    return times


def positions(hot_versions: int) -> list[tuple[str, str, int | None]]:
    """(label, adapter, cursor): a page starts at the version just below the cursor."""
    return [
        ("first page", HOT, None),
        ("middle", HOT, hot_versions // 2),
        ("near the end", HOT, min(hot_versions, 2 * PAGE)),
        ("typical adapter, first page", TYPICAL, None),
    ]


async def measure_service(url: str, data: Dataset, samples: int) -> tuple[
    list[Result], dict[str, Any]
]:
    """Time ``history_page`` directly and the page statement it sends; EXPLAIN that."""
    from sqlalchemy import event  # noqa: PLC0415

    from registry_service.auth.roles import Principal, Role  # noqa: PLC0415
    from registry_service.db.engine import Database  # noqa: PLC0415
    from registry_service.versions.history import history_page  # noqa: PLC0415

    principal = Principal(token_id=0, name="bench", role=Role.READER, tenant_id=1,
                          tenant=TENANT)
    db = Database(url)
    captured: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM versions" in statement:
            captured.append((statement, parameters))

    plans: dict[str, Any] = {}
    labels: list[tuple[str, str, str, int | None]] = []
    calls: list[Callable[[], Awaitable[object]]] = []
    raw = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        for label, adapter, cursor in positions(data.hot_versions):
            async def call(adapter: str = adapter, cursor: int | None = cursor) -> None:
                async with db.session() as session:
                    page = await history_page(session, principal, adapter, limit=PAGE,
                                              cursor=None if cursor is None else str(cursor))
                if page.count(b'"digest"') != PAGE:
                    raise RuntimeError(f"{adapter} cursor {cursor}: not {PAGE} versions")

            # The exact statement and parameters the service sends, to run alone.
            event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
            captured.clear()
            await call()
            event.remove(db.engine.sync_engine, "before_cursor_execute", capture)
            statement, params = captured[-1]
            args = list(params)

            async def sql(statement: str = statement, args: list[Any] = args) -> None:
                rows = await raw.fetch(statement, *args)
                if len(rows) != PAGE + 1:
                    raise RuntimeError(f"keyset query returned {len(rows)} rows")

            labels += [("service", label, adapter, cursor), ("sql", label, adapter, cursor)]
            calls += [call, sql]
            plan = await raw.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", *args)
            plans[label] = {"statement": statement, "params": [str(a) for a in args],
                            "plan": [r[0] for r in plan]}
        times = await _round_robin(calls, samples)
        results = [timed_result(*spec, spent) for spec, spent in zip(labels, times, strict=True)]
        middle = data.hot_versions // 2
        results.append(await _offset_contrast(raw, data, middle, samples))
    finally:
        await raw.close()
        await db.close()
    return results, plans


async def _offset_contrast(raw: asyncpg.Connection, data: Dataset, cursor: int,
                           samples: int) -> Result:
    """The same page by OFFSET: what keyset pagination avoids."""
    offset = data.hot_versions - cursor + 1
    statement = ("SELECT * FROM versions WHERE adapter_id = $1 ORDER BY number DESC "
                 "LIMIT $2 OFFSET $3")
    hot_id = data.adapter_ids[HOT]

    async def sql() -> None:
        rows = await raw.fetch(statement, hot_id, PAGE + 1, offset)
        if rows[0]["number"] != cursor - 1:
            raise RuntimeError("OFFSET page does not match the keyset page")

    n = max(10, min(samples, 100))
    [times] = await _round_robin([sql], n, warmup=3)
    return timed_result("sql OFFSET (contrast)", "middle", HOT, cursor, times)



def uses_index(plan: list[str]) -> bool:
    return any(f"Index Scan Backward using {INDEX}" in line for line in plan) and not any(
        "Seq Scan" in line or "Sort" in line.split("(")[0] for line in plan)
