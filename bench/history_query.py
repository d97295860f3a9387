"""p50/p99/max of the version-history query with 1,000,000 versions in Postgres, while
the registry's background work runs as in production.

A fresh database is created on the machine's Postgres (``$LORAPLANE_TEST_DATABASE_URL``,
default ``postgresql://postgres@127.0.0.1:5432/postgres``), migrated with the
registry's own migrations, and filled with ``COPY`` (``bench/history_data.py``):
``--versions`` rows over ``--adapters`` adapters, one hot adapter holding 10% of them,
written in upload order, with the alias moves and ``version_blobs`` rows those uploads
imply. A local blob store holds a file for every digest the versions name, plus
``--orphans`` unreferenced old ones.

Then, for the hot adapter's first page, a page in the middle of its history and one
near its end (and a typical adapter's first page), each ``--samples`` times:

- ``api``: ``GET /v1/adapters/{name}/versions?limit=50[&cursor=N]`` on a real
  registry process (``loraplane registry serve`` on this database and that store), one
  keep-alive connection, end to end. Meanwhile the blob collector runs a pass every
  ``--gc-interval`` s (the window opens once one is running; the share of the window a
  pass ran is sampled from ``/metrics``), and ``--agents`` agents report their status
  every ``--report-interval`` s, from a process of their own. The registry's event-loop
  lag histogram is read over the same window (two scrapes);
- ``api, no background``: the same calls on a registry with no background work (the
  same database, an empty store, no agents), once before the busy phase and once after;
- ``service``: ``registry_service.versions.history.history_page`` (what the route
  answers, as JSON bytes) called directly in a session of the registry's own
  ``Database``, before the registry starts;
- ``sql``: the keyset statement the service sends, captured from SQLAlchemy, run
  alone through asyncpg; ``sql offset`` (in the middle only): the same page by ``OFFSET``.

Goals (issue 41): API p99 < 10 ms and loop-lag p99 < 5 ms, and the same goals as
ratios within the run (``goals``), for a machine slower than the issue's. ``EXPLAIN
(ANALYZE, BUFFERS)`` of the keyset statement shows which index it uses. The database and the
store are removed at the end, whatever happens.

    .venv/bin/python -m bench.history_query --versions 1000000 --samples 500
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.background import (
    GC_RUNNING,
    LOOP_LAG,
    AgentFleet,
    GcWatch,
    agent_tokens,
    histogram_delta,
    lag_summary,
    loop_stalls,
    scrape,
    wait_for_pass,
    wait_for_quiet,
)
from bench.common import (
    busy_share,
    cpu_counters,
    git_commit,
    machine_summary,
    running_registry,
    table,
)
from bench.history_data import HOT, migrate_fresh, write_blob_store
from bench.history_layers import (
    INDEX,
    PAGE,
    WARMUP,
    Dataset,
    Result,
    load,
    measure_service,
    positions,
    timed_result,
    uses_index,
)

ADMIN_TOKEN = "lp_bench-history-admin-token-0123456789"
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
QUIET = "api, no background"

# --- the API, under the background work -----------------------------------------------------


def _gets(client: httpx.Client, specs: list[tuple[str, str, int | None]]
          ) -> list[Callable[[], None]]:
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
    return gets


@dataclass
class Background:
    """What ran beside the API's timed calls: the collector, the agents, the loop."""

    window: dict[str, Any]
    agents: dict[str, Any]
    # Stalls the registry's watchdog logged (over its whole run, start-up included).
    stalls: dict[str, Any] = field(default_factory=dict)
    # The loop lag on the registry with no background work, over both quiet phases.
    quiet_lag: dict[str, Any] = field(default_factory=dict)

    @property
    def loop_lag(self) -> dict[str, Any]:
        lag: dict[str, Any] = self.window["loop_lag"]
        return lag


def _warm(gets: list[Callable[[], None]]) -> None:
    for warm in gets:
        for _ in range(WARMUP):
            warm()


