"""The proxy's HTTP client to vLLM, and the boundary where its errors become refusals.

The proxy makes one call to vLLM per request it serves, through ``upstream_http.py``:
a hand-written keep-alive HTTP/1.1 client on httptools
(docs/decisions.md#the-proxy-has-its-own-http-client-to-vllm). The control calls to vLLM
(``node/vllm_client.py``) use the same client; the calls to the registry and the blob
store use aiohttp (``node/registry_http.py``, ``node/blob_fetch.py``).

Its connections are opened on first use, inside the running event loop, since the
proxy app is built before the loop starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from inference_agent.serving.openai_errors import ProxyError, vllm_unreachable
from inference_agent.serving.upstream_http import UpstreamPool, UpstreamResponse

# What a caller may catch from an upstream response while it reads the body
# (UpstreamClosed is an OSError).
UPSTREAM_ERRORS = (OSError, TimeoutError)
# vLLM's server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); one kept
# longer here may be reused just as vLLM closes it. The pool retries a request once when
# that happens before any answer came back; keeping connections 3 s makes it rare.
KEEPALIVE_S = 3.0
JSON_HEADERS = {"Content-Type": "application/json"}


def upstream_error(exc: BaseException) -> ProxyError:
    """A failed call to vLLM as the refusal the client gets: 504 when it timed out,
    503 when vLLM could not be reached or broke the connection."""
    if isinstance(exc, TimeoutError):
        return ProxyError(504, f"the model server did not answer in time: {exc!r}",
                          "server_error", "vllm_timeout")
    return vllm_unreachable(f"{type(exc).__name__}: {exc}")


class Upstream:
    """Keep-alive connections to one vLLM server; POSTs stream, GETs are read whole."""

    def __init__(self, base_url: str, *, request_timeout_s: float,
                 connect_timeout_s: float, max_connections: int = 1024) -> None:
        self.base_url = base_url.rstrip("/")
        # Between bytes, not in total: a long stream may take as long as it needs.
        # vLLM batches many concurrent requests; the pool must not be the bottleneck.
        self._pool = UpstreamPool(self.base_url, read_timeout_s=request_timeout_s,
                                  connect_timeout_s=connect_timeout_s,
                                  keepalive_s=KEEPALIVE_S, max_connections=max_connections)

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]
                   ) -> UpstreamResponse | ProxyError:
        """Send ``body`` (JSON) and return once vLLM's headers are in; the caller reads
        the body and must close the response."""
        try:
            return await self._pool.request("POST", path, body, {**JSON_HEADERS, **headers})
        except UPSTREAM_ERRORS as exc:
            return upstream_error(exc)

    async def get(self, path: str, timeout_s: float
                  ) -> tuple[int, bytes, str | None] | ProxyError:
        """(status, body, content type) of a GET read whole, within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._pool.request("GET", path, b"", {})
                try:
                    body = await response.read()
                finally:
                    response.close()
                return response.status, body, response.headers.get("content-type")
        except UPSTREAM_ERRORS as exc:
            return upstream_error(exc)

    async def aclose(self) -> None:
        await self._pool.aclose()
