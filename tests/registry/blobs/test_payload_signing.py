"""Uploads sign their body's sha256 over plain HTTP only (``signs_payload``): over TLS
that hash would be a second pass over every uploaded byte, for no protection TLS and the
blob's own sha256 do not already give."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse, HTTPHeaders
from pydantic import ValidationError

from devharness.services import SeaweedS3
from registry_service.blobs import S3BlobStore
from registry_service.blobs.s3 import signs_payload
from registry_service.settings import RegistrySettings
from tests.registry.blobs.conftest import s3_store_for

BODY = b"weights" * 1000
UNSIGNED = "UNSIGNED-PAYLOAD"


class _Raw:
    """The body of a canned response: empty."""

    def stream(self, **_kwargs: Any) -> Any:
        return iter([b""])


def record_body_hashes(store: S3BlobStore, *, answer: bool) -> list[str]:
    """The ``X-Amz-Content-SHA256`` of every upload request ``store`` sends; with
    ``answer`` each is answered 200 here instead of going out."""
    sent: list[str] = []

    def before_send(request: Any, **_kwargs: Any) -> AWSResponse | None:
        sent.append(request.headers["X-Amz-Content-SHA256"].decode())
        if not answer:
            return None
        headers = HTTPHeaders()
        headers["ETag"] = '"e"'
        return AWSResponse(request.url, 200, headers, _Raw())

    hooks: Any = store._upload_client.meta.events  # typed as if handlers returned None
    hooks.register("before-send.s3", before_send)
    return sent


async def upload(store: S3BlobStore) -> None:
    writer = await store.open_writer()
    writer.write(BODY)
    await writer.finish(hashlib.sha256(BODY).hexdigest(), len(BODY))


@pytest.mark.parametrize(("endpoint", "signed"), [
    ("http://s3.internal:9000", True), ("HTTP://s3.internal", True),
    ("https://s3.internal", False), (None, False)])
def test_only_plain_http_signs_the_payload(endpoint: str | None, signed: bool) -> None:
    assert signs_payload(endpoint) is signed


@pytest.mark.parametrize("endpoint", ["http://s3.internal", "https://s3.internal", None])
def test_the_setting_decides_outright(endpoint: str | None) -> None:
    assert signs_payload(endpoint, "on") and not signs_payload(endpoint, "off")


def test_the_setting_refuses_other_values() -> None:
    with pytest.raises(ValidationError, match="s3_payload_signing"):
        RegistrySettings(s3_payload_signing="sometimes")


async def test_over_http_the_body_hash_is_signed(seaweed: SeaweedS3) -> None:
    store = s3_store_for(seaweed)
    sent = record_body_hashes(store, answer=False)
    await upload(store)  # SeaweedFS checks the signature, body hash included
    assert sent == [hashlib.sha256(BODY).hexdigest()]
    assert await store.size(hashlib.sha256(BODY).hexdigest()) == len(BODY)


async def test_off_sends_an_unsigned_body_that_the_store_takes(seaweed: SeaweedS3) -> None:
    store = s3_store_for(seaweed, payload_signing="off")
    sent = record_body_hashes(store, answer=False)
    await upload(store)
    assert sent == [UNSIGNED]
    assert await store.size(hashlib.sha256(BODY).hexdigest()) == len(BODY)


async def test_over_tls_the_body_is_not_hashed_again() -> None:
    store = S3BlobStore("blobs", endpoint_url="https://127.0.0.1:9", access_key="k",
                        secret_key="s", path_style=True)
    sent = record_body_hashes(store, answer=True)
    await upload(store)
    assert sent == [UNSIGNED]
    assert not re.fullmatch(r"[0-9a-f]{64}", sent[0])
