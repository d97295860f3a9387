"""Event signatures: what verifies, what does not, and the keys' forms."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from loraplane.event_signing import (
    EventKeys,
    EventSigner,
    InvalidKey,
    decode_private,
    decode_public,
    encode_public,
    new_private_text,
    read_or_create_key_file,
)

DATA = b'{"type":"adapter_updated","tenant":"acme"}'


def signer() -> EventSigner:
    return EventSigner(Ed25519PrivateKey.generate())


def keys_of(*signers: EventSigner) -> EventKeys:
    return EventKeys.from_public([encode_public(s.public) for s in signers])


def test_a_signed_message_verifies_with_its_key_only() -> None:
    registry, other = signer(), signer()
    header = registry.header(DATA)
    verdict = keys_of(registry).verify(DATA, header)
    assert verdict.ok and verdict.key_id == registry.key_id
    assert keys_of(other).verify(DATA, header).reason == "unknown_key"
    # A rotation: the old key and the new one are both accepted.
    assert keys_of(other, registry).verify(DATA, header).ok


@pytest.mark.parametrize("change", ["data", "signature", "key_id", "scheme"])
def test_any_change_is_refused(change: str) -> None:
    registry = signer()
    header = registry.header(DATA)
    scheme, kid, signature = header.split(":")
    data = DATA
    if change == "data":
        data = DATA.replace(b"acme", b"evil")
    elif change == "signature":
        raw = bytearray(base64.b64decode(signature))
        raw[0] ^= 1
        header = f"{scheme}:{kid}:{base64.b64encode(bytes(raw)).decode()}"
    elif change == "key_id":
        header = f"{scheme}:{'0' * 16}:{signature}"
    else:
        header = f"rsa:{kid}:{signature}"
    expected = {"data": "bad_signature", "signature": "bad_signature",
                "key_id": "unknown_key", "scheme": "malformed"}[change]
    assert keys_of(registry).verify(data, header).reason == expected


@pytest.mark.parametrize("header", [None, "", "ed25519", "ed25519:x:y:z", "a" * 500,
                                    "ed25519:{kid}:not-base64!", "ed25519:{kid}:AAAA"])
def test_missing_or_garbled_signatures_are_refused(header: str | None) -> None:
    registry = signer()
    if header is not None:
        header = header.replace("{kid}", registry.key_id)
    assert not keys_of(registry).verify(DATA, header).ok


def test_the_signature_covers_a_context_not_bare_bytes() -> None:
    # Signed without the context, the same bytes do not verify: the key signs events only.
    key = Ed25519PrivateKey.generate()
    registry = EventSigner(key)
    bare = base64.b64encode(key.sign(DATA)).decode()
    assert keys_of(registry).verify(DATA, f"ed25519:{registry.key_id}:{bare}").reason \
        == "bad_signature"


def test_keys_round_trip_and_bad_keys_are_refused() -> None:
    text = new_private_text()
    private = decode_private(text)
    public = encode_public(private.public_key())
    assert encode_public(decode_public(public)) == public
    for bad in ("", "not base64", base64.b64encode(b"short").decode()):
        with pytest.raises(InvalidKey):
            decode_private(bad)
        with pytest.raises(InvalidKey):
            decode_public(bad)


def test_the_key_file_is_made_once_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "event-signing-key"
    first = read_or_create_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = read_or_create_key_file(path)
    assert encode_public(first.public_key()) == encode_public(again.public_key())
    path.write_text("garbage\n")
    with pytest.raises(InvalidKey):
        read_or_create_key_file(path)
