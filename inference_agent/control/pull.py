"""A durable pull consumer read as a stream: one standing pull request at a time.

nats-py's ``fetch`` sends requests per call (a no-wait probe, then a lingering request
once the probe came back empty), so every event cost an agent two or three round trips
to NATS and as many wake-ups, and an idle agent cycled through them every
``fetch_timeout_s``. Here one request for up to ``batch`` messages stands for
``expires_s``: the server delivers each event to it as soon as it is stored, events
stored together arrive together, and an idle heartbeat every ``heartbeat_s`` shows the
request is still standing. A new request goes out when the standing one ends (its
batch delivered, its time up, or refused) or has not been heard from for two
heartbeats (a restarted server forgets it).

The messages come through the subscription's callback into a queue of this stream's
own, which ``next`` takes from at once when one is waiting: nats-py's ``next_msg``
made two tasks, a timer and a uuid for every message, and its task hand-offs let the
client's flusher run between two events that came together, so that their acks went
out in two writes where one does.
"""

from __future__ import annotations

import asyncio
import json
import time

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DEFAULT_PREFIX, Header, StatusCode

# The request ended without an error: nothing more to deliver for it.
_ENDED = {StatusCode.NO_MESSAGES.value, StatusCode.REQUEST_TIMEOUT.value}


class PullRefused(nats.errors.Error):
    """The server refused or cut off the pull request (409: the consumer was deleted,
    too many waiting requests; 503: no stream or consumer answers)."""

    def __init__(self, status: str, description: str) -> None:
        super().__init__(f"pull request refused: {status} {description}".strip())
        self.status = status


class PullStream:
    """The messages of one durable pull consumer, as they are stored."""

    def __init__(self, client: NatsClient, stream: str, consumer: str, *, batch: int = 256,
                 expires_s: float = 30.0, heartbeat_s: float = 5.0,
                 prefix: str = DEFAULT_PREFIX) -> None:
        if not 0 < 2 * heartbeat_s < expires_s:
            raise ValueError("the heartbeat must be under half of the request's expiry")
        self._client = client
        self._subject = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._request = json.dumps({
            "batch": batch, "expires": int(expires_s * 1e9),
            "idle_heartbeat": int(heartbeat_s * 1e9)}).encode()
        self._batch = batch
        self._silent_s = 2 * heartbeat_s + 1.0
        self._sub: Subscription | None = None
        self._arrivals: asyncio.Queue[Msg] = asyncio.Queue()
        self._inbox = ""
        self._left = 0  # messages the standing request may still bring; 0: none stands
        self._heard = 0.0  # monotonic time of its last message or heartbeat
        self.requests = 0

    async def open(self) -> None:
        self._inbox = self._client.new_inbox()
        self._sub = await self._client.subscribe(self._inbox, cb=self._arrived)

    async def _arrived(self, msg: Msg) -> None:
        self._arrivals.put_nowait(msg)

    @property
    def waiting(self) -> int:
        """Messages delivered and not yet taken by ``next``."""
        return self._arrivals.qsize()

    def renew(self) -> None:
        """Ask again at the next wait: after a reconnect the server may have dropped
        the standing request, and waiting for the heartbeats to stop would be slow."""
        self._left = 0

    async def next(self, timeout_s: float) -> Msg:
        """The next message. Raises nats' ``TimeoutError`` when ``timeout_s`` passes
        without one, ``PullRefused`` when the server refuses the request."""
        if self._sub is None:
            raise RuntimeError("PullStream.open() first")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            await self._stand()
            msg = await self._take(deadline)
            self._heard = time.monotonic()
            status = msg.headers.get(Header.STATUS) if msg.headers else None
            if not status:
                self._left -= 1
                return msg
            if status == StatusCode.CONTROL_MESSAGE.value:
                continue  # the idle heartbeat
            self._left = 0
            if status not in _ENDED:
                description = (msg.headers or {}).get(Header.DESCRIPTION, "")
                raise PullRefused(status, description)

    async def _take(self, deadline: float) -> Msg:
        """The next message delivered; nats' ``TimeoutError`` at ``deadline`` (loop time)
        without one, ``ConnectionClosedError`` if none is waiting and the client closed."""
        if not self._arrivals.empty():
            return self._arrivals.get_nowait()
        if self._client.is_closed:
            raise nats.errors.ConnectionClosedError
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(max(deadline, loop.time() + 0.001)):
                return await self._arrivals.get()
        except TimeoutError:
            raise nats.errors.TimeoutError from None

    async def _stand(self) -> None:
        """Make sure a request stands: send one if none does or it went silent."""
        if self._left > 0 and time.monotonic() - self._heard < self._silent_s:
            return
        self._left, self._heard = self._batch, time.monotonic()
        self.requests += 1
        await self._client.publish(self._subject, self._request, reply=self._inbox)
