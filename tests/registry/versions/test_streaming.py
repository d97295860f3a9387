"""The weights stream straight to the blob store: with a declared digest to their final
key, without one through a temporary key; a refusal at any point leaves nothing."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import (
    count_rows,
    declared_parts,
    open_uploads,
    staging_leftovers,
    stored_blobs,
    upload_declared,
    upload_dir,
)
from registry_service.blobs.base import blob_key


def big_adapter(folder: Path, **options: Any) -> Path:
    """Over one 5 MiB part of the S3 store: the weights go up as a multipart upload."""
    return make_adapter(folder, hidden=1024, intermediate=2048, rank=64, layers=12, **options)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _nothing_left(registry: RegistryHarness) -> None:
    assert await count_rows(registry) == (0, 1)  # adapter_created only
    assert await stored_blobs(registry) == []
    assert await open_uploads(registry) == []
    assert staging_leftovers(registry) == []


async def test_declared_digest_streams_to_the_final_key(registry: RegistryHarness,
                                                        tmp_path: Path) -> None:
    await registry.create_adapter("bot")
    folder = big_adapter(tmp_path / "a", seed=3)
    response = await upload_declared(registry, "bot", declared_parts(folder))
    assert response.status_code == 201, response.text
    weights = folder / "adapter_model.safetensors"
    assert weights.stat().st_size > 8 * 1024 * 1024
    files = {f["name"]: f["sha256"] for f in response.json()["files"]}
    assert files["adapter_model.safetensors"] == _sha(weights)
    assert await stored_blobs(registry) == sorted(
        blob_key(sha) for sha in files.values())
    assert await open_uploads(registry) == []
    assert staging_leftovers(registry) == []
    again = await upload_declared(registry, "bot", declared_parts(folder))
    assert again.status_code == 200 and again.json()["created"] is False, again.text


async def test_undeclared_upload_lands_under_its_digest_only(registry: RegistryHarness,
                                                             tmp_path: Path) -> None:
    await registry.create_adapter("bot")
    folder = big_adapter(tmp_path / "a", seed=4)
    response = await upload_dir(registry, "bot", folder)
    assert response.status_code == 201, response.text
    shas = [f["sha256"] for f in response.json()["files"]]
    # No temporary object stays beside the blobs.
    assert await stored_blobs(registry) == sorted(blob_key(sha) for sha in shas)
    assert await open_uploads(registry) == []


async def test_a_wrong_declared_digest_is_refused_and_leaves_nothing(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    folder = big_adapter(tmp_path / "a", seed=5)
    config, weights = declared_parts(folder)
    lying = dataclasses.replace(weights, sha256=hashlib.sha256(b"other").hexdigest())
    response = await upload_declared(registry, "bot", [config, lying])
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "digest_mismatch"
    assert error["detail"]["file"] == "adapter_model.safetensors"
    await _nothing_left(registry)


async def test_nothing_is_left_before_the_first_write(registry: RegistryHarness) -> None:
    # The S3 bucket comes with the registry's first write: an upload refused before one
    # leaves no bucket, and "nothing left" must read that as nothing (CI beside two busy
    # loops once failed the test below on NoSuchBucket).
    await registry.create_adapter("bot")
    await _nothing_left(registry)


async def test_a_malformed_content_digest_is_a_400(registry: RegistryHarness,
                                                   tmp_path: Path) -> None:
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "a", seed=6)
    boundary = "b0undary"
    weights = (folder / "adapter_model.safetensors").read_bytes()
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; "
            "filename=\"adapter_model.safetensors\"\r\nContent-Digest: sha-256=:bm90:\r\n\r\n"
            ).encode() + weights + f"\r\n--{boundary}--\r\n".encode()
    response = await registry.client.post(
        "/v1/adapters/bot/versions", content=body, timeout=60,
        headers={**registry.admin_headers,
                 "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_digest"
    await _nothing_left(registry)


async def test_nan_in_the_last_part_aborts_the_multipart_upload(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    """The first parts are already in S3 when the NaN arrives: they are discarded."""
    await registry.create_adapter("bot")
    for declared in (True, False):
        folder = big_adapter(tmp_path / f"nan-{declared}", seed=7, inject="nan")
        if declared:
            response = await upload_declared(registry, "bot", declared_parts(folder))
        else:
            response = await upload_dir(registry, "bot", folder)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "non_finite_values"
        await _nothing_left(registry)


async def test_a_refusal_after_every_byte_arrived_leaves_no_upload_open(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    """The weights are sound but the config names another base model: refused once every
    byte (and every part of the multipart upload) is in."""
    await registry.create_adapter("bot", base_model="another-model")
    folder = big_adapter(tmp_path / "a", seed=8, base_model="tiny-llama")
    response = await upload_dir(registry, "bot", folder)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "base_model_mismatch"
    await _nothing_left(registry)
