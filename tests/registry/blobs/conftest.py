"""Fixtures for the blob store tests: a real SeaweedFS S3 and both store kinds."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devharness.services import SeaweedS3
from registry_service.blobs import BlobStore, LocalBlobStore, S3BlobStore

# Five MiB parts (the S3 minimum) so a test file of a dozen MiB is a real multipart upload.
TEST_PART_SIZE_MB = 5


@dataclass(frozen=True)
class BlobFile:
    path: Path
    data: bytes
    sha256: str

    @property
    def size(self) -> int:
        return len(self.data)


def make_blob_file(directory: Path, size: int) -> BlobFile:
    data = os.urandom(size)
    path = directory / f"blob-{secrets.token_hex(4)}.bin"
    path.write_bytes(data)
    return BlobFile(path=path, data=data, sha256=hashlib.sha256(data).hexdigest())


def s3_store_for(server: SeaweedS3, *, bucket: str | None = None, **options: Any) -> S3BlobStore:
    return S3BlobStore(
        bucket or f"blobs-{secrets.token_hex(4)}",
        endpoint_url=server.endpoint_url,
        region=server.region,
        access_key=server.access_key,
        secret_key=server.secret_key,
        path_style=True,
        create_bucket=True,
        part_size_mb=TEST_PART_SIZE_MB,
        **options,
    )


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with SeaweedS3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
async def s3_store(seaweed: SeaweedS3) -> AsyncIterator[S3BlobStore]:
    store = s3_store_for(seaweed)
    await store.check()
    yield store
    await store.close()


@pytest.fixture
async def local_store(tmp_path: Path) -> AsyncIterator[LocalBlobStore]:
    store = LocalBlobStore(tmp_path / "blobs")
    await store.check()
    yield store
    await store.close()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> BlobStore:
    fixture_name = f"{request.param}_store"
    found: BlobStore = request.getfixturevalue(fixture_name)
    return found
