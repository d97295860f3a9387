"""The agent's OpenAI-compatible front door to vLLM.

Every OpenAI call needs an inference token (``Authorization: Bearer``), checked
locally (serving/auth.py); its tenant confines the request: it reaches only that
tenant's adapters and routing rules, and ``/v1/models`` lists only them. The health
endpoints and ``/metrics`` stay open for operators and Prometheus.

A generation request is resolved to an adapter version (or the base model), takes a
lease on that version in the same synchronous step, makes sure the version is loaded,
and is forwarded to vLLM under the versioned name. vLLM's answer (JSON or an SSE
stream) goes back unchanged: its ``model`` field already names the version. Every
response after resolution carries ``X-Loraplane-Adapter``. Refusals are OpenAI-style
(see openai_errors.py for the status of each).

The token is checked from the headers before the body is read (``admit``, through the
front door), and the body is bounded (``max_body_bytes``). A loaded-adapter slot is the
scarce thing tenants share: a request holds one from its lease to its end (a stream's
last byte). No tenant's requests may hold more than ``tenant_slots`` at once (503
``tenant_slots_full``), so another tenant's cold version always finds a slot it can
evict into, and a request waits at most ``slot_wait_s`` for a slot when every one is
busy (503 ``capacity_exhausted``), each with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inference_agent.errors import AgentError, TenantSlotsFull
from inference_agent.metrics import CONTENT_TYPE, AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.registry_client import RegistryLink
from inference_agent.serving.auth import InferenceKeys
from inference_agent.serving.calls import ProxyCall
from inference_agent.serving.front_door import DEFAULT_MAX_BODY_BYTES, FrontDoor
from inference_agent.serving.json_body import encode_body, parse_body
from inference_agent.serving.leases import Leases
from inference_agent.serving.model_server_metrics import MODEL_SERVER_METRICS_PATH
from inference_agent.serving.openai_errors import (
    ProxyError,
    bad_request,
    body_too_large,
    from_agent_error,
    shutting_down,
)
from inference_agent.serving.routes import RouteTable, Target, UnresolvedVersion
from inference_agent.serving.streams import Inflight, InflightMiddleware, UpstreamStream
from inference_agent.serving.traffic import TrafficTally
from inference_agent.serving.upstream import UPSTREAM_ERRORS, Upstream, upstream_error
from inference_agent.serving.upstream_http import UpstreamResponse
from inference_agent.serving.version_lookup import VersionLookup
from loraplane.naming import DEFAULT_ALIAS

# Client headers worth handing to vLLM (and back): they tie logs on both sides together.
_PASSTHROUGH_HEADERS = ("x-request-id",)
_PROBE_TIMEOUT_S = 5.0


def _never() -> bool:
    return False


def _always() -> bool:
    return True


def _nothing() -> None:
    return None


class Proxy:
    """The request handlers; one instance per app, holding the agent's parts."""

    def __init__(self, *, routes: RouteTable, cache: AdapterCache, leases: Leases,
                 metrics: AgentMetrics, upstream: Upstream, base_model: str,
                 registry: RegistryLink | None, keys: InferenceKeys,
                 draining: Callable[[], bool], ready: Callable[[], bool],
                 request_resync: Callable[[], None],
                 model_server: Callable[[], Awaitable[bytes]] | None = None,
                 tenant_slots: int | None = None, slot_wait_s: float | None = None,
                 tally: TrafficTally | None = None) -> None:
        """``request_resync`` asks the control loop to compare the cache with vLLM;
        ``model_server`` renders the series a gateway reads (model_server_metrics.py);
        ``tenant_slots`` bounds the versions one tenant's requests hold at once, and
        ``slot_wait_s`` a request's wait for a slot (None: no bound of their own);
        ``tally`` counts the requests of aliases under canary (traffic.py)."""
        self.routes = routes
        self.keys = keys
        self.cache = cache
        self.leases = leases
        self.metrics = metrics
        self.upstream = upstream
        self.base_model = base_model
        self.versions = VersionLookup(registry, base_model)
        self.draining = draining
        self.ready = ready
        self.request_resync = request_resync
        self.model_server = model_server
        self.tenant_slots = tenant_slots
        self.slot_wait_s = slot_wait_s
        self.tally = tally if tally is not None else TrafficTally()

    # generation

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "/v1/completions")

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "/v1/chat/completions")

    async def _generate(self, request: Request, path: str) -> Response:
        # Only reached if the front door is bypassed: it serves these paths itself.
        return await self.generate(request.headers, await request.body(), path)

    def admit(self, headers: Mapping[str, str]) -> Response | None:
        """The refusal of a generation request its headers alone decide (shutting down,
        no valid token), made before its body is read; None to read it."""
        if self.draining():
            return _refuse(ProxyCall(self.metrics), shutting_down())
        tenant = self.keys.tenant_for(headers.get("authorization"))
        if isinstance(tenant, ProxyError):
            return _refuse(ProxyCall(self.metrics), tenant)
        return None

    def body_too_large(self, limit: int) -> Response:
        return _refuse(ProxyCall(self.metrics), body_too_large(limit))

    async def generate(self, headers: Mapping[str, str], raw: bytes, path: str) -> Response:
        """Serve a generation request (``raw`` its body) and return what to answer."""
        call = ProxyCall(self.metrics, self.tally)
        try:
            return await self._serve(headers, raw, path, call)
        except BaseException:
            # Cancelled or a bug: the lease must not outlive the request either way.
            call.done(500, "internal")
            raise

    async def _serve(self, headers: Mapping[str, str], raw: bytes, path: str,
                     call: ProxyCall) -> Response:
        if self.draining():
            return _refuse(call, shutting_down())
        tenant = self.keys.tenant_for(headers.get("authorization"))
        if isinstance(tenant, ProxyError):
            return _refuse(call, tenant)
        parsed = parse_body(raw)
        if isinstance(parsed, ProxyError):
            return _refuse(call, parsed)
        body, exact = parsed
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            return _refuse(call, bad_request("`model` must be a string", param="model"))
        user = body.get("user")
        try:
            target = await self._route(model, headers, tenant, call,
                                       user if isinstance(user, str) else None)
            if target.ref is not None:
                await self.cache.ensure_active(target.ref, slot_wait_s=self.slot_wait_s)
        except AgentError as exc:
            return _refuse(call, from_agent_error(exc))
        body["model"] = target.model_name
        payload = encode_body(body, exact)
        if isinstance(payload, ProxyError):
            return _refuse(call, payload)
        return await self._forward(path, payload, headers, target, call)

    async def _route(self, model: str | None, headers: Mapping[str, str], tenant: str,
                     call: ProxyCall, user: str | None = None) -> Target:
        resolved = self.routes.resolve(model, headers, tenant, user)
        if isinstance(resolved, UnresolvedVersion):
            resolved = self.routes.target_for(
                await self.versions.get(resolved.adapter, resolved.version))
        # No await between the route decision above and the lease: a flip cannot slip
        # in between and let the swap unload this version under the request.
        lease = None
        if resolved.ref is not None:
            name = resolved.model_name
            if (self.tenant_slots is not None and not self.leases.holds(tenant, name)
                    and self.leases.held_by(tenant) >= self.tenant_slots):
                call.bind(resolved, None)
                raise TenantSlotsFull(
                    f"this tenant's requests in flight already hold {self.tenant_slots} "
                    "loaded adapter versions, its share of this server; retry when one "
                    "ends", detail={"tenant_slots": self.tenant_slots})
            lease = self.leases.acquire(name, tenant)
        call.bind(resolved, lease)
        return resolved

    async def _forward(self, path: str, payload: bytes,
                       client_headers: Mapping[str, str], target: Target,
                       call: ProxyCall) -> Response:
        headers = _passthrough(client_headers)
        upstream = await self.upstream.post(path, payload, headers)
        if (isinstance(upstream, UpstreamResponse) and upstream.status == 404
                and target.ref is not None):
            # vLLM lost a version the cache believes loaded (vLLM restarted, or someone
            # unloaded it by hand). Load it again and try once more rather than fail
            # every request until the periodic resync notices; what else vLLM lost is
            # the control loop's to find, not this request's.
            upstream.close()
            self.cache.mark_lost(target.model_name)
            self.request_resync()
            try:
                await self.cache.ensure_active(target.ref, slot_wait_s=self.slot_wait_s)
            except AgentError as exc:
                return _refuse(call, from_agent_error(exc))
            upstream = await self.upstream.post(path, payload, headers)
        if isinstance(upstream, ProxyError):
            return _refuse(call, upstream)
        return await self._pass_back(upstream, call)

    async def _pass_back(self, upstream: UpstreamResponse, call: ProxyCall
                         ) -> Response:
        headers = {**call.headers(), **_passthrough(upstream.headers)}
        success = 200 <= upstream.status < 300
        if success and _is_event_stream(upstream):
            return UpstreamStream(upstream, headers, call.done, call.chunk)
        try:
            content = await upstream.read()
        except UPSTREAM_ERRORS as exc:
            return _refuse(call, upstream_error(exc))
        finally:
            # A read that failed or was cancelled closes the connection (vLLM aborts);
            # a whole answer has already given it back, and this does nothing.
            upstream.close()
        call.body(content)
        call.done(upstream.status, None if success else f"vllm_{upstream.status}")
        return Response(content, status_code=upstream.status, headers=headers,
                        media_type=upstream.headers.get("content-type"))

    # listing and probes

    async def models(self, request: Request) -> Response:
        tenant = self.keys.tenant_for(request.headers.get("authorization"))
        if isinstance(tenant, ProxyError):
            return tenant.response()
        answer = await self.upstream.get("/v1/models", _PROBE_TIMEOUT_S)
        if isinstance(answer, ProxyError):
            return answer.response()
        status, content, content_type = answer
        if not 200 <= status < 300:
            return Response(content, status_code=status, media_type=content_type)
        upstream = {entry.get("id"): entry for entry in orjson.loads(content).get("data", [])}
        return JSONResponse({"object": "list",
                             "data": self._model_entries(upstream, tenant)})

    def _model_entries(self, upstream: Mapping[str, dict[str, Any]],
                       tenant: str) -> list[dict[str, Any]]:
        created = int(time.time())
        base = upstream.get(self.base_model) or _model_entry(
            self.base_model, created, parent=None, root=self.base_model)
        entries = [base]
        own = self.routes.adapters(tenant)
        for adapter in sorted(own):
            for alias, (_revision, ref) in sorted(self.routes.aliases(adapter).items()):
                root = self.routes.target_for(ref).model_name
                ids = [adapter] if alias == DEFAULT_ALIAS else []
                ids.append(f"{adapter}@{alias}")
                entries.extend(_model_entry(i, created, self.base_model, root) for i in ids)
        # Not vLLM's entries for these: their ``root`` is a path in the agent's cache.
        entries.extend(_model_entry(name, created, self.base_model, name)
                       for name in sorted(self.cache.loaded_names())
                       if name.partition("@")[0] in own)
        return entries

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        started, draining = self.ready(), self.draining()
        vllm = await self._vllm_healthy()
        ok = started and vllm and not draining
        return JSONResponse({"ready": ok, "started": started, "vllm": vllm,
                             "draining": draining}, status_code=200 if ok else 503)

    async def _vllm_healthy(self) -> bool:
        answer = await self.upstream.get("/health", _PROBE_TIMEOUT_S)
        return not isinstance(answer, ProxyError) and 200 <= answer[0] < 300

    async def prometheus(self, request: Request) -> Response:
        # Rendered on a worker thread: with hundreds of adapters' labels the text takes
        # long enough to stall every proxied request (prometheus_client locks its own).
        body = await asyncio.to_thread(self.metrics.render)
        if self.model_server is not None:
            body += await self.model_server()
        return Response(body, media_type=CONTENT_TYPE)

    async def model_server_metrics(self, request: Request) -> Response:
        """Only the model-server protocol's series: what a gateway's picker scrapes many
        times a second, without rendering every metric of the agent each time."""
        if self.model_server is None:
            return Response(status_code=404)
        return Response(await self.model_server(), media_type=CONTENT_TYPE)


