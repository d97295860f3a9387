"""Canaries across registry processes: one killed with SIGKILL mid-canary is resumed by
the registry started after it (both backends), and two replicas on one Postgres judge
every step once. Steps are made due in the database, never by waiting them out; the
lease of a killed analyst is short here (LORAPLANE_CANARY_LEASE_S) so that its
successor takes the canary over soon."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import create_async_engine

from devharness.adapters import make_adapter
from devharness.services import NatsService
from devharness.uploads import adapter_parts
from devharness.waiting import eventually
from loraplane.events import AgentStatus
from loraplane.netutil import free_ports
from loraplane.process import ChildProcess
from registry_service.canaries.models import CanaryRow
from tests.cli.conftest import CLI, START_TIMEOUT_S, clean_env
from tests.conftest import fresh_postgres
from tests.registry.canaries.support import side

ADMIN = "lp_canary-replicas-admin-0123456789abcdef"
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
CANARY = "/v1/adapters/bot/aliases/live/canary"


@dataclass
class Registries:
    """Registry processes of one database, each with a data folder of its own."""

    root: Path
    database_url: str  # the registry's (async driver) URL, for the test's own edits
    env: dict[str, str]
    runs: list[ChildProcess] = field(default_factory=list)

    def start(self, data_dir: Path) -> str:
        port, nats_port = free_ports(2)
        process = ChildProcess(
            "loraplane registry serve",
            [*CLI, "registry", "serve", "--port", str(port), "--data-dir", str(data_dir)],
            log_path=self.root / f"serve-{len(self.runs) + 1}.log",
            env=clean_env(LORAPLANE_EMBEDDED_NATS_PORT=str(nats_port), **self.env))
        process.start()
        self.runs.append(process)
        url = f"http://127.0.0.1:{port}"

        def probe() -> str | None:
            try:
                status = httpx.get(f"{url}/readyz", timeout=2).status_code
            except httpx.TransportError as exc:
                return f"{type(exc).__name__}: {exc}"
            return None if status == 200 else f"/readyz answered {status}"

        process.wait_ready(probe, START_TIMEOUT_S, interval_s=0.2)
        return url

    async def edit(self, canary_id: int, **values: Any) -> CanaryRow:
        engine = create_async_engine(self.database_url)
        try:
            async with engine.begin() as conn:
                if values:
                    await conn.execute(update(CanaryRow).where(CanaryRow.id == canary_id)
                                       .values(**values))
                row = (await conn.execute(select(CanaryRow)
                                          .where(CanaryRow.id == canary_id))).one()
        finally:
            await engine.dispose()
        return row  # type: ignore[return-value]

    async def make_due(self, canary_id: int) -> None:
        await self.edit(canary_id, step_started_at=datetime.now(UTC) - timedelta(days=1))


@pytest.fixture
def registries(request: pytest.FixtureRequest, tmp_path: Path,
               nats: NatsService) -> Iterator[Registries]:
    env = {"LORAPLANE_ADMIN_TOKEN": ADMIN, "LORAPLANE_CANARY_LEASE_S": "2",
           "LORAPLANE_NATS_URL": nats.url}
    with contextlib.ExitStack() as stack:
        if request.param == "embedded":
            url = f"sqlite+aiosqlite:///{tmp_path / 'data' / 'registry.db'}"
        else:
            pg = stack.enter_context(fresh_postgres())
            url = pg.async_url
            env["LORAPLANE_DATABASE_URL"] = url
            env["LORAPLANE_AUTO_MIGRATE"] = "true"
        found = Registries(tmp_path, url, env)
        yield found
        for process in found.runs:
            process.stop(grace_s=10)


async def _bot(url: str, tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=120) as http:
        created = await http.post("/v1/adapters", json={
            "name": "bot", "base_model": "tiny-llama", "tenant": "acme"})
        assert created.status_code == 201, created.text
        for seed in (1, 2):
            folder = make_adapter(tmp_path / f"v{seed}", seed=seed)
            pushed = await http.post("/v1/adapters/bot/versions", files=adapter_parts(folder),
                                     data={"aliases": "live" if seed == 1 else ""})
            assert pushed.status_code == 201, pushed.text


async def _report(url: str, canary_id: int, stable: int, canary: int) -> None:
    status = AgentStatus(agent_id="gpu-1", base_model="tiny-llama", time=datetime.now(UTC),
                         served=[], traffic=[side(canary_id, "stable", stable),
                                             side(canary_id, "canary", canary)])
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as http:
        answer = await http.post("/v1/agents/gpu-1/status",
                                 json=status.model_dump(mode="json"))
    assert answer.status_code == 200, answer.text


async def _canary(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as http:
        listed = await http.get("/v1/adapters/bot/aliases/live/canaries")
    assert listed.status_code == 200, listed.text
    last: dict[str, Any] = listed.json()["canaries"][0]
    return last


async def _history(url: str) -> list[tuple[str, str]]:
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as http:
        moves = (await http.get("/v1/adapters/bot/aliases/live/history")).json()["moves"]
    return [(m["action"], m["actor"]) for m in reversed(moves)]


async def _start(url: str, steps: list[int]) -> int:
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as http:
        started = await http.post(CANARY, json={"version": 2, "steps": steps,
                                                "step_seconds": 3600,
                                                "analysis": {"min_requests": 10}})
    assert started.status_code == 201, started.text
    return int(started.json()["id"])


@pytest.mark.parametrize("registries", ["embedded", "postgres"], indirect=True)
async def test_a_registry_killed_mid_canary_is_resumed_by_the_next(
    registries: Registries, tmp_path: Path,
) -> None:
    first = registries.start(tmp_path / "data")
    await _bot(first, tmp_path)
    cid = await _start(first, [10, 50])
    await _report(first, cid, 100, 20)
    # Its analyst holds the canary, then dies holding it.
    await eventually(lambda: _leased(registries, cid), what="the canary leased")
    registries.runs[0].stop(grace_s=10, sig=signal.SIGKILL)
    await registries.make_due(cid)
    second = registries.start(tmp_path / "data")
    stepped = await eventually(lambda: _at_step(second, 2), what="the step judged")
    assert (stepped["state"], stepped["weight"]) == ("progressing", 50)
    assert await _history(second) == [
        ("publish", "bootstrap-admin"), ("canary_start", "bootstrap-admin"),
        ("canary_step", "canary-analysis")]


@pytest.mark.parametrize("registries", ["postgres"], indirect=True)
async def test_two_replicas_judge_each_step_once(registries: Registries,
                                                tmp_path: Path) -> None:
    urls = [registries.start(tmp_path / "a"), registries.start(tmp_path / "b")]
    await _bot(urls[0], tmp_path)
    cid = await _start(urls[1], [10, 30, 50, 70])
    for step in range(1, 5):
        await _report(urls[step % 2], cid, 100 * step, 25 * step)
        await registries.make_due(cid)
        if step < 4:
            await eventually(lambda s=step: _at_step(urls[s % 2], s + 1),  # type: ignore[misc]
                             what=f"step {step} judged")
    done = await eventually(lambda: _promoted(urls[0]), what="the canary promoted")
    assert done["weight"] == 100
    history = await _history(urls[1])
    assert [action for action, _ in history] == [
        "publish", "canary_start", "canary_step", "canary_step", "canary_step",
        "canary_promote"], history
    judged = sum([await _judged(url) for url in urls])
    assert judged == 4


async def _leased(registries: Registries, cid: int) -> bool:
    return (await registries.edit(cid)).analyst is not None


async def _at_step(url: str, step: int) -> dict[str, Any] | None:
    canary = await _canary(url)
    return canary if canary["step"] == step else None


async def _promoted(url: str) -> dict[str, Any] | None:
    canary = await _canary(url)
    return canary if canary["state"] == "promoted" else None


async def _judged(url: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        text = (await http.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("loraplane_registry_canary_steps_judged_total{"))
