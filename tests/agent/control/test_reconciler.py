"""The reconciler's decisions, with a real RouteTable and WorkQueue, and narrow fakes for
the registry (desired state), the swapper (records moves and applies them to the table)
and the cache."""

from __future__ import annotations

import hashlib

from inference_agent.control.contract import Readiness, SwapResult
from inference_agent.control.keys import ALL, ROUTES, VLLM
from inference_agent.control.reconciler import Reconciler
from inference_agent.control.watchdir import LocalVersion
from inference_agent.control.workqueue import Done, Failed, Retry, WorkQueue
from inference_agent.errors import (
    AdapterRejected,
    FetchFailed,
    RegistryUnavailable,
    VllmUnavailable,
)
from inference_agent.metrics import AgentMetrics
from inference_agent.serving.routes import RouteTable
from loraplane.events import (
    CanaryRoute,
    DesiredAdapter,
    DesiredAlias,
    DesiredState,
    FileRef,
    RouteRule,
    VersionRef,
)
from tests.agent.loop_support import FakeCache, FakeSwapper

BASE = "tiny-llama"


def ref(adapter: str, version: int, salt: str = "") -> VersionRef:
    digest = hashlib.sha256(f"{adapter}{version}{salt}".encode()).hexdigest()
    return VersionRef(adapter=adapter, version=version, digest=digest, base_model=BASE,
                      rank=8, alpha=16, target_modules=["q_proj"],
                      files=[FileRef(name="adapter_config.json", size=1, sha256=digest,
                                     url=f"/v1/adapters/{adapter}/versions/{version}/files/c")])


class FakeRegistry:
    def __init__(self) -> None:
        self.adapters: dict[str, dict[str, tuple[int, VersionRef]]] = {}
        self.routes: list[RouteRule] = []
        self.calls: list[str | None] = []
        self.down = False
        self.canaries: dict[tuple[str, str], CanaryRoute] = {}

    def canary(self, adapter: str, alias: str, canary: CanaryRoute | None) -> None:
        """A canary transition: the alias's revision moves, its version stays."""
        revision, target = self.adapters[adapter][alias]
        self.adapters[adapter][alias] = (revision + 1, target)
        if canary is None:
            self.canaries.pop((adapter, alias), None)
        else:
            self.canaries[(adapter, alias)] = canary

    def move(self, adapter: str, alias: str, target: VersionRef | None) -> None:
        aliases = self.adapters.setdefault(adapter, {})
        revision = aliases[alias][0] + 1 if alias in aliases else 1
        if target is None:
            aliases.pop(alias)
        else:
            aliases[alias] = (revision, target)

    async def desired(self, base_model: str, adapter: str | None = None) -> DesiredState:
        self.calls.append(adapter)
        if self.down:
            raise RegistryUnavailable("registry down")
        names = [n for n in sorted(self.adapters) if adapter in (None, n)]
        return DesiredState(
            base_model=base_model, stream_seq=7, event_seq=7, routes=self.routes,
            adapters=[DesiredAdapter(tenant="acme", name=n, base_model=base_model, aliases=[
                DesiredAlias(alias=a, revision=r, target=t, canary=self.canaries.get((n, a)))
                for a, (r, t) in sorted(self.adapters[n].items())]) for n in names])


class OwnedNames:
    """A watched folder that owns ``names`` (tests/agent/control/test_watchdir.py covers
    the real one)."""

    tenant = "local"

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def owns(self, adapter: str) -> bool:
        return adapter in self.names

    def release(self, adapter: str) -> None:
        raise AssertionError("not used here")

    async def read(self, adapter: str, current: VersionRef | None) -> LocalVersion | None:
        raise AssertionError("not used here")

    async def copy_in(self, ref: VersionRef, local: LocalVersion) -> None:
        raise AssertionError("not used here")


