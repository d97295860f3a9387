"""A small synchronous REST client for the registry, used by every CLI command.

Every failure leaves this module as a ``CliError``: HTTP errors carry the server's
``{"error": {"code", "message", "detail"}}``, and transport failures say which registry
could not be reached and why, so no command ever has to look at an httpx exception.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from loraplane import __version__

DEFAULT_REGISTRY = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S = 30.0
_BODY_SNIPPET = 300

Params = Mapping[str, str | int | float | None]


class CliError(Exception):
    """An error to show the user as one message, with the exit code to leave with."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "cli_error",
        status: int | None = None,
        detail: Mapping[str, Any] | None = None,
        hint: str | None = None,
        exit_code: int = 1,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.detail: dict[str, Any] = dict(detail or {})
        self.hint = hint
        self.exit_code = exit_code

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "detail": self.detail}
        if self.status is not None:
            body["status"] = self.status
        return {"error": body}


def path(*segments: str | int) -> str:
    """``/v1/...`` with every segment percent-encoded, so a name can never change the route."""
    return "/v1/" + "/".join(quote(str(s), safe="") for s in segments)


def _validation_summary(detail: Mapping[str, Any]) -> str:
    errors = detail.get("errors")
    if not isinstance(errors, list):
        return ""
    parts = []
    for item in errors:
        if isinstance(item, Mapping):
            loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
            parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
    return "; ".join(parts)


def error_from_response(response: httpx.Response) -> CliError:
    """Map an error response to a CliError, whether or not it has the registry's shape."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        detail = error.get("detail")
        detail = detail if isinstance(detail, dict) else {}
        message = error["message"]
        summary = _validation_summary(detail)
        if summary:
            message = f"{message}: {summary}"
        return CliError(
            message, code=str(error.get("code") or f"http_{status}"), status=status, detail=detail
        )
    # Not the registry's error shape: a proxy, a wrong URL, or another service entirely.
    text = response.text.strip()[:_BODY_SNIPPET]
    reason = response.reason_phrase or "error"
    message = f"HTTP {status} {reason} from {response.request.url}"
    return CliError(f"{message}: {text}" if text else message, code=f"http_{status}", status=status)


def transport_error(base_url: str, exc: httpx.TransportError) -> CliError:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return CliError(
            f"cannot reach the registry at {base_url}: {exc or type(exc).__name__}",
            code="unreachable",
            hint="is `loraplane registry serve` running? Point the CLI at it with "
            "--registry URL or LORAPLANE_REGISTRY.",
        )
    if isinstance(exc, httpx.TimeoutException):
        return CliError(
            f"the registry at {base_url} did not answer in time ({type(exc).__name__})",
            code="timeout",
            hint="raise --timeout (LORAPLANE_TIMEOUT) if the registry is busy",
        )
    if isinstance(exc, httpx.UnsupportedProtocol):
        return CliError(
            f"invalid registry URL {base_url!r}: {exc}", code="invalid_url", exit_code=2
        )
    return CliError(
        f"request to the registry at {base_url} failed: {exc or type(exc).__name__}",
        code="transport_error",
    )


class RegistryClient:
    """The registry's REST API over one pooled HTTP connection."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.has_token = bool(token)
        headers = {"User-Agent": f"loraplane-cli/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            self._http = httpx.Client(
                base_url=self.base_url,
                headers=headers,
                timeout=httpx.Timeout(timeout_s),
                transport=transport,
            )
        except (httpx.InvalidURL, ValueError) as exc:
            raise CliError(
                f"invalid registry URL {base_url!r}: {exc}", code="invalid_url", exit_code=2
            ) from exc

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        params: Params | None = None,
        json: Any = None,
        content: Iterable[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> Any:
        """Send one request; the decoded JSON body (None for an empty one) or a CliError."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(
                method,
                url,
                params=query,
                json=json,
                content=content,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.InvalidURL as exc:
            raise CliError(f"invalid request URL {url!r}: {exc}", code="invalid_url") from exc
        except httpx.TransportError as exc:
            raise transport_error(self.base_url, exc) from exc
        return self._decode(response)

    def _decode(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            error = error_from_response(response)
            if response.status_code == 401 and not self.has_token:
                error.hint = (
                    "no token was given: pass --token or set LORAPLANE_TOKEN (on the "
                    "registry's host the CLI reads <data-dir>/admin-token)"
                )
            raise error
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise CliError(
                f"the registry at {self.base_url} sent a response that is not "
                f"JSON (HTTP {response.status_code})",
                code="bad_response",
            ) from exc

    def get(self, url: str, params: Params | None = None) -> Any:
        return self.request("GET", url, params=params)

    def post(self, url: str, json: Any = None) -> Any:
        return self.request("POST", url, json=json)

    def put(self, url: str, json: Any = None) -> Any:
        return self.request("PUT", url, json=json)

    def delete(self, url: str) -> Any:
        return self.request("DELETE", url)

    def paginate(
        self,
        url: str,
        key: str,
        *,
        params: Params | None = None,
        limit: int | None = None,
        page_size: int = 100,
    ) -> list[dict[str, Any]]:
        """Follow ``next_cursor`` until the server has no more or ``limit`` items arrived."""
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while limit is None or len(items) < limit:
            want = page_size if limit is None else min(page_size, limit - len(items))
            page = self.get(url, {**(params or {}), "limit": want, "cursor": cursor})
            items.extend(page.get(key) or [])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return items if limit is None else items[:limit]
