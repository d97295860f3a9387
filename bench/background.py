"""A registry's background work as production has it, for benchmarks that time requests
beside it: the blob collector's passes (read from the registry's own ``/metrics``),
agents reporting their status, and the event-loop lag histogram over a window.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.agent_reports import post, status
from bench.common import percentile

GC_RUNNING = "loraplane_registry_blob_gc_running"
GC_EXAMINED = "loraplane_registry_blob_gc_blobs_examined_total"
GC_DELETED = "loraplane_registry_blob_gc_deleted_total"
GC_PASS = "loraplane_registry_blob_gc_pass_seconds"
LOOP_LAG = "loraplane_registry_event_loop_lag_seconds"


# --- /metrics ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scrape:
    """One read of ``/metrics``: plain samples by name, and histograms' buckets."""

    at: float  # time.monotonic()
    values: dict[str, float]
    buckets: dict[str, list[tuple[float, float]]]  # name -> [(le, cumulative count)]

    def value(self, name: str) -> float:
        return self.values.get(name, 0.0)


def parse(text: str, at: float) -> Scrape:
    values: dict[str, float] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") and "le" in sample.labels:
                buckets.setdefault(family.name, []).append(
                    (float(sample.labels["le"]), sample.value))
            else:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    for series in buckets.values():
        series.sort()
    return Scrape(at, values, buckets)


def scrape(client: httpx.Client, url: str) -> Scrape:
    response = client.get(f"{url}/metrics")
    response.raise_for_status()
    return parse(response.text, time.monotonic())


def gauge(client: httpx.Client, url: str, name: str) -> float:
    """One unlabelled sample's value, read without parsing the whole page: this process
    also times the API, and a full parse of a fleet's metrics competes with it."""
    response = client.get(f"{url}/metrics")
    response.raise_for_status()
    found = re.search(rf"^{re.escape(name)} (\S+)$", response.text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def histogram_delta(before: Scrape, after: Scrape, name: str) -> list[tuple[float, float]]:
    """Cumulative bucket counts of ``name`` observed between two scrapes."""
    if name not in after.buckets:
        raise RuntimeError(f"{name} is not exported by the registry")
    start = dict(before.buckets.get(name, []))
    return [(le, count - start.get(le, 0.0)) for le, count in after.buckets[name]]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> tuple[float, float,
                                                                                  float]:
    """Prometheus' ``histogram_quantile``: linear within the bucket the rank falls in.
    Returns (value, bucket lower bound, bucket upper bound), in the buckets' unit."""
    total = buckets[-1][1]
    if total <= 0:
        return math.nan, math.nan, math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):  # Prometheus answers the highest finite bound
                return lower, lower, le
            if count == below:
                return le, lower, le
            return lower + (le - lower) * (rank - below) / (count - below), lower, le
        lower, below = le, count
    return lower, lower, math.inf


def lag_summary(buckets: list[tuple[float, float]]) -> dict[str, Any]:
    """p50, p99 (and the bucket p99 falls in) and the highest bucket any tick reached,
    in ms, from the lag histogram's counts over a window."""
    p50, _, _ = histogram_quantile(0.50, buckets)
    p99, p99_lower, p99_upper = histogram_quantile(0.99, buckets)
    top_lower, top_upper, below = 0.0, 0.0, 0.0
    lower = 0.0
    for le, count in buckets:
        if count > below:
            top_lower, top_upper = lower, le
        lower, below = le, count
    return {"ticks": int(buckets[-1][1]), "p50_ms": p50 * 1000, "p99_ms": p99 * 1000,
            "p99_bucket_ms": [p99_lower * 1000, p99_upper * 1000],
            "max_bucket_ms": [top_lower * 1000, top_upper * 1000]}


# "event loop was held for 0.29 s in all (by task 'blob-gc' at path.py:12 (func))"
_STALL = re.compile(r"event loop was held for ([\d.]+) s in all \(by task '([^']*)' at (.*)\)$")


def loop_stalls(log: Path, top: int = 3) -> dict[str, Any]:
    """The stalls the registry's loop watchdog named in its log over the whole run: how
    many, the longest, and the places named most often, as ``[place, times]`` lists (as
    JSON has them: a document written with ``--json-out`` reads back equal)."""
    held: list[float] = []
    places: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
        found = _STALL.search(line)
        if found:
            held.append(float(found.group(1)))
            places[f"task {found.group(2)!r} at {found.group(3)}"] += 1
    return {"count": len(held), "longest_s": max(held, default=0.0),
            "seconds_in_all": round(sum(held), 2),
            "most_named": [[place, n] for place, n in places.most_common(top)]}


# --- the collector -------------------------------------------------------------------------


def _first_scrape(client: httpx.Client, url: str, timeout_s: float, interval_s: float,
                  ok: Callable[[Scrape], bool], failure: str) -> Scrape:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = scrape(client, url)
        if ok(seen):
            return seen
        time.sleep(interval_s)
    raise RuntimeError(f"{failure} within {timeout_s:.0f} s")


def wait_for_pass(client: httpx.Client, url: str, timeout_s: float,
                  interval_s: float = 0.01) -> Scrape:
    """The first scrape that shows a collector pass running."""
    return _first_scrape(client, url, timeout_s, interval_s,
                         lambda seen: seen.value(GC_RUNNING) >= 1,
                         "no blob collector pass started")


def wait_for_quiet(client: httpx.Client, url: str, timeout_s: float,
                   interval_s: float = 0.05) -> Scrape:
    """The first scrape after the registry's start-up collector pass ended, none running."""
    return _first_scrape(client, url, timeout_s, interval_s,
                         lambda seen: (seen.value(f"{GC_PASS}_count") >= 1
                                       and seen.value(GC_RUNNING) == 0),
                         "the registry's start-up collector pass did not end")


