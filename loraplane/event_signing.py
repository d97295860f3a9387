"""Signed events: the registry signs every message it publishes, agents verify it.

Anyone who can publish on NATS must not be able to change what an agent serves, so an
agent believes an event only when it carries a valid Ed25519 signature by a key of its
registry. The signature covers the message's bytes exactly as published (no
re-serialisation, so nothing to canonicalise), prefixed with a context string so the
key signs nothing else. It travels in the ``Loraplane-Signature`` header as
``ed25519:<key id>:<base64 signature>``; the key id is the first 16 hex digits of the
sha256 of the raw public key, so a verifier can hold several keys while one rotates.

Imports ``cryptography`` (OpenSSL): a verify costs tens of microseconds.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from loraplane.private_files import read_or_create_secret

SIGNATURE_HEADER = "Loraplane-Signature"
_CONTEXT = b"loraplane-event-v1\n"
_SCHEME = "ed25519"
_KEY_BYTES = 32
_SIGNATURE_BYTES = 64
# A header longer than this is no signature of ours: refused before any decoding.
_MAX_HEADER = 200


class InvalidKey(ValueError):
    """A key given in configuration or by the registry is not an Ed25519 key."""


def _b64decode(text: str, size: int, what: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidKey(f"{what} is not base64") from None
    if len(raw) != size:
        raise InvalidKey(f"{what} must be {size} bytes, not {len(raw)}")
    return raw


def _public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(_public_bytes(public)).hexdigest()[:16]


def encode_public(public: Ed25519PublicKey) -> str:
    return base64.b64encode(_public_bytes(public)).decode("ascii")


def decode_public(text: str) -> Ed25519PublicKey:
    """A public key from its base64 form (32 raw bytes)."""
    return Ed25519PublicKey.from_public_bytes(_b64decode(text, _KEY_BYTES, "a public key"))


def decode_private(text: str) -> Ed25519PrivateKey:
    """A private key from its base64 form (the 32-byte seed)."""
    return Ed25519PrivateKey.from_private_bytes(
        _b64decode(text, _KEY_BYTES, "the event signing key"))


def new_private_text() -> str:
    """A fresh key's seed, base64: what ``LORAPLANE_EVENT_SIGNING_KEY`` takes."""
    return base64.b64encode(os.urandom(_KEY_BYTES)).decode("ascii")


def read_or_create_key_file(path: Path) -> Ed25519PrivateKey:
    """The key kept in ``path`` (mode 0600), made on first use."""
    text, _made = read_or_create_secret(path, new_private_text)
    return decode_private(text)


class EventSigner:
    """Signs published messages with one private key."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public = private.public_key()
        self.key_id = key_id(self.public)

    def header(self, data: bytes) -> str:
        signature = self._private.sign(_CONTEXT + data)
        return f"{_SCHEME}:{self.key_id}:{base64.b64encode(signature).decode('ascii')}"


@dataclass(frozen=True)
class Verdict:
    """``ok``, or why a message was refused: ``unsigned``, ``malformed``,
    ``unknown_key`` or ``bad_signature`` (also the metric's label)."""

    reason: str
    key_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


class EventKeys:
    """The public keys an agent accepts, by key id."""

    def __init__(self, keys: dict[str, Ed25519PublicKey] | None = None) -> None:
        self._keys = dict(keys or {})

    @classmethod
    def from_public(cls, encoded: list[str]) -> EventKeys:
        keys = [decode_public(text) for text in encoded]
        return cls({key_id(key): key for key in keys})

    def ids(self) -> set[str]:
        return set(self._keys)

    def replace(self, other: EventKeys) -> None:
        self._keys = dict(other._keys)

    def verify(self, data: bytes, header: str | None) -> Verdict:
        if not header:
            return Verdict("unsigned")
        parts = header.split(":") if len(header) <= _MAX_HEADER else []
        if len(parts) != 3 or parts[0] != _SCHEME:
            return Verdict("malformed")
        kid, encoded = parts[1], parts[2]
        key = self._keys.get(kid)
        if key is None:
            return Verdict("unknown_key", kid[:16])
        try:
            signature = _b64decode(encoded, _SIGNATURE_BYTES, "a signature")
            key.verify(signature, _CONTEXT + data)
        except (InvalidKey, InvalidSignature):
            return Verdict("bad_signature", kid)
        return Verdict("ok", kid)
