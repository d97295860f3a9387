"""Blob writers (a blob streamed in as it arrives) on a local folder and on SeaweedFS:
nothing is visible under a blob key before ``finish``, and ``abort``, or the sweep after
a crash, leaves nothing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devharness.services import SeaweedS3
from registry_service.blobs import BlobStore, LocalBlobStore, S3BlobStore, blob_key
from registry_service.blobs.base import BlobWriter
from registry_service.errors import BlobStoreUnavailable
from tests.registry.blobs.conftest import s3_store_for

MIB = 1024 * 1024


@pytest.fixture
async def streaming_s3(seaweed: SeaweedS3) -> AsyncIterator[S3BlobStore]:
    # Five MiB parts (the S3 minimum): a dozen MiB are several parts.
    store = s3_store_for(seaweed, stream_part_mb=5)
    await store.check()
    yield store
    await store.close()


@pytest.fixture(params=["local", "s3"])
def any_store(request: pytest.FixtureRequest) -> BlobStore:
    name = "local_store" if request.param == "local" else "streaming_s3"
    found: BlobStore = request.getfixturevalue(name)
    return found


async def _feed(writer: BlobWriter, data: bytes) -> None:
    """In uneven pieces, from a worker thread, as the upload receiver does."""
    rng, position = random.Random(len(data)), 0
    while position < len(data):
        step = rng.randint(1, 3 * MIB)
        await asyncio.to_thread(writer.write, data[position:position + step])
        position += step


async def leftovers(store: BlobStore, seaweed: SeaweedS3 | None = None) -> list[str]:
    """Every key or file in the store, open multipart uploads included."""
    if isinstance(store, LocalBlobStore):
        return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*")
                      if p.is_file())
    assert isinstance(store, S3BlobStore) and seaweed is not None
    client = seaweed.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=store.bucket).get("Contents", [])]
    uploads = client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    return sorted(keys + [f"multipart:{u['Key']}" for u in uploads])


def _server(store: BlobStore, request: pytest.FixtureRequest) -> SeaweedS3 | None:
    return request.getfixturevalue("seaweed") if isinstance(store, S3BlobStore) else None


@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("size", [0, 1234, 5 * MIB, 12 * MIB + 7])
async def test_a_finished_writer_stores_exactly_the_blob(
    any_store: BlobStore, request: pytest.FixtureRequest, declared: bool, size: int
) -> None:
    data = os.urandom(size)
    sha = hashlib.sha256(data).hexdigest()
    writer = await any_store.open_writer(sha if declared else None)
    await _feed(writer, data)
    assert blob_key(sha) not in await leftovers(any_store, _server(any_store, request))
    assert not await any_store.exists(sha)  # nothing visible before finish
    await writer.finish(sha, size)
    await writer.abort()  # a no-op once finished
    async with await any_store.open_stream(sha) as stream:
        assert b"".join([chunk async for chunk in stream]) == data
    assert await leftovers(any_store, _server(any_store, request)) == [blob_key(sha)]


@pytest.mark.parametrize("declared", [True, False])
async def test_abort_after_several_parts_leaves_nothing(
    any_store: BlobStore, request: pytest.FixtureRequest, declared: bool
) -> None:
    data = os.urandom(12 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    writer = await any_store.open_writer(sha if declared else None)
    await _feed(writer, data)
    assert await leftovers(any_store, _server(any_store, request)) != []  # parts are up
    await writer.abort()
    assert await leftovers(any_store, _server(any_store, request)) == []


async def test_the_sweep_removes_what_a_crashed_upload_left(
    any_store: BlobStore, request: pytest.FixtureRequest
) -> None:
    server = _server(any_store, request)
    for declared in (None, hashlib.sha256(b"x").hexdigest()):
        writer = await any_store.open_writer(declared)
        await _feed(writer, os.urandom(11 * MIB))  # then the registry dies
    if server is not None:  # a temporary object completed, not yet copied
        assert isinstance(any_store, S3BlobStore)
        server.client().put_object(Bucket=any_store.bucket, Key="uploads/left", Body=b"x")
    left = await leftovers(any_store, server)
    assert left
    assert await any_store.sweep_incomplete(3600) == 0  # too young: maybe still running
    assert await any_store.sweep_incomplete(0) == len(left)
    assert await leftovers(any_store, server) == []


async def test_a_declared_blob_already_stored_is_not_sent_again(
    streaming_s3: S3BlobStore, seaweed: SeaweedS3, tmp_path: Path
) -> None:
    data = os.urandom(6 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    source = tmp_path / "blob"
    source.write_bytes(data)
    await streaming_s3.put_file(sha, source, len(data))
    writer = await streaming_s3.open_writer(sha)
    await _feed(writer, data)
    assert await leftovers(streaming_s3, seaweed) == [blob_key(sha)]  # no upload begun
    await writer.finish(sha, len(data))
    # Collected between the check at the start and the end: the client must send it again.
    again = await streaming_s3.open_writer(sha)
    await _feed(again, data)
    await streaming_s3.delete(sha)
    with pytest.raises(BlobStoreUnavailable) as caught:
        await again.finish(sha, len(data))
    assert caught.value.code == "blob_being_collected" and caught.value.retryable
    await again.abort()
    assert await leftovers(streaming_s3, seaweed) == []
