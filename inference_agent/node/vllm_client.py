"""HTTP client for one vLLM OpenAI server: readiness and runtime LoRA load/unload.

Both calls are idempotent the way the reconciler needs them: loading a name vLLM
already has is success (a name is never reused for other weights, see naming.py), and
unloading a name vLLM does not know is success.

The calls go through the proxy's own keep-alive client for vLLM
(``serving/upstream_http.py``): the agent makes two per swap (load, unload), on every
agent of a fleet at every push, and copies vLLM's metrics.
Why: docs/decisions.md#the-proxy-has-its-own-http-client-to-vllm
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference_agent.errors import VllmRefused, VllmUnavailable
from inference_agent.serving.upstream import JSON_HEADERS, KEEPALIVE_S, UPSTREAM_ERRORS
from inference_agent.serving.upstream_http import UpstreamPool

_ALREADY_LOADED = "has already been loaded"
# Statuses that say "the server (or a proxy in front of it) is not able to answer now",
# as opposed to an answer about the adapter itself.
_UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
# Loads of different adapters may run at once (one per work-queue worker); more wait.
_MAX_CONNECTIONS = 16


@dataclass(frozen=True, slots=True)
class Answer:
    """A response of vLLM, read whole."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def _error_message(response: Answer) -> str:
    """vLLM's ``error.message`` (OpenAI error body), else the body's text."""
    try:
        body: Any = response.json()
    except ValueError:
        return response.text.strip()[:500] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return response.text.strip()[:500]


class VllmClient:
    """Talks to ``base_url`` (e.g. http://127.0.0.1:8000) with its own connection pool."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        # Idle connections dropped before vLLM closes them (5 s), as the proxy's
        # are: kept as long as vLLM keeps them, a call could go out on a connection
        # vLLM was closing and fail with "Server disconnected" (bench/fanout.py: an
        # agent's start-up died on it, its vLLM stand-in answering a hundred agents).
        self._pool = UpstreamPool(self.base_url, read_timeout_s=timeout_s,
                                  connect_timeout_s=timeout_s, keepalive_s=KEEPALIVE_S,
                                  max_connections=_MAX_CONNECTIONS)

    @property
    def keepalive_s(self) -> float:
        """How long an idle connection to vLLM is kept for the next call."""
        return self._pool.keepalive_s

    async def wait_ready(self, timeout_s: float, *, poll_s: float = 0.5) -> None:
        """Poll ``GET /v1/models`` until it answers 200; VllmUnavailable after timeout_s."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            try:
                response = await self._request("GET", "/v1/models",
                                               timeout_s=min(5.0, timeout_s))
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except VllmUnavailable as exc:
                cause = exc.__cause__ or exc
                last = f"{type(cause).__name__}: {cause}"
            if time.monotonic() >= deadline:
                raise VllmUnavailable(
                    f"vLLM at {self.base_url} not ready after {timeout_s:.0f}s ({last})",
                    detail={"url": self.base_url})
            await asyncio.sleep(poll_s)

    async def models(self) -> list[dict[str, Any]]:
        """The raw ``data`` list of ``GET /v1/models``."""
        response = await self._request("GET", "/v1/models")
        if response.status_code != 200:
            raise VllmUnavailable(f"GET /v1/models answered {response.status_code}: "
                                  f"{_error_message(response)}")
        data = response.json().get("data", [])
        return [m for m in data if isinstance(m, dict)]

    async def loaded(self) -> set[str]:
        """Names of the LoRA adapters vLLM serves now (entries with a ``parent``)."""
        return {str(m["id"]) for m in await self.models()
                if m.get("parent") is not None and "id" in m}

    async def metrics_text(self, timeout_s: float = 5.0) -> str:
        """vLLM's ``/metrics`` (Prometheus text); VllmUnavailable unless it answers 200."""
        response = await self._request("GET", "/metrics", timeout_s=timeout_s)
        if response.status_code != 200:
            raise VllmUnavailable(f"GET /metrics answered {response.status_code}",
                                  detail={"url": self.base_url})
        return response.text

    async def load(self, name: str, path: Path) -> None:
        """Load ``path`` as ``name``; a name already loaded counts as success."""
        response = await self._request("POST", "/v1/load_lora_adapter",
                                       body={"lora_name": name, "lora_path": str(path)})
        if response.status_code == 200:
            return
        message = _error_message(response)
        if response.status_code == 400 and _ALREADY_LOADED in message:
            return
        self._raise(response, message, f"loading {name} from {path}", name)

    async def unload(self, name: str) -> None:
        """Unload ``name``; a name vLLM does not know counts as success."""
        response = await self._request("POST", "/v1/unload_lora_adapter",
                                       body={"lora_name": name})
        if response.status_code in (200, 404):
            return
        self._raise(response, _error_message(response), f"unloading {name}", name)

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def _request(self, method: str, path: str, *, body: Any = None,
                       timeout_s: float | None = None) -> Answer:
        # The pool's timeout is between bytes; each call here is bounded in total.
        content = b"" if body is None else json.dumps(body).encode()
        try:
            async with asyncio.timeout(self._timeout_s if timeout_s is None else timeout_s):
                response = await self._pool.request(method, path, content,
                                                    JSON_HEADERS if body is not None else {})
                try:
                    return Answer(response.status, await response.read())
                finally:
                    response.close()
        except UPSTREAM_ERRORS as exc:
            kind = "timed out" if isinstance(exc, TimeoutError) else "unreachable"
            raise VllmUnavailable(f"vLLM at {self.base_url} {kind}: "
                                  f"{type(exc).__name__}: {exc}",
                                  detail={"url": self.base_url}) from exc

    @staticmethod
    def _raise(response: Answer, message: str, what: str, name: str) -> None:
        detail = {"status": response.status_code, "name": name}
        if response.status_code in _UNAVAILABLE_STATUSES:
            raise VllmUnavailable(f"vLLM unavailable while {what}: {message}", detail=detail)
        raise VllmRefused(message, detail=detail)
