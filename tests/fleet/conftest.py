"""A fleet without vLLM, shared by the package's tests: one registry (Postgres,
SeaweedFS as S3, NATS), three real ``loraplane agent`` processes and the vLLM stand-in
(``devharness/vllm_standin.py``, one port per agent, answering completions after a
delay and injecting the faults a test sets), started by ``bench/fanout_fleet.py``.

The agents report a running canary's traffic every 0.5 s (5 s by default), so the
analyst judges a step on counts at most half a second old. Each test makes adapters
of its own (``FleetAdapters.make``) and clears the stand-in's faults at its end.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.fanout import adapter_folder
from bench.fanout_fleet import BASE_MODEL, Fleet, running_fleet
from devharness.load_generator import Answer, LoadGenerator
from devharness.waiting import eventually
from loraplane.api.canaries import Canary, CanaryAnalysis
from loraplane.client import AsyncRegistryClient
from tests.fleet.canaries import ended

AGENTS = 3
TENANT = "fleet"
CUSTOMERS = [f"customer-{i:03d}" for i in range(100)]
AGENT_SETTINGS = {"canary_report_interval_s": "0.5", "heartbeat_interval_s": "30",
                  "resync_interval_s": "600"}


@dataclass
class FleetUnderTest:
    fleet: Fleet
    api: AsyncRegistryClient
    inference_token: str
    work: Path

    @property
    def agent_urls(self) -> list[str]:
        return [agent.url for agent in self.fleet.agents.values()]

    async def make(self, prefix: str) -> str:
        """A new adapter of ``prefix``: version 1 on ``live``, version 2 on no alias."""
        name = f"{prefix}-{secrets.token_hex(3)}"
        await self.api.create_adapter(name, BASE_MODEL, tenant=TENANT)
        await self.api.push(name, adapter_folder(self.work, 1), aliases=["live"])
        await self.api.push(name, adapter_folder(self.work, 2))
        return name

    def load(self, name: str, *, rate: float = 60.0) -> LoadGenerator:
        """Completions of ``name@live`` from every customer, through every agent."""
        return LoadGenerator(self.agent_urls, self.inference_token, f"{name}@live", CUSTOMERS,
                             rate=rate)

    async def hot_everywhere(self, name: str, load: LoadGenerator) -> float:
        """Wait until every agent has served ``name@1`` (so the stand-in has it loaded on
        every port); the ``time.monotonic()`` mark after which answers count."""
        urls = set(self.agent_urls)

        def served() -> bool:
            return {a.agent for a in load.answers if a.ok} >= urls

        await eventually(served, timeout_s=120, what=f"every agent serving {name}")
        ports = [str(self.fleet.port_of(agent_id)) for agent_id in self.fleet.agents]

        async def loaded() -> bool:
            state = await asyncio.to_thread(self.fleet.standin.state)
            return all(f"{name}@1" in state["loaded"].get(port, []) for port in ports)

        await eventually(loaded, timeout_s=120, what=f"{name}@1 loaded on every port")
        return load.answers[-1].sent

    async def until_aborted(self, prefix: str, faults: dict[int, dict[str, Any]], *,
                            step_seconds: int, analysis: CanaryAnalysis
                            ) -> tuple[str, Canary, list[Answer]]:
        """A new adapter (``make``) under load, with the stand-in's ``faults`` (version
        -> ``set_fault``'s arguments), and a one-step canary of version 2 at 50 % until
        the analysis aborts it at that step: the adapter, the canary aborted, and the
        answers sent from its start."""
        name = await self.make(prefix)
        for version, fault in faults.items():
            self.fleet.standin.set_fault(f"{name}@{version}", **fault)
        async with self.load(name).running() as load:
            # Stable is loaded everywhere first: an agent then loads the canary's
            # version before it routes any request to it.
            await self.hot_everywhere(name, load)
            mark = time.monotonic()
            await self.api.start_canary(name, 2, steps=[50], step_seconds=step_seconds,
                                        on_failure="rollback", analysis=analysis)
            aborted = await ended(self.api, name, "aborted")
            assert (aborted.step, aborted.weight) == (1, 0), aborted
            return name, aborted, load.since(mark)


@pytest.fixture(scope="package")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FleetUnderTest]:
    work = tmp_path_factory.mktemp("fleet")
    async with running_fleet(work, ports=AGENTS) as running:
        running.add_agents(AGENTS, settings=AGENT_SETTINGS)
        token = running.registry.create_token("inference", "fleet-client", tenant=TENANT)
        async with AsyncRegistryClient(running.registry.url, running.registry.admin_token,
                                       timeout_s=120) as api:
            yield FleetUnderTest(running, api, token, work)


@pytest.fixture(autouse=True)
def _clear_faults(fleet: FleetUnderTest) -> Iterator[None]:
    """The stand-in's faults, cleared after each test."""
    try:
        yield
    finally:
        fleet.fleet.standin.clear_faults()
