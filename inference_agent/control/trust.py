"""Which messages from the event stream the agent believes.

The bus is not trusted: anyone able to publish on NATS could otherwise choose what an
agent serves. A message is used only when it carries a valid signature by one of the
registry's event keys (loraplane/event_signing.py). The keys come from the registry
(``GET /v1/events/keys``, over the agent's authenticated link) at start-up and again
when a message names a key this agent does not hold (a rotation), at most once per
``refresh_min_s``; or they are pinned in the settings and never fetched.

A refused message is counted (``loraplane_agent_events_rejected_total{reason}``),
logged, and answered by a full read of the registry (``on_refused``): whatever it
claimed, the registry's own state is what the agent then serves. The reads are spaced
by ``refresh_min_s`` too, so a flood of forgeries costs the registry a bounded rate of
reads, not one per message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from inference_agent.errors import AgentError
from inference_agent.metrics import AgentMetrics
from loraplane.event_signing import EventKeys, InvalidKey, Verdict

log = logging.getLogger(__name__)
FetchKeys = Callable[[], Awaitable[list[str]]]
# Log the first refusals, then one in this many: a flood must not flood the log.
_LOG_EVERY = 100


class EventTrust:
    """Verifies each message's signature against the registry's keys."""

    def __init__(self, keys: EventKeys, *, fetch: FetchKeys | None,
                 metrics: AgentMetrics, on_refused: Callable[[], None],
                 refresh_min_s: float = 5.0) -> None:
        """``fetch`` None: ``keys`` are pinned. Else it returns the registry's public
        keys (base64)."""
        self.keys = keys
        self._fetch = fetch
        self._metrics = metrics
        self._on_refused = on_refused
        self.refresh_min_s = refresh_min_s
        self._fetched_at = -float("inf")
        self._read_at = -float("inf")
        self.refused = 0

    async def refresh(self) -> None:
        """Fetch the registry's keys now; AgentError (or InvalidKey) if that fails."""
        if self._fetch is None:
            return
        self._fetched_at = time.monotonic()
        fetched = EventKeys.from_public(await self._fetch())
        if fetched.ids() != self.keys.ids():
            log.info("event keys: %s", ", ".join(sorted(fetched.ids())) or "none")
        self.keys.replace(fetched)

    async def believe(self, data: bytes, header: str | None) -> bool:
        """True if ``data`` is signed by the registry; else count and answer it."""
        verdict = self.keys.verify(data, header)
        if verdict.reason == "unknown_key" and self._due(self._fetched_at):
            try:
                await self.refresh()
            except (AgentError, InvalidKey) as exc:
                log.warning("reading the registry's event keys failed: %s", exc)
            verdict = self.keys.verify(data, header)
        if verdict.ok:
            return True
        self.reject(verdict)
        return False

    def reject(self, verdict: Verdict) -> None:
        """A message not to be believed: counted, logged, and the registry read."""
        self.refused += 1
        self._metrics.events_rejected.labels(reason=verdict.reason).inc()
        if self.refused <= 3 or self.refused % _LOG_EVERY == 0:
            log.warning("dropped a message from the event stream: %s%s (%d so far); "
                        "reading the registry instead", verdict.reason,
                        f" (key {verdict.key_id})" if verdict.key_id else "", self.refused)
        if self._due(self._read_at):
            self._read_at = time.monotonic()
            self._on_refused()

    def _due(self, last: float) -> bool:
        """Whether ``refresh_min_s`` has passed since ``last`` (monotonic time)."""
        return time.monotonic() - last >= self.refresh_min_s