class World:
    def __init__(self, *, max_attempts: int = 3, pins: tuple[str, ...] = (),
                 prewarm: tuple[str, ...] = (), local: frozenset[str] = frozenset()) -> None:
        self.registry = FakeRegistry()
        self.routes = RouteTable(BASE)
        self.swapper = FakeSwapper(self.routes)
        self.cache = FakeCache()
        self.queue: WorkQueue[str] = WorkQueue()
        self.metrics = AgentMetrics()
        self.changes = 0
        self.reconciler = Reconciler(
            base_model=BASE, registry=self.registry, routes=self.routes,
            swapper=self.swapper, cache=self.cache, queue=self.queue, metrics=self.metrics,
            max_attempts=max_attempts, pins=pins, prewarm=prewarm,
            local=OwnedNames(local), on_change=self._changed)

    def _changed(self) -> None:
        self.changes += 1

    def serving(self, adapter: str) -> dict[str, int]:
        return {alias: r.version for alias, (_rev, r) in self.routes.aliases(adapter).items()}

    def failure_count(self, adapter: str, code: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "loraplane_agent_failures_total", {"adapter": adapter, "code": code})
        return value or 0.0


async def test_new_adapter_is_applied_and_a_second_pass_changes_nothing() -> None:
    w = World()
    w.registry.move("bot", "live", ref("bot", 1))
    w.registry.move("bot", "canary", ref("bot", 2))
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    assert w.serving("bot") == {"live": 1, "canary": 2}
    assert w.routes.owner("bot") == "acme", "the desired state's tenant owns it"
    assert sorted(w.swapper.moves) == [("bot", "canary", 1, 2), ("bot", "live", 1, 1)]
    assert w.registry.calls == ["bot"], "one adapter re-reads only its own desired state"
    desired_reads = w.metrics.registry.get_sample_value(
        "loraplane_agent_stage_seconds_count", {"stage": "desired"})
    assert desired_reads == 1
    w.swapper.moves.clear()
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    assert w.swapper.moves == []


async def test_alias_moved_removed_and_adapter_deleted() -> None:
    w = World()
    w.registry.move("bot", "live", ref("bot", 1))
    w.registry.move("bot", "canary", ref("bot", 1))
    await w.reconciler.reconcile("bot")
    w.swapper.moves.clear()
    w.registry.move("bot", "live", ref("bot", 2))
    w.registry.move("bot", "canary", None)
    w.reconciler.notify("bot")  # a change no event carried: read again
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    # The removal takes a revision above the one held, so the table accepts it.
    assert w.swapper.moves == [("bot", "canary", 2, None), ("bot", "live", 2, 2)]
    assert w.serving("bot") == {"live": 2}
    del w.registry.adapters["bot"]
    w.swapper.moves.clear()
    w.reconciler.notify("bot")
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    assert w.swapper.moves == [("bot", "live", 3, None)]
    assert w.routes.alias("bot", "live") == (0, None), "a deleted adapter is forgotten"
    assert "bot" not in w.routes.adapters()


async def test_same_version_moved_back_only_records_the_revision() -> None:
    w = World()
    w.registry.move("bot", "live", ref("bot", 1))
    await w.reconciler.reconcile("bot")
    w.registry.adapters["bot"]["live"] = (5, ref("bot", 1))
    w.swapper.moves.clear()
    w.reconciler.notify("bot")
    await w.reconciler.reconcile("bot")
    assert w.swapper.moves == []
    assert w.routes.alias("bot", "live")[0] == 5


async def test_retryable_failures_retry_then_mark_the_version_bad() -> None:
    w = World(max_attempts=3)
    w.registry.move("bot", "live", ref("bot", 1))
    await w.reconciler.reconcile("bot")
    w.registry.move("bot", "live", ref("bot", 2))
    w.reconciler.notify("bot")
    w.swapper.errors[("bot", 2)] = FetchFailed("sha256 mismatch")
    outcomes = [await w.reconciler.reconcile("bot") for _ in range(3)]
    assert [type(o) for o in outcomes] == [Retry, Retry, Failed]
    assert w.serving("bot") == {"live": 1}, "the previous version keeps serving"
    [failure] = w.reconciler.failures()
    assert (failure.version, failure.code, failure.attempts, failure.bad) == \
        (2, "fetch_failed", 3, True)
    assert failure.reason == "sha256 mismatch"
    assert w.failure_count("bot", "fetch_failed") == 3
    # Bad on this host: not tried again while it stays the desired version.
    w.swapper.moves.clear()
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    assert w.swapper.moves == []
    # A new desired version is tried, and the old mark is dropped.
    w.registry.move("bot", "live", ref("bot", 3))
    w.reconciler.notify("bot")
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    assert w.serving("bot") == {"live": 3}
    assert w.reconciler.failures() == []


