"""Commit -> event on the stream: the outbox relay with and without the hand-over.

In one process, on a fresh Postgres database (or ``--sqlite``) and a ``nats-server``:
a commit writes one outbox row (``adapter_deleted``, as a use case's would), and a core
NATS subscriber stamps its arrival. Rounds alternate between a relay that publishes the
rows a commit hands it (``hand-over``) and one that claims them first in a transaction
of its own (``claim``, the design before), so the shared machine's noise falls on both
alike; the ratio of the medians is per pair of rounds.

    .venv/bin/python -m bench.relay_latency --rounds 10 --commits 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

from bench.agent_setup import MachineLoad
from bench.common import git_commit, percentile
from devharness.services import NatsService, PostgresDatabase
from loraplane.events import STREAM_SUBJECTS, AdapterDeleted
from registry_service.db.engine import Database
from registry_service.db.migrate import upgrade
from registry_service.events.relay import EventRelay
from registry_service.events.service import envelope, record_event
from registry_service.metrics import RegistryMetrics
from registry_service.settings import RegistrySettings

MODES = ("hand-over", "claim")


async def one_round(db: Database, url: str, settings: RegistrySettings, hand_over: bool,
                    commits: int) -> list[float]:
    """``commits`` sequential commits; commit -> arrival at a subscriber, each. ``db``
    is this round's own: its relay is the only listener of its commits."""
    arrived: dict[str, float] = {}
    news = asyncio.Event()

    async def on_message(message: Any) -> None:
        arrived[json.loads(message.data)["event_id"]] = time.perf_counter()
        news.set()

    # The commit's time, taken by the first listener of its outbox rows, right after the
    # database committed and before the relay hears of them: the bench's own coroutine
    # may resume after the event has already arrived, on a loaded machine.
    committed_at: list[float] = []

    def stamp(_rows: Any) -> None:
        committed_at.append(time.perf_counter())

    client = await nats.connect(url)
    await client.subscribe(STREAM_SUBJECTS, cb=on_message)
    relay = EventRelay(db, url, settings=settings, metrics=RegistryMetrics(),
                       hand_over=hand_over)
    db.on_outbox_commit(stamp)
    db.on_outbox_commit(relay.notify)
    await relay.start()
    delays = []
    try:
        for _ in range(commits):
            async with db.session() as session:
                event = AdapterDeleted(**envelope("bench", "relay"), base_model="tiny")
                record_event(session, event, actor="bench")
                await session.commit()
            while event.event_id not in arrived:
                news.clear()
                await asyncio.wait_for(news.wait(), 30)
            delays.append(arrived[event.event_id] - committed_at[-1])
    finally:
        await relay.stop()
        await client.close()
        await db.close()
    return delays


async def measure(url: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    schema = Database(url)
    await upgrade(schema)
    await schema.close()
    settings = RegistrySettings(data_dir=work / "data", relay_poll_interval_s=1.0)
    rounds: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    for index in range(args.rounds):
        # Alternate which mode goes first, so neither always follows the other.
        order = MODES if index % 2 == 0 else MODES[::-1]
        for mode in order:
            rounds[mode].append(await one_round(Database(url), args.nats_url, settings,
                                                mode == "hand-over", args.commits))
    ratios = [statistics.median(c) / statistics.median(h)
              for h, c in zip(rounds["hand-over"], rounds["claim"], strict=True)]
    out: dict[str, Any] = {}
    for mode in MODES:
        every = [d for r in rounds[mode] for d in r]
        out[mode] = {f"p{p}_ms": round(percentile(every, p) * 1000, 2) for p in (50, 95, 99)}
        out[mode]["samples"] = len(every)
    out["claim_over_hand_over_median_ratio"] = {
        "mean": round(statistics.mean(ratios), 2), "min": round(min(ratios), 2),
        "max": round(max(ratios), 2)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--commits", type=int, default=20, help="commits per round")
    parser.add_argument("--sqlite", action="store_true")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.rounds < 1 or args.commits < 1:
        parser.error("--rounds and --commits must be positive")
    commit = git_commit()
    with tempfile.TemporaryDirectory(prefix="lp-relay-") as tmp, \
            contextlib.ExitStack() as stack:
        work = Path(tmp)
        server = NatsService(work)
        server.start()
        stack.callback(server.stop)
        args.nats_url = server.url
        if args.sqlite:
            url = f"sqlite+aiosqlite:///{work / 'registry.sqlite'}"
        else:
            database = PostgresDatabase()
            asyncio.run(database.create())
            stack.callback(lambda: asyncio.run(database.drop()))
            url = database.url.replace("postgresql://", "postgresql+asyncpg://", 1)
        with MachineLoad() as load:
            result = asyncio.run(measure(url, args, work))
    document = {"benchmark": "relay_latency", **commit, "machine": load.summary,
                "database": "sqlite" if args.sqlite else "postgres", **result}
    print(json.dumps(document, indent=2))
    return document


if __name__ == "__main__":
    main()
