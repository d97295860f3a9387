"""Publishing versions: the happy path, idempotency, history and downloads."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import httpx

from devharness.adapters import make_adapter
from devharness.registry import RegistryHarness
from devharness.uploads import count_rows, stored_blobs, upload, upload_dir
from loraplane.digest import version_digest


async def test_push_creates_version_moves_live_and_records_events(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("support-bot")
    folder = make_adapter(tmp_path / "a", rank=8, seed=1)
    response = await upload_dir(registry, "support-bot", folder, notes="first")
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["version"], body["created"], body["rank"]) == (1, True, 8)
    assert body["notes"] == "first" and body["uploader"] == "bootstrap-admin"
    assert [(a["alias"], a["version"], a["revision"]) for a in body["aliases"]] == [("live", 1, 1)]
    expected = {}
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        data = (folder / name).read_bytes()
        expected[name] = (len(data), hashlib.sha256(data).hexdigest())
    assert {f["name"]: (f["size"], f["sha256"]) for f in body["files"]} == expected
    assert body["digest"] == version_digest((n, s, h) for n, (s, h) in expected.items())
    assert len(await stored_blobs(registry)) == 2
    events = (await registry.client.get("/v1/events", headers=registry.admin_headers)).json()
    types = [(e["type"], e.get("alias"), e.get("version")) for e in events["events"]]
    assert types == [("adapter_created", None, None), ("version_published", None, None),
                     ("adapter_updated", "live", 1)]
    updated = events["events"][2]
    assert updated["target"]["digest"] == body["digest"]
    assert updated["previous_version"] is None and updated["revision"] == 1
    assert {f["name"] for f in updated["files"]} == set(expected)


async def test_an_upload_without_aliases_stores_and_serves_nothing(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    """Storing is not serving: no ``aliases`` field (as an empty one) moves no alias."""
    await registry.create_adapter("bot")
    for seed, aliases in ((1, None), (2, "")):
        folder = make_adapter(tmp_path / f"a{seed}", seed=seed)
        response = await upload_dir(registry, "bot", folder, aliases=aliases)
        assert response.status_code == 201, response.text
        assert response.json()["aliases"] == []
    shown = (await registry.client.get("/v1/adapters/bot", headers=registry.admin_headers))
    assert shown.json()["aliases"] == []
    events = (await registry.client.get("/v1/events", headers=registry.admin_headers)).json()
    assert "adapter_updated" not in [e["type"] for e in events["events"]]


async def test_identical_reupload_is_idempotent(registry: RegistryHarness,
                                                tmp_path: Path) -> None:
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "a", seed=1)
    first = await upload_dir(registry, "bot", folder)
    assert first.status_code == 201
    rows_before = await count_rows(registry)
    again = await upload_dir(registry, "bot", folder)
    assert again.status_code == 200, again.text
    assert again.json()["version"] == 1 and again.json()["created"] is False
    assert again.json()["aliases"][0]["changed"] is False
    assert await count_rows(registry) == rows_before


async def test_new_content_is_a_new_version_and_moves_the_alias(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    first = await upload_dir(registry, "bot", make_adapter(tmp_path / "1", seed=1))
    assert first.status_code == 201
    second = await upload_dir(registry, "bot", make_adapter(tmp_path / "2", seed=2),
                              aliases="live,canary")
    assert second.status_code == 201
    moves = {a["alias"]: (a["version"], a["previous_version"]) for a in second.json()["aliases"]}
    assert moves == {"live": (2, 1), "canary": (2, None)}
    shown = (await registry.client.get("/v1/adapters/bot", headers=registry.admin_headers)).json()
    assert {a["alias"]: a["version"] for a in shown["aliases"]} == {"canary": 2, "live": 2}
    assert shown["latest_version"] == 2


async def test_history_is_newest_first_with_keyset_pagination(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    registry = embedded_registry
    await registry.create_adapter("bot")
    for seed in range(5):
        response = await upload_dir(registry, "bot", make_adapter(tmp_path / str(seed), seed=seed))
        assert response.status_code == 201
    seen: list[int] = []
    cursor: str | None = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await registry.client.get("/v1/adapters/bot/versions", params=params,
                                          headers=registry.admin_headers)).json()
        seen += [v["version"] for v in page["versions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [5, 4, 3, 2, 1]
    bad = await registry.client.get("/v1/adapters/bot/versions", params={"cursor": "x"},
                                    headers=registry.admin_headers)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"


async def test_files_download_matches_upload(registry: RegistryHarness, tmp_path: Path) -> None:
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "a", seed=3)
    assert (await upload_dir(registry, "bot", folder)).status_code == 201
    url = "/v1/adapters/bot/versions/1/files/adapter_model.safetensors"
    response = await registry.client.get(url, headers=registry.admin_headers)
    if registry.backend == "postgres_s3":
        assert response.status_code == 307
        location = response.headers["location"]
        async with httpx.AsyncClient() as direct:
            fetched = await direct.get(location)
            assert fetched.status_code == 200
            content = fetched.content
            tampered = await direct.get(location.replace("Expires=", "Expires=1"))
            assert tampered.status_code == 403
    else:
        assert response.status_code == 200
        content = response.content
    assert content == (folder / "adapter_model.safetensors").read_bytes()
    missing = await registry.client.get("/v1/adapters/bot/versions/1/files/other.bin",
                                        headers=registry.admin_headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"


async def test_archive_upload_is_the_same_version_as_loose_files(
    registry: RegistryHarness, tmp_path: Path
) -> None:
    await registry.create_adapter("bot")
    folder = make_adapter(tmp_path / "adapter", seed=4)
    archive = tmp_path / "adapter.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="adapter")
    first = await upload(registry, "bot", [("files", ("adapter.tar.gz", archive.read_bytes()))])
    assert first.status_code == 201, first.text
    loose = await upload_dir(registry, "bot", folder)
    assert loose.status_code == 200 and loose.json()["version"] == 1
    config = json.loads((folder / "adapter_config.json").read_text())
    assert first.json()["rank"] == config["r"]
