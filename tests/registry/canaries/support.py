"""A registry with an adapter ``bot`` whose alias ``live`` is on version 1, and the
canary routes' calls, and agents' reports of a canary's traffic, for the canary
tests. Steps are made due by moving their start back in the database, never by
waiting out a step."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import update

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from devharness.waiting import eventually
from loraplane.events import TRAFFIC_BUCKETS, AgentStatus, CanaryTrack, CanaryTraffic
from registry_service.canaries.models import CanaryRow
from registry_service.db.base import utcnow
from tests.registry.agents.support import BASE_MODEL, post_status

ALIAS = "/v1/adapters/bot/aliases/live"
CANARY = f"{ALIAS}/canary"


async def bot(registry: RegistryHarness, tmp_path: Path, versions: int = 3) -> None:
    """``bot`` with ``versions`` versions and ``live`` on version 1."""
    await registry.create_adapter("bot")
    for seed in range(1, versions + 1):
        adapter = make_adapter(tmp_path / str(seed), seed=seed)
        response = await upload_dir(registry, "bot", adapter,
                                    aliases="live" if seed == 1 else "")
        assert response.status_code == 201, response.text


async def call(registry: RegistryHarness, method: str, url: str,
               headers: dict[str, str] | None = None, **kwargs: Any) -> tuple[int, Any]:
    response = await registry.client.request(method, url, headers=headers or
                                             registry.admin_headers, **kwargs)
    return response.status_code, response.json()


async def start_canary(registry: RegistryHarness, version: int = 2,
                       **body: Any) -> tuple[int, Any]:
    return await call(registry, "POST", CANARY, json={"version": version, **body})


async def history(registry: RegistryHarness) -> list[tuple[str, int | None, int | None]]:
    _, body = await call(registry, "GET", f"{ALIAS}/history")
    return [(m["action"], m["from_version"], m["to_version"]) for m in body["moves"]]


async def alias_events(registry: RegistryHarness) -> list[dict[str, Any]]:
    _, body = await call(registry, "GET", "/v1/events", params={"limit": 1000})
    return [e for e in body["events"] if e["type"] == "adapter_updated"]


ANALYSIS = {"min_requests": 10}


def side(canary_id: int, track: CanaryTrack, requests: int, *, errors: int = 0,
         seconds: float = 0.02, load_failures: int = 0) -> CanaryTraffic:
    """``requests`` requests of one side, each taking ``seconds``, cumulative."""
    first = next(i for i, bound in enumerate(TRAFFIC_BUCKETS) if seconds <= bound)
    latency = [0] * first + [requests] * (len(TRAFFIC_BUCKETS) + 1 - first)
    return CanaryTraffic(canary_id=canary_id, track=track, requests=requests, errors=errors,
                         latency=latency, ttft=latency, load_failures=load_failures)


async def report(registry: RegistryHarness, agent_id: str, *traffic: CanaryTraffic) -> None:
    status = AgentStatus(agent_id=agent_id, base_model=BASE_MODEL, time=utcnow(), served=[],
                         traffic=list(traffic))
    response = await post_status(registry, status.model_dump(mode="json"))
    assert response.status_code == 200, response.text


async def make_due(registry: RegistryHarness, canary_id: int) -> None:
    """The step's window opened long enough ago: the analyst judges it next look."""
    async with registry.ctx.db.session() as session:
        await session.execute(update(CanaryRow).where(CanaryRow.id == canary_id)
                              .values(step_started_at=utcnow() - timedelta(days=1)))
        await session.commit()


async def canary_when(registry: RegistryHarness, **expected: Any) -> dict[str, Any]:
    """The canary (running or the alias's last) once its fields are ``expected``."""
    async def check() -> dict[str, Any] | None:
        _, body = await call(registry, "GET", f"{ALIAS}/canaries")
        last: dict[str, Any] = body["canaries"][0]
        return last if all(last[k] == v for k, v in expected.items()) else None
    return await eventually(check, what=f"the canary with {expected}")


async def running(registry: RegistryHarness, tmp_path: Path, **body: Any) -> int:
    await bot(registry, tmp_path)
    status, canary = await start_canary(registry, **{"steps": [10, 50], "step_seconds": 600,
                                                     "analysis": ANALYSIS, **body})
    assert status == 201, canary
    return int(canary["id"])


async def alias_version(registry: RegistryHarness) -> int:
    _, adapter = await call(registry, "GET", "/v1/adapters/bot")
    return next(int(a["version"]) for a in adapter["aliases"] if a["alias"] == "live")


async def first_step(registry: RegistryHarness, tmp_path: Path, stable: dict[str, Any],
                     canary: dict[str, Any], state: str, **body: Any) -> dict[str, Any]:
    """A canary whose first step saw ``stable`` and ``canary`` (``side``'s arguments),
    once the analysis has put it in ``state``."""
    cid = await running(registry, tmp_path, **body)
    await report(registry, "gpu-1", side(cid, "stable", **stable),
                 side(cid, "canary", **canary))
    await make_due(registry, cid)
    return await canary_when(registry, state=state)
