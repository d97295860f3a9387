"""The page's version endpoints: one version's details with its config, and the diff of
two versions (config keys, files, sizes), tenant-scoped like the rest of /ui."""

from __future__ import annotations

from pathlib import Path

from devharness.registry import RegistryHarness
from tests.registry.auth.principals import assert_error
from tests.registry.ui.support import OTHER, OWN, push, scene


async def test_a_version_shows_its_shape_files_and_config(registry: RegistryHarness,
                                                          tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    reader = await registry.token("reader", OWN)
    response = await registry.client.get("/ui/api/adapters/bot/versions/1", headers=reader)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["adapter"], body["version"], body["rank"], body["alpha"]) == ("bot", 1, 8, 16)
    assert body["target_modules"] == ["q_proj", "v_proj"]
    assert (body["base_model"], body["uploader"], body["notes"]) == \
        ("tiny-llama", "bootstrap-admin", "first cut")
    sizes = {f["name"]: f["size"] for f in body["files"]}
    assert set(sizes) == {"adapter_config.json", "adapter_model.safetensors"}
    assert sum(sizes.values()) == body["total_size"]
    assert body["config"]["peft_type"] == "LORA"
    assert (body["config"]["r"], body["config"]["lora_alpha"]) == (8, 16)


async def test_the_diff_of_two_versions(registry: RegistryHarness, tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    await push(registry, "bot", tmp_path / "bot2", 5, rank=16, targets=("q_proj", "k_proj"),
               extra_config={"lora_dropout": 0.1})
    response = await registry.client.get("/ui/api/adapters/bot/diff?base=1&head=2",
                                         headers=await registry.token("reader", OWN))
    assert response.status_code == 200, response.text
    diff = response.json()
    assert (diff["adapter"], diff["base"], diff["head"]) == ("bot", 1, 2)
    config = {c["key"]: (c["change"], c["before"], c["after"]) for c in diff["config"]}
    assert config["r"] == ("changed", 8, 16)
    assert config["target_modules"][0] == "changed"
    assert config["lora_dropout"][0] in ("added", "changed")
    assert "peft_type" not in config  # unchanged keys are left out
    files = {f["name"]: f for f in diff["files"]}
    weights = files["adapter_model.safetensors"]
    assert weights["change"] == "changed"
    assert weights["after_size"] > weights["before_size"]  # twice the rank
    assert diff["head_size"] > diff["base_size"]
    same = await registry.client.get("/ui/api/adapters/bot/diff?base=2&head=2",
                                     headers=registry.admin_headers)
    assert same.json()["config"] == []
    assert {f["change"] for f in same.json()["files"]} == {"same"}


async def test_versions_of_another_tenant_are_not_found(registry: RegistryHarness,
                                                        tmp_path: Path) -> None:
    await scene(registry, tmp_path)
    other = await registry.token("admin", OTHER)
    for path in ("/ui/api/adapters/bot/versions/1", "/ui/api/adapters/bot/diff?base=1&head=1"):
        assert_error(await registry.client.get(path, headers=other), 404, "adapter_not_found")
    assert_error(await registry.client.get("/ui/api/adapters/bot/versions/9",
                                           headers=registry.admin_headers),
                 404, "version_not_found")
    assert_error(await registry.client.get("/ui/api/adapters/bot/diff?base=1&head=9",
                                           headers=registry.admin_headers),
                 404, "version_not_found")
    for bad in ("base=0&head=1", "base=1", "base=x&head=1"):
        assert_error(await registry.client.get(f"/ui/api/adapters/bot/diff?{bad}",
                                               headers=registry.admin_headers),
                     422, "invalid_request")


async def test_a_reader_may_not_move_an_alias(registry: RegistryHarness,
                                              tmp_path: Path) -> None:
    """The page hides promote and rollback from a reader; the registry refuses them too."""
    await scene(registry, tmp_path)
    await push(registry, "bot", tmp_path / "bot2", 5, aliases="")
    reader = await registry.token("reader", OWN)
    put = await registry.client.put("/v1/adapters/bot/aliases/live",
                                    json={"version": 2, "expected_revision": 1}, headers=reader)
    assert_error(put, 403, "insufficient_role")
    back = await registry.client.post("/v1/adapters/bot/aliases/live/rollback",
                                      json={"expected_revision": 1}, headers=reader)
    assert_error(back, 403, "insufficient_role")
