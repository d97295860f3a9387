"""Leases: counts, idempotent release, waiting for idle."""

from __future__ import annotations

import asyncio

from inference_agent.serving.leases import Leases
from tests.agent.loop_support import one_loop_turn


async def test_acquire_counts_and_release_is_idempotent() -> None:
    leases = Leases()
    first, second = leases.acquire("a@1"), leases.acquire("a@1")
    assert leases.count("a@1") == 2 and leases.count("a@2") == 0
    first.release()
    first.release()
    assert leases.count("a@1") == 1
    with second:
        pass
    assert leases.count("a@1") == 0
    assert leases.busy() == {}


async def test_wait_idle_returns_at_once_when_idle_and_false_on_timeout() -> None:
    leases = Leases()
    assert await leases.wait_idle("a@1", 0.01)
    lease = leases.acquire("a@1")
    assert not await leases.wait_idle("a@1", 0.05)
    lease.release()
    assert await leases.wait_idle("a@1", 0.01)


async def test_wait_idle_wakes_on_the_last_release_only() -> None:
    leases = Leases()
    one, two = leases.acquire("a@1"), leases.acquire("a@1")
    waiter = asyncio.create_task(leases.wait_idle("a@1", 5))
    await one_loop_turn()  # the waiter waits
    one.release()
    await one_loop_turn()  # a wake-up this release caused has run
    assert not waiter.done()
    two.release()
    assert await asyncio.wait_for(waiter, 1)


async def test_a_lease_taken_again_before_the_waiter_runs_keeps_it_waiting() -> None:
    leases = Leases()
    lease = leases.acquire("a@1")
    waiter = asyncio.create_task(leases.wait_idle("a@1", 5))
    await one_loop_turn()  # the waiter waits
    lease.release()
    again = leases.acquire("a@1")  # same loop turn: the waiter has not run yet
    await one_loop_turn()  # now it has woken and looked at the count
    assert not waiter.done()
    again.release()
    assert await asyncio.wait_for(waiter, 1)


async def test_wait_any_idle_wakes_when_some_name_becomes_idle() -> None:
    leases = Leases()
    lease = leases.acquire("b@2")
    assert not await leases.wait_any_idle(0.02)
    waiter = asyncio.create_task(leases.wait_any_idle(5))
    await one_loop_turn()  # the waiter waits on the current event
    lease.release()
    assert await asyncio.wait_for(waiter, 1)
