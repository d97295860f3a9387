"""Every kind of NATS credentials against a real nats-server secured with it.

For each kind the registry's bus (what the relay publishes through) and the agent's
follower connect with the project's own connect code, an event goes round, and wrong
credentials fail quickly with a reason that names the problem.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import nkeys
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import SecretStr

from devharness.waiting import eventually
from inference_agent.control.follower import Follower
from inference_agent.control.keys import CREDENTIALS
from inference_agent.control.workqueue import Backoff
from loraplane.event_signing import EventSigner
from loraplane.events import subject_for
from loraplane.nats_auth import NatsSecurity
from registry_service.errors import EventBusUnavailable
from registry_service.events.bus import EventBus
from tests.agent.trust_support import trusting
from tests.core.nats_auth_support import (
    decentralized,
    make_pki,
    new_keypair,
    secured_nats,
    tls_config,
)

PASSWORD = "pa55-word-secret"
TOKEN = "t0ken-secret"
# The registry's relay signs what it publishes; the follower believes only this key.
SIGNER = EventSigner(Ed25519PrivateKey.generate())


@dataclass
class Secured:
    url: str
    good: NatsSecurity
    wrong: NatsSecurity
    # What the failure with ``wrong`` says.
    refusal: str


def _seed_file(path: Path) -> tuple[Path, str]:
    user = new_keypair(nkeys.PREFIX_BYTE_USER)
    path.write_bytes(user.seed + b"\n")
    return path, user.public_key.decode()


@pytest.fixture(params=["user_password", "token", "nkey", "creds", "tls", "tls_first"])
def secured(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Secured]:
    kind = str(request.param)
    work = tmp_path / kind
    work.mkdir()
    authorization = "authorization violation"
    if kind == "user_password":
        config = f'authorization {{\n  user: alice\n  password: "{PASSWORD}"\n}}\n'
        good = NatsSecurity(user="alice", password=SecretStr(PASSWORD))
        wrong = NatsSecurity(user="alice", password=SecretStr("not-" + PASSWORD))
    elif kind == "token":
        config = f'authorization {{\n  token: "{TOKEN}"\n}}\n'
        good, wrong = (NatsSecurity(token=SecretStr(TOKEN)),
                       NatsSecurity(token=SecretStr("not-" + TOKEN)))
    elif kind == "nkey":
        seed, public = _seed_file(work / "user.nk")
        stranger, _ = _seed_file(work / "stranger.nk")
        config = f"authorization {{\n  users: [ {{ nkey: {public} }} ]\n}}\n"
        good, wrong = NatsSecurity(nkey_seed_file=seed), NatsSecurity(nkey_seed_file=stranger)
    elif kind == "creds":
        operator = decentralized(work)
        config = operator.config
        good = NatsSecurity(creds_file=operator.creds_file)
        wrong = NatsSecurity(creds_file=operator.stranger_creds_file)
    else:
        pki, first = make_pki(work), kind == "tls_first"
        config = tls_config(pki, handshake_first=first)
        good = NatsSecurity(tls_ca_file=pki.ca_file, tls_cert_file=pki.client_cert,
                            tls_key_file=pki.client_key, tls_handshake_first=first)
        # The server's CA is not among the system's: its certificate is refused.
        wrong = NatsSecurity(tls_cert_file=pki.client_cert, tls_key_file=pki.client_key,
                             tls_handshake_first=first)
        authorization = "certificate verify failed"
    with secured_nats(work / "server", config) as url:
        yield Secured(url, good, wrong, authorization)


@asynccontextmanager
async def following(url: str, security: NatsSecurity,
                    keys: list[str]) -> AsyncIterator[Follower]:
    follower = Follower(url, agent_id="gpu-secure", base_model="tiny", enqueue=keys.append,
                        trust=trusting(SIGNER),
                        fetch_timeout_s=0.5, error_streak=2, connect_timeout_s=3,
                        request_timeout_s=3, backoff=Backoff(0.2, 1.0), security=security)
    task = asyncio.create_task(follower.run(1))
    try:
        yield follower
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def _event(seq: int) -> bytes:
    return json.dumps({"type": "credentials_changed", "event_id": f"e-{seq}", "seq": seq,
                       "time": "2026-01-01T00:00:00Z", "tenant": "acme",
                       "adapter": ""}).encode()


async def _ready_bus(url: str, security: NatsSecurity) -> EventBus:
    bus = EventBus(url, security=security, connect_deadline_s=5)
    await bus.connect()
    # JetStream may still be opening its store just after the server starts listening.
    async def stream_ready() -> bool:
        await bus.ensure_stream()
        return True

    await eventually(stream_ready, timeout_s=10, what="the stream",
                     retrying=(EventBusUnavailable,))
    return bus


async def test_the_relay_publishes_and_the_follower_receives(secured: Secured) -> None:
    bus = await _ready_bus(secured.url, secured.good)
    keys: list[str] = []
    try:
        async with following(secured.url, secured.good, keys) as follower:
            await asyncio.wait_for(follower.connected.wait(), 15)
            data = _event(1)
            await bus.publish(subject_for("acme", ""), data, "e-1",
                              signature=SIGNER.header(data))
            await eventually(lambda: CREDENTIALS in keys, timeout_s=10, what="the event")
    finally:
        await bus.close()


async def test_wrong_credentials_fail_fast_with_the_reason(
    secured: Secured, caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus(secured.url, security=secured.wrong, connect_deadline_s=3)
    with caplog.at_level(logging.DEBUG), pytest.raises(EventBusUnavailable) as refused:
        await asyncio.wait_for(bus.connect(), 10)
    assert secured.refusal in str(refused.value.detail["reason"]).lower()

    keys: list[str] = []
    async with following(secured.url, secured.wrong, keys) as follower:
        def refused_logged() -> bool:
            return any(secured.refusal in r.getMessage().lower() and r.levelno >= logging.WARNING
                       for r in caplog.records)

        await eventually(refused_logged, timeout_s=15, what="the follower's refusal")
        assert not follower.connected.is_set()
    for record in caplog.records:
        assert PASSWORD not in record.getMessage() and TOKEN not in record.getMessage()
