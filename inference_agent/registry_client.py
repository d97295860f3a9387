"""HTTP client for the registry: desired state, version metadata, files, status.

File URLs are registry paths. The local blob store answers 200 with the bytes; the S3
store answers 307 to a presigned URL. httpx drops ``Authorization`` when a redirect
leaves the origin, so the bearer token never reaches S3 (tests check this).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from inference_agent.errors import (
    FetchFailed,
    NotServable,
    RegistryUnavailable,
    TerminalError,
)
from loraplane.events import AgentStatus, DesiredState, FileRef, VersionRef

OnBytes = Callable[[int], None]
_M = TypeVar("_M", DesiredState, VersionRef)
_CHUNK = 1024 * 1024


def _error(response: httpx.Response) -> tuple[str, str]:
    """(code, message) from the registry's ``{"error": {"code", "message"}}`` body."""
    try:
        error = response.json().get("error", {})
        return str(error.get("code", "http_error")), str(error.get("message", response.text))
    except (ValueError, AttributeError):
        return "http_error", response.text[:500] or f"HTTP {response.status_code}"


class RegistryClient:
    """One agent's connection to the registry, authenticated with its bearer token."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout_s,
            headers={"Authorization": f"Bearer {token}"})

    async def desired(self, base_model: str, adapter: str | None = None) -> DesiredState:
        params = {"base_model": base_model}
        if adapter is not None:
            params["adapter"] = adapter
        response = await self._get("/v1/desired", params=params)
        return self._parse(DesiredState, response)

    async def version(self, adapter: str, version: int) -> VersionRef:
        """One version's metadata; NotServable if the registry does not have it."""
        response = await self._get(f"/v1/adapters/{adapter}/versions/{version}")
        return self._parse(VersionRef, response)

    async def download(self, url: str, dest: Path, *, size: int, sha256: str,
                       on_bytes: OnBytes | None = None) -> None:
        """Stream ``url`` into ``dest``, checking size and sha256; FetchFailed otherwise.

        ``dest`` is left partially written on failure: callers download into staging.
        """
        digest, written = hashlib.sha256(), 0
        try:
            async with self.http.stream("GET", url, follow_redirects=True) as response:
                if response.status_code != 200:
                    await response.aread()
                    code, message = _error(response)
                    raise FetchFailed(f"GET {url} answered {response.status_code}: {message}",
                                      detail={"url": url, "status": response.status_code,
                                              "registry_code": code})
                with dest.open("wb") as out:
                    async for chunk in response.aiter_bytes(_CHUNK):
                        written += len(chunk)
                        if written > size:
                            raise FetchFailed(f"{url} is larger than its {size} bytes",
                                              detail={"url": url, "size": size})
                        digest.update(chunk)
                        out.write(chunk)
                        if on_bytes is not None:
                            on_bytes(len(chunk))
        except httpx.HTTPError as exc:
            raise FetchFailed(f"downloading {url} failed: {type(exc).__name__}: {exc}",
                              detail={"url": url}) from exc
        if written != size or digest.hexdigest() != sha256:
            raise FetchFailed(
                f"{url}: got {written} bytes with sha256 {digest.hexdigest()}, "
                f"expected {size} bytes with sha256 {sha256}",
                detail={"url": url, "size": written, "expected_size": size,
                        "sha256": digest.hexdigest(), "expected_sha256": sha256})

    def fetcher(self, on_bytes: OnBytes | None = None
                ) -> Callable[[FileRef, Path], Awaitable[None]]:
        """A ``Materializer`` fetch function downloading through this client."""
        async def fetch(file: FileRef, dest: Path) -> None:
            await self.download(file.url, dest, size=file.size, sha256=file.sha256,
                                on_bytes=on_bytes)
        return fetch

    async def post_status(self, status: AgentStatus) -> None:
        url = f"/v1/agents/{status.agent_id}/status"
        response = await self._send("POST", url, json=status.model_dump(mode="json"))
        self._check(response)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _get(self, url: str, **kwargs: Any) -> httpx.Response:
        response = await self._send("GET", url, **kwargs)
        self._check(response)
        return response

    async def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self.http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise RegistryUnavailable(
                f"registry {self.base_url} unreachable: {type(exc).__name__}: {exc}",
                detail={"url": self.base_url}) from exc

    @staticmethod
    def _check(response: httpx.Response) -> None:
        if response.status_code < 300:
            return
        code, message = _error(response)
        detail = {"status": response.status_code, "registry_code": code,
                  "url": str(response.request.url)}
        if response.status_code == 404:
            raise NotServable(message, detail=detail)
        if response.status_code >= 500 or response.status_code == 429:
            raise RegistryUnavailable(f"registry answered {response.status_code}: {message}",
                                      detail=detail)
        # 401/403/422...: retrying the same request cannot help.
        raise TerminalError(f"registry refused: {message}", code=f"registry_{code}",
                            detail=detail)

    @staticmethod
    def _parse(model: type[_M], response: httpx.Response) -> _M:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise RegistryUnavailable(f"registry sent an unexpected body: {exc}",
                                      detail={"url": str(response.request.url)}) from exc
