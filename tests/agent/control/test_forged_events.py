"""Forged events on an open NATS change nothing an agent serves.

A real registry (SQLite, local blobs) over HTTP, a real NATS JetStream that takes no
credentials, a real agent in this loop and the vLLM stand-in. The attacker holds no
registry secret: it publishes on the events subjects like anyone on the network, and
runs a web server of its own where its forged file URLs point. The review's four
forgeries (a file URL on the attacker's host, a version that does not exist with the
bytes inline, an adapter name that climbs out of the cache, a route to another
tenant's adapter) and fifty chained route revisions from the future are refused;
what the registry then publishes is still served.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.js.client import JetStreamContext
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from devharness.adapters import make_adapter
from devharness.services import NatsService
from devharness.vllm_standin import StandIn
from devharness.vllm_standin import create_app as standin_app
from devharness.waiting import eventually
from inference_agent.service import Agent
from inference_agent.settings import AgentSettings
from loraplane.event_signing import SIGNATURE_HEADER, EventSigner
from loraplane.events import STREAM_NAME, subject_for
from tests.agent.loop_support import ServedRegistry, running_agent, serve_app, served_registry

BASE = "tiny-llama"
REJECTED = "loraplane_agent_events_rejected_total"


class Attacker:
    """A web server that records every request and the headers it came with."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []

    def app(self) -> Starlette:
        async def anything(request: Request) -> Response:
            self.requests.append(dict(request.headers))
            return Response(b"{}", media_type="application/json")
        return Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])


@pytest.fixture
def nats_service(nats: NatsService) -> NatsService:
    return nats


@pytest.fixture
async def reg(tmp_path: Path, nats: NatsService) -> AsyncIterator[ServedRegistry]:
    async with served_registry(tmp_path, nats) as served:
        yield served


async def last_event(js: JetStreamContext, tenant: str, adapter: str) -> dict[str, Any]:
    msg = await js.get_last_msg(STREAM_NAME, subject_for(tenant, adapter))
    assert msg.data is not None
    event: dict[str, Any] = json.loads(msg.data)
    return event


def forged_version(real: dict[str, Any], attacker: str) -> dict[str, Any]:
    """acme-bot@78, which does not exist: the next revision, its files on the attacker's
    host and inline, with sizes and sha256s that match what is inline."""
    event = copy.deepcopy(real)
    event.update(event_id=str(uuid.uuid4()), revision=real["revision"] + 1, version=78,
                 previous_version=real["version"])
    target = event["target"]
    target["version"] = 78
    for files in (event["files"], target["files"]):
        for entry in files:
            entry["url"] = f"{attacker}/steal/{entry['name']}"
            entry["direct_url"] = f"{attacker}/direct/{entry['name']}"
    config = next(f for f in target["files"] if f["name"] == "adapter_config.json")
    config["content"] = base64.b64encode(b"{}").decode()
    return event


def escaping(real: dict[str, Any]) -> dict[str, Any]:
    event = copy.deepcopy(real)
    event.update(event_id=str(uuid.uuid4()), adapter="../../x", revision=1)
    event["target"]["adapter"] = "../../x"
    return event


def route_to(tenant: str, adapter: str, owner: str, revision: int, key: str = "c1"
             ) -> dict[str, Any]:
    rule = {"kind": "customer", "key": key, "adapter": adapter, "alias": "live",
            "tenant": owner, "base_model": BASE}
    return {"type": "route_changed", "event_id": str(uuid.uuid4()), "seq": 10_000 + revision,
            "time": "2026-11-29T00:00:00Z", "tenant": tenant, "adapter": adapter,
            "kind": "customer", "key": key, "rule": rule, "route_revision": revision}


def live_version(agent: Agent) -> int | None:
    _revision, ref = agent.routes.alias("acme-bot", "live")
    return ref.version if ref is not None else None


def rejected(agent: Agent, reason: str) -> float:
    value = agent.metrics.registry.get_sample_value(REJECTED, {"reason": reason})
    return value or 0.0


