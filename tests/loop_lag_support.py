"""Holding an event loop on purpose, and what the loop-lag monitor then says.

The hold lasts a minimum and then until the monitor's warning names it (or a cap): the
warning is awaited as a condition, never bet on a duration being long enough.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from devharness.waiting import eventually

# The hold ends once the warning is out, or after this if it never comes.
GIVE_UP_S = 30.0
# A tick is due at most 0.1 s (the default interval) after the hold began: >= 0.35 s late.
HELD_S = 0.45


class LagLog(logging.Handler):
    """loraplane.loop_lag's lines; ``named`` is set by the first that contains ``mark``."""

    def __init__(self, mark: str) -> None:
        super().__init__(logging.WARNING)
        self.mark = mark
        self.lines: list[str] = []
        self.named = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        if self.mark in line:
            self.named.set()

    def marked(self) -> list[str]:
        return [line for line in self.lines if self.mark in line]


@contextmanager
def lag_log(mark: str) -> Iterator[LagLog]:
    handler = LagLog(mark)
    logger = logging.getLogger("loraplane.loop_lag")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def hold_the_loop(named: threading.Event, at_least_s: float) -> None:
    """Hold the calling thread (a loop's) ``at_least_s``, and until ``named`` is set."""
    started = time.monotonic()
    while time.monotonic() - started < GIVE_UP_S:
        if time.monotonic() - started >= at_least_s and named.is_set():
            return
        time.sleep(0.01)


def observations_above(exposition: str, name: str, edge: float) -> float:
    """Observations of histogram ``name`` above bucket edge ``edge``, from /metrics text."""
    count = below = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == f"{name}_count":
                count += sample.value
            elif sample.name == f"{name}_bucket" and float(sample.labels["le"]) == edge:
                below += sample.value
    return count - below


async def hold_and_see(client: httpx.AsyncClient, name: str) -> list[str]:
    """Hold this loop (the service's, which runs in it) with a task named ``hog`` until
    the warning names it, wait until ``client``'s /metrics counts one more observation of
    ``name`` above 0.25 s, and return the warnings that named the hog."""
    async def late() -> float:
        response = await client.get("/metrics")
        assert response.status_code == 200, response.text
        assert f"{name}_bucket" in response.text
        return observations_above(response.text, name, 0.25)

    before = await late()
    with lag_log("task 'hog'") as log:
        async def hog() -> None:
            hold_the_loop(log.named, HELD_S)

        await asyncio.create_task(hog(), name="hog")

    async def moved() -> bool:
        return await late() >= before + 1

    await eventually(moved, what=f"an observation above 0.25 s in {name}")
    return log.marked() or log.lines


def names_the_hog(lines: list[str]) -> bool:
    """Whether a warning names the hog's task and the innermost frame that held it."""
    return any("so far by task 'hog' at tests/loop_lag_support.py:" in line
               and line.endswith("(hold_the_loop)") for line in lines)
