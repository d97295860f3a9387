"""The agent's service layer without vLLM: status reports to a real registry over HTTP
(through outages), and start-up that fails in order."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from devharness.services import NatsService
from devharness.tcp_pause import HELD_PROMPT, PausableTcpProxy
from devharness.vllm import VllmServer
from devharness.waiting import eventually
from inference_agent.control.failures import VersionFailure
from inference_agent.errors import VllmUnavailable
from inference_agent.node.registry_client import RegistryLink
from inference_agent.node.status import StatusReporter
from inference_agent.node.vllm_client import VllmClient
from inference_agent.service import Agent
from inference_agent.serving.routes import RouteTable
from inference_agent.settings import AgentSettings
from loraplane.events import AgentStatus, CanaryRoute, FileRef, VersionRef
from loraplane.netutil import free_port
from tests.agent.loop_support import FakeSwapper, ServedRegistry, served_registry

BASE = "tiny-llama"


def keys_file(folder: Path, tenant: str = "local", secret: str = "lp_local") -> Path:
    """A ``--keys-file`` with one credential."""
    path = folder / "keys"
    path.write_text(f"{tenant} {hashlib.sha256(secret.encode()).hexdigest()}\n")
    return path


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def ref(adapter: str, version: int) -> VersionRef:
    digest = hashlib.sha256(f"{adapter}{version}".encode()).hexdigest()
    return VersionRef(adapter=adapter, version=version, digest=digest, base_model=BASE,
                      rank=8, alpha=16, target_modules=["q_proj"],
                      files=[FileRef(name="adapter_config.json", size=1, sha256=digest,
                                     url="/x")])


class Loaded:
    def __init__(self) -> None:
        self.names: list[str] = []

    def loaded_names(self) -> list[str]:
        return list(self.names)


class Failures:
    def __init__(self) -> None:
        self.items: list[VersionFailure] = []
        self.moving: dict[tuple[str, str], int | None] = {}

    def failures(self) -> list[VersionFailure]:
        return list(self.items)

    def pending(self) -> dict[tuple[str, str], int | None]:
        return dict(self.moving)


async def reported(reg: ServedRegistry, agent_id: str) -> dict[str, Any] | None:
    response = await reg.harness.client.get("/v1/agents", headers=reg.harness.admin_headers)
    assert response.status_code == 200, response.text
    found = [a for a in response.json()["agents"] if a["agent_id"] == agent_id]
    return found[0]["status"] if found else None


async def test_status_reports_changes_and_survives_a_registry_outage(
        tmp_path: Path, nats: NatsService) -> None:
    port = free_port()
    routes, loaded, failures = RouteTable(BASE), Loaded(), Failures()
    routes.set_alias("bot", "live", 1, ref("bot", 1))
    loaded.names = ["bot@1"]
    async with served_registry(tmp_path, nats, port) as reg:
        client = RegistryLink(reg.url, await reg.agent_token())
        tried: list[AgentStatus] = []

        async def post(status: AgentStatus) -> None:
            tried.append(status)
            await client.post_status(status)

        reporter = StatusReporter(agent_id="gpu-1", base_model=BASE, routes=routes,
                                  cache=loaded, swapper=FakeSwapper(routes),
                                  sources=[failures], post=post,
                                  heartbeat_interval_s=30, debounce_s=0.1, retry_s=0.3)
        task = asyncio.create_task(reporter.run())
        state: dict[str, Any] = {}

        async def shows(check: Any) -> bool:
            state["status"] = await reported(reg, "gpu-1")
            return state["status"] is not None and bool(check(state["status"]))

        await eventually(lambda: shows(lambda s: s["served"]), what="first report")
        assert state["status"]["served"] == [{"adapter": "bot", "alias": "live", "version": 1,
                                              "state": "serving", "reason": None,
                                              "code": None}]
        assert state["status"]["loaded"] == ["bot@1"]
        # Several changes in a burst make one post, not one each.
        posted = reporter.posted
        routes.set_alias("bot", "live", 2, ref("bot", 2))
        failures.moving[("bot", "canary")] = 3
        failures.items.append(VersionFailure(
            adapter="bot", alias="canary", version=4, digest="d", code="rank_too_large",
            reason="rank 32 > 16", attempts=1, bad=True))
        for _ in range(5):
            reporter.changed()
        await eventually(lambda: shows(lambda s: s["failures"]), what="change reported")
        assert reporter.posted == posted + 1
        status = state["status"]
        assert {(e["alias"], e["version"], e["state"]) for e in status["served"]} == \
            {("live", 2, "serving"), ("canary", 3, "loading")}
        assert status["failures"][0]["code"] == "rank_too_large"
        assert status["failures"][0]["state"] == "failed"
    # The registry is down: the reporter keeps running and retries.
    posted, tries = reporter.posted, len(tried)
    routes.set_alias("bot", "live", 3, ref("bot", 5))
    reporter.changed()
    # The change was tried, failed, and was tried again: the reporter retries.
    await eventually(lambda: len(tried) >= tries + 2, what="a report and its retry")
    assert ("live", 5) in {(v.alias, v.version) for v in tried[-1].served}
    assert not task.done() and reporter.posted == posted
    async with served_registry(tmp_path, nats, port) as reg:
        await eventually(lambda: shows(lambda s: s["served"][0]["version"] == 5),
                         timeout_s=10, what="report after the outage")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.aclose()


async def test_start_up_waits_for_vllm_then_fails_in_order(tmp_path: Path) -> None:
    watch = tmp_path / "watch"
    watch.mkdir()
    settings = AgentSettings(base_model=BASE, watch_dir=watch, cache_dir=tmp_path / "cache",
                             keys_file=keys_file(tmp_path),
                             vllm_url=f"http://127.0.0.1:{free_port()}", port=0,
                             vllm_ready_timeout_s=1.5, agent_id="gpu-1")
    agent = Agent(settings)
    run = asyncio.create_task(agent.run(install_signals=False))
    await eventually(lambda: agent.url is not None, what="listening")
    assert agent.url is not None
    async with httpx.AsyncClient(base_url=agent.url) as client:
        await eventually(lambda: _answers(client), what="proxy up")
        response = await client.get("/readyz")
        assert response.status_code == 503 and response.json()["started"] is False
    with pytest.raises(VllmUnavailable, match="not ready"):
        await run
    assert agent.draining and not agent.ready.is_set()


async def test_stop_during_start_up_is_clean(tmp_path: Path) -> None:
    watch = tmp_path / "watch"
    watch.mkdir()
    settings = AgentSettings(base_model=BASE, watch_dir=watch, cache_dir=tmp_path / "cache",
                             keys_file=keys_file(tmp_path),
                             vllm_url=f"http://127.0.0.1:{free_port()}", port=0,
                             agent_id="gpu-1", shutdown_grace_s=1)
    agent = Agent(settings)
    run = asyncio.create_task(agent.run(install_signals=False))
    await eventually(lambda: agent.url is not None, what="listening")
    assert agent.url is not None
    async with httpx.AsyncClient(base_url=agent.url) as client:
        # Serving, and still waiting for vLLM: the stop lands in the middle of start-up.
        await eventually(lambda: _answers(client), what="proxy up")
        response = await client.get("/readyz")
        assert response.status_code == 503 and response.json()["started"] is False
    agent.stop()
    async with asyncio.timeout(10):
        await run
    assert agent.url is not None
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(base_url=agent.url) as client:
            await client.get("/healthz")


async def _answers(client: httpx.AsyncClient) -> bool:
    try:
        await client.get("/healthz")
    except httpx.TransportError:
        return False
    return True


# --- Agent.run() against a real vLLM, a real registry over HTTP and a real NATS -----------


async def complete(client: httpx.AsyncClient, model: str,
                   secret: str | None = None) -> tuple[int, str | None, str]:
    headers = bearer(secret) if secret is not None else None
    response = await client.post("/v1/completions", json={
        "model": model, "prompt": "hello there", "max_tokens": 8, "temperature": 0},
        headers=headers)
    text = response.json()["choices"][0]["text"] if response.status_code == 200 else \
        response.text
    return response.status_code, response.headers.get("x-loraplane-adapter"), text


@pytest.mark.vllm
async def test_agent_follows_swaps_repairs_and_shuts_down_gracefully(
        tmp_path: Path, nats: NatsService, tiny_model: Path, vllm_server: VllmServer,
        tcp_proxy: PausableTcpProxy) -> None:
    adapters = tiny_model / "adapters"
    vllm = VllmClient(vllm_server.url)
    async with served_registry(tmp_path, nats) as reg:
        for name in ("bot", "cold"):
            await reg.harness.create_adapter(name)
        await reg.publish("bot", adapters / "a1")
        await reg.publish("cold", adapters / "a3")
        watch = tmp_path / "watch"
        shutil.copytree(adapters / "a4", watch / "local")
        settings = AgentSettings(
            registry=reg.url, token=await reg.agent_token(), nats_url=nats.url,
            vllm_url=tcp_proxy.url, base_model=BASE, agent_id="gpu-1", port=0,
            base_model_config=tiny_model / "base" / "config.json",
            cache_dir=tmp_path / "cache", max_loaded=3, pin=["bot"], watch_dir=watch,
            watch_tenant="acme",
            resync_interval_s=1.5, heartbeat_interval_s=2, drain_timeout_s=5,
            shutdown_grace_s=15, retry_base_s=0.2, retry_max_s=1, max_attempts=2)
        _id, secret = await reg.inference_token("acme")
        agent = Agent(settings)
        run = asyncio.create_task(agent.run(install_signals=False))
        started = time.monotonic()
        async with asyncio.timeout(120):
            await agent.ready.wait()
        print(f"ready after {time.monotonic() - started:.2f}s")
        assert agent.url is not None
        assert await vllm.loaded() == {"bot@1"}, "the pinned adapter loads at start-up"
        async with httpx.AsyncClient(base_url=agent.url, timeout=60,
                                     headers=bearer(secret)) as client:
            status, served, first = await complete(client, "bot")
            assert (status, served) == (200, "bot@1")
            assert (await complete(client, "cold"))[:2] == (200, "cold@1")
            assert await vllm.loaded() == {"bot@1", "cold@1"}, "cold loads at first use"

            # A new version: event -> reconcile -> load -> flip -> drain -> unload.
            swap_started = time.monotonic()
            await reg.publish("bot", adapters / "a2")
            await eventually(lambda: _serves(client, "bot", "bot@2"), timeout_s=30,
                             what="bot@2 serving")
            print(f"bot@2 served {time.monotonic() - swap_started:.2f}s after the publish")
            status, _served, second = await complete(client, "bot")
            assert status == 200 and second != first
            await eventually(lambda: _lacks(vllm, "bot@1"), timeout_s=30, what="bot@1 gone")

            # A version vLLM cannot take: refused before loading, reported, bot@2 stays.
            await reg.publish("bot", adapters / "bad-rank")
            await eventually(lambda: _failed(reg, "rank_too_large"), timeout_s=30,
                             what="failure reported")
            assert (await complete(client, "bot"))[:2] == (200, "bot@2")

            # The watched folder is served too, and a change in it is a new version.
            assert (await complete(client, "local"))[:2] == (200, "local@1")
            shutil.copy(adapters / "a5" / "adapter_model.safetensors",
                        watch / "local" / "adapter_model.safetensors")
            await eventually(lambda: _serves(client, "local", "local@2"), timeout_s=30,
                             what="local@2 serving")

            # Drift: unloaded by hand; the periodic resync reloads the pinned version.
            await vllm.unload("bot@2")
            await eventually(lambda: _has(vllm, "bot@2"), timeout_s=30, what="bot@2 back")

            # Staged shutdown: a running stream finishes, new requests get 503.
            chunks = await _stream_across_shutdown(client, agent, tcp_proxy)
            assert chunks[-1] == "data: [DONE]" and len(chunks) > 20
        await asyncio.wait_for(run, 30)
    await vllm.aclose()


async def _stream_across_shutdown(client: httpx.AsyncClient, agent: Agent,
                                  tcp_proxy: PausableTcpProxy) -> list[str]:
    # Held by the TCP proxy until the refusal is seen: had the stream ended before stop(),
    # the agent would be gone, not refusing.
    body = {"model": "cold", "prompt": HELD_PROMPT, "max_tokens": 200,
            "temperature": 0, "stream": True, "ignore_eos": True}
    chunks: list[str] = []
    with tcp_proxy.holding():
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200, await response.aread()
            lines = response.aiter_lines()
            async for line in lines:
                if line:
                    chunks.append(line)
                    break
            agent.stop()
            refused = await client.post("/v1/completions",
                                        json={"model": "cold", "prompt": "x"})
            assert refused.status_code == 503, refused.text
            tcp_proxy.release()
            chunks += [line async for line in lines if line]
    return chunks


async def _serves(client: httpx.AsyncClient, model: str, name: str) -> bool:
    status, served, _text = await complete(client, model)
    return status == 200 and served == name


async def _has(vllm: VllmClient, name: str) -> bool:
    return name in await vllm.loaded()


async def _lacks(vllm: VllmClient, name: str) -> bool:
    return name not in await vllm.loaded()


async def _failed(reg: ServedRegistry, code: str) -> bool:
    status = await reported(reg, "gpu-1")
    return status is not None and any(f["code"] == code for f in status["failures"])


@pytest.mark.vllm
@pytest.mark.parametrize("via", ["event", "periodic"])
async def test_inference_tokens_confine_requests_and_revocation_is_honoured(
        vllm_server: VllmServer, tiny_model: Path, tmp_path: Path, nats: NatsService,
        via: str) -> None:
    """Fails on an open serving port. ``event``: only the credentials_changed event
    can tell the agent (the periodic refresh is an hour away); ``periodic``: the agent
    hears no event at all (no NATS), and the refresh alone honours the revocation."""
    async with served_registry(tmp_path, nats) as reg:
        await reg.harness.create_adapter("bot", tenant="acme")
        await reg.harness.create_adapter("g-bot", tenant="globex")
        await reg.publish("bot", tiny_model / "adapters" / "a1")
        await reg.publish("g-bot", tiny_model / "adapters" / "a2")
        acme_id, acme = await reg.inference_token("acme")
        _globex_id, globex = await reg.inference_token("globex")
        settings = AgentSettings(
            registry=reg.url, token=await reg.agent_token(),
            nats_url=nats.url if via == "event" else None, vllm_url=vllm_server.url,
            base_model=BASE, agent_id=f"auth-{via}", port=0, cache_dir=tmp_path / "cache",
            credentials_refresh_s=3600 if via == "event" else 1, retry_base_s=0.2,
            retry_max_s=1)
        agent = Agent(settings)
        run = asyncio.create_task(agent.run(install_signals=False))
        async with asyncio.timeout(120):
            await agent.ready.wait()
        assert agent.url is not None
        async with httpx.AsyncClient(base_url=agent.url, timeout=60) as client:
            await _confined(client, acme, globex)
            if via == "event":
                await _routed_within_tenants(reg, client, acme, globex)
            # A token made after start-up works once the agent heard of it...
            late_id, late = await reg.inference_token("acme")
            await eventually(lambda: _status(client, late, "bot", 200), timeout_s=20,
                             what="the new token accepted")
            # ...and a revoked one is refused within seconds, with no restart.
            await reg.revoke(acme_id)
            await eventually(lambda: _status(client, acme, "bot", 401), timeout_s=20,
                             what="the revoked token refused")
            assert await _status(client, late, "bot", 200)
            await reg.revoke(late_id)
            await eventually(lambda: _status(client, late, "bot", 401), timeout_s=20,
                             what="the second revocation honoured")
        agent.stop()
        await asyncio.wait_for(run, 30)


async def _confined(client: httpx.AsyncClient, acme: str, globex: str) -> None:
    """No token: 401. A token reaches its tenant's adapters only; another tenant's
    answers as an unknown one does, and /v1/models lists only its own."""
    for headers, code in (({}, "missing_api_key"),
                          (bearer("lp_not-a-token"), "invalid_api_key"),
                          ({"Authorization": acme}, "invalid_api_key")):
        for path in ("/v1/completions", "/v1/chat/completions"):
            response = await client.post(path, json={"model": "bot", "prompt": "x",
                                                     "stream": True}, headers=headers)
            assert response.status_code == 401, response.text
            assert response.json()["error"]["code"] == code
            assert response.headers["www-authenticate"] == "Bearer"
        models = await client.get("/v1/models", headers=headers)
        assert models.status_code == 401 and models.json()["error"]["code"] == code
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await client.get(path)).status_code == 200, path
    assert (await complete(client, "bot", acme))[:2] == (200, "bot@1")
    assert (await complete(client, "g-bot", globex))[:2] == (200, "g-bot@1")
    unknown = await complete(client, "nope", acme)
    for model in ("g-bot", "g-bot@live", "g-bot@1"):
        status, served, text = await complete(client, model, acme)
        assert (status, served) == (404, None), text
        assert text.replace("g-bot", "nope") == unknown[2].replace("nope@live", "nope")
    assert (await complete(client, "bot", globex))[0] == 404
    assert (await complete(client, "", acme))[:2] == (200, BASE), "the base model is open"
    listed = await client.get("/v1/models", headers=bearer(acme))
    assert {m["id"] for m in listed.json()["data"]} >= {BASE, "bot", "bot@live"}
    assert not any("g-bot" in m["id"] for m in listed.json()["data"])


async def _routed_within_tenants(reg: ServedRegistry, client: httpx.AsyncClient, acme: str,
                                 globex: str) -> None:
    """The issue's repro end to end: acme's default rule took every tenant's requests
    without a model, and customer keys were shared by all tenants."""
    await reg.put_route("default", "default", "bot")
    await reg.put_route("customer", "alice", "g-bot")

    async def served(secret: str, headers: dict[str, str], name: str) -> bool:
        response = await client.post("/v1/completions", json={
            "prompt": "hello there", "max_tokens": 8, "temperature": 0},
            headers={**bearer(secret), **headers})
        return (response.status_code, response.headers.get("x-loraplane-adapter")) == (
            200, name)

    await eventually(lambda: served(acme, {}, "bot@1"), timeout_s=30,
                     what="acme's default rule applied")
    await eventually(lambda: served(globex, {"X-Customer-Id": "alice"}, "g-bot@1"),
                     timeout_s=30, what="globex's customer rule applied")
    assert await served(globex, {}, BASE), "acme's default routes only acme"
    assert await served(acme, {"X-Customer-Id": "alice"}, "bot@1"), \
        "globex's customer rule routes only globex"


async def _status(client: httpx.AsyncClient, secret: str, model: str, status: int) -> bool:
    return (await complete(client, model, secret))[0] == status


async def test_one_traffic_tally_is_shared_by_the_proxy_the_swap_and_the_reports(
        tmp_path: Path) -> None:
    settings = AgentSettings(base_model=BASE, cache_dir=tmp_path / "cache",
                             keys_file=keys_file(tmp_path), registry="http://127.0.0.1:9",
                             token="lp_agent", canary_report_interval_s=2.5, port=0)
    agent = Agent(settings)
    try:
        assert agent.app.app.state.proxy.tally is agent.tally
        assert agent.swapper._tally is agent.tally
        agent.tally.load_failed(4)  # as the swap tells it: the reports read it
        agent.routes.set_owner("bot", "local")
        agent.routes.set_alias("bot", "live", 1, ref("bot", 1))
        agent.routes.set_canary("bot", "live", CanaryRoute(id=4, weight=5,
                                                           target=ref("bot", 2)))
        assert agent.status is not None
        (side,) = agent.status.build().traffic
        assert (side.canary_id, side.load_failures) == (4, 1)
        assert agent.status._traffic is not None
        assert agent.status._traffic.poll_s() == 2.5
    finally:
        await agent._close_clients()
