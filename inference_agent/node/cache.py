"""The adapter versions loaded in vLLM, named like vLLM's own LoRA manager.

``active`` holds the versions loaded in vLLM in least-recently-used order, and
``capacity`` bounds it. Loads are single-flight per
versioned name: concurrent requests for a cold version wait on one load. Eviction picks
the least recently used active version with no lease and no pin; when every one is
busy it waits (up to ``load_wait_timeout_s``) for a lease to be released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from inference_agent.errors import AgentError, CapacityExhausted
from inference_agent.futures import retrieve_exception
from inference_agent.metrics import AgentMetrics
from inference_agent.node.materialize import Materializer
from inference_agent.node.vllm_client import VllmClient
from inference_agent.serving.leases import Leases
from loraplane.events import VersionRef
from loraplane.naming import parse_model_ref, versioned_name

log = logging.getLogger(__name__)


def looks_versioned(name: str) -> bool:
    """True for ``adapter@N``: a name this agent (or a previous run of it) loaded."""
    ref = parse_model_ref(name)
    return ref is not None and ref.version is not None


class AdapterCache:
    """The loaded set: LRU order, pins, single-flight loads, eviction with leases."""

    def __init__(self, vllm: VllmClient, materializer: Materializer, leases: Leases, *,
                 capacity: int, metrics: AgentMetrics, load_wait_timeout_s: float,
                 on_evict: Callable[[str], None] | None = None,
                 is_routed: Callable[[str], bool] | None = None) -> None:
        """``is_routed`` (optional) narrows pins to the versions an alias points at, so an
        old version of a pinned adapter can still be evicted."""
        self._vllm = vllm
        self._materializer = materializer
        self._leases = leases
        self._metrics = metrics
        self.capacity = capacity
        self.load_wait_timeout_s = load_wait_timeout_s
        self.on_evict = on_evict
        self.is_routed = is_routed
        self.active: OrderedDict[str, VersionRef] = OrderedDict()
        self._pinned: set[str] = set()
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._unloading: dict[str, asyncio.Future[None]] = {}
        # Names holding a slot while their load is in flight, so two loads cannot both
        # take the last free slot.
        self._reserved: set[str] = set()
        # Bytes on disk of each loaded version's files, for the memory gauge.
        self._sizes: dict[str, int] = {}
        # The shortest wait for a slot a caller of a name's load asked for (a request's
        # ``slot_wait_s``), and the event that tells a waiting load it was shortened.
        self._slot_waits: dict[str, float] = {}
        self._slot_wake = asyncio.Event()

    # pins and LRU

    def pin(self, adapter: str) -> None:
        self._pinned.add(adapter)

    def unpin(self, adapter: str) -> None:
        """Make ``adapter`` evictable again; it stays loaded until LRU needs its slot."""
        self._pinned.discard(adapter)

    def is_pinned(self, adapter: str) -> bool:
        return adapter in self._pinned

    def pinned(self) -> set[str]:
        return set(self._pinned)

    def touch(self, name: str) -> None:
        if name in self.active:
            self.active.move_to_end(name)

    def is_active(self, name: str) -> bool:
        return name in self.active

    def is_loading(self, name: str) -> bool:
        return name in self._loading

    def loaded_names(self) -> list[str]:
        """Active names, least recently used first."""
        return list(self.active)

    def loading_names(self) -> list[str]:
        """Versions whose load is in flight: a request for one waits on that load."""
        return [name for name in self._loading if name not in self.active]

    def in_use_names(self) -> set[str]:
        """Names whose files must stay on disk: loaded, loading or about to load."""
        return set(self.active) | set(self._loading) | self._reserved

    # loading

    async def ensure_active(self, ref: VersionRef, *, record: bool = True,
                            slot_wait_s: float | None = None) -> str:
        """Make ``ref`` loaded in vLLM (single-flight) and return its versioned name.

        ``record=False`` (swaps, pre-warming) keeps the hit/miss counters about requests.
        ``slot_wait_s`` (a request's) bounds how long the load waits for a slot when
        every one is busy, counted from when it starts waiting: past it, the load (shared
        by every caller) raises ``CapacityExhausted``, at most ``load_wait_timeout_s``.
        """
        name = versioned_name(ref.adapter, ref.version)
        metrics = self._metrics
        if name in self.active:
            self.active.move_to_end(name)
            if record:  # a request's hit: the kept child, not labels() on every request
                metrics.child(metrics.cache_hits, metrics.adapter(ref.adapter)).inc()
            return name
        if record:
            metrics.child(metrics.cache_misses, metrics.adapter(ref.adapter)).inc()
        if slot_wait_s is not None and slot_wait_s < self._slot_waits.get(name, math.inf):
            self._slot_waits[name] = slot_wait_s
            self._wake_reservers()
        pending = self._loading.get(name)
        if pending is None:
            pending = asyncio.ensure_future(self._load(ref, name))
            self._loading[name] = pending
            pending.add_done_callback(retrieve_exception)
            pending.add_done_callback(lambda done: self._loading_done(name, done))
        # Shielded: one caller's cancellation (a client gone) must not abort the load
        # the other callers are waiting on.
        await asyncio.shield(pending)
        return name

    def _loading_done(self, name: str, done: asyncio.Future[None]) -> None:
        if self._loading.get(name) is done:
            del self._loading[name]
            self._slot_waits.pop(name, None)

    async def _load(self, ref: VersionRef, name: str) -> None:
        await self._await_unload(name)
        path = await self._materializer.materialize(ref)
        await self._reserve(name)
        started = time.perf_counter()
        try:
            with self._metrics.stage("load"):
                await self._vllm.load(name, path)
        except AgentError as exc:
            self._metrics.count_failure(ref.adapter, exc)
            raise
        finally:
            self._reserved.discard(name)
        self._metrics.load_seconds.labels(self._metrics.adapter(ref.adapter)).observe(
            time.perf_counter() - started)
        # The files' sizes were checked against the bytes written when the folder was
        # built: no walk and stat of each file at every load.
        self._sizes[name] = sum(f.size for f in ref.files)
        self.active[name] = ref
        self._metrics.tier_transition("warm", "hot", time.perf_counter() - started)
        self._changed()
        log.info("loaded %s (%d/%d active)", name, len(self.active), self.capacity)

    async def _reserve(self, name: str) -> None:
        """Take a slot for ``name``, evicting the LRU idle version if the cache is full."""
        started = time.monotonic()
        while True:
            if len(self.active) + len(self._reserved) < self.capacity:
                self._reserved.add(name)
                return
            victim = self._pick_victim()
            if victim is not None:
                self._reserved.add(name)
                self._evict(victim)
                return
            # Re-read at each turn: a request joining the load may have shortened it.
            wait_s = min(self.load_wait_timeout_s, self._slot_waits.get(name, math.inf))
            remaining = started + wait_s - time.monotonic()
            if remaining <= 0 or not self._any_leased():
                raise CapacityExhausted(
                    f"cannot load {name}: all {self.capacity} slots hold versions that are "
                    "pinned or have requests in flight",
                    detail={"name": name, "active": list(self.active),
                            "capacity": self.capacity})
            await self._wait_for_slot(remaining)

    async def _wait_for_slot(self, timeout_s: float) -> None:
        """Until some lease ends, a caller shortens a load's wait, or ``timeout_s``."""
        idle = asyncio.ensure_future(self._leases.wait_any_idle(timeout_s))
        woken = asyncio.ensure_future(self._slot_wake.wait())
        try:
            await asyncio.wait((idle, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
            woken.cancel()

    def _wake_reservers(self) -> None:
        self._slot_wake.set()
        self._slot_wake = asyncio.Event()

    def _evictable(self, name: str) -> bool:
        if self._leases.count(name) > 0:
            return False
        adapter = name.rpartition("@")[0]
        if adapter in self._pinned:
            # Without routing knowledge every version of a pinned adapter is kept.
            return self.is_routed is not None and not self.is_routed(name)
        return True

    def _pick_victim(self) -> str | None:
        return next((name for name in self.active if self._evictable(name)), None)

    def _any_leased(self) -> bool:
        return any(self._leases.count(name) > 0 for name in self.active)

    def _evict(self, victim: str) -> None:
        """Take ``victim`` out of the loaded set and unload it from vLLM in the background.

        The load that wants its slot does not wait for that unload: vLLM's names are
        only a map to folders, its engine keeps ``--max-loras`` adapters in slots by its
        own LRU, so the unload is bookkeeping that need not come first (waiting for it
        would put one more call to a busy vLLM in every miss). A request for ``victim``
        in the meantime loads it again once the unload is done (``_await_unload``). An
        unload that fails leaves a name in vLLM that nothing here uses; ``resync``
        removes such strays.
        """
        ref = self.active.pop(victim)
        self._metrics.cache_evictions.labels(self._metrics.adapter(ref.adapter)).inc()
        self._changed()
        log.info("evicting %s (least recently used, idle)", victim)
        if self.on_evict is not None:
            self.on_evict(victim)
        self._start_unload(victim)

    async def remove(self, name: str) -> None:
        """Unload ``name`` (the caller has drained it). A name being loaded is left alone:
        whoever loads it holds a lease and wants it; LRU eviction takes it later."""
        if name in self._loading:
            return
        self.active.pop(name, None)
        self._changed()
        await self._unload(name)

    async def _unload(self, name: str) -> None:
        await asyncio.shield(self._start_unload(name))

    def _start_unload(self, name: str) -> asyncio.Future[None]:
        """The unload of ``name`` in flight, started if there is none (single-flight)."""
        pending = self._unloading.get(name)
        if pending is None:
            pending = asyncio.ensure_future(self._timed_unload(name))
            self._unloading[name] = pending
            pending.add_done_callback(retrieve_exception)
            pending.add_done_callback(lambda done: self._unloading_done(name, done))
        return pending

    async def _timed_unload(self, name: str) -> None:
        started = time.perf_counter()
        with self._metrics.stage("unload"):
            await self._vllm.unload(name)
        self._metrics.tier_transition("hot", "warm", time.perf_counter() - started)

    def _unloading_done(self, name: str, done: asyncio.Future[None]) -> None:
        if self._unloading.get(name) is done:
            del self._unloading[name]
        if not done.cancelled() and done.exception() is not None:
            log.warning("unloading %s failed: %s; vLLM may still list it", name,
                        done.exception())

    async def _await_unload(self, name: str) -> None:
        # Loading a name while its unload is in flight could be undone by that unload.
        pending = self._unloading.get(name)
        if pending is not None:
            with contextlib.suppress(AgentError):
                await asyncio.shield(pending)

    # drift

    def mark_lost(self, name: str) -> None:
        """vLLM answered 404 for ``name``: it no longer has it. Only ``name`` leaves
        ``active``, so the next ``ensure_active`` loads it again; the full comparison
        with vLLM (``resync``) is the control loop's work."""
        if self.active.pop(name, None) is not None:
            log.warning("vLLM no longer has %s; it loads again", name)
            self._changed()

    async def resync(self) -> set[str]:
        """Match ``active`` to what vLLM really has; return the names vLLM lost.

        Names vLLM lost (restart, unload by hand) leave ``active`` and load again at
        their next request or reconcile. Names vLLM has that we did not load are
        unloaded only if they look like ours (``x@N``, e.g. a previous run's).
        """
        before = set(self.active)
        loaded = await self._vllm.loaded()
        lost = {name for name in before if name in self.active and name not in loaded}
        for name in lost:
            del self.active[name]
        strays = {name for name in loaded
                  if looks_versioned(name) and name not in self.in_use_names()}
        for name in sorted(strays):
            # Checked again at each step: while an earlier stray was being unloaded, a
            # reconcile may have loaded this one (vLLM answers a load of a name it has
            # as done). Once the unload is registered, a later load waits for it.
            if name in self.in_use_names():
                strays.discard(name)
                continue
            await self._unload(name)
        if lost or strays:
            log.warning("resync: vLLM lost %s; unloaded strays %s",
                        sorted(lost), sorted(strays))
            self._changed()
        return lost

    def _changed(self) -> None:
        self._metrics.versions_loaded.set(len(self.active))
        self._sizes = {n: size for n, size in self._sizes.items() if n in self.active}
        by_adapter: dict[str, int] = {}
        for name, ref in self.active.items():
            by_adapter[ref.adapter] = by_adapter.get(ref.adapter, 0) + self._sizes.get(name, 0)
        self._metrics.set_loaded_bytes(by_adapter)
