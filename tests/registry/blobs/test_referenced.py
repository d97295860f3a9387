"""The collector's read of the digests versions name: done by the database, a page of
versions at a time, on both backends."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from sqlalchemy import select

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import adapter_parts
from registry_service.blobs import referenced
from registry_service.blobs.referenced import ReferencedDigests, read_referenced
from registry_service.versions.models import Version


async def test_every_named_digest_is_found_across_pages(
    registry: RegistryHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    await registry.create_adapter("paged")
    for seed in range(5):
        response = await registry.client.post(
            "/v1/adapters/paged/versions",
            files=adapter_parts(make_adapter(tmp_path / str(seed), seed=seed)),
            headers=registry.admin_headers)
        assert response.status_code == 201, response.text
    async with registry.ctx.db.session() as session:
        named = {str(f["sha256"]) for files in await session.scalars(select(Version.files))
                 for f in files}
    assert len(named) >= 6  # five weights files, one or more configs
    monkeypatch.setattr(referenced, "PAGE_VERSIONS", 2)  # five versions: three pages

    found = await read_referenced(registry.ctx.db)

    assert all(sha in found for sha in named)
    assert len(found) == len(named)
    assert hashlib.sha256(b"nobody names this").hexdigest() not in found


async def test_an_empty_registry_names_nothing(registry: RegistryHarness) -> None:
    found = await read_referenced(registry.ctx.db)
    assert len(found) == 0
    assert hashlib.sha256(b"x").hexdigest() not in found


def test_prefixes_are_compared_whole() -> None:
    sha = hashlib.sha256(b"a").hexdigest()
    found = ReferencedDigests.of([int(sha[:16], 16)])
    assert sha in found
    assert sha[:15] + ("0" if sha[15] != "0" else "1") + sha[16:] not in found
    assert "not-hex-but-short" not in found and 42 not in found


def test_prefixes_from_every_bucket_are_found_once_each() -> None:
    """Gathered by top byte and sorted bucket by bucket: the whole array is in order."""
    rng = random.Random(7)
    digests = [f"{rng.getrandbits(256):064x}" for _ in range(20_000)]
    prefixes = [int(sha[:16], 16) for sha in digests]
    named = set(prefixes)
    found = ReferencedDigests.of(prefixes + prefixes[:500])  # repeats count once
    assert len(found) == len(named)
    assert all(sha in found for sha in digests)
    others = (f"{rng.getrandbits(256):064x}" for _ in range(2_000))
    assert not any(sha in found for sha in others if int(sha[:16], 16) not in named)
