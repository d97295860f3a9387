"""EventTrust: signed events believed, others counted and answered by a registry read;
the registry's keys fetched at a rotation, at a bounded rate."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference_agent.control.trust import EventTrust
from inference_agent.errors import RegistryUnavailable
from inference_agent.metrics import AgentMetrics
from loraplane.event_signing import EventKeys, EventSigner, encode_public

DATA = b'{"type":"credentials_changed"}'


def signer() -> EventSigner:
    return EventSigner(Ed25519PrivateKey.generate())


class Registry:
    """Answers the key requests with the current signer's key; counts them."""

    def __init__(self, current: EventSigner) -> None:
        self.current = current
        self.asked = 0
        self.down = False

    async def keys(self) -> list[str]:
        self.asked += 1
        if self.down:
            raise RegistryUnavailable("registry unreachable")
        return [encode_public(self.current.public)]


def trust_for(registry: Registry, reads: list[int],
              refresh_min_s: float = 5.0) -> tuple[EventTrust, AgentMetrics]:
    metrics = AgentMetrics()
    trust = EventTrust(EventKeys(), fetch=registry.keys, metrics=metrics,
                       on_refused=lambda: reads.append(1), refresh_min_s=refresh_min_s)
    return trust, metrics


def refused(metrics: AgentMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("loraplane_agent_events_rejected_total",
                                              {"reason": reason})
    return value or 0.0


async def test_a_rotated_key_is_fetched_and_believed() -> None:
    old, new = signer(), signer()
    registry, reads = Registry(old), list[int]()
    trust, metrics = trust_for(registry, reads, refresh_min_s=0)
    await trust.refresh()
    assert await trust.believe(DATA, old.header(DATA))
    registry.current = new
    assert await trust.believe(DATA, new.header(DATA)), "the new key was fetched"
    assert registry.asked == 2 and reads == [] and refused(metrics, "unknown_key") == 0


async def test_forgeries_cost_a_bounded_number_of_registry_requests() -> None:
    registry = Registry(signer())
    attacker, reads = signer(), list[int]()
    trust, metrics = trust_for(registry, reads, refresh_min_s=3600)
    await trust.refresh()
    asked = registry.asked
    for _ in range(100):
        assert not await trust.believe(DATA, attacker.header(DATA))
        assert not await trust.believe(DATA, None)
    assert refused(metrics, "unknown_key") == 100 and refused(metrics, "unsigned") == 100
    # The keys were just read: no fetch for the unknown key; and one registry read, not
    # one per forgery.
    assert registry.asked == asked and reads == [1]


async def test_a_registry_down_at_a_rotation_refuses_and_reads_later() -> None:
    old, new = signer(), signer()
    registry, reads = Registry(old), list[int]()
    trust, metrics = trust_for(registry, reads, refresh_min_s=0)
    await trust.refresh()
    registry.current, registry.down = new, True
    assert not await trust.believe(DATA, new.header(DATA))
    assert refused(metrics, "unknown_key") == 1 and reads == [1]
    registry.down = False
    assert await trust.believe(DATA, new.header(DATA))


async def test_pinned_keys_are_never_fetched() -> None:
    pinned, other = signer(), signer()
    reads: list[int] = []
    trust = EventTrust(EventKeys({pinned.key_id: pinned.public}), fetch=None,
                       metrics=AgentMetrics(), on_refused=lambda: reads.append(1))
    assert await trust.believe(DATA, pinned.header(DATA))
    assert not await trust.believe(DATA, other.header(DATA))
    assert reads == [1]
