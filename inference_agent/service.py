"""The agent process: builds every part, starts them in order, and shuts down in stages.

Start-up: listen (``/readyz`` answers 503 until ready) → wait for vLLM → pin → start
the reconcile workers and queue the watched folders → read the registry's snapshot →
reconcile every adapter → load pinned and pre-warmed adapters → ready; then follow the
event stream from the snapshot, resync periodically, report status, watch the local
folder. One TaskGroup owns every task (the loop-lag tick, loraplane/loop_lag.py, from
before start-up on); one work queue and one reconciler handle every key, from the
registry and from the watched folder alike. A periodic task that fails
with an ``OSError`` (no descriptor left, a full disk) is logged and started again
(``keep_running``) instead of ending the TaskGroup, and with it the agent.

Shutdown (SIGTERM/SIGINT, or ``stop()``): ``Agent._shutdown`` lists the stages in order:
stop intake (the proxy answers 503, the work queue takes no more keys), let proxied
requests, streams and swaps finish for up to ``shutdown_grace_s``, cancel the rest, and
close the server and the clients. A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import uvicorn

from inference_agent.control.follower import Follower, resync_every
from inference_agent.control.keys import ALL, CREDENTIALS, VLLM
from inference_agent.control.reconciler import Reconciler
from inference_agent.control.swap import Swapper
from inference_agent.control.trust import EventTrust
from inference_agent.control.watchdir import WatchDirSource
from inference_agent.control.workqueue import Backoff, WorkQueue
from inference_agent.errors import AgentError, RegistryUnavailable, VllmUnavailable
from inference_agent.http_server import QuietServer, server_config
from inference_agent.metrics import LOOP_LAG_METRIC, AgentMetrics
from inference_agent.node.cache import AdapterCache
from inference_agent.node.credentials import (
    KEYS_FILE_SOURCE,
    CredentialsRefresher,
    KeysFileError,
    read_keys_file,
)
from inference_agent.node.materialize import Materializer
from inference_agent.node.registry_client import RegistryLink
from inference_agent.node.status import StatusReporter
from inference_agent.node.vllm_client import VllmClient
from inference_agent.node.vllm_metrics import VllmMetricsMirror
from inference_agent.serving.auth import InferenceKeys
from inference_agent.serving.leases import Leases
from inference_agent.serving.model_server_metrics import ModelServerMetrics
from inference_agent.serving.proxy import create_proxy_app
from inference_agent.serving.routes import RouteTable
from inference_agent.serving.traffic import TrafficTally
from inference_agent.settings import AgentSettings
from inference_agent.tasks import cancel_all, keep_running
from loraplane.event_signing import EventKeys, InvalidKey
from loraplane.events import CredentialsChanged, DesiredState, Event
from loraplane.loop_lag import LoopLagMonitor, lag_histogram
from loraplane.lora import BaseModelShapes, UnsupportedBaseModel
from loraplane.naming import parse_model_ref
from loraplane.nats_auth import describe_nats
from loraplane.private_files import private_dir

log = logging.getLogger(__name__)

# How long the shutdown waits to tell the registry this agent leaves the fleet.
_LEAVE_TIMEOUT_S = 2.0


class AgentConfigError(ValueError):
    """Settings that parse but cannot be used (an unreadable base model config...)."""


def _shapes(settings: AgentSettings) -> BaseModelShapes | None:
    if settings.base_model_config is None:
        return None
    try:
        return BaseModelShapes.from_hf_config(settings.base_model_config)
    except (UnsupportedBaseModel, OSError, ValueError) as exc:
        raise AgentConfigError(f"--base-model-config {settings.base_model_config}: {exc}"
                               ) from exc


def _inference_keys(settings: AgentSettings) -> InferenceKeys:
    keys = InferenceKeys()
    if settings.keys_file is not None:
        try:
            keys.replace(KEYS_FILE_SOURCE, read_keys_file(settings.keys_file))
        except KeysFileError as exc:
            raise AgentConfigError(str(exc)) from exc
    return keys


def _prepare_dir(path: Path) -> None:
    try:
        private_dir(path)
        probe = path / ".write-probe"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise AgentConfigError(f"--cache-dir {path} is not a writable directory: "
                               f"{exc.strerror or exc}") from exc


class Agent:
    """One agent beside one vLLM server. ``run()`` until ``stop()`` or a signal."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = s = settings
        # Everything that can refuse the settings runs before any client is opened.
        shapes = _shapes(s)
        _prepare_dir(s.cache_dir)
        self.metrics = AgentMetrics(s.metrics_max_adapters)
        self.tally = TrafficTally()  # what each side of a running canary served here
        self.loop_lag = LoopLagMonitor(lag_histogram(self.metrics.registry, LOOP_LAG_METRIC),
                                       interval_s=s.loop_lag_interval_s,
                                       warn_after_s=s.loop_lag_warn_s,
                                       switch_interval_s=s.gil_switch_interval_s)
        self.vllm = VllmClient(s.vllm_url)
        self.registry = (RegistryLink(s.registry, s.token.get_secret_value())
                         if s.registry is not None and s.token is not None else None)
        fetch = (self.registry.fetcher(on_bytes=self.metrics.bytes_downloaded.inc,
                                       on_fetch=self.metrics.count_fetch)
                 if self.registry is not None else None)
        self.materializer = Materializer(
            s.cache_dir, max_bytes=s.cache_max_bytes, fetch=fetch, base_shapes=shapes,
            max_rank=s.max_lora_rank, metrics=self.metrics)
        self.leases = Leases()
        self.routes = RouteTable(s.base_model)
        self.keys = _inference_keys(s)
        self.credentials = (CredentialsRefresher(self.registry.inference_credentials,
                                                 self.keys,
                                                 interval_s=s.credentials_refresh_s)
                            if self.registry is not None else None)
        self.cache = AdapterCache(
            self.vllm, self.materializer, self.leases, capacity=s.max_loaded,
            metrics=self.metrics, load_wait_timeout_s=s.load_wait_timeout_s,
            on_evict=lambda _name: self._changed(), is_routed=self.routes.is_routed)
        self.swapper = Swapper(self.routes, self.cache, self.leases, self.materializer,
                               drain_timeout_s=s.drain_timeout_s, metrics=self.metrics,
                               on_change=self._changed, tally=self.tally)
        self.queue: WorkQueue[str] = WorkQueue(
            backoff=Backoff(s.retry_base_s, s.retry_max_s), name="reconcile")
        self.watchdir = (WatchDirSource(s.watch_dir, enqueue=self.queue.add,
                                        copier=self.materializer, state_dir=s.cache_dir,
                                        known_versions=self._known_versions,
                                        tenant=s.watch_tenant)
                         if s.watch_dir is not None else None)
        self.reconciler = Reconciler(
            base_model=s.base_model, registry=self.registry, routes=self.routes,
            swapper=self.swapper, cache=self.cache, queue=self.queue, metrics=self.metrics,
            max_attempts=s.max_attempts, pins=s.pin, prewarm=s.prewarm, local=self.watchdir,
            on_change=self._changed, agent_id=s.agent_id, max_loaded=s.max_loaded)
        self.status = self._build_status()
        self.trust = EventTrust(EventKeys.from_public(s.event_keys),
                                fetch=None if s.event_keys or self.registry is None
                                else self.registry.event_keys,
                                metrics=self.metrics,
                                on_refused=lambda: self.reconciler.notify(ALL))
        self.follower = (Follower(s.nats_url, agent_id=s.agent_id, base_model=s.base_model,
                                  enqueue=self._event_key, trust=self.trust,
                                  metrics=self.metrics, security=s.nats_security,
                                  on_event=self._event)
                         if s.nats_url is not None and self.registry is not None else None)
        self.ready = asyncio.Event()
        self.draining = False
        self.vllm_series = VllmMetricsMirror(self.vllm.metrics_text,
                                             interval_s=s.vllm_metrics_interval_s,
                                             registry=self.metrics.registry)
        model_server = ModelServerMetrics(self.routes, self.cache, self.vllm_series)
        self.app = create_proxy_app(
            routes=self.routes, cache=self.cache, leases=self.leases, metrics=self.metrics,
            vllm_url=s.vllm_url, base_model=s.base_model, registry=self.registry,
            keys=self.keys, draining=lambda: self.draining, ready=self.ready.is_set,
            request_resync=lambda: self.queue.add(VLLM), model_server=model_server.render,
            max_body_bytes=s.max_body_bytes, tenant_slots=s.tenant_slots,
            slot_wait_s=min(s.slot_wait_s, s.load_wait_timeout_s), tally=self.tally)
        self.url: str | None = None
        self.snapshot: DesiredState | None = None
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._clients_closed = False

    def _build_status(self) -> StatusReporter | None:
        if self.registry is None:
            return None
        return StatusReporter(agent_id=self.settings.agent_id,
                              base_model=self.settings.base_model, routes=self.routes,
                              cache=self.cache, swapper=self.swapper, sources=[self.reconciler],
                              post=self.registry.post_status,
                              heartbeat_interval_s=self.settings.heartbeat_interval_s,
                              disk=self.materializer, owned=self.reconciler.placement,
                              settling=self.swapper.settling,
                              settle_max_s=self.settings.status_settle_max_s,
                              debounce_s=self.settings.status_debounce_s,
                              tally=self.tally,
                              canary_report_interval_s=self.settings.canary_report_interval_s)

    def _event_key(self, key: str) -> None:
        """A key the event stream asks for: credentials go to their refresher; a full
        resync (after a NATS break) re-reads them too."""
        if key in (CREDENTIALS, ALL) and self.credentials is not None:
            self.credentials.poke()
        if key != CREDENTIALS:
            self.reconciler.notify(key)

    def _event(self, event: Event) -> None:
        if isinstance(event, CredentialsChanged):
            if self.credentials is not None:
                self.credentials.poke()
            return
        self.reconciler.on_event(event)

    def _changed(self) -> None:
        # Built after the parts that call it; a change before then has nothing to tell.
        status = getattr(self, "status", None)
        if status is not None:
            status.changed()

    def _known_versions(self, adapter: str) -> int:
        """The highest version of ``adapter`` this host knows: routed or on disk."""
        versions = [ref.version for _rev, ref in self.routes.aliases(adapter).values()]
        for folder in self.materializer.cached():
            parsed = parse_model_ref(folder.name)
            if parsed is not None and parsed.adapter == adapter and parsed.version:
                versions.append(parsed.version)
        return max(versions, default=0)

    # --- running --------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin the staged shutdown; a second call skips the grace period."""
        if self._stop.is_set():
            self._force.set()
        self._stop.set()

    async def run(self, *, install_signals: bool = True) -> None:
        """Serve until stopped. Raises if start-up fails (vLLM never ready, bad token)."""
        sock = self._listen()
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        gc.freeze()  # the modules and parts built so far; start-up's state at ready
        try:
            async with asyncio.TaskGroup() as group:
                failed = await self._lifecycle(group, sock)
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            sock.close()
            gc.unfreeze()  # what this agent froze can be collected again once it ends
            # Closed by _shutdown already, unless something raised before it ran.
            await self._close_clients()
        if failed is not None:
            raise failed

    def _listen(self) -> socket.socket:
        host, port = self.settings.host, self.settings.port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host, port), family=family, backlog=2048)
        except OSError as exc:
            raise AgentConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
        # create_server leaves the protocol number 0, so asyncio does not set TCP_NODELAY
        # on accepted connections; without it a response's body waits for the client's
        # delayed ACK (Nagle). Accepted sockets inherit the option from the listener.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if family == socket.AF_INET6 else bound[0]
        self.url = f"http://{shown}:{bound[1]}"
        return sock

    async def _lifecycle(self, group: asyncio.TaskGroup,
                         sock: socket.socket) -> BaseException | None:
        """Serve, start, wait for a stop, shut down; returns why start-up failed, if it did."""
        server = QuietServer(server_config(self.app, self.settings))
        served = group.create_task(server.serve(sockets=[sock]), name="http")
        # Watches the loop from before start-up (its work counts too) to the shutdown.
        tasks: list[asyncio.Task[Any]] = [group.create_task(self.loop_lag.run(),
                                                            name="loop-lag")]
        failures: list[BaseException] = []
        starting = group.create_task(self._guarded_start(group, tasks, failures),
                                     name="start-up")
        stop = asyncio.create_task(self._stop.wait())
        try:
            # Until a stop, the server ending, or start-up failing.
            waiting = {stop, served, starting}
            while not (stop.done() or served.done() or failures):
                _done, waiting = await asyncio.wait(waiting,
                                                    return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        await self._shutdown(server, served, [starting, *tasks])
        return failures[0] if failures else None

    async def _guarded_start(self, group: asyncio.TaskGroup, tasks: list[asyncio.Task[Any]],
                             failures: list[BaseException]) -> None:
        # A failed start-up is reported by run() after an orderly shutdown, not by the
        # TaskGroup tearing everything down at once.
        try:
            await self._start(group, tasks)
        except Exception as exc:
            log.error("start-up failed: %s: %s", type(exc).__name__, exc)
            failures.append(exc)

    async def _start(self, group: asyncio.TaskGroup, tasks: list[asyncio.Task[Any]]) -> None:
        s = self.settings
        events = (describe_nats(self.follower.url, s.nats_security) if self.follower is not None
                  else "none (periodic resync only)")
        log.info("agent %s: proxy on %s, waiting for vLLM at %s; events from %s", s.agent_id,
                 self.url, s.vllm_url, events)

        def spawn(run: Callable[[], Coroutine[Any, Any, Any]], name: str) -> None:
            tasks.append(group.create_task(keep_running(name, run), name=name))

        await self.vllm.wait_ready(s.vllm_ready_timeout_s)
        # Taken again only when a scrape finds it older than its interval.
        await self.vllm_series.refresh()
        if self.registry is None:
            await self._first_repair()
        self.reconciler.pin_configured()
        spawn(lambda: self.queue.run(self.reconciler.reconcile, s.reconcile_workers),
              "reconcile")
        if self.watchdir is not None:
            # Before the snapshot: the registry's reconcile leaves a local name alone.
            self.watchdir.scan()
            spawn(self.watchdir.run, "watch-dir")
        if self.registry is not None:
            await self._first_credentials()
            assert self.credentials is not None
            spawn(self.credentials.run, "credentials")
            self.snapshot = await self._first_snapshot(self.reconciler)
            if self.status is not None:
                spawn(self.status.run, "status")
            await self.queue.join()
            await self.reconciler.warm()
            if (follower := self.follower) is not None:
                await self._first_event_keys()
                start_seq = self.snapshot.stream_seq + 1
                spawn(lambda: follower.run(start_seq), "follower")
            spawn(lambda: resync_every(s.resync_interval_s, self.reconciler.notify),
                  "resync")
        self.ready.set()
        # What start-up built (modules, routes, clients) lives as long as the agent: kept
        # out of the collector's full passes, which scan every object with the GIL held
        # and so stall the loop for tens of ms at hundreds of adapters. ``run`` undoes it.
        gc.freeze()
        log.info("agent %s ready: %d adapters routed, %d versions loaded", s.agent_id,
                 len(self.routes.adapters()), len(self.cache.loaded_names()))

    async def _first_repair(self) -> None:
        """Unload a previous run's versions from vLLM before serving. Without it, one
        whose folder is gone (a new cache dir) passes for loaded, and vLLM's engine dies
        when it reads that folder again; the registry's snapshot does this in its mode."""
        try:
            await self.reconciler.repair_vllm()
        except AgentError as exc:
            log.warning("vLLM's adapters not checked at start-up (%s); retrying",
                        exc.message)
            self.queue.add(VLLM)

    async def _first_credentials(self) -> None:
        """The inference credentials before serving; waits out a registry that is down."""
        assert self.credentials is not None
        backoff: Backoff[str] = Backoff(self.settings.retry_base_s, self.settings.retry_max_s)
        while True:
            try:
                await self.credentials.refresh()
                log.info("%d inference credentials loaded", len(self.keys))
                return
            except RegistryUnavailable as exc:
                delay = backoff.next_delay("credentials")
                log.warning("registry not reachable (%s); retrying in %.1fs", exc.message,
                            delay)
                await asyncio.sleep(delay)

    async def _first_event_keys(self) -> None:
        """The registry's event keys before the first event; without them every event
        is refused and read from the registry instead, and they are asked for again at
        the first event that names a key."""
        try:
            await self.trust.refresh()
        except (AgentError, InvalidKey) as exc:
            log.warning("the registry's event keys could not be read (%s); events are "
                        "refused until they are", exc)

    async def _first_snapshot(self, reconciler: Reconciler) -> DesiredState:
        """The start-up snapshot; waits out a registry that is down, not a bad token.

        vLLM answered once already, but a busy one can still time out the repair that
        ends the snapshot (a hundred agents starting on one host): that is waited out
        too, not the end of the agent. The snapshot is applied again on each try."""
        backoff: Backoff[str] = Backoff(self.settings.retry_base_s, self.settings.retry_max_s)
        while True:
            try:
                return await reconciler.resync_all()
            except (RegistryUnavailable, VllmUnavailable) as exc:
                delay = backoff.next_delay(ALL)
                which = "registry" if isinstance(exc, RegistryUnavailable) else "vLLM"
                log.warning("%s not reachable (%s); retrying in %.1fs", which, exc.message,
                            delay)
                await asyncio.sleep(delay)

    async def _shutdown(self, server: uvicorn.Server, served: asyncio.Task[Any],
                        tasks: list[asyncio.Task[Any]]) -> None:
        """Every stage of the shutdown, in order."""
        grace = self.settings.shutdown_grace_s
        inflight = self.app.state.inflight
        log.info("shutting down: %d requests in flight, grace %.0fs", inflight.count, grace)
        # 1. Stop intake: the proxy answers 503 and /readyz fails.
        self.draining = True
        self.ready.clear()
        await self._leave_fleet()
        # 2. Let proxied requests, streams and running swaps finish within the grace
        #    period; the work queue takes no more keys while its workers finish.
        settled = await self._unless_forced(asyncio.gather(
            inflight.wait_zero(grace), self.queue.shutdown(grace)), grace)
        if not settled:
            log.warning("grace period over: %d requests still in flight are cut off",
                        inflight.count)
        # 3. Cancel the rest: every task of the agent, then the drains of old versions.
        await cancel_all(tasks)
        await self.swapper.drain_all(0)
        # 4. Close the HTTP server (it waits SERVER_CLOSE_S for its connections), then
        #    the clients.
        server.should_exit = True
        await asyncio.wait({served})
        await self._close_clients()

    async def _leave_fleet(self) -> None:
        # Best effort and bounded: the staleness window still covers a registry that
        # cannot be told. An agent that never reported is in no fleet to leave.
        if self.status is not None and self.status.posted:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.status.leave(), _LEAVE_TIMEOUT_S)

    async def _unless_forced(self, waiting: Awaitable[Any], timeout_s: float) -> bool:
        work = asyncio.ensure_future(waiting)
        forced = asyncio.create_task(self._force.wait())
        done, _ = await asyncio.wait({work, forced}, timeout=timeout_s + 0.5,
                                     return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if work not in done:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            return False
        result = work.result()
        return isinstance(result, list) and all(result)

    async def _close_clients(self) -> None:
        if self._clients_closed:
            return
        self._clients_closed = True
        for close in (self.vllm.aclose, self.registry.aclose if self.registry else None):
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