async def test_terminal_failure_marks_bad_at_once() -> None:
    w = World(max_attempts=5)
    w.registry.move("bot", "live", ref("bot", 1))
    w.swapper.errors[("bot", 1)] = AdapterRejected("rank 32 > max_lora_rank 16",
                                                   code="rank_too_large")
    outcome = await w.reconciler.reconcile("bot")
    assert isinstance(outcome, Failed) and "rank 32" in outcome.reason
    [failure] = w.reconciler.failures()
    assert failure.bad and failure.attempts == 1 and failure.code == "rank_too_large"
    assert w.serving("bot") == {}
    assert w.changes > 0


async def test_outages_are_retried_forever_and_never_mark_bad() -> None:
    w = World(max_attempts=2)
    w.registry.move("bot", "live", ref("bot", 1))
    w.swapper.errors[("bot", 1)] = VllmUnavailable("connection refused")
    for _ in range(5):
        assert isinstance(await w.reconciler.reconcile("bot"), Retry)
    [failure] = w.reconciler.failures()
    assert not failure.bad and failure.attempts == 0
    del w.swapper.errors[("bot", 1)]
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    assert w.reconciler.failures() == []


async def test_registry_down_is_a_retry() -> None:
    w = World()
    w.registry.down = True
    assert isinstance(await w.reconciler.reconcile("bot"), Retry)
    assert isinstance(await w.reconciler.reconcile(ALL), Retry)
    assert isinstance(await w.reconciler.reconcile(ROUTES), Retry)


async def test_full_resync_applies_routes_queues_every_adapter_and_repairs_vllm() -> None:
    w = World(pins=("pinned",))
    w.reconciler.pin_configured()
    assert w.cache.pinned == {"pinned"}
    w.registry.move("bot", "live", ref("bot", 1))
    w.registry.move("pinned", "live", ref("pinned", 4))
    w.registry.routes = [RouteRule(kind="customer", key="c1", adapter="bot", alias="live",
                                   tenant="acme", base_model=BASE)]
    # Known here but gone from the registry: must be queued so it gets removed.
    w.routes.set_alias("gone", "live", 1, ref("gone", 1))
    assert isinstance(await w.reconciler.reconcile(ALL), Done)
    assert w.reconciler.last_snapshot is not None
    assert w.routes.rules() == w.registry.routes
    assert w.cache.resyncs == 1
    assert w.swapper.recounts == 1  # the disk cache counted again, off a push's path
    assert len(w.queue) == 3
    keys = [await w.queue.get() for _ in range(3)]
    assert sorted(k for k in keys if k is not None) == ["bot", "gone", "pinned"]
    w.registry.calls.clear()
    for key in ["bot", "gone", "pinned"]:
        assert isinstance(await w.reconciler.reconcile(key), Done)
    assert w.registry.calls == [], "the snapshot's entries were used, not re-read"
    assert w.serving("bot") == {"live": 1} and w.serving("gone") == {}
    # Pinned adapters are loaded again at every full resync.
    await w.reconciler.reconcile(ALL)
    assert "pinned@4" in w.cache.loaded


async def test_an_event_after_the_snapshot_forces_a_fresh_read() -> None:
    w = World()
    w.registry.move("bot", "live", ref("bot", 1))
    await w.reconciler.resync_all()
    w.registry.move("bot", "live", ref("bot", 2))
    w.reconciler.notify("bot")
    await w.reconciler.reconcile("bot")
    assert w.registry.calls[-1] == "bot"
    assert w.serving("bot") == {"live": 2}


async def test_a_fresh_read_during_a_resync_outdates_its_snapshot_entry() -> None:
    w = World()
    w.registry.move("bot", "live", ref("bot", 1))
    old = await w.registry.desired(BASE)
    w.registry.move("bot", "live", ref("bot", 2))

    class SlowRegistry(FakeRegistry):
        async def desired(self, base_model: str, adapter: str | None = None) -> DesiredState:
            if adapter is None:
                # The full read "started" before bot's own read below finished.
                await w.reconciler.reconcile("bot")
                return old
            return await FakeRegistry.desired(w.registry, base_model, adapter)

    w.reconciler._registry = SlowRegistry()
    await w.reconciler.resync_all()
    assert w.serving("bot") == {"live": 2}
    await w.reconciler.reconcile("bot")
    assert w.serving("bot") == {"live": 2}, "the older snapshot must not move it back"


