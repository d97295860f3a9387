"""The agent's front door against a real vLLM server (CPU build, tiny model).

The route table, leases, cache, materializer and vLLM client are the agent's own; the
proxy runs under uvicorn. Requests that compare outputs run one at a time, and base
and adapter requests never overlap (the CPU engine's batching bug, see docs/vllm.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from devharness.registry import admin_headers, registry_settings
from devharness.services import NatsService
from devharness.tcp_pause import PausableTcpProxy
from devharness.uploads import adapter_parts
from devharness.vllm import VllmServer
from devharness.waiting import eventually
from inference_agent.node.registry_client import RegistryLink
from loraplane.events import RouteRule, VersionRef
from loraplane.netutil import free_port
from registry_service.app import create_app
from tests.agent.openai_calls import (
    CHAT,
    COMPLETION,
    HEADER,
    HELD_STREAM,
    assert_openai_error,
    post,
    sse,
    streamed_text,
    tokens,
)
from tests.agent.proxy_harness import (
    BASE,
    AgentOptions,
    ProxyAgent,
    local_ref,
    running_agent,
    serve_asgi,
)
from tests.vllm_fixtures import SHARED_CONTEXT

pytestmark = pytest.mark.vllm
# The shared server's context: room for a stream that cannot end before its client
# has gone.
CONTEXT = SHARED_CONTEXT

Versions = dict[str, tuple[VersionRef, Path]]


@pytest.fixture(scope="module")
def versions(tiny_model: Path) -> Versions:
    """support@1 = a1, support@2 = a2, sql@3 = a3: three distinct sets of weights."""
    folders = tiny_model / "adapters"
    return {
        "support@1": (local_ref(folders / "a1", "support", 1), folders / "a1"),
        "support@2": (local_ref(folders / "a2", "support", 2), folders / "a2"),
        "sql@3": (local_ref(folders / "a3", "sql", 3), folders / "a3"),
    }


def route_aliases(agent: ProxyAgent, versions: Versions) -> None:
    agent.route("support", "live", 1, versions["support@1"][0])
    agent.route("support", "canary", 1, versions["support@2"][0])
    agent.route("sql", "live", 1, versions["sql@3"][0])


def rule(kind: str, key: str, adapter: str, alias: str) -> RouteRule:
    return RouteRule(kind=kind, key=key, adapter=adapter, alias=alias,
                     tenant="acme", base_model=BASE)


@pytest.fixture
async def agent(tcp_proxy: PausableTcpProxy, tiny_model: Path, versions: Versions,
                tmp_path: Path) -> AsyncIterator[ProxyAgent]:
    async with running_agent(tcp_proxy.url, tiny_model / "base", tmp_path / "cache",
                             versions.values()) as running:
        route_aliases(running, versions)
        yield running


@pytest.fixture
async def agent_with_registry(vllm_server: VllmServer, tiny_model: Path, tmp_path: Path,
                              nats: NatsService) -> AsyncIterator[ProxyAgent]:
    """An agent following a real registry (over HTTP) where ``support`` has versions 1
    (a1) and 2 (a2) and only ``live`` -> 2 is routed."""
    settings = registry_settings("embedded", tmp_path / "registry", nats.url, None, None)
    async with (serve_asgi(create_app(settings)) as url,
                httpx.AsyncClient(base_url=url, headers=admin_headers(),
                                  timeout=60.0) as admin):
        created = await admin.post("/v1/adapters", json={
            "name": "support", "base_model": BASE, "tenant": "acme"})
        assert created.status_code == 201, created.text
        for folder in ("a1", "a2"):
            uploaded = await admin.post(
                "/v1/adapters/support/versions", data={"aliases": "live"},
                files=adapter_parts(tiny_model / "adapters" / folder))
            assert uploaded.status_code == 201, uploaded.text
        token = await admin.post("/v1/tokens", json={"name": "agent", "role": "agent"})
        registry = RegistryLink(url, token.json()["secret"])
        try:
            async with running_agent(vllm_server.url, tiny_model / "base", tmp_path / "cache",
                                     options=AgentOptions(registry=registry)) as running:
                running.route("support", "live", 2,
                                         await registry.version("support", 2))
                yield running
        finally:
            await registry.aclose()


@pytest.fixture
async def direct(vllm_server: VllmServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=60.0) as client:
        yield client


async def test_completions_and_chat_equal_vllm_direct(
        agent: ProxyAgent, direct: httpx.AsyncClient) -> None:
    proxied = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support"})
    assert proxied.headers[HEADER] == "support@1"
    assert proxied.json()["model"] == "support@1"
    reference = await post(direct, "/v1/completions", {**COMPLETION, "model": "support@1"})
    assert tokens(proxied) == tokens(reference)
    assert proxied.json()["choices"][0]["text"] == reference.json()["choices"][0]["text"]

    chat = await post(agent.client, "/v1/chat/completions", {**CHAT, "model": "support"})
    assert chat.status_code == 200, chat.text
    assert chat.headers[HEADER] == "support@1" and chat.json()["model"] == "support@1"
    chat_reference = await post(direct, "/v1/chat/completions", {**CHAT, "model": "support@1"})
    assert (chat.json()["choices"][0]["message"]["content"]
            == chat_reference.json()["choices"][0]["message"]["content"])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_streams_equal_vllm_direct(agent: ProxyAgent, direct: httpx.AsyncClient,
                                         path: str) -> None:
    chat = path.endswith("chat/completions")
    body = {**(CHAT if chat else COMPLETION), "stream": True}
    proxied = await post(agent.client, path, {**body, "model": "support@canary"})
    assert proxied.status_code == 200, proxied.text
    assert proxied.headers[HEADER] == "support@2"
    assert proxied.headers["content-type"].startswith("text/event-stream")
    events = sse(proxied.text)
    assert events[-1] == "[DONE]" and len(events) > 2
    assert {event["model"] for event in events[:-1]} == {"support@2"}
    reference = sse((await post(direct, path, {**body, "model": "support@2"})).text)
    assert streamed_text(events, chat) == streamed_text(reference, chat)
    non_streamed = await post(direct, path, {**body, "stream": False, "model": "support@2"})
    choice = non_streamed.json()["choices"][0]
    assert streamed_text(events, chat) == (choice["message"]["content"] if chat
                                           else choice["text"])


async def test_names_aliases_versions_and_headers_route_to_their_version(
        agent: ProxyAgent, direct: httpx.AsyncClient) -> None:
    cases: list[tuple[str | None, dict[str, str], str]] = [
        ("support", {}, "support@1"),
        ("support@live", {}, "support@1"),
        ("support@canary", {}, "support@2"),
        ("support@2", {}, "support@2"),
        ("sql", {}, "sql@3"),
        (None, {"X-Customer-Id": "acme"}, "sql@3"),
        (None, {"X-Task-Type": "summarize"}, "support@2"),
        # The customer rule is more specific than the task rule.
        (None, {"X-Customer-Id": "acme", "X-Task-Type": "summarize"}, "sql@3"),
        (None, {"X-Customer-Id": "nobody"}, BASE),
        (None, {}, BASE),
        (BASE, {}, BASE),
    ]
    agent.routes.set_rules([rule("customer", "acme", "sql", "live"),
                            rule("task", "summarize", "support", "canary")])
    outputs: dict[str, list[int]] = {}
    for model, headers, expected in cases:
        body = {**COMPLETION, **({"model": model} if model is not None else {})}
        response = await post(agent.client, "/v1/completions", body, headers)
        assert response.headers.get(HEADER) == expected, (model, headers, response.text)
        assert response.json()["model"] == expected
        outputs.setdefault(expected, tokens(response))
        assert tokens(response) == outputs[expected], (model, headers)
    for name, ids in outputs.items():
        assert tokens(await post(direct, "/v1/completions", {**COMPLETION, "model": name})) == ids
    assert len({tuple(ids) for ids in outputs.values()}) == 4  # four distinct weight sets

    agent.routes.set_rules([rule("default", "default", "support", "live")])
    for headers in ({}, {"X-Customer-Id": "nobody"}):
        response = await post(agent.client, "/v1/completions", COMPLETION, headers)
        assert response.headers[HEADER] == "support@1"
        assert tokens(response) == outputs["support@1"]


async def test_unknown_models_and_bad_bodies_get_openai_errors(agent: ProxyAgent) -> None:
    for model in ("nope", "support@beta", "support@9", "Not A Name!"):
        response = await post(agent.client, "/v1/completions", {**COMPLETION, "model": model})
        error = assert_openai_error(response, 404, "model_not_found")
        assert error["type"] == "invalid_request_error" and error["param"] == "model"
        assert HEADER not in response.headers
    bad = await agent.client.post("/v1/chat/completions", content=b"{not json",
                                  headers={"content-type": "application/json"})
    assert_openai_error(bad, 400, "invalid_json")
    listed = await agent.client.post("/v1/completions", json=["a", "list"])
    assert_openai_error(listed, 400, "invalid_json")
    number = await post(agent.client, "/v1/completions", {**COMPLETION, "model": 7})
    assert_openai_error(number, 400, "invalid_request")
    assert agent.sample("loraplane_agent_requests_total", adapter="_unresolved",
                        status="404") == 4


async def test_vllm_errors_pass_through_with_the_version_header(agent: ProxyAgent) -> None:
    response = await post(agent.client, "/v1/completions",
                          {**COMPLETION, "model": "support", "max_tokens": CONTEXT + 1})
    assert response.status_code == 400
    assert response.headers[HEADER] == "support@1"
    assert "max_tokens" in response.json()["error"]["message"]
    assert agent.sample("loraplane_agent_request_errors_total", adapter="support",
                        reason="vllm_400") == 1


async def test_vllm_unreachable_answers_503(vllm_server: VllmServer, tiny_model: Path,
                                            versions: Versions, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with running_agent(dead, tiny_model / "base", tmp_path / "cache",
                             versions.values()) as agent:
        route_aliases(agent, versions)
        base = await post(agent.client, "/v1/completions", COMPLETION)
        assert_openai_error(base, 503, "vllm_unavailable")
        assert base.headers[HEADER] == BASE
        adapter = await post(agent.client, "/v1/chat/completions", {**CHAT, "model": "sql"})
        assert_openai_error(adapter, 503, "vllm_unavailable")
        assert adapter.headers[HEADER] == "sql@3"
        assert agent.leases.busy() == {}
        assert_openai_error(await agent.client.get("/v1/models"), 503, "vllm_unavailable")
        ready = await agent.client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["vllm"] is False
        assert (await agent.client.get("/healthz")).status_code == 200


async def test_concurrent_first_requests_for_a_cold_version_load_it_once(
        agent: ProxyAgent, direct: httpx.AsyncClient) -> None:
    assert agent.cache.loaded_names() == []
    responses = await asyncio.gather(*(
        post(agent.client, "/v1/completions", {**COMPLETION, "model": "sql"})
        for _ in range(6)))
    assert {r.headers[HEADER] for r in responses} == {"sql@3"}
    assert len({tuple(tokens(r)) for r in responses}) == 1
    assert agent.loads() == 1
    assert agent.sample("loraplane_agent_cache_misses_total") >= 1
    assert (agent.sample("loraplane_agent_cache_misses_total")
            + agent.sample("loraplane_agent_cache_hits_total")) == 6
    assert agent.cache.loaded_names() == ["sql@3"]
    served = {m["id"] for m in (await direct.get("/v1/models")).json()["data"]}
    assert "sql@3" in served


async def test_a_stream_holds_its_lease_until_it_ends(agent: ProxyAgent,
                                                      tcp_proxy: PausableTcpProxy) -> None:
    body = {**HELD_STREAM, "model": "support"}
    with tcp_proxy.holding():
        async with agent.client.stream("POST", "/v1/completions", json=body) as response:
            assert response.headers[HEADER] == "support@1"
            chunks = response.aiter_raw()
            await anext(chunks)
            assert agent.leases.count("support@1") == 1
            assert agent.inflight.count == 1
            assert not await agent.inflight.wait_zero(0.5)
            tcp_proxy.release()
            rest = b"".join([chunk async for chunk in chunks])
    assert rest.rstrip().endswith(b"data: [DONE]")
    await eventually(lambda: agent.leases.count("support@1") == 0, timeout_s=5.0,
                     what="lease released")
    assert await agent.inflight.wait_zero(5.0)
    assert agent.sample("loraplane_agent_requests_total", adapter="support",
                        status="200") == 1


async def test_a_client_that_goes_away_releases_its_lease(agent: ProxyAgent,
                                                          tcp_proxy: PausableTcpProxy) -> None:
    body = {**HELD_STREAM, "model": "support"}
    # Held: the stream cannot end before the agent sees its client leave.
    with tcp_proxy.holding():
        async with agent.client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            await anext(response.aiter_raw())
            assert agent.leases.count("support@1") == 1
        # Leaving the block closes the connection mid-stream.
        await eventually(lambda: agent.leases.count("support@1") == 0, timeout_s=10.0,
                         what="lease released")
    assert await agent.inflight.wait_zero(5.0)
    assert agent.sample("loraplane_agent_request_errors_total", adapter="support",
                        reason="client_disconnected") == 1
    after = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support"})
    assert after.status_code == 200


async def test_capacity_exhausted_answers_503_with_retry_after(
        tcp_proxy: PausableTcpProxy, tiny_model: Path, versions: Versions, tmp_path: Path) -> None:
    options = AgentOptions(capacity=1, load_wait_timeout_s=0.3)
    async with running_agent(tcp_proxy.url, tiny_model / "base", tmp_path / "cache",
                             versions.values(), options) as agent:
        route_aliases(agent, versions)
        body = {**HELD_STREAM, "model": "support"}
        with tcp_proxy.holding():
            async with agent.client.stream("POST", "/v1/completions", json=body) as stream:
                chunks = stream.aiter_raw()  # kept: a dropped iterator closes the stream
                await anext(chunks)
                busy = await post(agent.client, "/v1/completions",
                                  {**COMPLETION, "model": "sql"})
                assert_openai_error(busy, 503, "capacity_exhausted")
                assert busy.headers["Retry-After"] == "1"
                assert busy.headers[HEADER] == "sql@3"
            # Leaving the block hangs up: the agent ends the stream, releases its lease.
            await eventually(lambda: agent.leases.count("support@1") == 0, timeout_s=10.0,
                             what="stream ended")
        after = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "sql"})
        assert after.status_code == 200 and after.headers[HEADER] == "sql@3"
        assert agent.cache.loaded_names() == ["sql@3"]
        assert agent.sample("loraplane_agent_cache_evictions_total") == 1


async def test_a_version_refused_by_validation_answers_502(agent: ProxyAgent,
                                                           tiny_model: Path) -> None:
    wide = local_ref(tiny_model / "adapters" / "bad-rank", "wide", 1, rank=32)
    agent.route("wide", "live", 1, wide)
    response = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "wide"})
    error = assert_openai_error(response, 502, "rank_too_large")
    assert "rank 32" in error["message"]
    assert response.headers[HEADER] == "wide@1"
    assert agent.leases.busy() == {}


async def test_a_version_vllm_lost_is_loaded_again(agent: ProxyAgent,
                                                   direct: httpx.AsyncClient) -> None:
    first = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support"})
    unloaded = await direct.post("/v1/unload_lora_adapter", json={"lora_name": "support@1"})
    assert unloaded.status_code == 200
    again = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support"})
    assert tokens(again) == tokens(first)
    assert agent.loads() == 2
    assert agent.resyncs == ["vllm"], "the full resync is queued, not run by the request"


async def test_draining_and_readiness(vllm_server: VllmServer, tiny_model: Path,
                                      versions: Versions, tmp_path: Path) -> None:
    state = {"draining": False, "ready": False}
    options = AgentOptions(draining=lambda: state["draining"], ready=lambda: state["ready"])
    async with running_agent(vllm_server.url, tiny_model / "base", tmp_path / "cache",
                             versions.values(), options) as agent:
        not_started = await agent.client.get("/readyz")
        assert not_started.status_code == 503 and not_started.json()["started"] is False
        state["ready"] = True
        assert (await agent.client.get("/readyz")).json() == {
            "ready": True, "started": True, "vllm": True, "draining": False}
        state["draining"] = True
        refused = await post(agent.client, "/v1/completions", COMPLETION)
        assert_openai_error(refused, 503, "shutting_down")
        assert refused.headers["Retry-After"] == "1"
        assert (await agent.client.get("/readyz")).status_code == 503


async def test_models_lists_base_routed_names_and_loaded_versions(agent: ProxyAgent) -> None:
    await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support@canary"})
    response = await agent.client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    entries = {entry["id"]: entry for entry in body["data"]}
    assert set(entries) == {BASE, "support", "support@live", "support@canary", "sql",
                            "sql@live", "support@2"}
    assert entries[BASE]["max_model_len"] == CONTEXT  # vLLM's own entry for the base
    assert {e["parent"] for i, e in entries.items() if i != BASE} == {BASE}
    assert entries["support"]["root"] == "support@1"
    assert entries["support@canary"]["root"] == "support@2"


async def test_metrics_count_requests_per_adapter(agent: ProxyAgent) -> None:
    await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support"})
    await post(agent.client, "/v1/completions", {**COMPLETION, "model": "missing"})
    response = await agent.client.get("/metrics")
    assert response.status_code == 200
    text = response.text
    # No canary runs: the track label is empty (Prometheus stores no label then).
    assert ('loraplane_agent_requests_total{adapter="support",status="200",track=""} 1.0'
            in text)
    assert ('loraplane_agent_requests_total{adapter="_unresolved",status="404",track=""} '
            '1.0') in text
    assert 'loraplane_agent_request_seconds_count{adapter="support",track=""} 1.0' in text
    assert ('loraplane_agent_request_errors_total{adapter="_unresolved",'
            'reason="model_not_found"} 1.0') in text


async def test_a_version_no_alias_points_at_is_looked_up_in_the_registry(
        agent_with_registry: ProxyAgent, direct: httpx.AsyncClient) -> None:
    agent = agent_with_registry
    old = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support@1"})
    assert old.headers[HEADER] == "support@1"
    assert tokens(old) == tokens(await post(direct, "/v1/completions",
                                            {**COMPLETION, "model": "support@1"}))
    live = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support"})
    assert live.headers[HEADER] == "support@2" and tokens(live) != tokens(old)
    assert agent.loads() == 2
    missing = await post(agent.client, "/v1/completions", {**COMPLETION, "model": "support@7"})
    assert_openai_error(missing, 404, "model_not_found")
    assert "support@7" in missing.json()["error"]["message"]
