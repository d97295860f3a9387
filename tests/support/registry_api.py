"""The registry's REST API over real HTTP, for end-to-end tests, the demo and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class RegistryApiError(AssertionError):
    """The registry refused a call the caller expected to succeed."""


class RegistryApi:
    """Calls with one bearer token; each method fails loudly on an unexpected status."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 120.0) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=timeout_s,
                                      headers={"Authorization": f"Bearer {token}"})

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> RegistryApi:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, expect: Sequence[int] = (200,),
                    **kwargs: Any) -> Any:
        response = await self.http.request(method, path, **kwargs)
        if response.status_code not in expect:
            raise RegistryApiError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    async def create_adapter(self, name: str, *, base_model: str = "tiny-llama",
                             tenant: str = "e2e") -> dict[str, Any]:
        body = {"name": name, "base_model": base_model, "tenant": tenant}
        result: dict[str, Any] = await self._call("POST", "/v1/adapters", (201,), json=body)
        return result

    async def push(self, name: str, folder: Path, *,
                   aliases: Sequence[str] | None = ("live",), notes: str | None = None
                   ) -> dict[str, Any]:
        """Upload ``folder``'s adapter files as a version (multipart, like ``loraplane
        push``). ``aliases=()`` moves no alias."""
        files = [("files", (n, (folder / n).read_bytes())) for n in ADAPTER_FILES]
        data: dict[str, str] = {}
        if aliases is not None:
            data["aliases"] = ",".join(aliases)
        if notes is not None:
            data["notes"] = notes
        result: dict[str, Any] = await self._call(
            "POST", f"/v1/adapters/{name}/versions", (200, 201), files=files, data=data)
        return result

    async def move_alias(self, name: str, alias: str, version: int) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "PUT", f"/v1/adapters/{name}/aliases/{alias}", json={"version": version})
        return result

    async def rollback(self, name: str, alias: str = "live") -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", f"/v1/adapters/{name}/aliases/{alias}/rollback")
        return result

    async def version(self, name: str, number: int) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/v1/adapters/{name}/versions/{number}")
        return result

    async def agents(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/v1/agents")
        return result

    async def agent(self, agent_id: str) -> dict[str, Any] | None:
        """The registry's latest report of one agent, or None if it never reported."""
        listing = await self.agents()
        return next((a for a in listing["agents"] if a["agent_id"] == agent_id), None)

    async def rollout(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/v1/adapters/{name}/rollout")
        return result
