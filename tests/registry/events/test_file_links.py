"""Small files carried in published events: which go, what the relay reads for them, and
what goes without (on the local blob store, which signs no URL but reads like any)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest

from registry_service.blobs.base import BlobStream
from registry_service.blobs.local import LocalBlobStore
from registry_service.errors import BlobStoreUnavailable
from registry_service.events import file_links
from registry_service.events.file_links import INLINE_MAX_BYTES, FileLinker


async def _stored(store: LocalBlobStore, tmp_path: Path, data: bytes) -> dict[str, Any]:
    sha = hashlib.sha256(data).hexdigest()
    source = tmp_path / sha
    source.write_bytes(data)
    await store.put_file(sha, source, len(data))
    return {"name": f"f-{len(data)}", "size": len(data), "sha256": sha, "url": "/v1/x"}


def _reads(store: LocalBlobStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    read: list[str] = []
    real = store.open_stream

    async def counted(sha256: str, chunk_size: int = 1 << 20) -> BlobStream:
        read.append(sha256)
        return await real(sha256, chunk_size)

    monkeypatch.setattr(store, "open_stream", counted)
    return read


async def test_small_files_go_inline_and_are_read_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    small = await _stored(store, tmp_path, b'{"r": 8}')
    edge = await _stored(store, tmp_path, b"x" * INLINE_MAX_BYTES)
    large = await _stored(store, tmp_path, b"y" * (INLINE_MAX_BYTES + 1))
    reads = _reads(store, monkeypatch)
    linker = FileLinker(store, expires_s=60)
    payload: dict[str, Any] = {"files": [small, edge, large], "target": {"files": [small]}}
    linked = await linker.link(payload)
    again = await linker.link(payload)
    for event in (linked, again):
        files = event["files"]
        assert base64.b64decode(files[0]["content"]) == b'{"r": 8}'
        assert base64.b64decode(files[1]["content"]) == b"x" * INLINE_MAX_BYTES
        assert "content" not in files[2]
        assert event["target"]["files"][0]["content"] == files[0]["content"]
    assert sorted(reads) == sorted([small["sha256"], edge["sha256"]])  # once each
    assert "content" not in payload["files"][0]  # the outbox row's JSON is untouched


async def test_a_blob_missing_or_wrong_in_the_store_goes_without(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    missing = await _stored(store, tmp_path, b"gone")
    store.path_for(missing["sha256"]).unlink()
    wrong = await _stored(store, tmp_path, b"right")
    store.path_for(wrong["sha256"]).write_bytes(b"wrong")
    linker = FileLinker(store, expires_s=60)
    linked = await linker.link({"files": [missing, wrong]})
    assert [f.get("content") for f in linked["files"]] == [None, None]
    assert [f["sha256"] for f in linked["files"]] == [missing["sha256"], wrong["sha256"]]


async def test_a_store_that_hangs_or_fails_holds_no_event_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay publishes as it links: a read that does not answer in time, or fails,
    leaves the file to its URL, and no read is tried again for a while."""
    monkeypatch.setattr(file_links, "INLINE_READ_TIMEOUT_S", 0.05)
    store = LocalBlobStore(tmp_path / "blobs")
    first = await _stored(store, tmp_path, b"one")
    second = await _stored(store, tmp_path, b"two")
    tried: list[str] = []
    never = asyncio.Event()

    async def hangs(sha256: str, chunk_size: int = 1 << 20) -> BlobStream:
        tried.append(sha256)
        await never.wait()
        raise AssertionError("unreachable")

    monkeypatch.setattr(store, "open_stream", hangs)
    linker = FileLinker(store, expires_s=60)
    linked = await linker.link({"files": [first, second]})
    assert [f.get("content") for f in linked["files"]] == [None, None]
    assert tried == [first["sha256"]]  # paused after the first: the second not tried
    assert [f.get("content") for f in (await linker.link({"files": [first]}))["files"]
            ] == [None]
    assert tried == [first["sha256"]]

    async def fails(sha256: str, chunk_size: int = 1 << 20) -> BlobStream:
        tried.append(sha256)
        raise BlobStoreUnavailable("down")

    monkeypatch.setattr(store, "open_stream", fails)
    other = FileLinker(store, expires_s=60)
    assert "content" not in (await other.link({"files": [second]}))["files"][0]
    assert "content" not in (await other.link({"files": [second]}))["files"][0]
    assert tried == [first["sha256"], second["sha256"]]


async def test_a_missing_blob_does_not_pause_the_others(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    missing = await _stored(store, tmp_path, b"gone")
    store.path_for(missing["sha256"]).unlink()
    present = await _stored(store, tmp_path, b"here")
    linked = await FileLinker(store, expires_s=60).link({"files": [missing, present]})
    assert "content" not in linked["files"][0]
    assert base64.b64decode(linked["files"][1]["content"]) == b"here"
