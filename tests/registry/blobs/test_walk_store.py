"""The local store's walks in a child process: what they list and sweep, a failing walk,
and a listing left early."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from registry_service.blobs import LocalBlobStore, local
from registry_service.errors import BlobStoreUnavailable

A, B, C = "a" * 64, "b" * 64, "c" * 64


def blob_file(root: Path, name: str, mtime: float | None = None) -> Path:
    path = root / "sha256" / name[:2] / name[2:4] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


async def test_the_listing_names_exactly_the_blob_files_with_their_times(
    local_store: LocalBlobStore,
) -> None:
    root = local_store.root
    blob_file(root, A, mtime=1_700_000_000.25)
    blob_file(root, B)
    shard = blob_file(root, C).parent
    (shard / f".{C}.tmp").write_bytes(b"half")  # a blob being written
    (shard / ("D" * 64)).write_bytes(b"x")  # not a digest: upper case
    (shard / ("c" * 63)).write_bytes(b"x")  # not a digest: too short
    (shard / ("e" * 64)).mkdir()  # a directory named like one
    (shard / ("f" * 64)).symlink_to(shard / C)  # a link, not a stored blob

    listed = {blob.sha256: blob.modified async for blob in local_store.list_blobs()}

    assert set(listed) == {A, B, C}
    assert listed[A].timestamp() == pytest.approx(1_700_000_000.25, abs=1e-6)


async def test_an_empty_or_missing_store_lists_nothing(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "never-made")
    assert [blob async for blob in store.list_blobs()] == []
    assert await store.sweep_incomplete(0) == 0


async def test_the_sweep_removes_only_old_temporary_files(
    local_store: LocalBlobStore,
) -> None:
    root = local_store.root
    shard = blob_file(root, A).parent
    old, young = shard / f".{B}.tmp", root / ".upload-1.tmp"
    for path in (old, young):
        path.write_bytes(b"half")
    os.utime(old, (1_000_000_000, 1_000_000_000))

    assert await local_store.sweep_incomplete(3600.0) == 1

    assert not old.exists() and young.exists()
    assert {blob.sha256 async for blob in local_store.list_blobs()} == {A}


async def test_a_walk_that_fails_is_the_store_unavailable(
    local_store: LocalBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing = tmp_path / "failing_walk.py"
    failing.write_text("import sys\nsys.stderr.write('cannot read the disk')\nsys.exit(3)\n")
    monkeypatch.setattr(local, "WALK_SCRIPT", str(failing))

    with pytest.raises(BlobStoreUnavailable) as refused:
        [blob async for blob in local_store.list_blobs()]

    assert refused.value.detail == {"exit_code": 3, "stderr": "cannot read the disk"}


async def test_a_listing_left_early_kills_its_walk(
    local_store: LocalBlobStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for i in range(8000):  # far more than the pipes hold: the walk is still writing
        blob_file(local_store.root, f"{i:064x}")
    children: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def recorded(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        child = await spawn(*args, **kwargs)
        children.append(child)
        return child

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recorded)
    listing = local_store.list_blobs()
    assert isinstance(listing, AsyncIterator)
    await anext(listing)
    [child] = children
    assert child.returncode is None

    await listing.aclose()  # type: ignore[attr-defined]

    assert child.returncode is not None
    assert child.returncode < 0 or sys.platform == "win32"  # killed, not finished
