"""Readers of the history API, with and without pushes beside them.

``READERS`` asyncio tasks, each on its own keep-alive connection, loop over the
queries; a pusher uploads small, distinct adapters (``devharness.adapters``) through
the real API at a steady rate, alternating between the hot and a typical adapter. The
phases alternate (quiet, pushes, quiet, pushes, ...) so a drift in the machine's load
falls on both kinds alike; the ratio compares them within one run.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import percentile
from bench.history_data import BASE_MODEL, HOT, TYPICAL
from loraplane.client import AsyncRegistryClient

QUIET, PUSHING = "readers only", "readers + pushes"


@dataclass(frozen=True)
class Query:
    label: str
    kind: str  # "versions" or "alias history"
    adapter: str
    alias: str | None = None
    cursor: int | None = None

    def path(self) -> str:
        if self.alias is not None:
            return f"/v1/adapters/{self.adapter}/aliases/{self.alias}/history"
        return f"/v1/adapters/{self.adapter}/versions"

    def params(self, page: int) -> dict[str, int]:
        params = {"limit": page}
        if self.cursor is not None:
            params["cursor"] = self.cursor
        return params


def queries(hot_versions: int) -> list[Query]:
    return [
        Query("versions, hot, first page", "versions", HOT),
        Query("versions, hot, middle", "versions", HOT, cursor=hot_versions // 2),
        Query("versions, typical, first page", "versions", TYPICAL),
        Query("alias history, hot/latest", "alias history", HOT, alias="latest"),
        Query("alias history, hot/live", "alias history", HOT, alias="live"),
        Query("alias history, typical/live", "alias history", TYPICAL, alias="live"),
    ]


@dataclass
class LoadRun:
    reads: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    pushes: list[float] = field(default_factory=list)
    push_errors: list[str] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))


async def _reader(url: str, token: str, specs: list[Query], page: int, offset: int,
                  phase: list[str], run: LoadRun, stop: asyncio.Event) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        i = offset
        while not stop.is_set():
            spec = specs[i % len(specs)]
            i += 1
            current = phase[0]
            t0 = time.perf_counter()
            response = await client.get(spec.path(), params=spec.params(page))
            spent = time.perf_counter() - t0
            response.raise_for_status()
            body = response.json()
            rows = body["versions"] if spec.alias is None else body["moves"]
            if not rows:
                raise RuntimeError(f"{spec.label}: empty page")
            if phase[0] == current:  # a read that straddles two phases counts in neither
                run.reads[(current, spec.label)].append(spent * 1000)


async def _pusher(client: AsyncRegistryClient, folders: list[Path], interval_s: float,
                  phase: list[str], run: LoadRun, stop: asyncio.Event) -> None:
    """One push every ``interval_s`` while the phase is PUSHING (none in flight at once)."""
    next_at = time.monotonic()
    k = 0
    while not stop.is_set():
        if phase[0] != PUSHING:
            await asyncio.sleep(0.05)
            next_at = time.monotonic()
            continue
        if k >= len(folders):
            raise RuntimeError(f"all {k} adapters made for the pushes were pushed")
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += interval_s
        t0 = time.perf_counter()
        try:
            result = await client.push(HOT if k % 2 == 0 else TYPICAL, folders[k], aliases=["live"])
            if not result.created:
                raise RuntimeError("a distinct adapter was not a new version")
        except Exception as exc:  # counted and reported, not hidden
            run.push_errors.append(repr(exc)[:300])
        else:
            run.pushes.append((time.perf_counter() - t0) * 1000)
        k += 1


def make_push_folders(root: Path, count: int) -> list[Path]:
    from devharness.adapters import make_adapter  # noqa: PLC0415 - numpy, only here

    return [make_adapter(root / f"push-{k}", seed=1000 + k, base_model=BASE_MODEL)
            for k in range(count)]


async def run_load(url: str, token: str, specs: list[Query], *, page: int, readers: int,
                   phases: int, phase_s: float, push_interval_s: float,
                   folders: list[Path], min_pushes: int = 1) -> LoadRun:
    """Each phase lasts ``phase_s``, and longer if need be, until every query has been
    read in it and, in a pushing phase, ``min_pushes`` pushes have ended: a slow
    machine gives longer phases, never an empty one."""
    run = LoadRun()
    phase = [QUIET]
    stop = asyncio.Event()
    async with AsyncRegistryClient(url, token, timeout_s=120) as client:
        tasks = [asyncio.create_task(_reader(url, token, specs, page, i, phase, run, stop))
                 for i in range(readers)]
        tasks.append(asyncio.create_task(
            _pusher(client, folders, push_interval_s, phase, run, stop)))
        try:
            await asyncio.sleep(2.0)  # connections open, first requests served: not timed
            run.reads.clear()
            for n in range(2 * phases):
                phase[0] = QUIET if n % 2 == 0 else PUSHING
                wanted = _PhaseEnd(run, phase[0], specs,
                                   min_pushes if phase[0] == PUSHING else 0)
                t0 = time.monotonic()
                await asyncio.sleep(phase_s)
                await wanted.wait(tasks)
                run.phase_seconds[phase[0]] += time.monotonic() - t0
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    return run


class _PhaseEnd:
    """What a phase must have seen before it ends: a read of every query, and pushes."""

    def __init__(self, run: LoadRun, kind: str, specs: list[Query], pushes: int) -> None:
        self.run, self.kind = run, kind
        self.reads = {spec.label: len(run.reads.get((kind, spec.label), [])) for spec in specs}
        self.pushes = self._pushes_ended() + pushes

    def _pushes_ended(self) -> int:
        return len(self.run.pushes) + len(self.run.push_errors)

    def reached(self) -> bool:
        return self._pushes_ended() >= self.pushes and all(
            len(self.run.reads.get((self.kind, label), [])) > before
            for label, before in self.reads.items())

    async def wait(self, tasks: list[asyncio.Task[None]]) -> None:
        while not self.reached():
            for task in tasks:
                if task.done():  # a reader or the pusher failed: its error, not a hang
                    task.result()
                    raise RuntimeError("a reader or the pusher stopped early")
            await asyncio.sleep(0.05)


def summarize(run: LoadRun, specs: list[Query]) -> dict[str, object]:
    rows = []
    for spec in specs:
        quiet = run.reads.get((QUIET, spec.label), [])
        busy = run.reads.get((PUSHING, spec.label), [])
        if not quiet or not busy:
            raise RuntimeError(f"{spec.label}: no reads in a phase")
        q50, q99 = percentile(quiet, 50), percentile(quiet, 99)
        b50, b99 = percentile(busy, 50), percentile(busy, 99)
        rows.append({"query": spec.label, "n_quiet": len(quiet), "n_pushing": len(busy),
                     "quiet_p50_ms": q50, "quiet_p99_ms": q99, "pushing_p50_ms": b50,
                     "pushing_p99_ms": b99, "p50_ratio": b50 / q50, "p99_ratio": b99 / q99,
                     "quiet_max_ms": max(quiet), "pushing_max_ms": max(busy)})
    pushes = run.pushes
    seconds = run.phase_seconds[PUSHING]
    return {
        "reads": rows,
        "pushes": {"n": len(pushes), "errors": run.push_errors[:5],
                   "error_count": len(run.push_errors),
                   "per_s": len(pushes) / seconds if seconds else 0.0,
                   "p50_ms": percentile(pushes, 50) if pushes else None,
                   "p99_ms": percentile(pushes, 99) if pushes else None,
                   "max_ms": max(pushes) if pushes else None},
        "phase_seconds": dict(run.phase_seconds),
    }
