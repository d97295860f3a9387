"""The proxy's HTTP client to vLLM, and the boundary where its errors become refusals.

aiohttp rather than httpx on this path: a proxied request is one client call, and
httpx (with httpcore and anyio under it) spent about 1.4 ms of CPU on each against
aiohttp's 0.4 ms on these machines, most of the agent's cost per request
(``bench/agent_proxy_overhead.py``, docs/benchmarks.md). The control calls to vLLM
(``node/vllm_client.py``) and the blob fetches use aiohttp for the same reason.

The session is made on first use, inside the running event loop, since the proxy app
is built before the loop starts.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from inference_agent.lazy_session import LazySession
from inference_agent.serving.openai_errors import ProxyError, vllm_unreachable

# What a caller may catch from an upstream response while it reads the body.
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError)
# vLLM's server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); one kept
# longer here may be reused just as vLLM closes it, and that request fails. aiohttp's
# default is 15 s: the benchmark saw those failures after its pauses.
KEEPALIVE_S = 3.0
_JSON = {"Content-Type": "application/json"}


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
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s,
                                    sock_read=request_timeout_s)
        # vLLM batches many concurrent requests; the pool must not be the bottleneck.
        # auto_decompress off: bytes go back to the client as vLLM sent them.
        self._session = LazySession(timeout=timeout, keepalive_s=KEEPALIVE_S,
                                    limit=max_connections, auto_decompress=False)

    def _client(self) -> aiohttp.ClientSession:
        return self._session.get()

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]
                   ) -> aiohttp.ClientResponse | ProxyError:
        """Send ``body`` (JSON) and return once vLLM's headers are in; the caller reads
        the body and must close or release the response."""
        try:
            return await self._client().post(f"{self.base_url}{path}", data=body,
                                              headers={**_JSON, **headers})
        except UPSTREAM_ERRORS as exc:
            return upstream_error(exc)

    async def get(self, path: str, timeout_s: float
                  ) -> tuple[int, bytes, str | None] | ProxyError:
        """(status, body, content type) of a GET read whole, within ``timeout_s``."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._client().get(f"{self.base_url}{path}",
                                          timeout=timeout) as response:
                body = await response.read()
                return response.status, body, response.headers.get("Content-Type")
        except UPSTREAM_ERRORS as exc:
            return upstream_error(exc)

    async def aclose(self) -> None:
        await self._session.aclose()
