"""The agent's requests to the registry, sent over aiohttp.

The requests are the ones ``loraplane.client`` builds (its ``Call`` values and headers),
and every answer but a 204 goes through the client's parser (``ClientConfig.finish``),
so the errors are the client's ``RegistryError`` kinds; ``registry_client.py`` maps
them to the agent's. aiohttp, not the client's httpx, for the whole control path: a
status report cost 3-4x the CPU through httpx, and a 50 MB fetch 2x the time
(docs/decisions.md, "The agent's control path speaks aiohttp").
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
from yarl import URL

from inference_agent.lazy_session import LazySession
from inference_agent.node.blob_fetch import BlobFetcher, DirectFetchFailed, save
from loraplane.client._core import (
    KEEPALIVE_EXPIRY_S,
    Call,
    ClientConfig,
    FileCheck,
    OnBytes,
    registry_file_path,
)
from loraplane.client.errors import (
    BadResponse,
    DownloadFailed,
    InvalidURL,
    RegistryError,
    TimedOut,
    Unavailable,
    Unreachable,
)

T = TypeVar("T")
# The largest answer read: the desired-state snapshot is about a megabyte at hundreds
# of adapters.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class RegistryHttp:
    """Sends ``Call`` values to the registry of ``config``, with its token and user agent."""

    def __init__(self, config: ClientConfig, blobs: BlobFetcher) -> None:
        self.config = config
        self.blobs = blobs
        # Seen by the session when it is made (tests watch the requests sent).
        self.trace_configs: list[aiohttp.TraceConfig] = []
        # A file streams as long as it needs: connect and each read are bounded instead.
        self._streaming = aiohttp.ClientTimeout(total=None, sock_connect=config.timeout_s,
                                                sock_read=config.timeout_s)
        # Below the registry's own keep-alive (registry_service/server.py).
        self._session = LazySession(timeout=aiohttp.ClientTimeout(total=config.timeout_s),
                                    keepalive_s=KEEPALIVE_EXPIRY_S,
                                    trace_configs=self.trace_configs)

    async def send(self, call: Call[T], *, parse_off_loop: bool = False) -> T:
        """The parsed answer of ``call``, or the RegistryError it maps to. With
        ``parse_off_loop`` the answer is decoded and validated on a worker thread."""
        url = self.config.base_url + call.url
        try:
            async with self._session.get().request(call.method, url, **_request(call),
                                                   headers=self._headers(call)) as response:
                answer = (None if response.status == 204
                          else await _answer(url, call.method, response))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise self._transport(exc) from exc
        if answer is None:
            return call.parse(None)
        if parse_off_loop:
            return await asyncio.to_thread(self.config.finish, call, answer)
        return self.config.finish(call, answer)

    async def download(self, url: str, dest: Path, *, size: int, sha256: str,
                       on_bytes: OnBytes | None = None) -> None:
        """Stream a file URL (a ``FileRef.url``, a path on the registry) into ``dest``,
        checking size and sha256; DownloadFailed otherwise.

        A redirect (the S3 store's 307 to a presigned URL) is followed by the blob
        fetcher, which sends no bearer token. ``dest`` may be partly written on failure.
        """
        check = FileCheck(registry_file_path(url), dest, size, sha256, on_bytes)
        target = self.config.base_url + check.url
        try:
            async with self._session.get().get(target, headers=self.config.headers,
                                               allow_redirects=False,
                                               timeout=self._streaming) as response:
                if response.status in _REDIRECTS and "Location" in response.headers:
                    location = response.url.join(URL(response.headers["Location"],
                                                     encoded=True))
                elif response.status != 200:
                    raise check.refused(await _answer(target, "GET", response))
                else:
                    await save(response.content, dest, check)
                    check.finish()
                    return
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise check.broken(self._transport(exc)) from exc
        await self._redirected(str(location), check)

    async def _redirected(self, url: str, check: FileCheck) -> None:
        try:
            await self.blobs.download(url, check.dest, size=check.size, sha256=check.sha256,
                                      on_bytes=check.on_bytes)
        except DirectFetchFailed as exc:
            raise DownloadFailed(f"downloading {check.url} failed: {exc}",
                                 detail={"url": check.url, "reason": exc.reason}) from exc

    def _headers(self, call: Call[Any]) -> dict[str, str]:
        headers = {**self.config.headers, **(call.request_headers() or {})}
        if call.json is not None:
            headers.setdefault("Content-Type", "application/json")
        return headers

    def _transport(self, exc: BaseException) -> RegistryError:
        """The client's error for a request that got no answer."""
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


def _request(call: Call[Any]) -> dict[str, Any]:
    """aiohttp's arguments for ``call``'s query and body (uploads are the CLI's)."""
    if call.body is not None:
        raise TypeError("the agent sends no multipart upload")
    # As httpx writes them: compact JSON, query values as text.
    data = (json.dumps(call.json, separators=(",", ":"), ensure_ascii=False).encode()
            if call.json is not None else call.content)
    return {"params": {key: str(value) for key, value in call.params.items()},
            "data": data}


async def _answer(url: str, method: str, response: aiohttp.ClientResponse) -> httpx.Response:
    """The answer, read up to MAX_ANSWER_BYTES, as the client's parser takes it."""
    declared = response.content_length
    if declared is not None and declared > MAX_ANSWER_BYTES:
        raise _too_large(url, response.status)
    parts: list[bytes] = []
    held = 0
    async for chunk in response.content.iter_any():
        held += len(chunk)
        if held > MAX_ANSWER_BYTES:
            raise _too_large(url, response.status)
        parts.append(chunk)
    return httpx.Response(response.status, headers=list(response.headers.items()),
                          content=b"".join(parts), request=httpx.Request(method, url))


def _too_large(url: str, status: int) -> BadResponse:
    return BadResponse(f"the registry's answer to {url} is larger than "
                       f"{MAX_ANSWER_BYTES} bytes", status=status)
