"""Which agents keep an adapter hot: rendezvous (highest random weight) hashing.

The registry (its fleet view) and every agent compute owners with this one function,
from the same inputs: the live agents of the adapter's base model and the adapter's
name. Each (agent, adapter) pair gets a weight from a stable hash; the owners are the
``replicas`` agents with the highest weights. An agent joining takes over only the
adapters where it outranks a current owner; an agent leaving hands over only the
adapters it owned: the fewest moves any placement can make.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

# Weights are the first 8 bytes of blake2b: stable across processes and Python
# versions (``hash()`` is salted per process) and cheap enough for 100 agents x
# thousands of adapters on every resync.
_DIGEST_SIZE = 8


def weight(agent_id: str, adapter: str) -> int:
    """The pair's weight; the NUL separator keeps ``("ab", "c")`` apart from ``("a", "bc")``."""
    digest = hashlib.blake2b(f"{agent_id}\0{adapter}".encode(), digest_size=_DIGEST_SIZE)
    return int.from_bytes(digest.digest(), "big")


def owners(agents: Iterable[str], adapter: str, replicas: int | None) -> list[str]:
    """The agents that keep ``adapter`` hot, highest weight first.

    ``replicas`` None means no placement: every agent owns it.
    Ties (equal weights) fall back to the agent id so every caller agrees.
    """
    unique = sorted(set(agents))
    if replicas is None:
        return unique
    ranked = sorted(unique, key=lambda agent: (weight(agent, adapter), agent), reverse=True)
    return ranked[:max(0, replicas)]


def owns(agent_id: str, agents: Iterable[str], adapter: str, replicas: int | None) -> bool:
    """True if ``agent_id`` is one of the adapter's owners among ``agents``.

    ``agent_id`` counts as live whether or not ``agents`` lists it: an agent that has
    not reported yet still computes its own share.
    """
    fleet = set(agents) | {agent_id}
    return agent_id in owners(fleet, adapter, replicas)


def assignment(agents: Iterable[str], adapters: Mapping[str, int | None]
               ) -> dict[str, set[str]]:
    """adapter -> its owners, for every adapter of ``adapters`` (name -> replicas)."""
    fleet = sorted(set(agents))
    return {name: set(owners(fleet, name, replicas)) for name, replicas in adapters.items()}
