"""--watch-dir with a real folder, real adapters and the real Materializer (validation),
through the agent's one loop: the WatchDirSource queues ``local/<name>`` keys on a real
WorkQueue and the real Reconciler handles them. The swapper is a recording fake that
applies moves to a real RouteTable."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

from devharness.adapters import make_adapter, make_base_config
from devharness.waiting import eventually
from inference_agent.control.keys import local_key
from inference_agent.control.reconciler import Reconciler
from inference_agent.control.watchdir import STATE_FILE, WatchDirSource, hash_folder
from inference_agent.control.workqueue import Done, Failed, Outcome, Retry, WorkQueue
from inference_agent.errors import VllmUnavailable
from inference_agent.metrics import AgentMetrics
from inference_agent.node.materialize import Materializer
from inference_agent.serving.routes import RouteTable
from loraplane.digest import version_digest
from loraplane.lora import BaseModelShapes
from tests.agent.loop_support import FakeCache, FakeSwapper

BASE = "tiny-llama"


class Setup:
    def __init__(self, tmp_path: Path, known: int = 0) -> None:
        self.watch = tmp_path / "watch"
        self.watch.mkdir(exist_ok=True)
        self.cache_dir = tmp_path / "cache"
        self.routes = RouteTable(BASE)
        self.swapper = FakeSwapper(self.routes)
        shapes = BaseModelShapes.from_hf_config(make_base_config(tmp_path / "config.json"))
        self.materializer = Materializer(self.cache_dir, max_bytes=10**9, fetch=None,
                                         base_shapes=shapes, max_rank=16,
                                         metrics=AgentMetrics())
        self.changes = 0
        self.queue: WorkQueue[str] = WorkQueue()
        self.source = WatchDirSource(self.watch, enqueue=self.queue.add,
                                     copier=self.materializer, state_dir=self.cache_dir,
                                     known_versions=lambda _a: known, debounce_ms=100)
        # No registry: the watched folder alone is desired, as with --watch-dir alone.
        self.reconciler = Reconciler(
            base_model=BASE, registry=None, routes=self.routes, swapper=self.swapper,
            cache=FakeCache(), queue=self.queue, metrics=AgentMetrics(), max_attempts=3,
            local=self.source, on_change=self._changed)

    def _changed(self) -> None:
        self.changes += 1

    async def sync(self, adapter: str) -> Outcome:
        return await self.reconciler.reconcile(local_key(adapter))

    def live(self, adapter: str) -> int | None:
        _rev, ref = self.routes.alias(adapter, "live")
        return ref.version if ref is not None else None


@asynccontextmanager
async def watching(setup: Setup) -> AsyncIterator[None]:
    setup.source.scan()
    tasks = [asyncio.create_task(setup.source.run()),
             asyncio.create_task(setup.queue.run(setup.reconciler.reconcile, 2))]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with suppress(asyncio.CancelledError):
                await task


async def test_a_folder_is_served_and_each_change_is_a_new_version(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    make_adapter(s.watch / "bot", seed=1)
    (s.watch / "Not A Slug").mkdir()
    async with watching(s):
        await eventually(lambda: s.live("bot") == 1, what="v1 served")
        assert s.source.owns("bot")
        _rev, ref = s.routes.alias("bot", "live")
        assert ref is not None and ref.files[0].url.startswith("file://")
        assert ref.digest == version_digest(hash_folder(s.watch / "bot"))
        assert s.materializer.path_of(ref) is not None, "copied into the disk cache"
        make_adapter(s.watch / "bot", seed=2)
        await eventually(lambda: s.live("bot") == 2, what="v2 served")
        # The new version went through the same apply path, at a newer revision.
        assert [m for m in s.swapper.moves if m[0] == "bot"] == \
            [("bot", "live", 1, 1), ("bot", "live", 2, 2)]
        # An adapter for a wider model is refused by validation; v2 keeps serving.
        make_adapter(s.watch / "bot", seed=3, hidden=256, intermediate=512)
        await eventually(lambda: bool(s.reconciler.failures()), what="failure reported")
        [failure] = s.reconciler.failures()
        assert (failure.version, failure.bad, failure.code) == (3, True, "shape_mismatch")
        assert "base model" in failure.reason
        assert s.live("bot") == 2
        make_adapter(s.watch / "bot", seed=4)
        await eventually(lambda: s.live("bot") == 4, what="fixed folder served")
        assert s.reconciler.failures() == []
        shutil.rmtree(s.watch / "bot")
        await eventually(lambda: s.live("bot") is None, what="alias removed")
        assert not s.source.owns("bot")
        assert "bot" not in s.routes.adapters()


async def test_numbers_survive_a_restart_and_start_above_known_versions(
        tmp_path: Path) -> None:
    s = Setup(tmp_path, known=7)
    make_adapter(s.watch / "bot", seed=1)
    s.source.scan()
    assert isinstance(await s.sync("bot"), Done)
    assert s.live("bot") == 8, "local numbers start after any version already known"
    make_adapter(s.watch / "bot", seed=2)
    await s.sync("bot")
    assert s.live("bot") == 9
    assert (s.cache_dir / STATE_FILE).is_file()
    # Restart: same weights keep their number, other weights never reuse one.
    again = Setup(tmp_path)
    await again.sync("bot")
    assert again.live("bot") == 9
    make_adapter(again.watch / "bot", seed=1)
    await again.sync("bot")
    assert again.live("bot") == 8, "the weights numbered 8 keep their number"
    make_adapter(again.watch / "bot", seed=5)
    await again.sync("bot")
    assert again.live("bot") == 10


async def test_broken_folders_wait_for_a_change_and_outages_retry(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    folder = s.watch / "bot"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{not json")
    s.source.scan()
    outcome = await s.sync("bot")
    assert isinstance(outcome, Failed)
    [failure] = s.reconciler.failures()
    assert failure.code == "missing_files" and s.changes > 0
    s.swapper.moves.clear()
    assert isinstance(await s.sync("bot"), Done), "same broken files: no retry"
    make_adapter(folder, seed=1)
    version = s.reconciler.failures()[0].version + 1
    s.swapper.errors[("bot", version)] = VllmUnavailable("vLLM restarting")
    assert isinstance(await s.sync("bot"), Retry)
    assert not s.reconciler.failures()[0].bad
    del s.swapper.errors[("bot", version)]
    assert isinstance(await s.sync("bot"), Done)
    assert s.live("bot") == version and s.reconciler.failures() == []
