"""The agent's link to the registry: desired state, version metadata, files, status.

The requests are ``loraplane.client``'s, sent over aiohttp (``registry_http.py``); this
module maps the client's ``RegistryError`` kinds to the agent's own at the boundary, so
the reconciler only asks whether to retry. File URLs are registry paths: the local blob
store answers 200 with the bytes, the S3 store a 307 to a presigned URL, which is
followed without the bearer token (tests check this). A file that came with a
presigned ``direct_url`` (in an event or the desired-state snapshot, when the registry
adds them) is fetched from the store first (blob_fetch.py), and through the registry
only if that fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from inference_agent.errors import (
    AgentError,
    FetchFailed,
    NotServable,
    RegistryUnavailable,
    TerminalError,
)
from inference_agent.node.blob_fetch import BlobFetcher, DirectFetchFailed
from inference_agent.node.registry_http import RegistryHttp
from loraplane.client import (
    BadResponse,
    DownloadFailed,
    NotFound,
    Refused,
    RegistryError,
)
from loraplane.client import _calls as api_calls
from loraplane.client._core import ClientConfig
from loraplane.events import AgentStatus, DesiredState, FileRef, VersionRef
from loraplane.private_files import write_private

log = logging.getLogger(__name__)
OnBytes = Callable[[int], None]
# (source, result): "direct" or "registry", "ok" or a safe reason; for the metrics.
OnFetch = Callable[[str, str], None]


def agent_error(exc: RegistryError) -> AgentError:
    """The agent's kind of ``exc``: a 404 is not servable, a refusal terminal, and
    everything else (unreachable, 5xx, 429, an unexpected body) worth a retry."""
    if isinstance(exc, DownloadFailed):
        return FetchFailed(exc.message, detail=exc.detail)
    detail = {"status": exc.status, "registry_code": exc.code, "url": exc.url}
    if isinstance(exc, NotFound):
        return NotServable(exc.message, detail=detail)
    if isinstance(exc, Refused):
        # 401/403/422...: retrying the same request cannot help.
        return TerminalError(f"registry refused: {exc.message}", code=f"registry_{exc.code}",
                             detail=detail)
    if isinstance(exc, BadResponse):
        return RegistryUnavailable(f"registry sent an unexpected body: {exc.message}",
                                   detail={"url": exc.url})
    if exc.status is None:
        return RegistryUnavailable(f"registry unreachable: {exc.message}",
                                   detail={"url": exc.url})
    return RegistryUnavailable(f"registry answered {exc.status}: {exc.message}", detail=detail)


@contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except RegistryError as exc:
        raise agent_error(exc) from exc


class RegistryLink:
    """One agent's connection to the registry, authenticated with its bearer token."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        config = ClientConfig(base_url, token, timeout_s=timeout_s,
                              user_agent="loraplane-agent")
        self.blobs = BlobFetcher(timeout_s=timeout_s)
        self.http = RegistryHttp(config, self.blobs)

    @property
    def base_url(self) -> str:
        return self.http.config.base_url

    async def desired(self, base_model: str, adapter: str | None = None) -> DesiredState:
        """The desired state of ``base_model`` (or of one adapter). The full snapshot is
        decoded and validated on a worker thread: at hundreds of adapters it is a
        megabyte of JSON, which would hold the loop. One adapter's answer is small:
        parsed in place."""
        with _mapped():
            return await self.http.send(api_calls.desired(base_model, adapter),
                                        parse_off_loop=adapter is None)

    async def inference_credentials(self) -> dict[str, str]:
        """token sha256 -> tenant of every live inference token."""
        with _mapped():
            listed = await self.http.send(api_calls.inference_credentials())
        return {c.token_hash: c.tenant for c in listed.credentials}

    async def event_keys(self) -> list[str]:
        """The public keys (base64) the registry signs its events with."""
        with _mapped():
            listed = await self.http.send(api_calls.event_keys())
        return [key.public_key for key in listed.keys]

    async def version(self, adapter: str, version: int) -> VersionRef:
        """One version's metadata; NotServable if the registry does not have it."""
        with _mapped():
            listed = await self.http.send(api_calls.get_version(adapter, version))
        # Only the fields an agent loads by: a VersionRef equals the one in desired state.
        return VersionRef.model_validate(listed.model_dump(include=set(VersionRef.model_fields)))

    async def download(self, url: str, dest: Path, *, size: int, sha256: str,
                       on_bytes: OnBytes | None = None) -> None:
        """Stream ``url`` into ``dest``, checking size and sha256; FetchFailed otherwise.

        ``dest`` is left partially written on failure: callers download into staging.
        """
        with _mapped():
            await self.http.download(url, dest, size=size, sha256=sha256, on_bytes=on_bytes)

    def fetcher(self, on_bytes: OnBytes | None = None, on_fetch: OnFetch | None = None
                ) -> Callable[[FileRef, Path], Awaitable[tuple[int, str]]]:
        """A ``Materializer`` fetch function: the bytes the event carried for a small
        file, else the blob store directly when the event gave a URL, else (or when that
        fails) through the registry. Every path checks size and sha256 (a download while
        streaming) and writes nothing else, so what was written is what ``file``
        declares; carried bytes that do not match are fetched instead."""
        counted: OnFetch = on_fetch or (lambda _source, _result: None)

        async def fetch(file: FileRef, dest: Path) -> tuple[int, str]:
            if file.content is not None:
                if _write_inline(file, file.content, dest):
                    counted("inline", "ok")
                    return file.size, file.sha256
                counted("inline", "mismatch")
            if file.direct_url is not None:
                try:
                    await self.blobs.download(file.direct_url, dest, size=file.size,
                                              sha256=file.sha256, on_bytes=on_bytes)
                    counted("direct", "ok")
                    return file.size, file.sha256
                except DirectFetchFailed as exc:
                    counted("direct", exc.reason)
                    log.info("%s: fetching from the blob store failed (%s); asking the "
                             "registry", file.name, exc)
            try:
                await self.download(file.url, dest, size=file.size, sha256=file.sha256,
                                    on_bytes=on_bytes)
            except AgentError:
                counted("registry", "failed")
                raise
            counted("registry", "ok")
            return file.size, file.sha256
        return fetch

    async def post_status(self, status: AgentStatus) -> None:
        # Encoded on a worker thread: a report of thousands of entries would hold the loop.
        call = await asyncio.to_thread(api_calls.send_status, status)
        with _mapped():
            await self.http.send(call)

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.blobs.aclose()


def _write_inline(file: FileRef, content: bytes, dest: Path) -> bool:
    """Write the bytes an event carried for ``file`` if they are the file's; a few KiB
    at most (the relay's limit), so on the event loop."""
    if len(content) != file.size or hashlib.sha256(content).hexdigest() != file.sha256:
        log.warning("%s: the event's copy does not match its sha256; fetching it", file.name)
        return False
    write_private(dest, content)
    return True
