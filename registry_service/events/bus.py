"""The registry's boundary to NATS JetStream.

Everything nats-py raises is turned into ``EventBusUnavailable`` here, so the relay
and the routes only ever see the registry's own errors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import nats
from nats.aio.client import Client as NatsClient
from nats.js.api import StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from loraplane.event_signing import SIGNATURE_HEADER
from loraplane.events import STREAM_NAME, STREAM_SUBJECTS
from loraplane.nats_auth import ConnectErrors, NatsSecurity, describe_error, describe_nats
from loraplane.netutil import mask_url
from registry_service.errors import EventBusUnavailable

log = logging.getLogger(__name__)

# Long enough to cover a relay retrying the same rows after a crash or a lost ack.
DUPLICATE_WINDOW_S = 600.0
MSG_ID_HEADER = "Nats-Msg-Id"


@asynccontextmanager
async def _nats_errors(action: str, errors: ConnectErrors | None = None) -> AsyncIterator[None]:
    try:
        yield
    except EventBusUnavailable:
        raise
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        reason = (errors or ConnectErrors()).reason(exc)
        raise EventBusUnavailable(
            f"NATS is unavailable ({action})",
            detail={"action": action, "reason": reason},
        ) from exc


class EventBus:
    """One NATS connection and its JetStream context.

    The client reconnects by itself forever once connected (a registry runs for
    months); only the first connection is bounded, so a registry starting while NATS
    is down is told so instead of waiting.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "loraplane-registry",
        security: NatsSecurity | None = None,
        connect_deadline_s: float = 5.0,
        request_timeout_s: float = 5.0,
    ) -> None:
        self.url = url
        self.name = name
        self.security = security or NatsSecurity()
        self._connect_errors = ConnectErrors()
        self.connect_deadline_s = connect_deadline_s
        self.request_timeout_s = request_timeout_s
        self._nc = NatsClient()
        self._js: JetStreamContext | None = None
        self._closing = False

    @property
    def is_connected(self) -> bool:
        return self._js is not None and self._nc.is_connected

    @property
    def is_closed(self) -> bool:
        return self._nc.is_closed

    async def answers(self, timeout_s: float) -> bool:
        """One PING/PONG with the server: whether it answered within ``timeout_s``.

        ``is_connected`` alone stays true for a server that is frozen or cut off behind
        a live TCP connection until the client's own pings give up (about a minute)."""
        if not self.is_connected:
            return False
        try:
            await self._nc.flush(timeout=timeout_s)  # type: ignore[arg-type]
        except (nats.errors.Error, OSError, TimeoutError):
            return False
        return True

    async def connect(self) -> None:
        try:
            async with _nats_errors("connect", self._connect_errors):
                await asyncio.wait_for(self._connect(), self.connect_deadline_s)
        except BaseException:
            # A failed or cancelled first attempt leaves a half-open client behind.
            await self.close()
            raise
        self._js = JetStreamContext(self._nc, timeout=self.request_timeout_s)
        log.info("connected to NATS at %s", describe_nats(self.url, self.security))

    async def _connect(self) -> None:
        await self._nc.connect(
            self.url,
            name=self.name,
            connect_timeout=2,
            reconnect_time_wait=2,
            max_reconnect_attempts=-1,
            ping_interval=20,
            max_outstanding_pings=3,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            **self.security.connect_options(),
        )

    async def _on_error(self, exc: Exception) -> None:
        # Every failed reconnect attempt lands here; the relay reports the outage once.
        self._connect_errors.record(exc)
        log.debug("nats: %s", describe_error(exc))

    async def _on_disconnected(self) -> None:
        if not self._closing:
            log.warning("disconnected from NATS at %s", mask_url(self.url))

    async def _on_reconnected(self) -> None:
        log.info("reconnected to NATS at %s", mask_url(self.url))

    def _jetstream(self) -> JetStreamContext:
        if self._js is None or not self._nc.is_connected:
            # Publishing while reconnecting would only pile messages into the client's
            # buffer; the relay retries the rows instead.
            raise EventBusUnavailable("not connected to NATS", detail={"url": mask_url(self.url)})
        return self._js

    async def ensure_stream(self) -> None:
        """Create the stream, or bring an existing one's subjects and window in line."""
        js = self._jetstream()
        async with _nats_errors("ensure_stream"):
            try:
                info = await js.stream_info(STREAM_NAME)
            except NotFoundError:
                await js.add_stream(StreamConfig(
                    name=STREAM_NAME, subjects=[STREAM_SUBJECTS], storage=StorageType.FILE,
                    duplicate_window=DUPLICATE_WINDOW_S,
                ))
                log.info("created JetStream stream %s", STREAM_NAME)
                return
            config = info.config
            if (config.subjects or []) == [STREAM_SUBJECTS] and \
                    config.duplicate_window == DUPLICATE_WINDOW_S:
                return
            # Other settings (storage, replicas, limits) are the operator's to choose.
            await js.update_stream(config.evolve(subjects=[STREAM_SUBJECTS],
                                                 duplicate_window=DUPLICATE_WINDOW_S))
            log.info("updated JetStream stream %s", STREAM_NAME)

    async def publish(self, subject: str, data: bytes, msg_id: str,
                      signature: str | None = None) -> int:
        """Publish and wait for the stream's ack; returns the stream sequence.

        A duplicate (same ``msg_id`` inside the window) is acked with the sequence of
        the first copy, so the caller records the same number either way.
        """
        acked = await self.send(subject, data, msg_id, signature=signature)
        return await acked()

    async def send(self, subject: str, data: bytes, msg_id: str,
                   signature: str | None = None) -> Callable[[], Awaitable[int]]:
        """Publish without waiting; returns the wait for the stream's ack (its sequence).

        Messages sent one after another from one connection reach the stream in that
        order, so a batch can be in flight at once: its subscribers then get the batch
        together (one wake-up each) instead of one message per round trip to the stream.
        ``signature``: the ``Loraplane-Signature`` header (loraplane/event_signing.py).
        """
        js = self._jetstream()
        headers = {MSG_ID_HEADER: msg_id}
        if signature is not None:
            headers[SIGNATURE_HEADER] = signature
        async with _nats_errors("publish"):
            future = await js.publish_async(subject, data, stream=STREAM_NAME,
                                            headers=headers)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s

        async def acked() -> int:
            async with _nats_errors("publish"):
                # On timeout wait_for cancels the future, which frees its pending slot.
                ack = await asyncio.wait_for(future, max(0.0, deadline - loop.time()))
            return int(ack.seq)
        return acked

    async def close(self) -> None:
        self._js, self._closing = None, True
        if self._nc.is_closed:
            return
        try:
            await self._nc.close()
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            log.debug("closing the NATS connection: %s", exc)
