"""The JetStream follower: turns the registry's events into work-queue keys.

The agent reads a snapshot first, then follows the stream ``LORAPLANE`` on a durable
pull consumer of its own, ``agent-<agent_id>``, created to start at
``snapshot.stream_seq + 1``: every event newer than the snapshot arrives, and none in
between is lost. Events are hints: each one goes to ``on_event`` (the reconciler, which
acts on what a trustworthy event carries and re-reads the registry when it must), or,
without it, only queues its adapter (or ``*routes*``).

NATS outages are survived, not reported upwards: the client reconnects by itself; a
streak of failed fetches tears the session down and builds a new one, with backoff,
forever. After any break a full resync (``*all*``) is queued, so whatever the stream
could not deliver is repaired from the registry.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from inference_agent.control.keys import ALL, key_for
from inference_agent.control.pull import PullStream
from inference_agent.control.trust import EventTrust
from inference_agent.control.workqueue import Backoff
from inference_agent.errors import EventBusUnavailable
from inference_agent.metrics import AgentMetrics
from loraplane.event_signing import SIGNATURE_HEADER, Verdict
from loraplane.events import STREAM_NAME, STREAM_SUBJECTS, Event, parse_event
from loraplane.nats_auth import ConnectErrors, NatsSecurity, describe_error, describe_nats
from loraplane.netutil import mask_url

log = logging.getLogger(__name__)

Enqueue = Callable[[str], None]
OnEvent = Callable[[Event], None]
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 200
# A consumer nobody fetched from for this long belongs to a decommissioned agent.
_INACTIVE_THRESHOLD_S = 24 * 3600.0
# Events that arrived together are handled without a wait between them; a burst of
# hundreds would hold the loop, so the follower gives it back after this many.
EVENTS_PER_STEP = 8


def consumer_name(agent_id: str) -> str:
    """``agent-<agent_id>`` made safe for NATS (no ``.``, ``*``, ``>``, spaces...).

    When characters had to be replaced, a short hash of the real id keeps two ids
    that differ only in those characters (``a.b`` and ``a_b``) on separate consumers.
    """
    safe = _UNSAFE.sub("_", agent_id)
    if safe != agent_id or len(safe) > _MAX_NAME:
        tag = hashlib.sha256(agent_id.encode()).hexdigest()[:8]
        safe = f"{safe[:_MAX_NAME]}-{tag}"
    return f"agent-{safe}"


@asynccontextmanager
async def _nats_errors(action: str, errors: ConnectErrors | None = None) -> AsyncIterator[None]:
    try:
        yield
    except EventBusUnavailable:
        raise
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        reason = (errors or ConnectErrors()).reason(exc)
        raise EventBusUnavailable(f"NATS is unavailable ({action}): {reason}",
                                  detail={"action": action}) from exc


class Follower:
    """Follows the stream for one agent and base model until cancelled."""

    def __init__(self, url: str, *, agent_id: str, base_model: str, enqueue: Enqueue,
                 trust: EventTrust, batch: int = 256, fetch_timeout_s: float = 2.0,
                 error_streak: int = 3,
                 connect_timeout_s: float = 5.0, request_timeout_s: float = 5.0,
                 backoff: Backoff[str] | None = None,
                 metrics: AgentMetrics | None = None,
                 security: NatsSecurity | None = None,
                 on_event: OnEvent | None = None) -> None:
        """``batch``: how many events one standing pull request may bring
        (``PullStream``); each is handled as it arrives. ``fetch_timeout_s``: how long
        a wait for the next event lasts before the connection is checked.

        ``on_event`` takes each parsed event (the agent hands it to the reconciler,
        which acts on what it carries); without it, each event queues its key. Only
        messages ``trust`` believes (signed by the registry) are parsed at all."""
        self.url = url
        self._trust = trust
        self.security = security or NatsSecurity()
        self.base_model = base_model
        self.consumer = consumer_name(agent_id)
        self._enqueue = enqueue
        self._on_event = on_event or self._queue_key
        self.batch = batch
        self.fetch_timeout_s = fetch_timeout_s
        self.error_streak = error_streak
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._backoff: Backoff[str] = backoff or Backoff(0.5, 30.0)
        self.metrics = metrics
        self._start_seq = 1
        self._created = False
        # Stream sequence of the last event handled: where a lost consumer resumes.
        self.last_stream_seq: int | None = None
        self.events_seen = 0
        self.sessions = 0
        self.connected = asyncio.Event()
        self._pull: PullStream | None = None

    async def run(self, start_seq: int) -> None:
        """Follow from ``start_seq`` (the snapshot's ``stream_seq + 1``), forever."""
        self._start_seq = max(1, start_seq)
        while True:
            _raise_if_cancelling()
            try:
                await self._session()
            except EventBusUnavailable as exc:
                delay = self._backoff.next_delay("session")
                log.warning("event stream: %s; retrying in %.1fs", exc.message, delay)
            else:
                delay = self._backoff.next_delay("session")
            finally:
                self.connected.clear()
            if self._created:
                # Whatever the break hid is repaired from the registry.
                self._enqueue(ALL)
            await asyncio.sleep(delay)

    async def _session(self) -> None:
        client, errors = NatsClient(), ConnectErrors()
        try:
            async with _nats_errors("connect", errors):
                await asyncio.wait_for(self._connect(client, errors), self.connect_timeout_s)
            js = JetStreamContext(client, timeout=self.request_timeout_s)
            pull = self._pull = await self._subscribe(client, js)
            self.sessions += 1
            self.connected.set()
            self._backoff.forget("session")
            log.info("following %s from consumer %s on NATS at %s", STREAM_NAME, self.consumer,
                     describe_nats(self.url, self.security))
            await self._consume(client, pull)
        finally:
            self._pull = None
            await self._close(client)

    async def _connect(self, client: NatsClient, errors: ConnectErrors) -> None:
        async def reconnected() -> None:
            log.info("reconnected to NATS at %s; queueing a full resync", mask_url(self.url))
            if self._pull is not None:
                self._pull.renew()
            self._enqueue(ALL)

        async def quiet(exc: Exception) -> None:
            # Every failed reconnect attempt lands here; the session logs the outage.
            errors.record(exc)
            log.debug("nats: %s", describe_error(exc))

        await client.connect(self.url, name=f"loraplane-{self.consumer}", connect_timeout=2,
                             reconnect_time_wait=1, max_reconnect_attempts=-1,
                             ping_interval=10, max_outstanding_pings=3,
                             reconnected_cb=reconnected, error_cb=quiet,
                             **self.security.connect_options())

    async def _close(self, client: NatsClient) -> None:
        if not client.is_closed:
            try:
                await asyncio.wait_for(client.close(), 5)
            except (nats.errors.Error, OSError, TimeoutError, RuntimeError) as exc:
                # RuntimeError: under uvloop (the agent's loop), nats-py's flush of pending
                # bytes on a connection that already died raises "the handler is closed",
                # where asyncio's own transport ignores the write. Either way it is closed.
                log.debug("closing NATS: %s", exc)
        await _stop_leftover_tasks(client)

    async def _subscribe(self, client: NatsClient, js: JetStreamContext) -> PullStream:
        async with _nats_errors("consumer"):
            if not self._created:
                await self._recreate(js, self._start_seq)
                self._created = True
            else:
                await self._ensure_consumer(js)
            pull = PullStream(client, STREAM_NAME, self.consumer, batch=self.batch)
            await pull.open()
        return pull

    async def _recreate(self, js: JetStreamContext, start_seq: int) -> None:
        with suppress(NotFoundError):
            await js.delete_consumer(STREAM_NAME, self.consumer)
        await js.add_consumer(STREAM_NAME, ConsumerConfig(
            durable_name=self.consumer, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq, ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
            filter_subject=STREAM_SUBJECTS, inactive_threshold=_INACTIVE_THRESHOLD_S))
        log.info("created consumer %s on %s at sequence %d", self.consumer, STREAM_NAME,
                 start_seq)

    async def _ensure_consumer(self, js: JetStreamContext) -> None:
        """Keep the consumer if NATS still has it; else resume after the last event."""
        try:
            await js.consumer_info(STREAM_NAME, self.consumer)
            return
        except NotFoundError:
            pass
        resume = (self.last_stream_seq or self._start_seq - 1) + 1
        info = await js.stream_info(STREAM_NAME)
        if info.state.last_seq < resume - 1:
            # The stream itself was re-created and numbers restarted: take what it has;
            # the full resync queued after this break covers the rest.
            resume = max(1, info.state.first_seq)
        await self._recreate(js, resume)

    async def _consume(self, client: NatsClient, pull: PullStream) -> None:
        errors = handled = 0
        while errors < self.error_streak:
            _raise_if_cancelling()
            try:
                message = await pull.next(self.fetch_timeout_s)
            except (nats.errors.TimeoutError, TimeoutError):
                # No events for a while is normal; only a timeout while cut off is not.
                errors = 0 if client.is_connected else errors + 1
                continue
            except (nats.errors.Error, OSError) as exc:
                errors += 1
                log.warning("fetching events failed (%d in a row): %s: %s", errors,
                            type(exc).__name__, exc)
                await asyncio.sleep(min(1.0, self.fetch_timeout_s))
                continue
            errors = 0
            await self._handle(message)
            handled += 1
            if handled % EVENTS_PER_STEP == 0:
                await asyncio.sleep(0)
        raise EventBusUnavailable(f"{errors} fetches in a row failed",
                                  detail={"consumer": self.consumer})

    def _take(self, data: bytes) -> None:
        try:
            event = parse_event(data)
        except ValidationError as exc:
            # A newer registry may send types this agent does not know, signed: acked,
            # and the registry read instead, never redelivered forever.
            log.warning("ignoring an event this agent cannot parse: %s", exc.errors()[:1])
            self._trust.reject(Verdict("invalid"))
            return
        if self.metrics is not None:
            self.metrics.event_received(event.time)
        self._on_event(event)
        self.events_seen += 1

    def _queue_key(self, event: Event) -> None:
        key = key_for(event, self.base_model)
        if key is not None:
            self._enqueue(key)

    async def _handle(self, message: Msg) -> None:
        # A forged or unsigned message is acked like any other: redelivering it would
        # change nothing, and the trust has the registry read instead.
        header = message.headers.get(SIGNATURE_HEADER) if message.headers else None
        if await self._trust.believe(message.data, header):
            self._take(message.data)
        with suppress(nats.errors.NotJSMessageError):
            self.last_stream_seq = message.metadata.sequence.stream
        async with _nats_errors("ack"):
            await message.ack()


async def _stop_leftover_tasks(client: NatsClient) -> None:
    """Finish what nats-py's ``close()`` skips when it fails half-way.

    ``close()`` flushes pending bytes to the socket before it stops the subscriptions'
    tasks; on a connection that just died that flush raises ("Connection lost") and
    the tasks are left pending forever. The attributes are private, so they are read
    defensively: a nats-py without them has nothing to clean here.
    """
    subs: Any = getattr(client, "_subs", None)
    tasks = [task for sub in (list(subs.values()) if isinstance(subs, dict) else [])
             if isinstance(task := getattr(sub, "_wait_for_msgs_task", None), asyncio.Task)
             and not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def _raise_if_cancelling() -> None:
    """Honour a cancellation a nats-py call swallowed.

    Under Python 3.11's ``wait_for``, in which nats-py's own waits are made, a cancel
    that lands as the awaited thing completes is lost and the call returns normally.
    The request is still recorded on our task, so it is checked before every wait for
    an event.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def resync_every(interval_s: float, enqueue: Enqueue) -> None:
    """Queue a full resync every ``interval_s``: repairs drift no event reports
    (vLLM restarted, an adapter unloaded by hand, a lost message)."""
    while True:
        await asyncio.sleep(interval_s)
        enqueue(ALL)
