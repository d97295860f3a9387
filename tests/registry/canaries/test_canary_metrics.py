"""The canaries' metrics on both backends: a running canary's state, step, weight and
its last checks' values per side; how long a paused one has been paused; when the
analysis last rolled one back; and the steps judged, by outcome."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import update

from devharness.registry import RegistryHarness
from registry_service.canaries.models import CanaryRow
from registry_service.db.base import utcnow
from tests.registry.canaries import support as c
from tests.registry.test_metrics import read


async def test_a_running_canary_shows_its_state_step_weight_and_checks(
    registry: RegistryHarness, tmp_path: Path,
) -> None:
    at = {"adapter": "bot", "alias": "live"}
    advanced = await read(registry, "canary_steps_judged_total", outcome="advance")
    cid = await c.running(registry, tmp_path, steps=[10, 50, 90])
    assert await read(registry, "canary_state", state="progressing", **at) == 1
    assert await read(registry, "canary_weight_percent", **at) == 10
    await c.report(registry, "gpu-1", c.side(cid, "stable", 100), c.side(cid, "canary", 20))
    await c.make_due(registry, cid)
    await c.canary_when(registry, step=2)
    assert await read(registry, "canary_step", **at) == 2
    assert await read(registry, "canary_weight_percent", **at) == 50
    assert await read(registry, "canary_check_value", metric="requests", side="stable",
                      **at) == 100
    assert await read(registry, "canary_check_value", metric="requests", side="canary",
                      **at) == 20
    assert await read(registry, "canary_steps_judged_total",
                      outcome="advance") == advanced + 1
    assert await read(registry, "canary_paused_seconds", **at) == 0
    status, _ = await c.call(registry, "POST", f"{c.CANARY}/pause")
    assert status == 200
    assert await read(registry, "canary_state", state="paused", **at) == 1
    async with registry.ctx.db.session() as session:  # paused two hours ago
        await session.execute(update(CanaryRow).where(CanaryRow.id == cid).values(
            updated_at=utcnow() - timedelta(hours=2)))
        await session.commit()
    assert 7200 <= await read(registry, "canary_paused_seconds", **at) < 7200 + 600
    status, _ = await c.call(registry, "POST", f"{c.CANARY}/abort")
    assert status == 200
    assert await read(registry, "canary_state", **at) == 0  # no running canary, no series
    assert await read(registry, "canary_rolled_back_timestamp_seconds", **at) == 0


async def test_a_rollback_by_the_analysis_shows_when(registry: RegistryHarness,
                                                    tmp_path: Path) -> None:
    rolled = await read(registry, "canary_steps_judged_total", outcome="rollback")
    aborted = await c.first_step(registry, tmp_path, {"requests": 100},
                               {"requests": 100, "errors": 50}, "aborted")
    when = await read(registry, "canary_rolled_back_timestamp_seconds", adapter="bot",
                      alias="live")
    assert abs(when - _timestamp(aborted["updated_at"])) < 1e-3
    assert await read(registry, "canary_steps_judged_total",
                      outcome="rollback") == rolled + 1


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()
