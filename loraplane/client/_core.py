"""The transport-agnostic half of the client: requests as values, answers as models.

Each call of the REST API is built once here as a ``Call`` (method, path, query, body
and the parser of its answer). ``RegistryClient`` and ``AsyncRegistryClient`` only send
calls and hand the response back to ``finish``, the way httpx-based SDKs keep one
definition of an API behind a sync and an async shell.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from loraplane import __version__
from loraplane.client.config import Discover, client_connection
from loraplane.client.errors import (
    BadResponse,
    DownloadFailed,
    InvalidURL,
    RegistryError,
    error_from_response,
)
from loraplane.client.multipart import MultipartBody

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Query = Mapping[str, str | int | float | bool | None]
OnBytes = Callable[[int], None]

DEFAULT_TIMEOUT_S = 30.0
# The registry answers an upload only after it has hashed, validated and stored every byte.
UPLOAD_READ_TIMEOUT_S = 600.0
DOWNLOAD_CHUNK = 1024 * 1024
# An idle kept-alive connection is dropped by the client before the registry closes it
# (registry_service/server.py: KEEP_ALIVE_S). httpx's default (5 s) equals uvicorn's,
# so a request sent on a connection the server was closing at that moment failed with
# "Server disconnected" (seen as an agent's fetch retried after its queue's backoff).
KEEPALIVE_EXPIRY_S = 15.0


def registry_file_path(url: str) -> str:
    """``url`` (a ``FileRef.url``) if it is a file path on the registry itself.

    The client sends its bearer token with every request, so a URL from an event or a
    snapshot may only be a path of the registry's API: never another host (the token
    would go there), never a path that climbs out of ``/v1/``."""
    segments = url.split("/")
    if not url.startswith("/v1/") or "\\" in url or "?" in url or "#" in url \
            or any(segment in ("", ".", "..") for segment in segments[1:]):
        raise DownloadFailed("a file URL must be a path on the registry (/v1/...)",
                             code="foreign_file_url", detail={"url": url[:200]})
    return url


def path(*segments: str | int) -> str:
    """``/v1/...`` with every segment percent-encoded, so a name can never change the route."""
    return "/v1/" + "/".join(quote(str(s), safe="") for s in segments)


def query(params: Query) -> dict[str, str | int | float]:
    """The query without its unset parameters; booleans as the registry spells them."""
    out: dict[str, str | int | float] = {}
    for key, value in params.items():
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif value is not None:
            out[key] = value
    return out


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request of the REST API and how to read its answer."""

    method: str
    url: str
    parse: Callable[[Any], T]
    params: dict[str, str | int | float] = field(default_factory=dict)
    json: Any = None
    # A body already encoded (with its Content-Type among ``headers``); not with json.
    content: bytes | None = None
    body: MultipartBody | None = None
    upload: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    def request_headers(self) -> dict[str, str] | None:
        """The call's own headers and its body's (a multipart boundary), if any."""
        merged = {**self.headers, **(self.body.headers if self.body is not None else {})}
        return merged or None


def model(cls: type[M]) -> Callable[[Any], M]:
    """A parser of decoded JSON into ``cls``; a body off the contract is a BadResponse."""
    def parse(data: Any) -> M:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise BadResponse(f"the registry sent a {cls.__name__} off the contract: {exc}"
                              ) from exc
    return parse


def nothing(_: Any) -> None:
    return None


class ClientConfig:
    """What both shells share: where the registry is, how to authenticate, timeouts."""

    def __init__(self, base_url: str | None, token: str | Discover | None, *,
                 timeout_s: float, user_agent: str | None) -> None:
        # Unnamed: from LORAPLANE_REGISTRY/LORAPLANE_TOKEN or `loraplane login`'s profile.
        base_url, token = client_connection(base_url, token)
        self.base_url = base_url.rstrip("/")
        self.has_token = bool(token)
        self.timeout_s = timeout_s
        self.headers = {"User-Agent": user_agent or f"loraplane/{__version__}",
                        "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def http_options(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "headers": self.headers,
                "timeout": httpx.Timeout(self.timeout_s),
                "limits": httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)}

    def timeout(self, call: Call[Any]) -> httpx.Timeout | None:
        if not call.upload:
            return None
        return httpx.Timeout(self.timeout_s,
                             read=max(self.timeout_s, UPLOAD_READ_TIMEOUT_S))

    def invalid_url(self, exc: Exception) -> InvalidURL:
        return InvalidURL(f"invalid registry URL {self.base_url!r}: {exc}")

    def finish(self, call: Call[T], response: httpx.Response) -> T:
        """The parsed answer of ``call``, or the RegistryError it maps to."""
        if response.status_code >= 400:
            raise error_from_response(response)
        if not response.content:
            return call.parse(None)
        try:
            data = response.json()
        except ValueError as exc:
            raise BadResponse(f"the registry at {self.base_url} sent a response that is not "
                              f"JSON (HTTP {response.status_code})",
                              status=response.status_code) from exc
        return call.parse(data)


class Pager(Generic[T]):
    """Follows ``next_cursor`` until the server has no more or ``limit`` items arrived."""

    def __init__(self, limit: int | None, page_size: int) -> None:
        if page_size <= 0 or (limit is not None and limit < 0):
            raise ValueError("page_size must be positive and limit not negative")
        self.limit, self.page_size = limit, page_size
        self.items: list[T] = []
        self.cursor: str | None = None
        self._done = False

    def want(self) -> int | None:
        """How many items to ask for next; None once done."""
        if self._done or (self.limit is not None and len(self.items) >= self.limit):
            return None
        return self.page_size if self.limit is None else min(self.page_size,
                                                             self.limit - len(self.items))

    def add(self, items: list[T], next_cursor: str | None) -> None:
        self.items.extend(items)
        self.cursor = next_cursor
        self._done = not next_cursor

    def result(self) -> list[T]:
        return self.items if self.limit is None else self.items[:self.limit]


class FileCheck:
    """Checks a download's size and sha256 chunk by chunk, writing it to ``dest``."""

    def __init__(self, url: str, dest: Path, size: int, sha256: str,
                 on_bytes: OnBytes | None) -> None:
        self.url, self.dest, self.size, self.sha256 = url, dest, size, sha256
        self.on_bytes = on_bytes
        self.digest = hashlib.sha256()
        self.written = 0

    def refused(self, response: httpx.Response) -> DownloadFailed:
        error = error_from_response(response)
        return DownloadFailed(f"GET {self.url} answered {response.status_code}: "
                              f"{error.message}", status=response.status_code,
                              detail={"url": self.url, "status": response.status_code,
                                      "registry_code": error.code})

    def broken(self, exc: RegistryError | httpx.HTTPError) -> DownloadFailed:
        return DownloadFailed(f"downloading {self.url} failed: {type(exc).__name__}: {exc}",
                              detail={"url": self.url})

    def feed(self, chunk: bytes) -> bytes:
        self.written += len(chunk)
        if self.written > self.size:
            raise DownloadFailed(f"{self.url} is larger than its {self.size} bytes",
                                 detail={"url": self.url, "size": self.size})
        self.digest.update(chunk)
        if self.on_bytes is not None:
            self.on_bytes(len(chunk))
        return chunk

    def finish(self) -> None:
        got = self.digest.hexdigest()
        if self.written != self.size or got != self.sha256:
            raise DownloadFailed(
                f"{self.url}: got {self.written} bytes with sha256 {got}, "
                f"expected {self.size} bytes with sha256 {self.sha256}",
                detail={"url": self.url, "size": self.written, "expected_size": self.size,
                        "sha256": got, "expected_sha256": self.sha256})
