"""The agent's status report, sent with aiohttp rather than the shared httpx client.

Every agent reports once per change, so a push to a fleet of N agents is N reports;
one small POST cost about 1.25 ms of client CPU through httpx against 0.32 ms through
aiohttp on these machines (``bench/http_client_cpu.py``), as for the calls to vLLM
and the blob store. The request is the one ``loraplane.client`` builds
(``_calls.send_status``), and an answer other than 204 goes through the same parser,
so the errors are the client's own: the caller maps them as for every registry call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import httpx

from inference_agent.lazy_session import LazySession
from loraplane.client import _calls as api
from loraplane.client._core import KEEPALIVE_EXPIRY_S, ClientConfig
from loraplane.client.errors import (
    InvalidURL,
    RegistryError,
    TimedOut,
    Unavailable,
    Unreachable,
)
from loraplane.events import AgentStatus


class StatusPoster:
    """POSTs reports to the registry of ``config``, with its token and user agent."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        timeout = aiohttp.ClientTimeout(total=config.timeout_s)
        # Below the registry's own keep-alive (registry_service/server.py), as httpx's.
        self._session = LazySession(timeout=timeout, keepalive_s=KEEPALIVE_EXPIRY_S)

    async def post(self, status: AgentStatus) -> None:
        """Store ``status``; the RegistryError its answer (or no answer) maps to."""
        # Serialised on a worker thread: thousands of entries would hold the loop.
        call = await asyncio.to_thread(api.send_status, status)
        url = self.config.base_url + call.url
        headers = {**self.config.headers, **call.headers}
        try:
            async with self._session.get().post(url, data=call.content,
                                                headers=headers) as response:
                if response.status == 204:
                    return
                answer = _as_httpx(url, response.status, response.headers,
                                   await response.read())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise self._transport(exc) from exc
        self.config.finish(call, answer)

    def _transport(self, exc: BaseException) -> RegistryError:
        base = self.config.base_url
        if isinstance(exc, ValueError):  # aiohttp's InvalidURL is one too
            return InvalidURL(f"invalid registry URL {base!r}: {exc}", url=base)
        if isinstance(exc, aiohttp.ClientConnectorError):
            return Unreachable(f"cannot reach the registry at {base}: {exc}", url=base)
        if isinstance(exc, TimeoutError):
            return TimedOut(f"the registry at {base} did not answer in time", url=base)
        return Unavailable(f"request to the registry at {base} failed: "
                           f"{exc or type(exc).__name__}", code="transport_error", url=base)

    async def aclose(self) -> None:
        await self._session.aclose()


def _as_httpx(url: str, status: int, headers: Any, content: bytes) -> httpx.Response:
    """The answer as the client's parser takes it (an error's code, message, detail)."""
    return httpx.Response(status, headers=list(headers.items()), content=content,
                          request=httpx.Request("POST", url))
