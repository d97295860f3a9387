"""The fleet views parse every agent's report and build every adapter's rollout, work that
grows with the fleet (100 agents serving 500 adapters each held the loop for seconds):
it runs on worker threads, never on the event loop's, with the cyclic collector paused
(issue 41).

Checked through the real registry: each call that parses a report, writes a rollout's
JSON or writes the metrics is recorded with the thread it ran on."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import upload_dir
from loraplane.api.agents import AgentOut, RolloutOut
from loraplane.events import AgentStatus
from registry_service.metrics import RegistryMetrics
from registry_service.ui.routes import stream_hub
from tests.registry.agents.support import post_status, report, served


class Threads:
    """Which threads the watched calls ran on, by call name, while ``watching``."""

    def __init__(self) -> None:
        self.calls: dict[str, list[bool]] = {}  # name -> per call, on the loop's thread
        self.collecting: dict[str, list[bool]] = {}  # name -> per call, gc.isenabled()
        self._loop_thread: int | None = None

    def wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            if self._loop_thread is not None:
                on_loop = threading.get_ident() == self._loop_thread
                self.calls.setdefault(name, []).append(on_loop)
                self.collecting.setdefault(name, []).append(gc.isenabled())
            return call(*args, **kwargs)
        return watched

    @contextmanager
    def watching(self) -> Iterator[None]:
        self.calls, self.collecting = {}, {}
        self._loop_thread = threading.get_ident()  # the tests run on the loop's thread
        try:
            yield
        finally:
            self._loop_thread = None

    def off_loop(self, name: str) -> bool:
        """``name`` was called, never on the loop's thread, and never while the cyclic
        collector could start a pass (which holds the GIL, and so the loop, for as long
        as it walks every object of the process)."""
        calls = self.calls.get(name, [])
        return bool(calls) and not any(calls) and not any(self.collecting[name]) \
            and gc.isenabled()

    def on_threads(self, name: str) -> bool:
        """``name`` was called, and never on the loop's thread."""
        calls = self.calls.get(name, [])
        return bool(calls) and not any(calls)


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Threads:
    found = Threads()
    for method in ("model_validate", "model_validate_json"):
        monkeypatch.setattr(AgentStatus, method, classmethod(
            found.wrap("parse", getattr(AgentStatus, method).__func__)))
    monkeypatch.setattr(RolloutOut, "model_dump_json",
                        found.wrap("rollout_json", RolloutOut.model_dump_json))
    monkeypatch.setattr(AgentOut, "model_dump_json",
                        found.wrap("agent_json", AgentOut.model_dump_json))
    monkeypatch.setattr(RegistryMetrics, "render",
                        found.wrap("render", RegistryMetrics.render))
    return found


async def _fleet_of_two(registry: RegistryHarness, tmp_path: Path) -> None:
    await registry.create_adapter("bot")
    response = await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
    assert response.status_code == 201, response.text
    for agent in ("gpu-a", "gpu-b"):
        body = report(agent, entries=[served("bot", 1)], loaded=["bot@1"])
        assert (await post_status(registry, body)).status_code == 200


async def test_rollouts_and_the_agent_list_are_built_off_the_loop(
    registry: RegistryHarness, tmp_path: Path, threads: Threads,
) -> None:
    await _fleet_of_two(registry, tmp_path)
    headers = registry.admin_headers
    with threads.watching():
        response = await registry.client.get("/ui/api/fleet", headers=headers)
    assert response.status_code == 200, response.text
    [rollout] = response.json()["adapters"]
    assert rollout["adapter"] == "bot" and rollout["agents"] == 2
    assert rollout["hot"] == ["gpu-a", "gpu-b"]
    assert threads.off_loop("parse") and threads.off_loop("rollout_json"), threads.calls
    with threads.watching():
        response = await registry.client.get("/v1/adapters/bot/rollout", headers=headers)
    assert response.status_code == 200 and response.json()["agents"] == 2
    assert threads.off_loop("parse"), threads.calls
    with threads.watching():
        response = await registry.client.get("/v1/agents", headers=headers)
    assert [a["agent_id"] for a in response.json()["agents"]] == ["gpu-a", "gpu-b"]
    assert threads.off_loop("parse") and threads.off_loop("agent_json"), threads.calls


async def test_the_metrics_fleet_gauges_are_computed_and_written_off_the_loop(
    registry: RegistryHarness, tmp_path: Path, threads: Threads,
) -> None:
    await _fleet_of_two(registry, tmp_path)
    with threads.watching():
        response = await registry.client.get("/metrics")
    assert response.status_code == 200
    assert ('loraplane_registry_alias_agents_converged{adapter="bot",alias="live"} 2.0'
            in response.text)
    assert threads.off_loop("parse") and threads.on_threads("render"), threads.calls


async def test_the_ui_streams_look_is_built_off_the_loop(
    registry: RegistryHarness, tmp_path: Path, threads: Threads,
) -> None:
    await _fleet_of_two(registry, tmp_path)
    hub = stream_hub(registry.ctx)
    token = registry.admin_headers["Authorization"].removeprefix("Bearer ")
    with threads.watching():
        subscriber = hub.subscribe(token, max_per_token=5)
        try:
            await subscriber.changed.wait()
        finally:
            hub.unsubscribe(subscriber)
    look = subscriber.latest
    assert look is not None and not isinstance(look, Exception)
    assert '"adapter":"bot"' in look.fleet_json
    assert threads.off_loop("parse") and threads.off_loop("rollout_json"), threads.calls
