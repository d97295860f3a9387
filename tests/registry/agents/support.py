"""Building agent reports and reading the fleet, for the agent API tests."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import update

from devharness.registry import RegistryHarness
from loraplane.events import AgentStatus, ServedVersion, ServeState
from registry_service.agents.models import AgentRow
from tests.registry.auth.principals import or_admin

BASE_MODEL = "tiny-llama"


def served(adapter: str, version: int, alias: str | None = "live",
           state: ServeState = "serving", *, reason: str | None = None,
           code: str | None = None) -> ServedVersion:
    return ServedVersion(adapter=adapter, alias=alias, version=version, state=state,
                         reason=reason, code=code)


def report(agent_id: str, *, entries: Iterable[ServedVersion] = (),
           failures: Iterable[ServedVersion] = (), loaded: Iterable[str] = (),
           base_model: str = BASE_MODEL, time: datetime | None = None) -> dict[str, Any]:
    status = AgentStatus(agent_id=agent_id, base_model=base_model,
                         time=time or datetime.now(UTC), served=list(entries),
                         failures=list(failures), loaded=list(loaded))
    return status.model_dump(mode="json")


async def post_status(registry: RegistryHarness, body: dict[str, Any],
                      headers: dict[str, str] | None = None,
                      agent_id: str | None = None) -> Any:
    return await registry.client.post(f"/v1/agents/{agent_id or body['agent_id']}/status",
                                      json=body, headers=or_admin(registry, headers))


async def fleet(registry: RegistryHarness, headers: dict[str, str] | None = None,
                **params: str) -> dict[str, dict[str, Any]]:
    response = await registry.client.get("/v1/agents", params=params,
                                         headers=or_admin(registry, headers))
    assert response.status_code == 200, response.text
    return {a["agent_id"]: a for a in response.json()["agents"]}


async def age_agent(registry: RegistryHarness, agent_id: str, seconds: float) -> None:
    """Pretend the agent's last report came ``seconds`` ago."""
    async with registry.ctx.db.session() as session:
        await session.execute(
            update(AgentRow).where(AgentRow.agent_id == agent_id)
            .values(last_seen_at=datetime.now(UTC) - timedelta(seconds=seconds)))
        await session.commit()
