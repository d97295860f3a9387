"""BlobFetcher.download against a real S3 (SeaweedFS): a file of several chunks is
written and hashed one chunk behind the socket; what does not match is never taken."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devharness.services import SeaweedS3
from inference_agent.node import blob_fetch
from inference_agent.node.blob_fetch import BlobFetcher, DirectFetchFailed
from loraplane.client._core import DOWNLOAD_CHUNK

# Three and a half chunks: the last write is a partial one.
BODY = os.urandom(3 * DOWNLOAD_CHUNK + DOWNLOAD_CHUNK // 2)
SMALL = os.urandom(1000)


@pytest.fixture
async def urls(seaweed: SeaweedS3) -> dict[str, str]:
    """Presigned GETs of a large and a small object."""
    client = seaweed.client()
    bucket = "blob-save-" + secrets.token_hex(4)

    def put() -> dict[str, str]:
        client.create_bucket(Bucket=bucket)
        found = {}
        for key, body in (("large", BODY), ("small", SMALL)):
            client.put_object(Bucket=bucket, Key=key, Body=body)
            found[key] = client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=600)
        return found
    return await asyncio.to_thread(put)


@pytest.fixture
async def fetcher() -> AsyncIterator[BlobFetcher]:
    fetcher = BlobFetcher()
    try:
        yield fetcher
    finally:
        await fetcher.aclose()


def writers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of every chunk written."""
    seen: list[int] = []
    write = blob_fetch._write

    def watched(*args: object) -> None:
        seen.append(threading.get_ident())
        write(*args)  # type: ignore[arg-type]
    monkeypatch.setattr(blob_fetch, "_write", watched)
    return seen


async def test_a_large_file_is_written_in_a_worker_thread_a_small_one_on_the_loop(
        urls: dict[str, str], fetcher: BlobFetcher, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = writers(monkeypatch)
    counted: list[int] = []
    await fetcher.download(urls["large"], tmp_path / "large", size=len(BODY),
                           sha256=hashlib.sha256(BODY).hexdigest(), on_bytes=counted.append)
    assert (tmp_path / "large").read_bytes() == BODY and sum(counted) == len(BODY)
    loop_thread = threading.get_ident()
    assert len(seen) >= 4 and loop_thread not in seen
    seen.clear()
    await fetcher.download(urls["small"], tmp_path / "small", size=len(SMALL),
                           sha256=hashlib.sha256(SMALL).hexdigest())
    assert (tmp_path / "small").read_bytes() == SMALL and set(seen) == {loop_thread}


async def test_a_large_file_longer_than_its_size_is_refused_mid_stream(
        urls: dict[str, str], fetcher: BlobFetcher, tmp_path: Path) -> None:
    # Refused by the write of the chunk that crosses the size, in the worker thread.
    with pytest.raises(DirectFetchFailed) as info:
        await fetcher.download(urls["large"], tmp_path / "large", size=2 * DOWNLOAD_CHUNK,
                               sha256=hashlib.sha256(BODY).hexdigest())
    assert info.value.reason == "mismatch" and "larger" in str(info.value)
    assert (tmp_path / "large").stat().st_size <= 3 * DOWNLOAD_CHUNK


async def test_a_large_file_with_another_sha256_is_refused(
        urls: dict[str, str], fetcher: BlobFetcher, tmp_path: Path) -> None:
    with pytest.raises(DirectFetchFailed) as info:
        await fetcher.download(urls["large"], tmp_path / "large", size=len(BODY),
                               sha256="0" * 64)
    assert info.value.reason == "mismatch" and "sha256" in str(info.value)
