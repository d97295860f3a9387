"""One testbed for the whole end-to-end run, every part a separate real process.

Postgres, SeaweedFS (S3) and one NATS; ``loraplane registry serve`` on them; two vLLM
servers (CPU build, the tiny model) and beside each a ``loraplane agent``. Started once
per run of this package and stopped at its end, even when a test fails. The testbed has
a database of its own: the registry tests empty the shared one between tests, and the
testbed's registry would publish their outbox rows.

``agent-a`` resyncs every few seconds (it shows drift being repaired); ``agent-b``
practically never does, so what it learns it learns from the event stream.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devharness.openai_client import OpenAIClient
from devharness.services import NatsService, PostgresDatabase, SeaweedS3, ServiceStartError
from devharness.tcp_pause import PausableTcpProxy
from devharness.testbed import AgentProcess, AgentSpec, Testbed, running_testbed
from devharness.vllm import VllmEnvError
from loraplane.client import AsyncRegistryClient
from loraplane.process import ProcessError
from tests.conftest import fresh_postgres
from tests.e2e.steps import TESTBED_CONTEXT

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
def testbed(e2e_postgres: PostgresDatabase, seaweed: SeaweedS3, e2e_nats: NatsService,
            vllm_python: Path, tiny_model: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    work = tmp_path_factory.mktemp("testbed")
    with contextlib.ExitStack() as stack:
        try:
            running = stack.enter_context(running_testbed(
                work, model_dir=tiny_model, vllm_python=vllm_python,
                database_url=e2e_postgres.url,
                nats=e2e_nats, s3=seaweed, max_loras=3, max_loaded=3,
                max_model_len=TESTBED_CONTEXT,
                agent_settings=AGENT_SETTINGS))
        except (ProcessError, VllmEnvError) as exc:
            pytest.fail(f"the testbed could not be started:\n{exc}", pytrace=False)
        yield running


@pytest.fixture
async def api(testbed: Testbed) -> AsyncIterator[AsyncRegistryClient]:
    async with AsyncRegistryClient(testbed.registry.url, testbed.registry.admin_token,
                                   timeout_s=120) as client:
        yield client


@pytest.fixture
async def agent_a(testbed: Testbed) -> AsyncIterator[OpenAIClient]:
    async with OpenAIClient(testbed.agents["a"].url, token=testbed.inference_token) as client:
        yield client


@pytest.fixture
async def agent_b(testbed: Testbed) -> AsyncIterator[OpenAIClient]:
    async with OpenAIClient(testbed.agents["b"].url, token=testbed.inference_token) as client:
        yield client


@pytest.fixture
async def vllm_a(testbed: Testbed) -> AsyncIterator[OpenAIClient]:
    async with OpenAIClient(testbed.vllms["a"].url) as client:
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
def agent_b_variant(testbed: Testbed) -> Iterator[AgentVariant]:
    variant = AgentVariant(testbed.agents["b"])
    try:
        yield variant
    finally:
        variant.restore()


@pytest.fixture
def agent_a_variant(testbed: Testbed) -> Iterator[AgentVariant]:
    variant = AgentVariant(testbed.agents["a"])
    try:
        yield variant
    finally:
        variant.restore()


# Request these before the agent's variant fixture: the TCP proxy must outlive the agent
# that was pointed at it, and fixtures are torn down in reverse order.
@pytest.fixture
def tcp_proxy_a(testbed: Testbed) -> Iterator[PausableTcpProxy]:
    with PausableTcpProxy(testbed.vllms["a"].url) as tcp_proxy:
        yield tcp_proxy


@pytest.fixture
def tcp_proxy_b(testbed: Testbed) -> Iterator[PausableTcpProxy]:
    with PausableTcpProxy(testbed.vllms["b"].url) as tcp_proxy:
        yield tcp_proxy
