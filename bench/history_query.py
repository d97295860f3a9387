"""p50/p99 of the version-history query with 1,000,000 versions in Postgres.

A fresh database is created on the machine's Postgres (``$LORAPLANE_TEST_DATABASE_URL``,
default ``postgresql://postgres@127.0.0.1:5432/postgres``), migrated with the
registry's own migrations, and filled with ``COPY`` (asyncpg
``copy_records_to_table``): ``--versions`` rows over ``--adapters`` adapters, one hot
adapter holding 10% of them (100,000 of 1,000,000), the rest spread evenly. Rows are
written in upload order, the hot adapter's versions interleaved with everyone else's,
as they would be after years of uploads (so a page of 50 is 50 different heap pages).
The alias moves those uploads and promotions imply are written too
(``bench/history_data.py``; ``bench/history_load.py`` times their history).

Then, for the hot adapter's first page, a page in the middle of its history and one
near its end (and a typical adapter's first page), each ``--samples`` times:

- ``api``: ``GET /v1/adapters/{name}/versions?limit=50[&cursor=N]`` on a real
  registry process (``loraplane registry serve`` on this database), one keep-alive
  connection, end to end (auth, adapter lookup, keyset query, JSON);
- ``service``: ``registry_service.versions.service.list_versions`` called directly
  in a session of the registry's own ``Database`` (adapter lookup + keyset query +
  ORM + models);
- ``sql``: the keyset statement the service sends, captured from SQLAlchemy, run
  alone through asyncpg;
- ``sql offset`` (for contrast, in the middle only): the same page by ``OFFSET``.

``EXPLAIN (ANALYZE, BUFFERS)`` of the captured keyset statement shows which index
it uses. The database is dropped at the end, whatever happens.

    .venv/bin/python -m bench.history_query --versions 1000000 --samples 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.common import (
    busy_share,
    cpu_counters,
    git_commit,
    machine_summary,
    percentile,
    running_registry,
    table,
)
from bench.history_data import HOT, TENANT, TYPICAL, History, load_postgres

ADMIN_TOKEN = "lp_bench-history-admin-token-0123456789"
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


def _result(layer: str, position: str, adapter: str, cursor: int | None,
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
    """Time ``list_versions`` directly and the SQL it sends; EXPLAIN that SQL."""
    from sqlalchemy import event  # noqa: PLC0415

    from registry_service.auth.roles import Principal, Role  # noqa: PLC0415
    from registry_service.db.engine import Database  # noqa: PLC0415
    from registry_service.versions.service import list_versions  # noqa: PLC0415

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
                    page = await list_versions(session, principal, adapter, limit=PAGE,
                                               cursor=None if cursor is None else str(cursor))
                if len(page.versions) != PAGE:
                    raise RuntimeError(f"{adapter} cursor {cursor}: {len(page.versions)} rows")

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
        results = [_result(*spec, spent) for spec, spent in zip(labels, times, strict=True)]
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
    return _result("sql OFFSET (contrast)", "middle", HOT, cursor, times)


def measure_api(registry_url: str, data: Dataset, samples: int) -> list[Result]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=registry_url, headers=headers, timeout=30) as client:
        specs = positions(data.hot_versions)
        gets: list[Callable[[], None]] = []
        for _label, adapter, cursor in specs:
            params: dict[str, str | int] = {"limit": PAGE}
            if cursor is not None:
                params["cursor"] = cursor
            url = f"/v1/adapters/{adapter}/versions"

            def get(url: str = url, params: dict[str, str | int] = params) -> None:
                response = client.get(url, params=params)
                response.raise_for_status()
                if len(response.json()["versions"]) != PAGE:
                    raise RuntimeError(f"{url}: short page")

            gets.append(get)
        for warm in gets:
            for _ in range(WARMUP):
                warm()
        times: list[list[float]] = [[] for _ in gets]
        for _ in range(samples):
            for timed, spent in zip(gets, times, strict=True):
                t0 = time.perf_counter()
                timed()
                spent.append(time.perf_counter() - t0)
    return [_result("api", label, adapter, cursor, spent)
            for (label, adapter, cursor), spent in zip(specs, times, strict=True)]


# --- main ----------------------------------------------------------------------------------


def uses_index(plan: list[str]) -> bool:
    return any(f"Index Scan Backward using {INDEX}" in line for line in plan) and not any(
        "Seq Scan" in line or "Sort" in line.split("(")[0] for line in plan)


def render(results: list[Result], plans: dict[str, Any], data: Dataset) -> str:
    order = {"api": 0, "service": 1, "sql": 2}
    ranked = sorted(results, key=lambda r: (order.get(r.layer, 3), r.position != "first page"))
    rows = [[r.layer, r.position, r.adapter, "-" if r.cursor is None else r.cursor, r.n,
             f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", f"{r.mean_ms:.2f}", f"{r.max_ms:.2f}"]
            for r in ranked]
    out = [f"{data.versions:,} versions over {data.adapters:,} adapters ({HOT}: "
           f"{data.hot_versions:,}); table + indexes {data.table_mib:.0f} MiB, "
           f"{INDEX} {data.index_mib:.0f} MiB; loaded in {data.seconds:.0f} s", "",
           table(["layer", "page", "adapter", "cursor", "n", "p50 ms", "p99 ms", "mean ms",
                  "max ms"], rows), ""]
    middle = plans.get("middle")
    if middle:
        out.append("EXPLAIN (ANALYZE, BUFFERS) of the keyset statement, middle page, "
                   f"params {middle['params']}:")
        out.append(middle["statement"])
        out.extend("  " + line for line in middle["plan"])
    verdict = {label: uses_index(p["plan"]) for label, p in plans.items()}
    out.append(f"Index Scan Backward using {INDEX}, no Sort, no Seq Scan: {verdict}")
    out.extend(f"{name}: {value:.2f}x" for name, value in ratios(results).items())
    return "\n".join(out)


def ratios(results: list[Result]) -> dict[str, float]:
    """p50 ratios of the middle page: the page by OFFSET over the keyset statement, and
    the whole API call and the service call over the keyset statement alone."""
    p50 = {r.layer: r.p50_ms for r in results if r.position == "middle"}
    keyset = p50.get("sql")
    if not keyset:
        return {}
    named = {"middle page, OFFSET / keyset (sql p50)": p50.get("sql OFFSET (contrast)"),
             "middle page, api / sql (p50)": p50.get("api"),
             "middle page, service / sql (p50)": p50.get("service")}
    return {name: value / keyset for name, value in named.items() if value is not None}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from devharness.services import NatsService, PostgresDatabase  # noqa: PLC0415
    from registry_service.db import migrate  # noqa: PLC0415
    from registry_service.db.engine import Database  # noqa: PLC0415

    commit = git_commit()  # before anything runs: what is measured is this
    pg = PostgresDatabase()
    work = Path(tempfile.mkdtemp(prefix="lp-bench-history-"))
    await pg.create()
    try:
        db = Database(pg.async_url)
        try:
            await migrate.upgrade(db)
        finally:
            await db.close()
        print(f"database {pg.name}: migrated; loading {args.versions:,} versions",
              file=sys.stderr)
        data = await load(pg.url, args.versions, args.adapters, args.seed)
        counters = cpu_counters()
        service_results, plans = await measure_service(pg.async_url, data, args.samples)
        nats = NatsService(work)
        nats.start()
        try:
            env = {"LORAPLANE_DATABASE_URL": pg.url, "LORAPLANE_AUTO_MIGRATE": "false",
                   "LORAPLANE_NATS_URL": nats.url, "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN}
            with running_registry(work / "registry", env) as registry:
                api_results = await asyncio.to_thread(measure_api, registry.url, data,
                                                      args.samples)
            busy = busy_share(counters, cpu_counters())
        finally:
            nats.stop()
    finally:
        await pg.drop()
        shutil.rmtree(work, ignore_errors=True)
    results = api_results + service_results
    print(render(results, plans, data))
    print(f"commit {commit['commit']}{' (dirty)' if commit['dirty'] else ''}; machine CPU "
          f"busy (all processes) while measuring: {busy:.0%}; load average "
          f"{os.getloadavg()[0]:.2f}")
    return {"benchmark": "history_query", "commit": commit,
            "cpu_busy_share_while_measuring": round(busy, 2), "ratios": ratios(results),
            "dataset": asdict(data) | {"adapter_ids": None},
            "page_size": PAGE, "results": [asdict(r) for r in results], "plans": plans,
            "uses_keyset_index": {label: uses_index(p["plan"]) for label, p in plans.items()}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=1_000_000)
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=500, help="timed calls per page")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.adapters < 2:
        parser.error("--samples must be positive, --adapters at least 2 (the hot one and "
                     "a typical one)")
    # Every page timed is a full page: the hot adapter's middle one and a typical
    # adapter's first one.
    hot = args.versions // 10
    if hot < 2 * PAGE + 2 or (args.versions - hot) // (args.adapters - 1) < PAGE:
        parser.error(f"--versions {args.versions} over --adapters {args.adapters}: too few "
                     f"for full pages of {PAGE} (the hot adapter holds a tenth)")
    machine = machine_summary()
    document = {"machine": machine, **asyncio.run(run(args))}
    text = json.dumps(document, indent=2, default=str)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    return document


if __name__ == "__main__":
    main()
