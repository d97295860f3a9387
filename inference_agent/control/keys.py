"""The work queue's keys: which desired state a key asks the reconciler to re-read.

An adapter name asks for that adapter as the registry has it. ``local/<name>`` asks for
the folder ``<name>`` of ``--watch-dir``. The special keys cannot collide with either:
an adapter name is a slug, which holds neither ``*`` nor ``/``.
"""

from __future__ import annotations

from loraplane.events import CredentialsChanged, Event, FleetChanged, RouteChanged

# Re-read the whole snapshot, queue every adapter, then repair vLLM (see VLLM).
ALL = "*all*"
# Re-read the routing rules.
ROUTES = "*routes*"
# Re-read the inference credentials (never queued: the credentials refresher takes it).
CREDENTIALS = "*credentials*"
# Compare what the cache believes loaded with what vLLM has, and repair the difference.
VLLM = "*vllm*"
LOCAL_PREFIX = "local/"


def local_key(adapter: str) -> str:
    """The key of a ``--watch-dir`` folder."""
    return f"{LOCAL_PREFIX}{adapter}"


def local_adapter(key: str) -> str | None:
    """The adapter a ``local/<name>`` key names; None for any other key."""
    return key[len(LOCAL_PREFIX):] if key.startswith(LOCAL_PREFIX) else None


def key_for(event: Event, base_model: str) -> str | None:
    """The work-queue key an event asks for; None if it concerns another base model.

    A fleet change asks for a full resync here; the reconciler's ``on_event`` acts on
    one without any read."""
    if isinstance(event, CredentialsChanged):
        return CREDENTIALS
    if isinstance(event, RouteChanged):
        if event.rule is not None and event.rule.base_model != base_model:
            return None
        # A removed rule does not say its base model: refreshing costs one read.
        return ROUTES
    if event.base_model != base_model:
        return None
    if isinstance(event, FleetChanged):
        return ALL
    return event.adapter
