"""The collector's metrics on a running registry's ``/metrics``: a pass is counted, its
blobs examined and deleted. (Its ``running`` gauge during a pass, and the examined
count moving page by page: test_gc_pages.py.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

from devharness.registry import RegistryHarness
from devharness.waiting import eventually
from tests.registry.test_metrics import read


async def start_up_pass_done(registry: RegistryHarness) -> bool:
    return (await read(registry, "blob_gc_pass_seconds_count") >= 1
            and await read(registry, "blob_gc_running") == 0)


async def test_a_pass_counts_what_it_examined_and_deleted(
    gc_registry: RegistryHarness, tmp_path: Path,
) -> None:
    registry = gc_registry
    await eventually(lambda: start_up_pass_done(registry), what="the start-up pass")
    names = ("blob_gc_pass_seconds_count", "blob_gc_blobs_examined_total",
             "blob_gc_deleted_total", "blob_gc_running")
    before = [await read(registry, name) for name in names]
    data = b"stored, then its upload failed"
    source = tmp_path / "orphan"
    source.write_bytes(data)
    await registry.ctx.blobs.put_file(hashlib.sha256(data).hexdigest(), source, len(data))

    response = await registry.client.post("/v1/admin/blob-gc", headers=registry.admin_headers)
    assert response.status_code == 200, response.text
    assert response.json()["deleted"] == 1

    after = [await read(registry, name) for name in names]
    examined = response.json()["examined"]
    assert examined >= 1
    assert after == [before[0] + 1, before[1] + examined, before[2] + 1, 0]
