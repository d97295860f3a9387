"""A steady load of completions from many customers, spread over a fleet's agents.

Requests go out at a fixed rate (at most ``concurrency`` in flight), customer after
customer (``X-Customer-Id``) and agent after agent, so every customer asks every agent
alike and the canary split sees each customer often. Every answer is kept: when it was
sent, its customer, the agent, the status and the version that served it (the agent's
``X-Loraplane-Adapter``); a request that got no answer has status 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import httpx

from devharness.openai_client import ADAPTER_HEADER, limits

CUSTOMER_HEADER = "X-Customer-Id"


@dataclass(frozen=True)
class Answer:
    sent: float  # time.monotonic()
    sent_wall: float  # time.time(), to compare with the registry's times
    customer: str
    agent: str
    status: int
    adapter: str | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


class LoadGenerator:
    """``rate`` requests a second for ``model`` from ``customers`` to ``agent_urls``."""

    def __init__(self, agent_urls: Sequence[str], token: str, model: str,
                 customers: Sequence[str], *, rate: float = 60.0, concurrency: int = 24,
                 max_tokens: int = 4) -> None:
        self.model = model
        self.agent_urls = list(agent_urls)
        self.answers: list[Answer] = []
        self.rate = rate
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self._clients = [httpx.AsyncClient(base_url=url, timeout=60, limits=limits(),
                                           headers={"Authorization": f"Bearer {token}"})
                         for url in agent_urls]
        # Request i: customer i mod C, agent i mod A; every customer within C requests,
        # and every (customer, agent) pair within C * A when C and A are coprime.
        self._pairs = ((customers[i % len(customers)], i % len(agent_urls))
                       for i in itertools.count())
        self._next_at = 0.0
        self._lock = asyncio.Lock()

    async def _slot(self) -> tuple[str, int]:
        """Wait for the next send time; the customer and agent it goes to."""
        async with self._lock:
            now = time.monotonic()
            at = max(now, self._next_at)
            self._next_at = at + 1 / self.rate
            pair = next(self._pairs)
        if at > now:
            await asyncio.sleep(at - now)
        return pair

    async def _worker(self) -> None:
        body = {"model": self.model, "prompt": "hello", "max_tokens": self.max_tokens}
        while True:
            customer, agent = await self._slot()
            client, url = self._clients[agent], self.agent_urls[agent]
            sent, sent_wall = time.monotonic(), time.time()
            try:
                response = await client.post("/v1/completions", json=body,
                                             headers={CUSTOMER_HEADER: customer})
            except httpx.HTTPError as exc:
                self.answers.append(Answer(sent, sent_wall, customer, url, 0, None,
                                           f"{type(exc).__name__}: {exc}"))
                continue
            self.answers.append(Answer(
                sent, sent_wall, customer, url, response.status_code,
                response.headers.get(ADAPTER_HEADER),
                "" if response.status_code == 200 else response.text[:300]))

    def since(self, mark: float) -> list[Answer]:
        """The answers to requests sent at or after ``mark`` (``time.monotonic()``)."""
        return [a for a in self.answers if a.sent >= mark]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LoadGenerator]:
        """The load, from entering to leaving; requests in flight are then cancelled."""
        tasks = [asyncio.create_task(self._worker()) for _ in range(self.concurrency)]
        try:
            yield self
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for client in self._clients:
                await client.aclose()
