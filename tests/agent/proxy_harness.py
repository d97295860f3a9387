"""The proxy with the agent's real parts, served over real HTTP, for tests.

Nothing here is a double: the route table, leases, cache, materializer and vLLM client
are the agent's own, and the app runs under uvicorn so streaming, disconnects and
status codes behave as they do in production.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from inference_agent.http_server import HTTP_PROTOCOL
from inference_agent.metrics import AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.materialize import Materializer
from inference_agent.node.registry_client import RegistryLink
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.auth import InferenceKeys, token_hash
from inference_agent.serving.leases import Leases
from inference_agent.serving.proxy import create_proxy_app
from inference_agent.serving.routes import RouteTable
from inference_agent.serving.streams import Inflight
from loraplane.digest import sha256_file, version_digest
from loraplane.events import FileRef, VersionRef
from loraplane.lora import BaseModelShapes
from loraplane.netutil import free_port

BASE = "tiny-llama"
# The proxy's client calls as TENANT; OTHER_TOKEN is an inference token of OTHER_TENANT.
TENANT, OTHER_TENANT = "acme", "globex"
TOKEN, OTHER_TOKEN = "lp_test-inference-acme", "lp_test-inference-globex"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def inference_keys() -> InferenceKeys:
    """Inference credentials of both test tenants."""
    keys = InferenceKeys()
    keys.replace("tests", {token_hash(TOKEN): TENANT, token_hash(OTHER_TOKEN): OTHER_TENANT})
    return keys


@contextlib.asynccontextmanager
async def serve_asgi(app: ASGIApp, **options: Any) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on a free port for the block; yield its base URL.
    ``options`` go to ``uvicorn.Config`` (``lifespan`` is "on", and the connection
    protocol and access log as the agent has them, unless they say)."""
    port = free_port()
    options = {"lifespan": "on", "http": HTTP_PROTOCOL, "access_log": False, **options}
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=5, **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def local_ref(folder: Path, adapter: str, version: int, *, rank: int = 8) -> VersionRef:
    """A VersionRef for an adapter folder on disk, as the registry would describe it."""
    files = []
    for name in ADAPTER_FILES:
        size, sha = sha256_file(folder / name)
        files.append(FileRef(name=name, size=size, sha256=sha,
                             url=f"/v1/adapters/{adapter}/versions/{version}/files/{name}"))
    digest = version_digest((f.name, f.size, f.sha256) for f in files)
    return VersionRef(adapter=adapter, version=version, digest=digest, base_model=BASE,
                      rank=rank, alpha=16.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], files=files)


@dataclass
class ProxyAgent:
    url: str
    client: httpx.AsyncClient
    routes: RouteTable
    leases: Leases
    cache: AdapterCache
    metrics: AgentMetrics
    materializer: Materializer
    inflight: Inflight
    # One entry per resync the proxy asked the control loop for.
    resyncs: list[str]
    keys: InferenceKeys

    def route(self, adapter: str, alias: str, revision: int, ref: VersionRef | None,
              tenant: str = TENANT) -> bool:
        """Move an alias of ``adapter``, which belongs to ``tenant``, as the swap would."""
        self.routes.set_owner(adapter, tenant)
        return self.routes.set_alias(adapter, alias, revision, ref)

    def sample(self, name: str, **labels: str) -> float:
        """Summed over the series whose labels include ``labels``."""
        return sum(s.value for family in self.metrics.registry.collect()
                   for s in family.samples
                   if s.name == name and labels.items() <= s.labels.items())

    def loads(self) -> float:
        """How many loads went to vLLM (the ``load`` stage's observation count)."""
        return self.sample("loraplane_agent_stage_seconds_count", stage="load")


@dataclass
class AgentOptions:
    capacity: int = 3
    load_wait_timeout_s: float = 30.0
    registry: RegistryLink | None = None
    draining: Callable[[], bool] | None = None
    ready: Callable[[], bool] | None = None


@contextlib.asynccontextmanager
async def running_agent(vllm_url: str, base_dir: Path, cache_dir: Path,
                        local: Iterable[tuple[VersionRef, Path]] = (),
                        options: AgentOptions | None = None) -> AsyncIterator[ProxyAgent]:
    """The proxy in front of ``vllm_url``; ``local`` versions are put in the disk cache
    first (as --watch-dir does), so they are known but cold: not loaded in vLLM."""
    opts = options or AgentOptions()
    metrics, leases, routes = AgentMetrics(), Leases(), RouteTable(BASE)
    resyncs: list[str] = []
    vllm = VllmClient(vllm_url)
    fetch = opts.registry.fetcher() if opts.registry is not None else None
    materializer = Materializer(cache_dir, max_bytes=1 << 30, fetch=fetch,
                                base_shapes=BaseModelShapes.from_hf_config(base_dir),
                                max_rank=16, metrics=metrics)
    for ref, folder in local:
        await materializer.add_local(ref, folder)
    cache = AdapterCache(vllm, materializer, leases, capacity=opts.capacity, metrics=metrics,
                         load_wait_timeout_s=opts.load_wait_timeout_s,
                         is_routed=routes.is_routed)
    keys = inference_keys()
    app = create_proxy_app(routes=routes, cache=cache, leases=leases, metrics=metrics,
                           vllm_url=vllm_url, base_model=BASE, registry=opts.registry,
                           keys=keys, draining=opts.draining, ready=opts.ready,
                           request_resync=lambda: resyncs.append("vllm"))
    try:
        async with serve_asgi(app) as url, httpx.AsyncClient(
                base_url=url, timeout=60.0, headers=bearer(TOKEN)) as client:
            yield ProxyAgent(url, client, routes, leases, cache, metrics, materializer,
                             app.state.inflight, resyncs, keys)
    finally:
        # The vLLM server outlives this agent: leave it with nothing loaded.
        with contextlib.suppress(Exception):
            for name in cache.loaded_names():
                await vllm.unload(name)
        await vllm.aclose()
