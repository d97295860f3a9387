"""The registry's event signing key: where it comes from, and what agents are told.

Every message the relay publishes is signed (loraplane/event_signing.py). The key is
``LORAPLANE_EVENT_SIGNING_KEY`` (replicas share it), or the file
``LORAPLANE_EVENT_SIGNING_KEY_FILE`` names, or else ``<data_dir>/event-signing-key``,
made at first start with mode 0600. Agents learn the public keys from
``GET /v1/events/keys``, with their registry token, or have them pinned.
"""

from __future__ import annotations

import logging

from loraplane.api.events import EventKey, EventKeyList
from loraplane.event_signing import (
    EventSigner,
    InvalidKey,
    decode_private,
    decode_public,
    encode_public,
    key_id,
    read_or_create_key_file,
)
from registry_service.errors import RegistryError
from registry_service.settings import RegistrySettings

log = logging.getLogger(__name__)


class SigningKeyUnavailable(RegistryError):
    """The configured signing key cannot be read; the registry does not start."""

    status = 503
    code = "signing_key_unavailable"


def event_signer(settings: RegistrySettings) -> EventSigner:
    """The signer of this registry's events; raises ``SigningKeyUnavailable``."""
    if settings.event_signing_key is not None:
        return EventSigner(decode_private(settings.event_signing_key.get_secret_value()))
    path = settings.signing_key_file
    try:
        if settings.event_signing_key_file is not None:
            private = decode_private(path.read_text())
        else:
            private = read_or_create_key_file(path)
    except (OSError, InvalidKey) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SigningKeyUnavailable(f"the event signing key {path} cannot be used: {reason}",
                                    detail={"path": str(path)}) from None
    signer = EventSigner(private)
    if settings.event_signing_key_file is None and settings.database_url is not None:
        log.warning("events are signed with the key kept in %s (key id %s); replicas of "
                    "this registry must share one key: set LORAPLANE_EVENT_SIGNING_KEY",
                    path, signer.key_id)
    return signer


def announced_keys(settings: RegistrySettings, signer: EventSigner) -> EventKeyList:
    """The signing key and every key still accepted, for ``GET /v1/events/keys``."""
    keys = [EventKey(key_id=signer.key_id, public_key=encode_public(signer.public),
                     signing=True)]
    for text in settings.verify_key_texts:
        public = decode_public(text)
        if key_id(public) != signer.key_id:
            keys.append(EventKey(key_id=key_id(public), public_key=text, signing=False))
    return EventKeyList(keys=keys)