async def start_agent(reg: ServedRegistry, nats: NatsService, tmp_path: Path,
                      vllm_url: str) -> AgentSettings:
    return AgentSettings(
        registry=reg.url, token=await reg.agent_token(), nats_url=nats.url,
        vllm_url=vllm_url, base_model=BASE, agent_id="target", port=0,
        cache_dir=tmp_path / "host" / "cache", credentials_refresh_s=3600,
        # No periodic resync during the test: a forgery believed would stay served.
        resync_interval_s=3600)


async def test_forged_events_change_nothing_served(
        reg: ServedRegistry, nats_service: NatsService, tmp_path: Path) -> None:
    await reg.harness.create_adapter("acme-bot")
    await reg.publish("acme-bot", make_adapter(tmp_path / "a1", seed=1))
    await reg.harness.create_adapter("evil-bot", tenant="evil")
    await reg.publish("evil-bot", make_adapter(tmp_path / "e1", seed=2))
    attacker = Attacker()
    client = await nats.connect(nats_service.url)
    js = client.jetstream()
    try:
        async with serve_app(attacker.app()) as evil_url, \
                serve_app(standin_app(StandIn(BASE))) as vllm_url:
            settings = await start_agent(reg, nats_service, tmp_path, vllm_url)
            async with running_agent(settings) as agent:
                await forge_and_check(reg, agent, js, evil_url, attacker, tmp_path)
    finally:
        await client.close()


async def forge_and_check(reg: ServedRegistry, agent: Agent, js: JetStreamContext,
                          evil_url: str, attacker: Attacker, tmp_path: Path) -> None:
    await eventually(lambda: live_version(agent) == 1, what="acme-bot served")
    real = await last_event(js, "acme", "acme-bot")
    forgeries: list[tuple[dict[str, Any], dict[str, str] | None]] = [
        (forged_version(real, evil_url), None),
        (escaping(real), None),
        (route_to("acme", "evil-bot", "evil", 1), None),
    ]
    forgeries += [(route_to("acme", "evil-bot", "evil", r, key=f"k{r}"), None)
                  for r in range(2, 52)]
    # Signed, but by the attacker's own key; and the registry's key id with a bad one.
    own = EventSigner(Ed25519PrivateKey.generate())
    version = forged_version(real, evil_url)
    data = json.dumps(version).encode()
    forgeries.append((version, {SIGNATURE_HEADER: own.header(data)}))
    registry_kid = reg.harness.ctx.relay.signer.key_id
    bad = f"ed25519:{registry_kid}:{base64.b64encode(bytes(64)).decode()}"
    forgeries.append((version, {SIGNATURE_HEADER: bad}))
    for event, headers in forgeries:
        await js.publish(subject_for(event["tenant"], "x"), json.dumps(event).encode(),
                         stream=STREAM_NAME, headers=headers)

    def counted() -> bool:
        return (rejected(agent, "unsigned"), rejected(agent, "unknown_key"),
                rejected(agent, "bad_signature")) == (53.0, 1.0, 1.0)

    await eventually(counted, timeout_s=30, what="every forgery refused")
    # The registry's own moves are still believed and applied.
    await reg.put_route("customer", "c2", "acme-bot")
    await reg.publish("acme-bot", make_adapter(tmp_path / "a2", seed=3))
    await eventually(lambda: live_version(agent) == 2, timeout_s=30,
                     what="the registry's version 2 served")
    await eventually(lambda: agent.routes.resolve(None, {"X-Customer-Id": "c2"}, "acme")
                     .model_name == "acme-bot@2", timeout_s=30, what="the real route")
    assert attacker.requests == [], "nothing reached the attacker's host"
    served = {ref.version for _rev, ref in agent.routes.aliases("acme-bot").values()}
    assert served == {2}
    assert ("acme-bot", 78) not in agent.materializer.on_disk()
    target = agent.routes.resolve(None, {"X-Customer-Id": "c1"}, "acme")
    assert target.model_name == BASE, "acme is routed to no other tenant's adapter"
    host = tmp_path / "host"
    assert sorted(p.name for p in host.iterdir()) == ["cache"], "nothing beside the cache"
    assert not (tmp_path / "x").exists() and not (host / "x").exists()