def _rounds(gets: list[Callable[[], None]], samples: int) -> list[list[float]]:
    """Seconds per call, each get ``samples`` times, taking turns."""
    times: list[list[float]] = [[] for _ in gets]
    for _ in range(samples):
        for timed, spent in zip(gets, times, strict=True):
            t0 = time.perf_counter()
            timed()
            spent.append(time.perf_counter() - t0)
    return times


def measure_api(registry_url: str, data: Dataset, samples: int, fleet: AgentFleet,
                gc_wait_s: float) -> tuple[list[Result], Background]:
    """Time every page ``samples`` times, taking turns, in a window that opens while a
    collector pass runs."""
    specs = positions(data.hot_versions)
    with httpx.Client(base_url=registry_url, headers=HEADERS, timeout=30) as client:
        gets = _gets(client, specs)
        _warm(gets)
        with GcWatch(registry_url, wait_for_pass(client, registry_url, gc_wait_s)) as watch:
            times = _rounds(gets, samples)
    closed = watch.closed.at if watch.closed else time.monotonic()
    background = Background(watch.summary(), fleet.summary(watch.opened.at, closed))
    return [timed_result("api", label, adapter, cursor, spent)
            for (label, adapter, cursor), spent in zip(specs, times, strict=True)], background


def measure_quiet(registry_url: str, data: Dataset, samples: int
                  ) -> tuple[list[list[float]], list[tuple[float, float]]]:
    """The same calls on a registry with no background work (its start-up pass over an
    empty store over, no agents): seconds per call per page, and the lag histogram's
    counts meanwhile."""
    with httpx.Client(base_url=registry_url, headers=HEADERS, timeout=30) as client:
        wait_for_quiet(client, registry_url, 120.0)
        gets = _gets(client, positions(data.hot_versions))
        _warm(gets)
        before = scrape(client, registry_url)
        times = _rounds(gets, samples)
        after = scrape(client, registry_url)
    return times, histogram_delta(before, after, LOOP_LAG)


# --- main ----------------------------------------------------------------------------------

def render(results: list[Result], plans: dict[str, Any], data: Dataset) -> str:
    order = {"api": 0, QUIET: 1, "service": 2, "sql": 3}
    ranked = sorted(results, key=lambda r: (order.get(r.layer, 4), r.position != "first page"))
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


def goals(results: list[Result], background: Background) -> dict[str, dict[str, Any]]:
    """Issue 41's goals under a collector pass: the slowest page's API p99 and the loop
    lag's p99, in ms as the issue states them and as ratios within this run. The ratios
    carry the issue's own figures to another machine: its 10 ms was about twice the API
    p99 with the collector held back (4.8-5.4 ms), its 5 ms lag 1.39x the API p50
    (3.6 ms)."""
    api_p99 = max(r.p99_ms for r in results if r.layer == "api")
    quiet_p99 = max(r.p99_ms for r in results if r.layer == QUIET)
    quiet_p50 = max(r.p50_ms for r in results if r.layer == QUIET)
    lag_p99 = background.window["loop_lag"]["p99_ms"]
    return {
        "history API p99 (slowest page)": _goal(api_p99, 10.0, "ms"),
        "event-loop lag p99": _goal(lag_p99, 5.0, "ms"),
        "history API p99, busy / no background": _goal(api_p99 / quiet_p99, 2.0, "x"),
        "event-loop lag p99 / API p50 with no background": _goal(lag_p99 / quiet_p50,
                                                                 round(5.0 / 3.6, 2), "x")}


def _goal(value: float, goal: float, unit: str) -> dict[str, Any]:
    return {"value": round(value, 2), "goal": goal, "unit": unit, "met": value < goal}


