"""The adapters API's bodies: the wire contract lives in the shared core."""

from __future__ import annotations

from loraplane.api.adapters import (
    AdapterCreate,
    AdapterOut,
    AdapterPage,
    AdapterUpdate,
    AliasOut,
)

__all__ = ["AdapterCreate", "AdapterOut", "AdapterPage", "AdapterUpdate", "AliasOut"]
