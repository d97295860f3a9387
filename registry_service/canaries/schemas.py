"""The canaries API's bodies: the wire contract lives in the shared core."""

from __future__ import annotations

from loraplane.api.canaries import Canary, CanaryAction, CanaryList, CanaryStart

__all__ = ["Canary", "CanaryAction", "CanaryList", "CanaryStart"]
