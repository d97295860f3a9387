"""Fetching a file straight from the blob store with the presigned URL an event (or the
desired-state snapshot) carried.

The registry's relay may add ``FileRef.direct_url`` to events, and ``GET /v1/desired``
to the snapshot (see registry_service/events/file_links.py): then the agent GETs the
store itself instead of asking the registry for a 307 to the same place, one registry
request less per file per agent per push or start. Anything going wrong here (no URL,
an expired or refused one, the store unreachable, bytes that do not match) is not a
failure of the version: the caller falls back to the registry path, which signs a
fresh URL for a token that may read the adapter. Size and sha256 are checked while
streaming, as on the registry path.

The URL is a credential until it expires: it never goes into a log line, an error text
or a metric label; only its scheme, host and path do.

aiohttp, as every call of the agent's control path (``registry_http.py``; docs/
decisions.md, "The agent's control path speaks aiohttp"). The URL goes out exactly as
signed (``encoded=True``): re-quoting its query would break the signature.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from inference_agent.futures import retrieve_exception
from inference_agent.lazy_session import LazySession
from loraplane.client._core import DOWNLOAD_CHUNK, FileCheck, OnBytes
from loraplane.client.errors import RegistryError
from loraplane.private_files import open_private

KEEPALIVE_S = 5.0


def masked(url: str) -> str:
    """``url`` without its query (the signature) and user info: safe to log."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"




class DirectFetchFailed(Exception):
    """The direct fetch did not produce the file; ``reason`` is safe to log and count."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class BlobFetcher:
    """GETs presigned URLs with no bearer token: the URL is the only credential, and
    the agent's token must never reach the blob store."""

    def __init__(self, *, timeout_s: float = 30.0) -> None:
        # Between bytes, not in total: a large file takes as long as it needs.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s,
                                    sock_read=timeout_s)
        # Seen by the session when it is made (tests watch the requests sent).
        self.trace_configs: list[aiohttp.TraceConfig] = []
        # Below a store's idle timeout.
        self._session = LazySession(timeout=timeout, keepalive_s=KEEPALIVE_S,
                                    trace_configs=self.trace_configs)

    def session(self) -> aiohttp.ClientSession:
        """Made on first use, inside the running event loop."""
        return self._session.get()

    async def download(self, url: str, dest: Path, *, size: int, sha256: str,
                       on_bytes: OnBytes | None = None) -> None:
        """Stream ``url`` into ``dest``; DirectFetchFailed (with a safe reason) if not."""
        check = FileCheck(masked(url), dest, size, sha256, on_bytes)
        try:
            async with self.session().get(URL(url, encoded=True),
                                          allow_redirects=False) as response:
                if response.status != 200:
                    await response.read()
                    # 403: expired or not signed for this store; 404: the blob is gone.
                    raise DirectFetchFailed(f"status_{response.status}",
                                            f"{check.url} answered {response.status}")
                await save(response.content, dest, check)
            check.finish()
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Their texts may quote the URL: only the kind of error is kept.
            raise DirectFetchFailed("unreachable",
                                    f"{check.url}: {type(exc).__name__}") from None
        except RegistryError as exc:  # FileCheck: too large, or size/sha256 mismatch
            raise DirectFetchFailed("mismatch", exc.message) from None

    async def aclose(self) -> None:
        await self._session.aclose()


def _write(out: BinaryIO, check: FileCheck, chunk: bytes) -> None:
    out.write(check.feed(chunk))


async def save(content: aiohttp.StreamReader, dest: Path, check: FileCheck) -> None:
    """Write and hash the body into ``dest`` as it arrives.

    A file of more than one chunk is written and hashed in a worker thread, one chunk
    behind the socket: both release the GIL, so the next chunk is received meanwhile
    instead of waiting (a 50 MB adapter, bench/large_adapter.py). A smaller file is
    written on the loop.
    """
    # A thread hand-off per chunk would cost a small file more than it saves.
    inline = check.size <= DOWNLOAD_CHUNK
    loop = asyncio.get_running_loop()
    behind: asyncio.Future[None] | None = None
    with open_private(dest, exclusive=False) as out:
        try:
            async for chunk in content.iter_chunked(DOWNLOAD_CHUNK):
                if inline:
                    _write(out, check, chunk)
                    continue
                if behind is not None:
                    # Shielded: a cancel must not mark a write done that is still running.
                    await asyncio.shield(behind)
                behind = loop.run_in_executor(None, _write, out, check, chunk)
                # Retrieved even when nobody awaits it (the download failed meanwhile).
                behind.add_done_callback(retrieve_exception)
            if behind is not None:
                await asyncio.shield(behind)
        finally:
            if behind is not None and not behind.done():
                # A thread cannot be stopped: let its write end before the file closes.
                await asyncio.wait([behind])
