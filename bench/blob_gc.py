"""One blob collector pass at scale: its time, the registry's memory during it, and that
it deletes exactly the unreferenced blobs.

For each ``--versions`` (by default 100,000 then 1,000,000): a fresh Postgres database
filled as ``bench/history_query.py`` fills it (``bench/history_data.py``: versions,
alias moves, ``version_blobs``), a registry process (``loraplane registry serve``) on it
with a local blob store and no background pass after its start-up one, then a store
laid out under it: an empty file for every digest the versions name (two per version)
and ``--orphans`` files no version names, all a week old. Then one pass,
``POST /v1/admin/blob-gc``, timed end to end, with the registry's VmRSS sampled at
20 Hz and its high-water mark reset before (``bench/common.py: RssSampler``) and its
event-loop lag histogram read before and after (and the stalls its watchdog logged
counted). Afterwards the store is counted: every
referenced file must remain and every orphan be gone. Memory is flat when the peak
growth at the largest size is about that at the smallest.

    .venv/bin/python -m bench.blob_gc --versions 100000 1000000 --orphans 10000
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.background import (
    GC_PASS,
    GC_RUNNING,
    LOOP_LAG,
    histogram_delta,
    lag_summary,
    loop_stalls,
    scrape,
)
from bench.common import RssSampler, git_commit, machine_summary, record, running_registry, table
from bench.history_data import migrate_fresh, store_census, write_blob_store
from bench.history_layers import load

ADMIN_TOKEN = "lp_bench-blob-gc-admin-token-0123456789"
KIB_PER_MIB = 1024


def _wait_idle(client: httpx.Client, url: str, timeout_s: float = 300.0) -> None:
    """Until the start-up pass (over the still empty store) has ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = scrape(client, url)
        if seen.value(f"{GC_PASS}_count") >= 1 and seen.value(GC_RUNNING) == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("the registry's start-up collector pass did not end")


def one_pass(url: str, pid: int, blob_root: Path, versions: int, orphans: int
             ) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=None) as client:
        _wait_idle(client, url)
        t0 = time.perf_counter()
        referenced, orphaned = write_blob_store(blob_root, versions, orphans)
        written_s = time.perf_counter() - t0
        print(f"  store: {referenced:,} referenced + {orphaned:,} orphan files in "
              f"{written_s:.0f} s; collecting", file=sys.stderr)
        before = scrape(client, url)
        with RssSampler(pid) as rss:
            t0 = time.perf_counter()
            response = client.post("/v1/admin/blob-gc")
            pass_s = time.perf_counter() - t0
        response.raise_for_status()
        after = scrape(client, url)
    census = store_census(blob_root, versions, orphans)
    report = response.json()
    exact = (report["deleted"] == orphans and census["referenced_missing"] == 0
             and census["orphans_present"] == 0 and census["other_files"] == 0)
    return {"versions": versions, "referenced_files": referenced, "orphan_files": orphaned,
            "store_written_s": round(written_s, 1), "pass_s": round(pass_s, 2),
            "report": report, "census": census, "exact": exact,
            "rss_before_mib": round(rss.start_kb / KIB_PER_MIB, 1),
            "rss_peak_mib": round(rss.peak_kb / KIB_PER_MIB, 1),
            "rss_growth_mib": round((rss.peak_kb - rss.start_kb) / KIB_PER_MIB, 1),
            "hwm_reset": rss.hwm_reset,
            "loop_lag": lag_summary(histogram_delta(before, after, LOOP_LAG))}


async def measure(versions: int, args: argparse.Namespace) -> dict[str, Any]:
    from devharness.services import NatsService, PostgresDatabase  # noqa: PLC0415

    pg = PostgresDatabase()
    work = Path(tempfile.mkdtemp(prefix="lp-bench-blob-gc-"))
    await pg.create()
    try:
        await migrate_fresh(pg.async_url)
        print(f"{versions:,} versions: loading", file=sys.stderr)
        data = await load(pg.url, versions, args.adapters, args.seed)
        nats = NatsService(work)
        nats.start()
        try:
            env = {"LORAPLANE_DATABASE_URL": pg.url, "LORAPLANE_AUTO_MIGRATE": "false",
                   "LORAPLANE_NATS_URL": nats.url, "LORAPLANE_ADMIN_TOKEN": ADMIN_TOKEN,
                   # Only the start-up pass (over an empty store) and the one timed.
                   "LORAPLANE_BLOB_GC_INTERVAL_S": "86400", "LORAPLANE_BLOB_GC_GRACE_S": "60"}
            if args.gc_busy_share is not None:
                env["LORAPLANE_BLOB_GC_BUSY_SHARE"] = str(args.gc_busy_share)
            with running_registry(work / "registry", env) as registry:
                result = await asyncio.to_thread(one_pass, registry.url, registry.pid,
                                                 registry.data_dir / "blobs", versions,
                                                 args.orphans)
            result["stalls"] = loop_stalls(registry.log)
        finally:
            nats.stop()
    finally:
        await pg.drop()
        shutil.rmtree(work, ignore_errors=True)
    return result | {"load_s": round(data.seconds, 1)}


def render(results: list[dict[str, Any]]) -> str:
    rows = [[f"{r['versions']:,}", f"{r['referenced_files']:,}", f"{r['orphan_files']:,}",
             f"{r['pass_s']:.1f}", f"{r['report']['examined']:,}",
             f"{r['report']['deleted']:,}", "yes" if r["exact"] else "NO",
             r["rss_before_mib"], r["rss_peak_mib"], r["rss_growth_mib"],
             f"{r['loop_lag']['p99_ms']:.2f}",
             "({}, {}]".format(*(f"{b:g}" for b in r["loop_lag"]["max_bucket_ms"])),
             f"{r['stalls']['count']} ({r['stalls']['longest_s']:.2f})"]
            for r in results]
    return table(["versions", "referenced blobs", "orphans", "pass s", "examined", "deleted",
                  "exactly the orphans", "RSS before MiB", "peak MiB", "growth MiB",
                  "loop lag p99 ms", "highest lag bucket ms",
                  "stalls logged (longest s)"], rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--versions", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--orphans", type=int, default=10_000,
                        help="unreferenced old blobs in the store (10,000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gc-busy-share", type=float, default=None,
                        help="the registry's blob_gc_busy_share (its default when absent)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.adapters < 2 or args.orphans < 0 or min(args.versions) < args.adapters:
        parser.error("--adapters at least 2, --versions at least one per adapter, "
                     "--orphans not negative")
    commit, machine = git_commit(), machine_summary()
    results = [asyncio.run(measure(versions, args)) for versions in args.versions]
    print(render(results))
    small, large = results[0], results[-1]
    flat = {"peak_ratio": round(large["rss_peak_mib"] / small["rss_peak_mib"], 3),
            "growth_mib": [small["rss_growth_mib"], large["rss_growth_mib"]]}
    print(f"peak RSS at {large['versions']:,} versions / at {small['versions']:,}: "
          f"{flat['peak_ratio']:.2f}x (growth during the pass {flat['growth_mib'][0]} → "
          f"{flat['growth_mib'][1]} MiB)")
    if not all(r["exact"] for r in results):
        print("THE COLLECTOR DID NOT DELETE EXACTLY THE ORPHANS", file=sys.stderr)
    return record("blob_gc", commit, machine, args.json_out, orphans=args.orphans,
                  adapters=args.adapters, gc_busy_share=args.gc_busy_share,
                  results=results, memory=flat)


if __name__ == "__main__":
    main()