def _refuse(call: ProxyCall, error: ProxyError) -> Response:
    call.done(error.status, error.code)
    return error.response(call.headers())


def _is_event_stream(response: UpstreamResponse) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")


def _passthrough(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name in _PASSTHROUGH_HEADERS
            if (value := headers.get(name)) is not None}


def _model_entry(model_id: str, created: int, parent: str | None, root: str
                 ) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created,
            "owned_by": "loraplane", "root": root, "parent": parent}


def create_proxy_app(*, routes: RouteTable, cache: AdapterCache, leases: Leases,
                     metrics: AgentMetrics, vllm_url: str, base_model: str,
                     registry: RegistryLink | None, keys: InferenceKeys,
                     draining: Callable[[], bool] | None = None,
                     ready: Callable[[], bool] | None = None,
                     request_resync: Callable[[], None] | None = None,
                     upstream: Upstream | None = None,
                     request_timeout_s: float = 600.0,
                     model_server: Callable[[], Awaitable[bytes]] | None = None,
                     max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                     tenant_slots: int | None = None, slot_wait_s: float | None = None,
                     tally: TrafficTally | None = None) -> FrontDoor:
    """The front door app. ``app.state.inflight`` counts proxied requests for shutdown.

    ``upstream`` is the client to vLLM; without one the app makes its own (bounded by
    ``request_timeout_s`` between bytes) and closes it when its lifespan ends.
    ``max_body_bytes`` bounds a generation request's body; ``tenant_slots`` and
    ``slot_wait_s`` and ``tally`` as ``Proxy`` takes them.
    """
    owned = upstream is None
    client = upstream or Upstream(vllm_url, request_timeout_s=request_timeout_s,
                                  connect_timeout_s=_PROBE_TIMEOUT_S)
    proxy = Proxy(routes=routes, cache=cache, leases=leases, metrics=metrics,
                  upstream=client,
                  base_model=base_model, registry=registry, keys=keys,
                  draining=draining or _never,
                  ready=ready or _always, request_resync=request_resync or _nothing,
                  model_server=model_server, tenant_slots=tenant_slots,
                  slot_wait_s=slot_wait_s, tally=tally)
    inflight = Inflight()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if owned:
                await client.aclose()

    app = Starlette(
        routes=[
            Route("/v1/completions", proxy.completions, methods=["POST"]),
            Route("/v1/chat/completions", proxy.chat_completions, methods=["POST"]),
            Route("/v1/models", proxy.models, methods=["GET"]),
            Route("/healthz", proxy.healthz, methods=["GET"]),
            Route("/readyz", proxy.readyz, methods=["GET"]),
            Route("/metrics", proxy.prometheus, methods=["GET"]),
            Route(MODEL_SERVER_METRICS_PATH, proxy.model_server_metrics, methods=["GET"]),
        ],
        middleware=[Middleware(InflightMiddleware, inflight=inflight)],
        lifespan=lifespan,
    )
    app.state.inflight = inflight
    app.state.proxy = proxy
    return FrontDoor(app, proxy.generate, inflight, admit=proxy.admit,
                     too_large=proxy.body_too_large, max_body_bytes=max_body_bytes)