async def test_restarted_history_is_reapplied() -> None:
    w = World()
    w.registry.move("bot", "live", ref("bot", 1))
    w.registry.move("bot", "live", ref("bot", 2))
    await w.reconciler.reconcile("bot")
    assert w.routes.alias("bot", "live")[0] == 2
    # Re-created: revision 1 again, other weights.
    w.registry.adapters["bot"] = {"live": (1, ref("bot", 1, salt="new"))}
    w.reconciler.notify("bot")
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    _rev, served = w.routes.alias("bot", "live")
    assert served is not None and served.digest == ref("bot", 1, salt="new").digest
    # The reset forgot the adapter; its tenant is known again before it serves.
    assert w.routes.owner("bot") == "acme"
    assert w.routes.resolve("bot", {}, "acme").model_name == "bot@1"


async def test_pinned_and_prewarmed_targets_are_loaded_and_local_adapters_skipped() -> None:
    w = World(pins=("bot@canary",), prewarm=("other", "missing", "bot@2"),
              local=frozenset({"mine"}))
    w.registry.move("bot", "live", ref("bot", 1))
    w.registry.move("bot", "canary", ref("bot", 2))
    w.registry.move("other", "live", ref("other", 3))
    w.registry.move("mine", "live", ref("mine", 1))
    for key in ["bot", "other", "mine"]:
        await w.reconciler.reconcile(key)
    assert w.serving("mine") == {}, "watch-dir adapters belong to the watcher"
    await w.reconciler.warm()
    assert w.cache.loaded == ["bot@2", "other@3", "bot@2"]


async def test_routes_key_refreshes_rules_and_moves_show_as_pending() -> None:
    w = World()
    rule = RouteRule(kind="default", key="default", adapter="bot", alias="live",
                     tenant="acme", base_model=BASE)
    w.registry.routes = [rule]
    assert isinstance(await w.reconciler.reconcile(ROUTES), Done)
    assert w.routes.rules() == [rule]
    seen: list[dict[tuple[str, str], int | None]] = []
    original = w.swapper.apply

    async def spy(adapter: str, alias: str, revision: int,
                  target: VersionRef | None, ready: Readiness = "warm",
                  canary: CanaryRoute | None = None) -> SwapResult:
        seen.append(w.reconciler.pending())
        return await original(adapter, alias, revision, target, ready, canary)

    w.swapper.apply = spy  # type: ignore[method-assign]
    w.registry.move("bot", "live", ref("bot", 1))
    await w.reconciler.reconcile("bot")
    assert seen == [{("bot", "live"): 1}]
    assert w.reconciler.pending() == {}


async def test_a_canary_transition_reaches_the_swap_with_its_weight() -> None:
    w = World()
    w.registry.move("bot", "live", ref("bot", 1))
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    for revision, weight in ((2, 10), (3, 50)):
        w.registry.canary("bot", "live", CanaryRoute(id=5, weight=weight,
                                                      target=ref("bot", 2)))
        w.reconciler.mirror.drop("bot")  # as a gap in the events would: read it again
        assert isinstance(await w.reconciler.reconcile("bot"), Done)
        assert w.swapper.moves[-1] == ("bot", "live", revision, 1)  # applied, not recorded
        canary = w.routes.canary("bot", "live")
        assert canary is not None and canary.weight == weight
    moves = len(w.swapper.moves)
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    assert len(w.swapper.moves) == moves, "nothing to do a second time"
    w.registry.canary("bot", "live", None)  # aborted
    w.reconciler.mirror.drop("bot")
    assert isinstance(await w.reconciler.reconcile("bot"), Done)
    assert w.routes.canary("bot", "live") is None and w.serving("bot") == {"live": 1}


async def test_vllm_key_repairs_the_cache_and_reloads_pinned_versions() -> None:
    w = World(pins=("bot",))
    w.registry.move("bot", "live", ref("bot", 1))
    await w.reconciler.reconcile("bot")
    w.registry.calls.clear()
    assert isinstance(await w.reconciler.reconcile(VLLM), Done)
    assert w.cache.resyncs == 1 and w.cache.loaded == ["bot@1"]
    assert w.registry.calls == [], "repairing vLLM reads nothing from the registry"
