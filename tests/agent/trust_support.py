"""An ``EventTrust`` that believes one registry's signing key, for tests that build a
follower without an agent."""

from __future__ import annotations

from collections.abc import Callable

from inference_agent.control.trust import EventTrust
from inference_agent.metrics import AgentMetrics
from loraplane.event_signing import EventKeys, EventSigner


def trusting(signer: EventSigner, *, metrics: AgentMetrics | None = None,
             on_refused: Callable[[], None] = lambda: None) -> EventTrust:
    return EventTrust(EventKeys({signer.key_id: signer.public}), fetch=None,
                      metrics=metrics or AgentMetrics(), on_refused=on_refused)