class GcWatch:
    """Samples the collector's ``running`` gauge every ``interval_s`` in a thread, from a
    scrape that saw a pass running (the window opens inside a pass) to ``close``."""

    def __init__(self, url: str, opened: Scrape, interval_s: float = 1.0) -> None:
        self.url, self.opened, self.interval_s = url, opened, interval_s
        self.samples = [opened.value(GC_RUNNING)]
        self.closed: Scrape | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GcWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.wait(self.interval_s):
                self.samples.append(gauge(client, self.url, GC_RUNNING))

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        with httpx.Client(timeout=30) as client:
            self.closed = scrape(client, self.url)

    def summary(self) -> dict[str, Any]:
        if self.closed is None:
            raise RuntimeError("the window is still open")
        before, after = self.opened, self.closed
        return {
            "window_s": round(after.at - before.at, 2),
            "gc_running_samples": len(self.samples),
            "gc_running_share": sum(1 for v in self.samples if v >= 1) / len(self.samples),
            "gc_passes_ended": int(after.value(f"{GC_PASS}_count")
                                   - before.value(f"{GC_PASS}_count")),
            "gc_blobs_examined": int(after.value(GC_EXAMINED) - before.value(GC_EXAMINED)),
            "gc_deleted": int(after.value(GC_DELETED) - before.value(GC_DELETED)),
            "loop_lag": lag_summary(histogram_delta(before, after, LOOP_LAG)),
        }


# --- agents --------------------------------------------------------------------------------


@dataclass
class AgentFleet:
    """``tokens`` (agent id -> secret) each reporting a status of ``adapters`` served
    adapters every ``interval_s``, their phases spread over the interval, from a process
    of their own: in the timing process their JSON work took the GIL from the client
    being timed, as agents on other machines never do. Every agent joins (reports once)
    before ``__enter__`` returns."""

    url: str
    tokens: dict[str, str]
    adapters: int
    interval_s: float

    def __post_init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=_fleet_process,
            args=(child, self.url, self.tokens, self.adapters, self.interval_s), daemon=True)

    def __enter__(self) -> AgentFleet:
        self._process.start()
        if not self._pipe.poll(120):
            self._process.kill()
            raise RuntimeError("the simulated agents did not join within 120 s")
        errors: list[str] = self._pipe.recv()
        if errors:
            self.__exit__()
            raise RuntimeError(f"an agent's join failed: {errors[0]}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._process.is_alive():
            self._pipe.send("stop")
            self._process.join(60)
        if self._process.is_alive():
            self._process.kill()

    def summary(self, since: float, until: float) -> dict[str, Any]:
        """Reports sent between two ``time.monotonic()`` instants (one clock for every
        process), and their latency."""
        self._pipe.send("snapshot")
        latencies_s, errors = self._pipe.recv()
        took = [t * 1000 for sent, t in latencies_s if since <= sent <= until]
        return {"agents": len(self.tokens), "adapters_each": self.adapters,
                "interval_s": self.interval_s, "reports": len(took),
                "errors": len(errors), "first_error": errors[:1],
                "p50_ms": percentile(took, 50) if took else None,
                "p99_ms": percentile(took, 99) if took else None,
                "max_ms": max(took) if took else None}


def _fleet_process(pipe: Connection, url: str, tokens: dict[str, str], adapters: int,
                   interval_s: float) -> None:
    asyncio.run(_Fleet(pipe, url, tokens, adapters, interval_s).run())


@dataclass
class _Fleet:
    """The agents, in the fleet's own process: told "snapshot" or "stop" on ``pipe``."""

    pipe: Connection
    url: str
    tokens: dict[str, str]
    adapters: int
    interval_s: float
    latencies_s: list[tuple[float, float]] = field(default_factory=list)  # (sent, took)
    errors: list[str] = field(default_factory=list)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=len(self.tokens))
        async with httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits) as client:
            await asyncio.gather(*(self._report(client, a, t, 1)
                                   for a, t in self.tokens.items()))
            self.pipe.send(self.errors)
            step = self.interval_s / len(self.tokens)
            agents = [asyncio.create_task(self._agent(client, a, t, i * step))
                      for i, (a, t) in enumerate(self.tokens.items())]
            while await asyncio.to_thread(self.pipe.recv) != "stop":
                self.pipe.send((list(self.latencies_s), list(self.errors)))
            for agent in agents:
                agent.cancel()
            await asyncio.gather(*agents, return_exceptions=True)

    async def _agent(self, client: httpx.AsyncClient, agent_id: str, token: str,
                     delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        number = 2
        while True:
            await self._report(client, agent_id, token, number)
            number += 1
            await asyncio.sleep(self.interval_s)

    async def _report(self, client: httpx.AsyncClient, agent_id: str, token: str,
                      number: int) -> None:
        sent = time.monotonic()
        try:
            took = await post(client, agent_id, token, status(agent_id, self.adapters, number))
        except (httpx.HTTPError, RuntimeError) as exc:
            self.errors.append(f"{agent_id}: {exc}")
            return
        self.latencies_s.append((sent, took))


def agent_tokens(url: str, admin_token: str, count: int) -> dict[str, str]:
    """``count`` agent tokens, made through the API, each bound to its own agent id."""
    tokens = {}
    with httpx.Client(base_url=url, timeout=30,
                      headers={"Authorization": f"Bearer {admin_token}"}) as client:
        for i in range(count):
            agent_id = f"bench-agent-{i:03d}"
            response = client.post("/v1/tokens", json={"name": agent_id, "role": "agent"})
            if response.status_code != 201:
                raise RuntimeError(f"token for {agent_id}: {response.status_code} "
                                   f"{response.text}")
            tokens[agent_id] = response.json()["secret"]
    return tokens
