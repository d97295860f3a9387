"""loraplane/loop_lag.py: a loop held on purpose moves the lag histogram's high buckets
and is named in one warning (its task, its function's file and line) and one end line;
a quiet loop's ticks are not counted late by their own interval."""

from __future__ import annotations

import asyncio
import inspect
import re
import sys
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from devharness.waiting import eventually
from loraplane.loop_lag import (
    LAG_BUCKETS,
    FrameNamer,
    LoopLagMonitor,
    lag_histogram,
    running_task_name,
)
from tests.loop_lag_support import GIVE_UP_S, LagLog, hold_the_loop, lag_log

NAME = "test_event_loop_lag_seconds"
HELD_S = 0.35
INTERVAL_S = 0.05


@pytest.fixture
def records() -> Iterator[LagLog]:
    with lag_log("'hog'") as handler:
        yield handler


def later_than(registry: CollectorRegistry, edge: float) -> float:
    """Observations above ``edge`` (a bucket edge)."""
    count = registry.get_sample_value(f"{NAME}_count") or 0.0
    return count - (registry.get_sample_value(f"{NAME}_bucket", {"le": str(edge)}) or 0.0)


def watchdogs() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "loop-lag-watchdog"]


def monitor(registry: CollectorRegistry, interval_s: float = INTERVAL_S) -> LoopLagMonitor:
    # The test's own frames count as the project's here.
    return LoopLagMonitor(lag_histogram(registry, NAME), interval_s=interval_s,
                          warn_after_s=0.05, frames=FrameNamer(packages=("tests",)))


async def test_a_held_loop_moves_the_high_buckets_and_is_named(records: LagLog) -> None:
    registry = CollectorRegistry()
    async with monitor(registry).running():
        await eventually(lambda: registry.get_sample_value(f"{NAME}_count"),
                         what="a first tick")
        before = later_than(registry, 0.25)

        async def hog() -> None:
            hold_the_loop(records.named, HELD_S)

        await asyncio.create_task(hog(), name="hog")
        # The tick due at most INTERVAL_S after the hold began ran after it: >= 0.30 s late.
        await eventually(lambda: later_than(registry, 0.25) >= before + 1,
                         what="an observation above 0.25 s")
        await eventually(lambda: len(records.marked()) >= 2, what="the stall's end line")
        assert watchdogs()
    assert not watchdogs(), "the watchdog thread outlived the monitor"
    # One warning while held, one line at its end; none per tick or per look. (A busy
    # machine may delay other ticks past the threshold too: only the hog's lines count.)
    assert len(records.marked()) == 2, records.lines
    held, ended = records.marked()
    lines, first = inspect.getsourcelines(hold_the_loop)
    found = re.fullmatch(r"event loop held for [0-9.]+ s so far by task 'hog' at "
                         r"tests/loop_lag_support.py:(\d+) \(hold_the_loop\)", held)
    assert found, held
    assert first <= int(found.group(1)) < first + len(lines)
    total = re.fullmatch(r"event loop was held for ([0-9.]+) s in all \(by task 'hog' at "
                         r"tests/loop_lag_support.py:\d+ \(hold_the_loop\)\)", ended)
    assert total, ended
    assert float(total.group(1)) >= HELD_S - INTERVAL_S - 0.01  # printed to 0.01 s


async def test_a_quiet_loop_is_not_counted_late_by_its_interval() -> None:
    registry = CollectorRegistry()
    interval = 0.2
    async with monitor(registry, interval).running():
        await eventually(lambda: (registry.get_sample_value(f"{NAME}_count") or 0) >= 5,
                         what="five ticks")
    # Late by the interval itself, every tick would be above interval / 2; a quiet loop
    # wakes a tick well within that at least once in five.
    assert (registry.get_sample_value(f"{NAME}_bucket", {"le": "0.1"}) or 0) >= 1
    assert not watchdogs()


def test_the_buckets_keep_the_goal_an_edge() -> None:
    assert 0.005 in LAG_BUCKETS
    assert list(LAG_BUCKETS) == sorted(LAG_BUCKETS)


async def test_the_running_task_is_named_or_none_for_a_callback() -> None:
    loop = asyncio.get_running_loop()
    assert running_task_name(loop) == f"task {asyncio.current_task().get_name()!r}"  # type: ignore[union-attr]
    named: asyncio.Future[str] = loop.create_future()
    loop.call_soon(lambda: named.set_result(running_task_name(loop)))
    assert await named == "none (a callback)"


async def test_without_asyncio_s_private_table_the_task_is_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(asyncio.tasks, "_current_tasks")
    assert running_task_name(asyncio.get_running_loop()) == "unknown"


def block_in_the_test(started: threading.Event, release: threading.Event) -> None:
    started.set()
    release.wait(GIVE_UP_S)


def test_a_stack_without_a_project_frame_names_its_innermost_frame() -> None:
    started, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=block_in_the_test, args=(started, release))
    thread.start()
    try:
        assert started.wait(GIVE_UP_S)
        assert thread.ident is not None
        ours = FrameNamer(packages=("tests",)).name(thread.ident)
        other = FrameNamer(packages=("no_such_package",)).name(thread.ident)
    finally:
        release.set()
        thread.join()
    assert re.fullmatch(r"tests/core/test_loop_lag.py:\d+ \(block_in_the_test\)", ours), ours
    # A frame of threading.py (Event.set or Event.wait), the innermost on that stack.
    assert re.fullmatch(r"/.*/threading.py:\d+ \(\w+\)", other), other
    assert FrameNamer().name(-1) == "unknown"


async def test_the_monitor_sets_the_gil_switch_interval_while_it_runs() -> None:
    before = sys.getswitchinterval()
    registry = CollectorRegistry()
    wanted = before / 4
    lag = LoopLagMonitor(lag_histogram(registry, NAME), interval_s=INTERVAL_S,
                         warn_after_s=INTERVAL_S, switch_interval_s=wanted)
    async with lag.running():
        await eventually(lambda: (registry.get_sample_value(f"{NAME}_count") or 0) >= 1,
                         what="a tick")
        assert sys.getswitchinterval() == pytest.approx(wanted)
    assert sys.getswitchinterval() == before
    with pytest.raises(ValueError, match="switch_interval_s"):
        LoopLagMonitor(lag_histogram(CollectorRegistry(), NAME), switch_interval_s=0)