def render_background(background: Background, met: dict[str, dict[str, Any]]) -> str:
    w, a, lag = background.window, background.agents, background.loop_lag
    lines = [
        f"blob collector: a pass running in {w['gc_running_share']:.0%} of the "
        f"{w['window_s']:.1f} s window ({w['gc_running_samples']} samples of "
        f"{GC_RUNNING}); {w['gc_passes_ended']} passes ended, {w['gc_blobs_examined']:,} "
        f"blobs examined, {w['gc_deleted']:,} deleted in it",
        f"agents: {a['agents']} x {a['adapters_each']} adapters, a report every "
        f"{a['interval_s']:g} s: {a['reports']} reports in the window, p50/p99/max "
        f"{_ms(a['p50_ms'])}/{_ms(a['p99_ms'])}/{_ms(a['max_ms'])} ms, {a['errors']} errors",
        f"event-loop lag ({LOOP_LAG}, {lag['ticks']} ticks in the window): p50 "
        f"{lag['p50_ms']:.2f} ms, p99 {lag['p99_ms']:.2f} ms (in bucket "
        f"({_bucket(lag['p99_bucket_ms'])}] ms, interpolated as histogram_quantile does), "
        f"highest bucket reached ({_bucket(lag['max_bucket_ms'])}] ms"]
    st = background.stalls
    lines.append(f"stalls the registry's watchdog logged over its whole run: {st['count']}, "
                 f"{st['seconds_in_all']:.1f} s in all, the longest {st['longest_s']:.2f} s; "
                 "most named: " + "; ".join(f"{n}x {place}" for place, n in st["most_named"]))
    quiet = background.quiet_lag
    lines.append(f"event-loop lag with no background work ({quiet['ticks']} ticks): p50 "
                 f"{quiet['p50_ms']:.2f} ms, p99 {quiet['p99_ms']:.2f} ms")
    lines += [f"goal {name} < {g['goal']:g} {g['unit']}: {g['value']:.2f} {g['unit']}, "
              f"{'met' if g['met'] else 'NOT MET'}" for name, g in met.items()]
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _bucket(bounds: list[float]) -> str:
    return ", ".join(f"{b:g}" for b in bounds)


def _registry_env(pg_url: str, nats_url: str, args: argparse.Namespace) -> dict[str, str]:
    return {"LORAPLANE_DATABASE_URL": pg_url, "LORAPLANE_AUTO_MIGRATE": "false",
            "LORAPLANE_NATS_URL": nats_url, "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN,
            "LORAPLANE_BLOB_GC_INTERVAL_S": str(args.gc_interval),
            "LORAPLANE_BLOB_GC_GRACE_S": str(args.gc_grace)} | (
                {} if args.gil_switch_interval is None
                else {"LORAPLANE_GIL_SWITCH_INTERVAL_S": str(args.gil_switch_interval)}) | (
                {} if args.gc_busy_share is None
                else {"LORAPLANE_BLOB_GC_BUSY_SHARE": str(args.gc_busy_share)})


def _quiet_env(pg_url: str, nats_url: str, args: argparse.Namespace) -> dict[str, str]:
    return _registry_env(pg_url, nats_url, args) | {"LORAPLANE_BLOB_GC_INTERVAL_S": "3600"}


async def _without_background(pg_url: str, nats_url: str, work: Path, data: Dataset,
                              args: argparse.Namespace) -> tuple[list[list[float]],
                                                                 list[tuple[float, float]]]:
    """One quiet phase: a registry on the same database with an empty store (its
    start-up pass has nothing to list) and no agents."""
    with running_registry(work / "quiet", _quiet_env(pg_url, nats_url, args)) as reg:
        return await asyncio.to_thread(measure_quiet, reg.url, data, args.samples)


