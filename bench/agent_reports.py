"""Status reports as an agent of the fan-out fleet sends them, for benchmarks that play
many agents without running them (``bench/background.py``'s ``AgentFleet``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx

from loraplane.events import AgentStatus, ServedVersion, TierEntry

BASE = "base"


def status(agent_id: str, adapters: int, version: int) -> dict[str, Any]:
    """A report like a fan-out agent's: every adapter's alias served, its tier, and
    three versions loaded; ``version`` is the pushed adapter's new version."""
    served = [ServedVersion(adapter=f"placed-{i:03d}", alias="live", version=1,
                            state="serving") for i in range(adapters)]
    served.append(ServedVersion(adapter="fanout-all", alias="live", version=version,
                                state="serving"))
    tiers = [TierEntry(adapter=s.adapter, version=s.version,
                       tier="hot" if i < 3 else "cold", owned=i < 2)
             for i, s in enumerate(served)]
    loaded = [f"{s.adapter}@{s.version}" for s in served[:2]] + [f"fanout-all@{version}"]
    report = AgentStatus(agent_id=agent_id, base_model=BASE, time=datetime.now(UTC),
                         served=served, loaded=loaded, tiers=tiers)
    return report.model_dump(mode="json")


async def post(client: httpx.AsyncClient, agent_id: str, token: str,
               body: dict[str, Any], minimal: bool = True) -> float:
    """One report, as agents send it (``Prefer: return=minimal`` unless ``minimal`` is
    False); its seconds."""
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"}
    if minimal:  # as agents send it (inference_agent/node/registry_client.py)
        headers["Prefer"] = "return=minimal"
    response = await client.post(f"/v1/agents/{agent_id}/status", json=body, headers=headers)
    if response.status_code != (204 if minimal else 200):
        raise RuntimeError(f"report of {agent_id}: {response.status_code} {response.text}")
    return time.perf_counter() - started
