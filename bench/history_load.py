"""Version and alias history at 1,000,000 versions: cold, and under 8 readers + pushes.

For each backend (``--backends postgres,sqlite``), a registry whose history is written
straight into its tables (``bench/history_data.py``: versions in upload order and the
alias moves pushes and promotions would have made), then:

1. **cold** (service layer, ``--cold-rounds`` times per query): the caches emptied,
   then one query timed in a fresh ``Database`` (after a ``SELECT 1`` that opens the
   connection), then the same query again, warm. On Postgres "emptied" is a restart of
   the benchmark's own cluster (shared_buffers empty) with its files evicted from the
   page cache; on SQLite the database file is evicted and the connection is new. See
   ``bench/coldcache.py`` for what that can and cannot reach.
2. **load** (API): ``loraplane registry serve`` on that database (SQLite: the embedded
   default, no database URL, the file in its data dir), 8 readers on their own
   connections looping over the queries, and phases without and with pushes of small
   adapters through the API (``bench/history_readers.py``). p50/p99 per query in each
   kind of phase, their ratio, and the pushes' latency.

    .venv/bin/python -m bench.history_load --versions 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.coldcache import evict, private_postgres, random_read_ms, resident_bytes
from bench.common import (
    busy_share,
    cpu_counters,
    git_commit,
    machine_summary,
    percentile,
    running_registry,
    table,
)
from bench.history_data import TENANT, History, load_postgres, load_sqlite
from bench.history_readers import Query, make_push_folders, queries, run_load, summarize

ADMIN_TOKEN = "lp_bench-history-load-admin-token-0123"
PAGE = 50
ALIAS_PAGE = 100
STARTUP_TIMEOUT_S = 900.0


@dataclass
class Backend:
    """One seeded database, and how to make its caches cold."""

    kind: str
    async_url: str
    registry_env: dict[str, str]
    files: list[Path]
    make_cold: Callable[[], int | None]
    load_seconds: float
    data_dir: Path  # the registry's; on SQLite it holds the seeded registry.db


def service_call(db: Any, spec: Query) -> Callable[[], Awaitable[int]]:
    from registry_service.aliases.service import alias_history  # noqa: PLC0415
    from registry_service.auth.roles import Principal, Role  # noqa: PLC0415
    from registry_service.versions.service import list_versions  # noqa: PLC0415

    principal = Principal(token_id=0, name="bench", role=Role.READER, tenant_id=1,
                          tenant=TENANT)

    async def call() -> int:
        async with db.session() as session:
            if spec.alias is not None:
                history = await alias_history(session, principal, spec.adapter, spec.alias,
                                              ALIAS_PAGE)
                return len(history.moves)
            page = await list_versions(session, principal, spec.adapter, limit=PAGE,
                                       cursor=None if spec.cursor is None else str(spec.cursor))
            return len(page.versions)
    return call


async def cold_round(backend: Backend, spec: Query) -> dict[str, Any]:
    from sqlalchemy import text  # noqa: PLC0415

    from registry_service.db.engine import Database  # noqa: PLC0415

    left = await asyncio.to_thread(backend.make_cold)
    db = Database(backend.async_url)
    try:
        async with db.session() as session:
            await session.execute(text("SELECT 1"))
        call = service_call(db, spec)
        t0 = time.perf_counter()
        rows = await call()
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        await call()
        warm = time.perf_counter() - t0
    finally:
        await db.close()
    if rows == 0:
        raise RuntimeError(f"{spec.label}: no rows")
    return {"cold_ms": cold * 1000, "warm_ms": warm * 1000, "cached_bytes_left": left}


async def measure_cold(backend: Backend, specs: list[Query], rounds: int) -> list[dict[str, Any]]:
    out = []
    for spec in specs:
        runs = [await cold_round(backend, spec) for _ in range(rounds)]
        cold = [r["cold_ms"] for r in runs]
        warm = [r["warm_ms"] for r in runs]
        out.append({"query": spec.label, "rounds": rounds, "cold_ms": cold, "warm_ms": warm,
                    "cold_median_ms": percentile(cold, 50),
                    "warm_median_ms": percentile(warm, 50),
                    "cached_bytes_left": [r["cached_bytes_left"] for r in runs]})
    return out


# The alias-history statement before and after this benchmark's fix, for hot/latest:
# sorting every move of the alias by id, against the (alias_id, revision) index.
SHAPES = {
    "ORDER BY alias_moves.id (before)":
        "SELECT m.id, f.number, t.number FROM alias_moves m JOIN aliases a ON a.id = m.alias_id "
        "LEFT JOIN versions f ON f.id = m.from_version_id "
        "LEFT JOIN versions t ON t.id = m.to_version_id "
        "WHERE a.adapter_id = 1 AND a.name = 'latest' ORDER BY m.id DESC LIMIT 100",
    "ORDER BY alias_moves.revision (after)":
        "SELECT m.id, f.number, t.number FROM alias_moves m "
        "LEFT JOIN versions f ON f.id = m.from_version_id "
        "LEFT JOIN versions t ON t.id = m.to_version_id "
        "WHERE m.alias_id = 1 ORDER BY m.revision DESC LIMIT 101",
}


async def measure_shapes(url: str, samples: int) -> list[dict[str, Any]]:
    """Both statements, warm, taking turns; the hot adapter's ``latest`` is alias 1."""
    from sqlalchemy import text  # noqa: PLC0415

    from registry_service.db.engine import Database  # noqa: PLC0415

    db = Database(url)
    times: dict[str, list[float]] = {label: [] for label in SHAPES}
    try:
        async with db.session() as session:
            for _ in range(samples + 1):  # the first round warms up
                for label, statement in SHAPES.items():
                    t0 = time.perf_counter()
                    rows = (await session.execute(text(statement))).all()
                    times[label].append((time.perf_counter() - t0) * 1000)
                    if len(rows) < 100:
                        raise RuntimeError(f"{label}: {len(rows)} rows")
    finally:
        await db.close()
    return [{"statement": label, "n": samples, "p50_ms": percentile(spent[1:], 50),
             "max_ms": max(spent[1:])} for label, spent in times.items()]


