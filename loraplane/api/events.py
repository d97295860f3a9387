"""The audit log: ``/v1/events``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from loraplane.events import AUDIT_ADAPTER, AuditEvent

DEFAULT_PAGE = 100
MAX_PAGE = 1000


class EventPage(BaseModel):
    """One page of the audit log; ask again with ``after=next_after`` for the next."""

    # Each item has the shape of the event published to JetStream (``event_json``). They
    # stay plain objects here so a client shows event types newer than itself unchanged.
    events: list[dict[str, Any]]
    next_after: int

    def parsed(self) -> list[AuditEvent]:
        """The events as the typed models of ``loraplane.events``."""
        return [AUDIT_ADAPTER.validate_python(event) for event in self.events]


class EventKey(BaseModel):
    """A public key that signs the registry's events (loraplane/event_signing.py)."""

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    public_key: str = Field(max_length=64, description="the raw Ed25519 key, base64")
    signing: bool = Field(description="true: new events are signed with it; false: a key "
                                      "being rotated out, still accepted")


class EventKeyList(BaseModel):
    """``GET /v1/events/keys``: the keys an agent accepts events from."""

    keys: list[EventKey] = Field(max_length=16)
