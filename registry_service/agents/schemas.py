"""The fleet API's bodies: the wire contract lives in the shared core."""

from __future__ import annotations

from loraplane.api.agents import (
    AgentList,
    AgentOut,
    AliasRollout,
    RolloutEntry,
    RolloutOut,
    TierOut,
)

__all__ = ["AgentList", "AgentOut", "AliasRollout", "RolloutEntry", "RolloutOut", "TierOut"]
