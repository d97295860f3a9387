"""Work that grows with the number of adapters runs off the agent's event loop: the
full desired-state snapshot is decoded and validated on a worker thread, the status
report is built, compared and serialised on one, and the disk listing the report reads
comes from the cache walk (on a worker thread) instead of a new listing on the loop.
Checked by the thread each step runs on, never by a duration."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from devharness.adapters import make_adapter
from devharness.services import NatsService
from inference_agent.control.failures import VersionFailure
from inference_agent.node import status as status_module
from inference_agent.node.registry_client import RegistryLink
from inference_agent.node.status import RoutedCopy, StatusReporter
from inference_agent.serving.routes import RouteTable
from loraplane.client import _calls as client_calls
from loraplane.events import DesiredState
from tests.agent.adapter_refs import adapter_ref
from tests.agent.loop_support import FakeSwapper, served_registry
from tests.agent.node.test_cache import World
from tests.loop_steps import recording_thread

BASE = "tiny-llama"


def off_the_loop(threads: list[threading.Thread]) -> bool:
    return bool(threads) and threading.main_thread() not in threads


async def test_the_full_snapshot_is_parsed_on_a_worker_thread(
        tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[threading.Thread] = []
    validate = DesiredState.model_validate

    def recorded(cls: type[DesiredState], *args: Any, **kwargs: Any) -> DesiredState:
        threads.append(threading.current_thread())
        return validate(*args, **kwargs)

    monkeypatch.setattr(DesiredState, "model_validate", classmethod(recorded))
    async with served_registry(tmp_path, nats) as reg:
        for name in ("bot", "other"):
            await reg.harness.create_adapter(name)
            await reg.publish(name, make_adapter(tmp_path / name, seed=len(name)))
        link = RegistryLink(reg.url, await reg.agent_token())
        try:
            snapshot = await link.desired(BASE)
            assert {a.name for a in snapshot.adapters} == {"bot", "other"}
            assert off_the_loop(threads)
            # One adapter's answer is small and still read as before.
            one = await link.desired(BASE, adapter="bot")
            assert [a.name for a in one.adapters] == ["bot"]
        finally:
            await link.aclose()


class Sources:
    def failures(self) -> list[VersionFailure]:
        return []

    def pending(self) -> dict[tuple[str, str], int | None]:
        return {("bot", "canary"): 3}


class Loaded:
    def loaded_names(self) -> list[str]:
        return ["bot@1"]


async def test_the_status_report_is_built_and_serialised_on_a_worker_thread(
        tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[threading.Thread] = []
    serialised: list[threading.Thread] = []
    monkeypatch.setattr(status_module, "build_status",
                        recording_thread(status_module.build_status, built))
    monkeypatch.setattr(client_calls, "send_status",
                        recording_thread(client_calls.send_status, serialised))
    routes = RouteTable(BASE)
    routes.set_alias("bot", "live", 1, adapter_ref(tmp_path, "bot", 1))
    async with served_registry(tmp_path, nats) as reg:
        link = RegistryLink(reg.url, await reg.agent_token())
        try:
            reporter = StatusReporter(agent_id="gpu-1", base_model=BASE, routes=routes,
                                      cache=Loaded(), swapper=FakeSwapper(routes),
                                      sources=[Sources()], post=link.post_status,
                                      heartbeat_interval_s=30)
            assert await reporter.report(force=True)
            # Unchanged: compared (off the loop too) and not posted again.
            assert await reporter.report(force=False)
            assert reporter.posted == 1
        finally:
            await link.aclose()
        agents = await reg.harness.client.get("/v1/agents",
                                              headers=reg.harness.admin_headers)
    [agent] = agents.json()["agents"]
    assert {(e["alias"], e["version"], e["state"]) for e in agent["status"]["served"]} == \
        {("live", 1, "serving"), ("canary", 3, "loading")}
    assert len(built) == 2 and off_the_loop(built)
    assert len(serialised) == 1 and off_the_loop(serialised)


async def test_after_a_walk_of_the_cache_the_disk_is_not_listed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path)
    mat = world.materializer
    for path in ("bot/1-aa", "bot/2-bb", "other/3-cc"):
        (mat.cache_dir / path).mkdir(parents=True)
        (mat.cache_dir / path / "adapter_model.safetensors").write_bytes(b"x" * 10)
    assert mat.on_disk() == {("bot", 1), ("bot", 2), ("other", 3)}
    listings: list[threading.Thread] = []
    monkeypatch.setattr(mat, "_list_folders", recording_thread(mat._list_folders, listings))
    await mat.evict_disk(keep=set(), recount=True)  # the periodic resync's recount
    assert mat.on_disk() == {("bot", 1), ("bot", 2), ("other", 3)}
    mat.max_bytes = 15  # room for one folder: the two oldest not kept go
    await mat.evict_disk(keep={"bot@1"})
    assert mat.on_disk() == {("bot", 1)}
    assert listings == [], "the report's disk listing came from the walk"


def test_the_reports_copy_of_the_routes_reads_as_the_table_did(tmp_path: Path) -> None:
    routes = RouteTable(BASE)
    bot1, bot2 = adapter_ref(tmp_path, "bot", 1), adapter_ref(tmp_path, "bot", 2)
    routes.set_alias("bot", "live", 1, bot1)
    routes.set_alias("bot", "canary", 1, bot2)
    routes.set_alias("gone", "live", 1, adapter_ref(tmp_path, "gone", 1))
    routes.set_alias("gone", "live", 2, None)  # a removal: a tombstone, not routed
    copy = RoutedCopy(routes)
    assert copy.adapters() == routes.adapters() == {"bot"}
    assert copy.aliases("bot") == routes.aliases("bot")
    assert copy.aliases("gone") == {} and copy.aliases("never") == {}
    # Moves after the copy (the loop goes on while the report is built) leave it as is.
    routes.set_alias("bot", "live", 2, bot2)
    routes.drop_adapter("bot")
    assert copy.aliases("bot") == {"live": (1, bot1), "canary": (1, bot2)}
