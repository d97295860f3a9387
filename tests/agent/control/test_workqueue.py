"""The work queue: de-duplication, one worker per key, re-queue while processing, backoff."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter

import pytest

from devharness.waiting import eventually
from inference_agent.control.workqueue import Backoff, Done, Failed, Outcome, Retry, WorkQueue
from tests.loop_steps import longest_run, probing


async def later_timer_fired(delay_s: float) -> None:
    """Return once a timer of ours, due ``delay_s`` from now, has fired.

    The loop runs due timers in order of their due time, so every timer due earlier has
    fired by then, however late the loop runs: an ordering, not a bet on a duration.
    """
    fired = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(delay_s, fired.set_result, None)
    await fired


async def test_a_key_added_many_times_while_queued_is_processed_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    seen: list[str] = []

    async def handler(key: str) -> Outcome:
        seen.append(key)
        return Done()

    for key in ["a", "b", "a", "a", "b", "c"]:
        queue.add(key)
    assert len(queue) == 3
    runner = asyncio.create_task(queue.run(handler, workers=2))
    # Settled: nothing queued, nothing running, so no further call can come.
    assert await queue.join(5)
    assert sorted(seen) == ["a", "b", "c"]
    assert not queue.pending_retries()
    assert await queue.shutdown(1)
    await runner


async def test_one_key_never_runs_on_two_workers_and_is_requeued_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    release = asyncio.Event()

    async def handler(key: str) -> Outcome:
        running[key] += 1
        peak[key] = max(peak[key], running[key])
        calls[key] += 1
        if calls[key] == 1:
            await release.wait()
        running[key] -= 1
        return Done()

    runner = asyncio.create_task(queue.run(handler, workers=4))
    queue.add("a")
    await eventually(lambda: queue.is_processing("a"))
    # Added five times while its worker runs: one more pass after it, not five.
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    await eventually(lambda: calls["b"] == 1)
    assert calls["a"] == 1 and len(queue) == 0, "a must wait for its running worker"
    release.set()
    assert await queue.join(5)
    assert calls["a"] == 2 and not queue.pending_retries()
    assert peak["a"] == 1
    assert await queue.shutdown(1)
    await runner


async def test_different_keys_run_in_parallel() -> None:
    queue: WorkQueue[int] = WorkQueue()
    started: set[int] = set()
    gate = asyncio.Event()

    async def handler(key: int) -> Outcome:
        started.add(key)
        await gate.wait()
        return Done()

    runner = asyncio.create_task(queue.run(handler, workers=3))
    for key in range(5):
        queue.add(key)
    await eventually(lambda: len(started) == 3)
    # The workers took their first keys in one loop turn, so a fourth worker would have
    # taken one then too; the two keys left are still queued, nobody is free for them.
    assert len(started) == 3, "three workers, three keys at once"
    assert len(queue) == 2 and not any(queue.is_processing(key) for key in (3, 4))
    assert sum(queue.is_processing(key) for key in range(5)) == 3
    gate.set()
    await eventually(lambda: len(started) == 5)
    assert await queue.shutdown(1)
    await runner


async def test_retry_backs_off_exponentially_and_done_resets() -> None:
    queue: WorkQueue[str] = WorkQueue(backoff=Backoff(0.04, 1.0, rng=random.Random(1)))
    times: list[float] = []
    loop = asyncio.get_running_loop()

    async def handler(key: str) -> Outcome:
        times.append(loop.time())
        return Retry() if len(times) < 4 else Done()

    runner = asyncio.create_task(queue.run(handler, workers=1))
    queue.add("k")
    await eventually(lambda: len(times) == 4)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Jitter draws from the upper half: failure n waits in [base*2^n/2, base*2^n].
    for n, gap in enumerate(gaps):
        assert 0.04 * 2**n / 2 - 0.005 <= gap <= 0.04 * 2**n + 0.05, gaps
    assert gaps[2] > gaps[0]
    assert await queue.join(5)  # the fourth call's Done has been settled
    assert queue.backoff.failures("k") == 0, "Done resets the backoff"
    assert not queue.pending_retries()
    assert await queue.shutdown(1)
    await runner


async def test_retry_after_and_failed() -> None:
    queue: WorkQueue[str] = WorkQueue()
    calls: Counter[str] = Counter()

    async def handler(key: str) -> Outcome:
        calls[key] += 1
        if key == "explicit" and calls[key] == 1:
            return Retry(after=0.05)
        return Failed("broken") if key == "bad" else Done()

    runner = asyncio.create_task(queue.run(handler, workers=2))
    queue.add("explicit")
    queue.add("bad")
    await eventually(lambda: calls["explicit"] == 2)
    assert await queue.join(5)
    # Settled with no retry timer left: nothing can run "bad" again.
    assert calls["bad"] == 1, "Failed is not retried by the queue"
    assert not queue.pending_retries() and queue.backoff.failures("bad") == 0
    assert await queue.shutdown(1)
    await runner


async def test_a_handler_that_raises_is_retried_and_others_keep_running() -> None:
    queue: WorkQueue[str] = WorkQueue(backoff=Backoff(0.01, 0.02))
    calls: Counter[str] = Counter()

    async def handler(key: str) -> Outcome:
        calls[key] += 1
        if key == "boom" and calls[key] < 3:
            raise RuntimeError("bug")
        return Done()

    runner = asyncio.create_task(queue.run(handler, workers=1))
    queue.add("boom")
    queue.add("fine")
    await eventually(lambda: calls["boom"] == 3 and calls["fine"] == 1)
    assert await queue.shutdown(1)
    await runner


async def test_add_after_keeps_the_earliest_timer_and_forget_cancels() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("k", 10)
    queue.add_after("k", 0.02)
    queue.add_after("k", 5)
    await eventually(lambda: len(queue) == 1, timeout_s=1)
    queue.add_after("j", 0.02)
    queue.forget("j")
    assert queue.pending_retries() == set()
    await later_timer_fired(0.04)
    assert len(queue) == 1
    assert await queue.shutdown(1)


async def test_shutdown_stops_intake_and_waits_for_in_flight_handlers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    finished: list[str] = []
    gate = asyncio.Event()

    async def handler(key: str) -> Outcome:
        await gate.wait()
        finished.append(key)
        return Done()

    runner = asyncio.create_task(queue.run(handler, workers=1))
    queue.add("a")
    queue.add("b")
    await eventually(lambda: queue.is_processing("a"))
    stopping = asyncio.create_task(queue.shutdown(2))
    # shutdown() sets the flag and then waits with no await before: once the flag is
    # up, a shutdown that did not wait would already be done.
    await eventually(lambda: queue.shutting_down)
    assert not stopping.done(), "shutdown waits for the running handler"
    queue.add("c")
    gate.set()
    assert await stopping
    await runner
    assert finished == ["a"], "queued keys are dropped, new ones refused"


async def test_shutdown_times_out_on_a_stuck_handler() -> None:
    queue: WorkQueue[str] = WorkQueue()

    async def handler(key: str) -> Outcome:
        await asyncio.Event().wait()  # stuck for good
        return Done()

    runner = asyncio.create_task(queue.run(handler, workers=1))
    queue.add("a")
    await eventually(lambda: queue.is_processing("a"))
    assert not await queue.shutdown(0.05)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner


def test_backoff_is_capped() -> None:
    backoff: Backoff[str] = Backoff(1.0, 8.0, rng=random.Random(0))
    delays = [backoff.next_delay("k") for _ in range(100)]
    assert max(delays) <= 8.0
    assert delays[-1] >= 4.0
    with pytest.raises(ValueError):
        Backoff(0, 1)


async def test_join_waits_for_a_first_pass_over_every_key() -> None:
    queue: WorkQueue[str] = WorkQueue()
    handled: list[str] = []

    async def handler(key: str) -> Outcome:
        await asyncio.sleep(0.02)
        handled.append(key)
        return Retry(after=30) if key == "flaky" else Done()

    assert await queue.join(0.1), "an empty queue is settled"
    for key in ["a", "b", "flaky"]:
        queue.add(key)
    assert not await queue.join(0.001)
    runner = asyncio.create_task(queue.run(handler, workers=2))
    assert await queue.join(2)
    assert sorted(handled) == ["a", "b", "flaky"]
    assert queue.pending_retries() == {"flaky"}
    assert await queue.shutdown(1)
    await runner


async def test_keys_with_nothing_to_do_each_take_their_own_loop_step() -> None:
    # A full resync of hundreds of unchanged adapters: handlers that never wait. Each
    # key gives the loop back, so requests are served between them.
    queue: WorkQueue[str] = WorkQueue()
    log: list[str] = []

    async def handler(key: str) -> Outcome:
        log.append("key")
        return Done()

    for index in range(50):
        queue.add(f"adapter-{index}")
    async with probing(log):
        runner = asyncio.create_task(queue.run(handler, workers=1))
        assert await queue.join(10)
    await queue.shutdown(5)
    await runner
    assert log.count("key") == 50
    assert longest_run(log, "key") == 1
