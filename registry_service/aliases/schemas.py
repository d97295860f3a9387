"""The aliases API's bodies: the wire contract lives in the shared core."""

from __future__ import annotations

from loraplane.api.aliases import (
    AliasHistory,
    AliasMoveOut,
    AliasMoveRequest,
    AliasState,
    RollbackRequest,
)

__all__ = ["AliasHistory", "AliasMoveOut", "AliasMoveRequest", "AliasState", "RollbackRequest"]
