"""NATS permissions, against a real nats-server: the agent user consumes the events and
can publish none; the registry user publishes them (loraplane/nats_permissions.py).

Run twice: on the config the registry's embedded default generates (random passwords
in the data folder), and on deploy/nats/loraplane-auth.conf, the file compose.yaml and
deploy/kubernetes give their NATS server (passwords from its environment).
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from devharness.waiting import eventually
from inference_agent.control.pull import PullStream
from loraplane.embedded_nats import PASSWORD_FILES, EmbeddedAuth, EmbeddedNats
from loraplane.events import STREAM_NAME, STREAM_SUBJECTS
from loraplane.nats_auth import NatsSecurity
from loraplane.nats_permissions import AGENT_USER, PASSWORD_ENV, REGISTRY_USER
from loraplane.netutil import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CONFIG = ROOT / "deploy" / "nats" / "loraplane-auth.conf"
CONSUMER = "agent-a1"


class DeployAuth(EmbeddedAuth):
    """The shipped deployment config, its passwords in the server's environment."""

    def config_text(self) -> str:
        return DEPLOY_CONFIG.read_text()


@contextmanager
def server_env(auth: EmbeddedAuth, deploy: bool) -> Iterator[None]:
    if not deploy:
        yield
        return
    saved = {name: os.environ.get(name) for name in PASSWORD_ENV.values()}
    os.environ.update({PASSWORD_ENV[user]: password
                       for user, password in auth.passwords.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Recorder:
    """What the server told a client asynchronously (a permissions violation, say)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    async def __call__(self, exc: Exception) -> None:
        self.errors.append(str(exc))


@asynccontextmanager
async def connected(url: str, security: NatsSecurity | None,
                    errors: Recorder | None = None) -> AsyncIterator[NatsClient]:
    options = security.connect_options() if security is not None else {}
    recorder = errors or Recorder()

    async def on_error(exc: Exception) -> None:
        await recorder(exc)

    client = await nats.connect(url, connect_timeout=2, allow_reconnect=False,
                                error_cb=on_error, **options)
    try:
        yield client
    finally:
        await client.close()


async def messages(url: str, security: NatsSecurity | None) -> int:
    async with connected(url, security) as client:
        info = await client.jetstream().stream_info(STREAM_NAME)
        return int(info.state.messages)


@pytest.mark.parametrize("deploy", [False, True], ids=["embedded-default", "deploy-config"])
async def test_agents_consume_and_only_the_registry_publishes(tmp_path: Path,
                                                              deploy: bool) -> None:
    store = tmp_path / "nats"
    auth = EmbeddedAuth.load_or_create(store)
    if deploy:
        auth = DeployAuth(auth.passwords)
    with server_env(auth, deploy):
        server = EmbeddedNats(store, free_port(), auth=auth)
        await server.start_async()
    try:
        await _check(server)
    finally:
        await server.stop_async()


async def _check(server: EmbeddedNats) -> None:
    url = server.url
    registry, agent = server.security(REGISTRY_USER), server.security(AGENT_USER)
    # Without credentials the server lets nobody in.
    with pytest.raises((nats.errors.Error, OSError)):
        async with connected(url, None):
            pass

    async with connected(url, registry) as client:
        js = client.jetstream()
        await js.add_stream(StreamConfig(name=STREAM_NAME, subjects=[STREAM_SUBJECTS],
                                         storage=StorageType.FILE))
        ack = await js.publish("loraplane.events.acme.x", b"from the registry",
                               headers={"Nats-Msg-Id": "event-1"})
        assert ack.seq == 1
    assert await messages(url, registry) == 1

    errors = Recorder()
    async with connected(url, agent, errors) as client:
        js = client.jetstream()
        # The agent's own path (inference_agent/control/follower.py): a durable pull
        # consumer of its own, deleted and created from a sequence, fetched from, acked.
        with pytest.raises(NotFoundError):  # an answer: the request was allowed
            await js.delete_consumer(STREAM_NAME, CONSUMER)
        await js.add_consumer(STREAM_NAME, ConsumerConfig(
            durable_name=CONSUMER, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=1, ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
            filter_subject=STREAM_SUBJECTS))
        await js.consumer_info(STREAM_NAME, CONSUMER)
        await js.stream_info(STREAM_NAME)
        pull = PullStream(client, STREAM_NAME, CONSUMER, batch=8)
        await pull.open()
        message = await pull.next(5.0)
        assert message.data == b"from the registry"
        await message.ack()
        await client.flush()

        async def acked() -> bool:
            info = await js.consumer_info(STREAM_NAME, CONSUMER)
            return int(info.ack_floor.stream_seq) == 1

        await eventually(acked, timeout_s=5, what="the ack recorded")

        # A forged event: refused by the server, nothing stored.
        await client.publish("loraplane.events.acme.x", b"forged")
        await client.flush()
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish("loraplane.events.acme.x", b"forged", timeout=1)
        # Nor may it change the stream: the requests never reach JetStream.
        for action in ("PURGE", "DELETE"):
            with pytest.raises(nats.errors.TimeoutError):
                await client.request(f"$JS.API.STREAM.{action}.{STREAM_NAME}", b"",
                                     timeout=1)
        await client.flush()
    # nats-py reports them in lower case.
    violations = [e.lower() for e in errors.errors if "permissions violation" in e.lower()]
    assert any('publish to "loraplane.events.acme.x"' in e for e in violations), errors.errors
    for action in ("purge", "delete"):
        assert any(f"stream.{action}.loraplane" in e for e in violations), errors.errors
    assert await messages(url, registry) == 1

    async with connected(url, registry) as client:
        ack = await client.jetstream().publish("loraplane.events.acme.x", b"second",
                                               headers={"Nats-Msg-Id": "event-2"})
        assert ack.seq == 2
    assert await messages(url, registry) == 2


def test_the_embedded_passwords_are_random_private_and_kept(tmp_path: Path) -> None:
    first = EmbeddedAuth.load_or_create(tmp_path)
    assert first.passwords[REGISTRY_USER] != first.passwords[AGENT_USER]
    for name in PASSWORD_FILES.values():
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert EmbeddedAuth.load_or_create(tmp_path) == first == EmbeddedAuth.read(tmp_path)
    other = EmbeddedAuth.load_or_create(tmp_path / "other")
    assert set(other.passwords.values()).isdisjoint(first.passwords.values())
    assert first.passwords[AGENT_USER] in first.config_text()
