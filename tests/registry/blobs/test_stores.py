"""Blob stores against real storage: a local directory and SeaweedFS over S3."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
from botocore.exceptions import ClientError

from devharness.services import SeaweedS3
from registry_service.blobs import (
    BlobStore,
    LocalBlobStore,
    S3BlobStore,
    blob_key,
    build_blob_store,
    content_disposition,
)
from registry_service.blobs.s3 import map_s3_error
from registry_service.bootstrap import build_blobs
from registry_service.errors import (
    BlobNotFound,
    BlobStoreFull,
    BlobStoreUnavailable,
    InvalidInput,
)
from registry_service.settings import RegistrySettings
from tests.registry.blobs.conftest import make_blob_file, s3_store_for

MIB = 1024 * 1024
ABSENT = "0" * 64


async def read_all(store: BlobStore, sha256: str, chunk_size: int = MIB) -> bytes:
    async with await store.open_stream(sha256, chunk_size) as stream:
        return b"".join([chunk async for chunk in stream])


async def test_round_trip_of_a_multi_megabyte_blob(store: BlobStore, tmp_path: Path) -> None:
    blob = make_blob_file(tmp_path, 12 * MIB + 12345)
    assert not await store.exists(blob.sha256)

    await store.put_file(blob.sha256, blob.path, blob.size)

    assert await store.exists(blob.sha256)
    assert await store.size(blob.sha256) == blob.size
    stream = await store.open_stream(blob.sha256, chunk_size=MIB)
    assert stream.size == blob.size
    digest, chunks = hashlib.sha256(), 0
    async for chunk in stream:
        assert len(chunk) <= MIB
        digest.update(chunk)
        chunks += 1
    assert digest.hexdigest() == blob.sha256
    assert chunks >= 12


async def test_put_is_idempotent_even_when_concurrent(store: BlobStore, tmp_path: Path) -> None:
    blob = make_blob_file(tmp_path, 3 * MIB)
    await store.put_file(blob.sha256, blob.path, blob.size)
    await store.put_file(blob.sha256, blob.path, blob.size)
    await asyncio.gather(*(store.put_file(blob.sha256, blob.path, blob.size) for _ in range(3)))

    assert await read_all(store, blob.sha256) == blob.data
    if isinstance(store, LocalBlobStore):
        leftovers = [p.name for p in store.root.rglob("*") if p.is_file()]
        assert leftovers == [blob.sha256]


async def test_put_refuses_a_file_of_another_size(store: BlobStore, tmp_path: Path) -> None:
    blob = make_blob_file(tmp_path, 1000)
    with pytest.raises(ValueError, match="expected 999"):
        await store.put_file(blob.sha256, blob.path, 999)
    assert not await store.exists(blob.sha256)


async def test_missing_blob(store: BlobStore) -> None:
    assert await store.size(ABSENT) is None
    assert not await store.exists(ABSENT)
    with pytest.raises(BlobNotFound) as raised:
        await store.open_stream(ABSENT)
    assert raised.value.detail["sha256"] == ABSENT
    await store.delete(ABSENT)


async def test_delete_removes_the_blob(store: BlobStore, tmp_path: Path) -> None:
    blob = make_blob_file(tmp_path, 4096)
    await store.put_file(blob.sha256, blob.path, blob.size)
    await store.delete(blob.sha256)
    assert not await store.exists(blob.sha256)
    with pytest.raises(BlobNotFound):
        await store.open_stream(blob.sha256)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "A" * 64, "abc", ABSENT + "0"])
async def test_refuses_what_is_not_a_sha256(store: BlobStore, bad: str) -> None:
    with pytest.raises(InvalidInput):
        await store.size(bad)
    with pytest.raises(InvalidInput):
        await store.open_stream(bad)


async def test_a_stream_closed_early_can_be_closed_twice(store: BlobStore, tmp_path: Path) -> None:
    blob = make_blob_file(tmp_path, 3 * MIB)
    await store.put_file(blob.sha256, blob.path, blob.size)
    stream = await store.open_stream(blob.sha256, chunk_size=MIB)
    assert await anext(stream) == blob.data[:MIB]
    await stream.aclose()
    await stream.aclose()
    assert [chunk async for chunk in stream] == []


async def test_local_presigned_url_is_none(local_store: LocalBlobStore) -> None:
    assert await local_store.presigned_url(ABSENT, filename="a.bin", expires_s=60) is None


async def test_presigned_url_downloads_and_refuses_tampering(
    s3_store: S3BlobStore, tmp_path: Path
) -> None:
    blob = make_blob_file(tmp_path, 2 * MIB + 1)
    await s3_store.put_file(blob.sha256, blob.path, blob.size)
    url = await s3_store.presigned_url(
        blob.sha256, filename="adapter model\u00e9.safetensors", expires_s=300
    )
    assert url is not None

    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.get(url)
        assert response.status_code == 200
        assert response.content == blob.data
        disposition = response.headers["content-disposition"]
        assert disposition == content_disposition("adapter model\u00e9.safetensors")
        assert "filename*=UTF-8''adapter%20model%C3%A9.safetensors" in disposition

        # Edited in place, not re-encoded: only the tampering may differ from the original.
        signature = dict(parse_qsl(urlsplit(url).query))["X-Amz-Signature"]
        forged = ("0" if signature[0] != "0" else "1") + signature[1:]
        tampered = [
            url.replace(f"X-Amz-Signature={signature}", f"X-Amz-Signature={forged}"),
            url.replace("X-Amz-Expires=300", "X-Amz-Expires=604800"),
            url.replace(blob_key(blob.sha256), blob_key(ABSENT)),
            url.replace("filename", "filenam3", 1),
        ]
        for bad in tampered:
            assert bad != url
            assert (await client.get(bad)).status_code == 403, bad


async def test_presigned_url_bounds_its_expiry(s3_store: S3BlobStore) -> None:
    for bad in (0, -1, 8 * 24 * 3600):
        with pytest.raises(ValueError):
            await s3_store.presigned_url(ABSENT, filename="a", expires_s=bad)


async def test_local_crash_before_rename_leaves_nothing(
    local_store: LocalBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = make_blob_file(tmp_path, MIB)

    def disk_full(src: Any, dst: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr("registry_service.blobs.local.os.replace", disk_full)
    # A full store is 507 insufficient_storage, not an unreachable one's 503.
    with pytest.raises(BlobStoreFull) as raised:
        await local_store.put_file(blob.sha256, blob.path, blob.size)
    assert (raised.value.status, raised.value.code) == (507, "insufficient_storage")
    assert raised.value.detail["errno"] == "ENOSPC"
    assert [p for p in local_store.root.rglob("*") if p.is_file()] == []


async def test_local_stream_of_a_blob_cut_short_fails(
    local_store: LocalBlobStore, tmp_path: Path
) -> None:
    blob = make_blob_file(tmp_path, 2 * MIB)
    await local_store.put_file(blob.sha256, blob.path, blob.size)
    stream = await local_store.open_stream(blob.sha256, chunk_size=MIB)
    os.truncate(local_store.path_for(blob.sha256), MIB)
    with pytest.raises(BlobStoreUnavailable, match="ended before"):
        async for _ in stream:
            pass


async def test_local_check_fails_on_an_unusable_root(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    with pytest.raises(BlobStoreUnavailable):
        await LocalBlobStore(not_a_dir / "blobs").check()


async def test_s3_check_reports_a_missing_bucket(seaweed: SeaweedS3) -> None:
    store = S3BlobStore(
        "no-such-bucket-here",
        endpoint_url=seaweed.endpoint_url,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
        path_style=True,
    )
    try:
        with pytest.raises(BlobStoreUnavailable, match="does not exist") as raised:
            await store.check()
        assert raised.value.retryable is False
    finally:
        await store.close()


async def test_s3_wrong_credentials_are_not_retryable(seaweed: SeaweedS3) -> None:
    store = S3BlobStore(
        "any-bucket",
        endpoint_url=seaweed.endpoint_url,
        access_key=seaweed.access_key,
        secret_key="wrong-secret",
        path_style=True,
    )
    try:
        with pytest.raises(BlobStoreUnavailable) as raised:
            await store.size(ABSENT)
        assert raised.value.retryable is False
        assert raised.value.detail["s3_status"] == 403
    finally:
        await store.close()


def _client_error(code: str, status: int) -> ClientError:
    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "GetObject")


@pytest.mark.parametrize(
    ("code", "status", "expected", "retryable"),
    [
        ("NoSuchKey", 404, BlobNotFound, False),
        ("NoSuchBucket", 404, BlobStoreUnavailable, False),
        ("SlowDown", 503, BlobStoreUnavailable, True),
        ("InternalError", 500, BlobStoreUnavailable, True),
        ("AccessDenied", 403, BlobStoreUnavailable, False),
        # A full store is 507 insufficient_storage, not the 503 of an unreachable one.
        ("XMinioStorageFull", 507, BlobStoreFull, True),
        ("QuotaExceeded", 403, BlobStoreFull, True),
        ("", 507, BlobStoreFull, True),
        ("EntityTooLarge", 400, BlobStoreUnavailable, False),
    ],
)
def test_s3_error_mapping(code: str, status: int, expected: type, retryable: bool) -> None:
    mapped = map_s3_error(_client_error(code, status), op="read a blob", sha256=ABSENT)
    assert type(mapped) is expected
    assert getattr(mapped, "retryable", None) is retryable


def test_factory_builds_both_kinds(tmp_path: Path) -> None:
    assert isinstance(build_blob_store("local", root=str(tmp_path)), LocalBlobStore)
    s3 = build_blob_store("s3", bucket="b", endpoint_url="http://127.0.0.1:1", path_style=True)
    assert isinstance(s3, S3BlobStore)
    with pytest.raises(TypeError):
        build_blob_store("local", root=tmp_path, bucket="b")
    with pytest.raises(ValueError):
        build_blob_store("gcs", root=tmp_path)  # type: ignore[arg-type]


async def _time_unavailable(label: str, call: Any) -> float:
    started = time.monotonic()
    with pytest.raises(BlobStoreUnavailable) as raised:
        await call
    elapsed = time.monotonic() - started
    assert raised.value.retryable, label
    print(f"S3 down: {label} raised BlobStoreUnavailable after {elapsed:.2f}s")
    return elapsed


async def test_s3_outage_is_unavailable_then_recovers(tmp_path: Path) -> None:
    # Its own server: stopping the shared one would break other tests if this one failed.
    server = SeaweedS3(tmp_path / "seaweed")
    server.start()
    store = s3_store_for(server)
    try:
        before = make_blob_file(tmp_path, 2 * MIB)
        await store.put_file(before.sha256, before.path, before.size)
        server.stop()

        after = make_blob_file(tmp_path, MIB)
        timings = [
            await _time_unavailable("check()", store.check()),
            await _time_unavailable("size()", store.size(before.sha256)),
            await _time_unavailable("open_stream()", store.open_stream(before.sha256)),
            await _time_unavailable(
                "put_file()", store.put_file(after.sha256, after.path, after.size)
            ),
        ]
        assert max(timings) < 20

        started = time.monotonic()
        server.start()
        print(f"S3 restart ready after {time.monotonic() - started:.2f}s")
        await store.check()
        assert await read_all(store, before.sha256) == before.data
        await store.put_file(after.sha256, after.path, after.size)
        assert await read_all(store, after.sha256) == after.data

        # Hung, not down: connections are accepted and never answered.
        impatient = s3_store_for(server, bucket=store.bucket, read_timeout_s=1, max_attempts=2)
        server.pause()
        try:
            await _time_unavailable("check() on a hung S3", impatient.check())
        finally:
            server.resume()
            await impatient.close()
        await store.check()
    finally:
        await store.close()
        server.stop()


async def test_presigned_urls_name_the_public_endpoint(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    """The registry reaches S3 as 127.0.0.1; agents are told ``localhost``, and the URL
    is signed for that host (its signature covers the Host header)."""
    public = seaweed.endpoint_url.replace("127.0.0.1", "localhost")
    assert public != seaweed.endpoint_url
    settings = RegistrySettings(
        data_dir=tmp_path / "data", s3_endpoint=seaweed.endpoint_url,
        s3_public_endpoint=public + "/", s3_bucket=f"public-{os.getpid()}-{time.time_ns()}",
        s3_access_key=seaweed.access_key, s3_secret_key=seaweed.secret_key,
        s3_region=seaweed.region, s3_create_bucket=True,
    )
    store = build_blobs(settings)
    try:
        blob = make_blob_file(tmp_path, MIB)
        await store.put_file(blob.sha256, blob.path, blob.size)
        url = await store.presigned_url(blob.sha256, filename="a.bin", expires_s=60)
        assert url is not None and url.startswith(public + "/"), url
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.get(url)
            assert response.status_code == 200 and response.content == blob.data
            inside = url.replace(public, seaweed.endpoint_url, 1)
            assert (await client.get(inside)).status_code == 403
    finally:
        await store.close()
