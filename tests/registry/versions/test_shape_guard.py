"""A new version must face the base model of the adapter's current versions; archives
and folders drop the same harmless extras."""

from __future__ import annotations

from pathlib import Path

from devharness.adapters import make_adapter, pack_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import adapter_parts, count_rows, stored_blobs, upload, upload_dir


async def first_version(registry: RegistryHarness, tmp_path: Path) -> None:
    """Adapter ``bot`` with version 1: hidden size 128, rank 8, q_proj and v_proj."""
    await registry.create_adapter("bot")
    first = await upload_dir(registry, "bot", make_adapter(tmp_path / "a", seed=1))
    assert first.status_code == 201, first.text


async def test_another_hidden_size_is_refused_and_nothing_is_stored(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await first_version(registry, tmp_path)
    rows, blobs = await count_rows(registry), await stored_blobs(registry)
    small = make_adapter(tmp_path / "small", seed=2, hidden=64, intermediate=128)
    refused = await upload_dir(registry, "bot", small)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "shape_mismatch"
    assert error["detail"] == {
        "module": "model.layers.0.self_attn.q_proj", "version": 1,
        "in_features": 64, "out_features": 64,
        "expected_in_features": 128, "expected_out_features": 128}
    assert (await count_rows(registry), await stored_blobs(registry)) == (rows, blobs)
    allowed = await registry.client.post(
        "/v1/adapters/bot/versions", files=adapter_parts(small),
        data={"allow_shape_change": "true", "aliases": ""}, headers=registry.admin_headers)
    assert allowed.status_code == 201, allowed.text
    body = allowed.json()
    assert (body["version"], body["shape_change_allowed"], body["aliases"]) == (2, True, [])
    assert "accepted because allow_shape_change was set" in body["warnings"][-1]


async def test_another_rank_or_more_modules_is_no_shape_change(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await first_version(registry, tmp_path)
    for seed, shape in ((2, {"rank": 4}), (3, {"targets": ("q_proj", "v_proj", "o_proj")})):
        folder = make_adapter(tmp_path / f"v{seed}", seed=seed, **shape)
        response = await upload_dir(registry, "bot", folder)
        assert response.status_code == 201, response.text
        assert response.json()["shape_change_allowed"] is False


async def test_an_archive_drops_tokenizer_files_as_a_folder_push_does(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "out", seed=1)
    first = await upload_dir(registry, "bot", folder)
    assert first.status_code == 201, first.text
    for extra in ("tokenizer_config.json", "special_tokens_map.json", "README.md"):
        (folder / extra).write_text("{}")
    for fmt in ("tar.gz", "zip"):
        archive = pack_adapter(folder, tmp_path / f"out.{fmt}", fmt=fmt)
        again = await upload(registry, "bot", [("files", (archive.name, archive.read_bytes()))])
        assert again.status_code == 200, again.text
        assert (again.json()["version"], again.json()["digest"]) == (1, first.json()["digest"])


async def test_pickle_weights_get_a_hint_to_resave(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "out", seed=1)
    (folder / "adapter_model.safetensors").rename(folder / "adapter_model.bin")
    archive = pack_adapter(folder, tmp_path / "out.tar.gz")
    refused = await upload(registry, "bot", [("files", (archive.name, archive.read_bytes()))])
    assert refused.status_code == 422, refused.text
    assert "save_pretrained(path, safe_serialization=True)" in refused.json()["error"]["message"]


async def test_allow_shape_change_is_true_or_false(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    response = await registry.client.post(
        "/v1/adapters/bot/versions", files=adapter_parts(make_adapter(tmp_path / "a", seed=1)),
        data={"allow_shape_change": "maybe"}, headers=registry.admin_headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_field"


async def test_a_current_version_whose_blob_is_gone_does_not_block_uploads(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await first_version(registry, tmp_path)
    version = (await registry.client.get("/v1/adapters/bot/versions/1",
                                         headers=registry.admin_headers)).json()
    weights = next(f for f in version["files"] if f["name"] == "adapter_model.safetensors")
    await registry.ctx.blobs.delete(weights["sha256"])
    folder = make_adapter(tmp_path / "b", seed=2, hidden=64, intermediate=128)
    response = await upload_dir(registry, "bot", folder)
    assert response.status_code == 201, response.text