async def _migrate(url: str) -> None:
    from registry_service.db import migrate  # noqa: PLC0415
    from registry_service.db.engine import Database  # noqa: PLC0415

    db = Database(url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.close()


@asynccontextmanager
async def postgres_backend(work: Path, history: History) -> AsyncIterator[Backend]:
    with private_postgres(work / "pg") as cluster:
        await _migrate(cluster.async_url)
        t0 = time.perf_counter()
        await load_postgres(cluster.url, history)
        seconds = time.perf_counter() - t0
        yield Backend("postgres", cluster.async_url,
                      {"LORAPLANE_DATABASE_URL": cluster.url,
                       "LORAPLANE_AUTO_MIGRATE": "false"},
                      [cluster.data / "base"], cluster.restart_cold, seconds,
                      work / "registry")


@asynccontextmanager
async def sqlite_backend(work: Path, history: History) -> AsyncIterator[Backend]:
    data_dir = work / "sqlite-registry"
    data_dir.mkdir(parents=True)
    path = data_dir / "registry.db"
    url = f"sqlite+aiosqlite:///{path}"
    await _migrate(url)
    t0 = time.perf_counter()
    await asyncio.to_thread(load_sqlite, str(path), history)
    seconds = time.perf_counter() - t0
    files = [path, path.with_name("registry.db-wal")]

    def make_cold() -> int | None:
        evict(files)
        return resident_bytes([path])

    yield Backend("sqlite", url, {}, files, make_cold, seconds, data_dir)


BACKENDS = {"postgres": postgres_backend, "sqlite": sqlite_backend}


def storage(backend: Backend) -> dict[str, Any]:
    """Size of the database files, and what an uncached 8 KiB read costs on them."""
    files = [p for f in backend.files for p in ([f] if f.is_file() else f.rglob("*"))
             if p.is_file()]
    biggest = max(files, key=lambda p: p.stat().st_size)
    reads = random_read_ms(biggest)
    return {"bytes": sum(p.stat().st_size for p in files),
            "uncached_8k_read_p50_ms": percentile(reads, 50),
            "uncached_8k_read_p99_ms": percentile(reads, 99)}


async def measure_backend(kind: str, args: argparse.Namespace, work: Path,
                          folders: list[Path]) -> dict[str, Any]:
    from devharness.services import NatsService  # noqa: PLC0415

    history = History(args.versions, args.adapters, args.seed)
    specs = queries(history.hot_versions)
    async with BACKENDS[kind](work / kind, history) as backend:
        print(f"{kind}: loaded in {backend.load_seconds:.0f} s; cold rounds", file=sys.stderr)
        disk = storage(backend)
        cold = await measure_cold(backend, specs, args.cold_rounds)
        shapes = await measure_shapes(backend.async_url, args.shape_samples)
        nats = NatsService(work / f"nats-{kind}")
        nats.start()
        try:
            env = {"LORAPLANE_NATS_URL": nats.url, "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN,
                   **backend.registry_env}
            print(f"{kind}: readers and pushes", file=sys.stderr)
            t0 = time.perf_counter()
            # At start-up the blob collector reads every version's files before /readyz
            # can answer (registry_service/blobs/gc.py): minutes at 1,000,000 versions.
            with running_registry(backend.data_dir, env,
                                  startup_timeout_s=STARTUP_TIMEOUT_S) as registry:
                ready_s = time.perf_counter() - t0
                print(f"{kind}: registry ready after {ready_s:.0f} s", file=sys.stderr)
                load = await run_load(registry.url, ADMIN_TOKEN, specs, page=PAGE,
                                      readers=args.readers, phases=args.phases,
                                      phase_s=args.phase_seconds,
                                      push_interval_s=args.push_interval, folders=folders,
                                      min_pushes=args.min_pushes)
        finally:
            nats.stop()
    return {"backend": kind, "versions": history.versions, "adapters": history.adapters,
            "hot_versions": history.hot_versions, "alias_moves": history.moves,
            "load_seconds": backend.load_seconds, "storage": disk, "cold": cold,
            "alias_history_shapes": shapes, "registry_ready_s": ready_s,
            "load": summarize(load, specs)}


def render(result: dict[str, Any]) -> str:
    disk = result["storage"]
    out = [f"== {result['backend']}: {result['versions']:,} versions over "
           f"{result['adapters']:,} adapters (hot: {result['hot_versions']:,}), "
           f"{result['alias_moves']:,} alias moves; {disk['bytes'] / 2**20:.0f} MiB on disk, "
           f"loaded in {result['load_seconds']:.0f} s; an uncached 8 KiB read: p50 "
           f"{disk['uncached_8k_read_p50_ms']:.2f} ms, p99 "
           f"{disk['uncached_8k_read_p99_ms']:.2f} ms", ""]
    out.append(table(["query (service layer)", "rounds", "cold median ms", "warm median ms",
                      "cold/warm", "cached bytes left"],
                     [[c["query"], c["rounds"], f"{c['cold_median_ms']:.1f}",
                       f"{c['warm_median_ms']:.1f}",
                       f"{c['cold_median_ms'] / c['warm_median_ms']:.1f}x",
                       max((b or 0) for b in c["cached_bytes_left"])]
                      for c in result["cold"]]))
    out += ["", table(["alias history hot/latest, SQL (warm)", "n", "p50 ms", "max ms"],
                      [[r["statement"], r["n"], f"{r['p50_ms']:.2f}", f"{r['max_ms']:.2f}"]
                       for r in result["alias_history_shapes"]])]
    load = result["load"]
    out += ["", table(["query (API, 8 readers)", "n quiet", "n pushing", "quiet p50",
                       "quiet p99", "pushing p50", "pushing p99", "p50 x", "p99 x"],
                      [[r["query"], r["n_quiet"], r["n_pushing"], f"{r['quiet_p50_ms']:.1f}",
                        f"{r['quiet_p99_ms']:.1f}", f"{r['pushing_p50_ms']:.1f}",
                        f"{r['pushing_p99_ms']:.1f}", f"{r['p50_ratio']:.2f}",
                        f"{r['p99_ratio']:.2f}"] for r in load["reads"]])]
    pushes = load["pushes"]
    out.append(f"registry ready {result['registry_ready_s']:.0f} s after its start; "
               f"pushes: {pushes['n']} ({pushes['per_s']:.2f}/s), p50 "
               f"{pushes['p50_ms'] or 0:.0f} ms, p99 {pushes['p99_ms'] or 0:.0f} ms, max "
               f"{pushes['max_ms'] or 0:.0f} ms; {pushes['error_count']} failed")
    return "\n".join(out)


def _work_dir() -> Path:
    work = Path(tempfile.mkdtemp(prefix="lp-bench-history-load-"))
    work.chmod(0o755)  # the private cluster runs as the postgres user
    return work


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    work = _work_dir()
    try:
        # Twice what the phases' length and --min-pushes call for: a phase that runs
        # over its length pushes on (bench/history_readers.py stops when none are left).
        per_phase = int(args.phase_seconds / args.push_interval) + 1 + args.min_pushes
        pushes = 2 * per_phase * args.phases
        folders = await asyncio.to_thread(make_push_folders, work / "adapters", pushes)
        results = []
        for kind in args.backends:
            results.append(await measure_backend(kind, args, work, folders))
            print(render(results[-1]), file=sys.stderr)  # a later failure keeps this
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=1_000_000)
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--backends", default="postgres,sqlite",
                        type=lambda s: [b for b in s.split(",") if b])
    parser.add_argument("--cold-rounds", type=int, default=3)
    parser.add_argument("--shape-samples", type=int, default=10,
                        help="timed runs of each alias-history statement")
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--phases", type=int, default=2,
                        help="quiet + pushing pairs")
    parser.add_argument("--phase-seconds", type=float, default=20.0)
    parser.add_argument("--push-interval", type=float, default=0.5,
                        help="seconds between push starts")
    parser.add_argument("--min-pushes", type=int, default=2,
                        help="a pushing phase lasts until this many pushes have ended in "
                             "it, longer than --phase-seconds if need be")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    unknown = set(args.backends) - set(BACKENDS)
    if unknown or not args.backends:
        parser.error(f"--backends: choose from {sorted(BACKENDS)}")
    counts = (args.cold_rounds, args.readers, args.phases, args.shape_samples,
              args.min_pushes)
    if min(counts) < 1 or args.phase_seconds <= 0:
        parser.error("--cold-rounds, --shape-samples, --readers, --phases, --min-pushes "
                     "and --phase-seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    machine = machine_summary()
    counters = cpu_counters()
    results = asyncio.run(run(args))
    document = {"benchmark": "history_load", "machine": machine, **git_commit(),
                "command": " ".join(sys.argv), "options": vars(args) | {"json_out": None},
                "cpu_busy_share": round(busy_share(counters, cpu_counters()), 2),
                "loadavg_1m_at_end": round(os.getloadavg()[0], 2), "results": results}
    for result in results:
        print(render(result))
    print(f"machine CPU busy (all processes): {document['cpu_busy_share']:.0%}; load average "
          f"{machine['loadavg_1m_at_start']} at start, {document['loadavg_1m_at_end']} at end")
    text = json.dumps(document, indent=2, default=str)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    return document


if __name__ == "__main__":
    main()