async def _under_background(pg_url: str, work: Path, data: Dataset,
                            args: argparse.Namespace) -> tuple[list[Result], Background]:
    """Quiet, busy, quiet: the quiet phases bracket the busy one so that a drift of the
    machine's speed falls on both sides of the ratio."""
    from devharness.services import NatsService  # noqa: PLC0415

    nats = NatsService(work)
    nats.start()
    try:
        before, lag_before = await _without_background(pg_url, nats.url, work, data, args)
        with running_registry(work / "registry", _registry_env(pg_url, nats.url, args)) as reg:
            tokens = agent_tokens(reg.url, ADMIN_TOKEN, args.agents)
            with AgentFleet(reg.url, tokens, args.agent_adapters, args.report_interval) as fleet:
                results, background = await asyncio.to_thread(
                    measure_api, reg.url, data, args.samples, fleet, args.gc_wait)
        background.stalls = loop_stalls(reg.log)
        after, lag_after = await _without_background(pg_url, nats.url, work, data, args)
    finally:
        nats.stop()
    background.quiet_lag = lag_summary([(le, n + dict(lag_after)[le]) for le, n in lag_before])
    quiet = [timed_result(QUIET, label, adapter, cursor, a + b) for (label, adapter, cursor), a, b
             in zip(positions(data.hot_versions), before, after, strict=True)]
    return results + quiet, background


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from devharness.services import PostgresDatabase  # noqa: PLC0415

    commit = git_commit()  # before anything runs: what is measured is this
    pg = PostgresDatabase()
    work = Path(tempfile.mkdtemp(prefix="lp-bench-history-"))
    await pg.create()
    try:
        await migrate_fresh(pg.async_url)
        print(f"database {pg.name}: migrated; loading {args.versions:,} versions",
              file=sys.stderr)
        data = await load(pg.url, args.versions, args.adapters, args.seed)
        t0 = time.perf_counter()
        stored = write_blob_store(work / "registry" / "blobs", args.versions, args.orphans)
        store_s = time.perf_counter() - t0
        print(f"blob store: {stored[0]:,} referenced + {stored[1]:,} orphan files in "
              f"{store_s:.0f} s", file=sys.stderr)
        counters = cpu_counters()
        service_results, plans = await measure_service(pg.async_url, data, args.samples)
        api_results, background = await _under_background(pg.url, work, data, args)
        busy = busy_share(counters, cpu_counters())
    finally:
        await pg.drop()
        shutil.rmtree(work, ignore_errors=True)
    results = api_results + service_results
    met = goals(results, background)
    print(render(results, plans, data))
    print(render_background(background, met))
    print(f"commit {commit['commit']}{' (dirty)' if commit['dirty'] else ''}; machine CPU "
          f"busy (all processes) while measuring: {busy:.0%}; load average "
          f"{os.getloadavg()[0]:.2f}")
    if background.window["gc_running_share"] <= 0:
        raise RuntimeError("NO COLLECTOR PASS RAN DURING THE MEASUREMENT: not the "
                           "production conditions this benchmark is for")
    return {"benchmark": "history_query", "commit": commit,
            "cpu_busy_share_while_measuring": round(busy, 2), "ratios": ratios(results),
            "dataset": asdict(data) | {"adapter_ids": None},
            "blob_store": {"referenced": stored[0], "orphans": stored[1],
                           "written_s": round(store_s, 1)},
            "options": {k: getattr(args, k) for k in ("gc_interval", "gc_grace", "agents",
                                                       "agent_adapters", "report_interval",
                                                       "gil_switch_interval",
                                                       "gc_busy_share")},
            "background": asdict(background), "goals": met,
            "page_size": PAGE, "results": [asdict(r) for r in results], "plans": plans,
            "uses_keyset_index": {label: uses_index(p["plan"]) for label, p in plans.items()}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=1_000_000)
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=500, help="timed calls per page")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--orphans", type=int, default=1000,
                        help="unreferenced old blobs in the store besides the versions' (1000)")
    parser.add_argument("--gc-interval", type=float, default=1.0,
                        help="the registry's blob_gc_interval_s: seconds between passes (1)")
    parser.add_argument("--gc-grace", type=float, default=60.0,
                        help="the registry's blob_gc_grace_s (60)")
    parser.add_argument("--gc-busy-share", type=float, default=None,
                        help="the registry's blob_gc_busy_share (its default when absent)")
    parser.add_argument("--gc-wait", type=float, default=600.0,
                        help="longest wait for a collector pass to start (600 s)")
    parser.add_argument("--agents", type=int, default=100, help="reporting agents (100)")
    parser.add_argument("--agent-adapters", type=int, default=100,
                        help="adapters each agent serves, in its report (100)")
    parser.add_argument("--report-interval", type=float, default=30.0,
                        help="seconds between an agent's reports (30, the agents' default)")
    parser.add_argument("--gil-switch-interval", type=float, default=None,
                        help="the registry's gil_switch_interval_s (its default when absent)")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.adapters < 2 or args.agents < 1 or args.orphans < 0:
        parser.error("--samples and --agents must be positive, --adapters at least 2 (the "
                     "hot one and a typical one), --orphans not negative")
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
