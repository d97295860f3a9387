"""One fleet for the whole end-to-end run, every part a separate real process.

Postgres, SeaweedFS (S3) and one NATS; ``loraplane registry serve`` on them; two vLLM
servers (CPU build, the tiny model) and beside each a ``loraplane agent``. Started once
per run of this package and stopped at its end, even when a test fails. The fleet has
a database of its own: the registry tests empty the shared one between tests, and the
fleet's relay would publish their outbox rows.

``agent-a`` resyncs every few seconds (it shows drift being repaired); ``agent-b``
practically never does, so what it learns it learns from the event stream.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.conftest import fresh_postgres
from tests.e2e.steps import FLEET_CONTEXT
from tests.support.fleet import AgentProcess, AgentSpec, Fleet, running_fleet
from tests.support.openai_client import OpenAIClient
from tests.support.processes import FleetError
from tests.support.registry_api import RegistryApi
from tests.support.relay import PausableRelay
from tests.support.services import NatsService, PostgresDatabase, SeaweedS3, ServiceStartError
from tests.support.vllm import (
    VllmEnvError,
    VllmServerError,
    ensure_tiny_model,
    ensure_vllm_env,
)

# Quick retries, so a version that keeps failing is marked bad within seconds.
COMMON_SETTINGS = {"retry_base_s": "0.2", "retry_max_s": "1", "max_attempts": "3",
                   "heartbeat_interval_s": "5", "shutdown_grace_s": "10"}
AGENT_SETTINGS = {
    "a": {**COMMON_SETTINGS, "resync_interval_s": "3"},
    "b": {**COMMON_SETTINGS, "resync_interval_s": "3600"},
}


@pytest.fixture(scope="package")
def e2e_postgres() -> Iterator[PostgresDatabase]:
    with fresh_postgres() as pg:
        yield pg


@pytest.fixture(scope="package")
def e2e_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsService]:
    server = NatsService(tmp_path_factory.mktemp("e2e-nats"))
    try:
        server.start()
    except ServiceStartError as exc:
        pytest.fail(f"NATS could not be started:\n{exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def fleet(e2e_postgres: PostgresDatabase, seaweed: SeaweedS3, e2e_nats: NatsService,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    with contextlib.ExitStack() as stack:
        try:
            python = ensure_vllm_env(install=True)
            model = ensure_tiny_model(work / "tiny", python)
            running = stack.enter_context(running_fleet(
                work, model_dir=model, vllm_python=python, database_url=e2e_postgres.url,
                nats=e2e_nats, s3=seaweed, max_loras=3, max_loaded=3,
                max_model_len=FLEET_CONTEXT,
                agent_settings=AGENT_SETTINGS))
        except (FleetError, VllmEnvError, VllmServerError) as exc:
            pytest.fail(f"the fleet could not be started:\n{exc}", pytrace=False)
        yield running


@pytest.fixture
async def api(fleet: Fleet) -> AsyncIterator[RegistryApi]:
    async with RegistryApi(fleet.registry.url, fleet.registry.admin_token) as client:
        yield client


@pytest.fixture
async def agent_a(fleet: Fleet) -> AsyncIterator[OpenAIClient]:
    async with OpenAIClient(fleet.agents["a"].url) as client:
        yield client


@pytest.fixture
async def agent_b(fleet: Fleet) -> AsyncIterator[OpenAIClient]:
    async with OpenAIClient(fleet.agents["b"].url) as client:
        yield client


@pytest.fixture
async def vllm_a(fleet: Fleet) -> AsyncIterator[OpenAIClient]:
    async with OpenAIClient(fleet.vllms["a"].url) as client:
        yield client


@pytest.fixture
def unique() -> str:
    """A short suffix that keeps one test's adapter names apart from every other's."""
    return secrets.token_hex(3)


class AgentVariant:
    """Run one agent with other flags for a while, then restore its own."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self.original = agent.spec

    def restart(self, spec: AgentSpec | None = None) -> float:
        return self.agent.restart(spec)

    def restore(self) -> None:
        if self.agent.spec != self.original or not self.agent.process.running:
            self.agent.restart(self.original)


@pytest.fixture
def agent_b_variant(fleet: Fleet) -> Iterator[AgentVariant]:
    variant = AgentVariant(fleet.agents["b"])
    try:
        yield variant
    finally:
        variant.restore()


@pytest.fixture
def agent_a_variant(fleet: Fleet) -> Iterator[AgentVariant]:
    variant = AgentVariant(fleet.agents["a"])
    try:
        yield variant
    finally:
        variant.restore()


# Request these before the agent's variant fixture: the relay must outlive the agent
# that was pointed at it, and fixtures are torn down in reverse order.
@pytest.fixture
def relay_a(fleet: Fleet) -> Iterator[PausableRelay]:
    with PausableRelay(fleet.vllms["a"].url) as relay:
        yield relay


@pytest.fixture
def relay_b(fleet: Fleet) -> Iterator[PausableRelay]:
    with PausableRelay(fleet.vllms["b"].url) as relay:
        yield relay
