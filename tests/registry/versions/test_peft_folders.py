"""Folders as PEFT's ``save_pretrained`` writes them are accepted unchanged.

``base_model_name_or_path`` holds the local path the base was loaded from, or null,
and a ``README.md`` lies next to the adapter: none of it needs editing. Whether an
adapter belongs to the registered base model is judged by its tensors' shapes.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest

from devharness.adapters import make_adapter, make_base_config
from devharness.peft_adapters import base_model_name, peft_save_pretrained
from devharness.registry import RegistryHarness
from devharness.services import NatsService
from devharness.uploads import stored_blobs, upload
from devharness.vllm import ensure_vllm_env
from tests.conftest import _registry

Parts = list[tuple[str, tuple[str, bytes]]]
Form = Literal["folder", "zip", "tar.gz"]
FORMS: tuple[Form, ...] = ("folder", "zip", "tar.gz")
SAVED = ("README.md", "adapter_config.json", "adapter_model.safetensors")


def parts_of(folder: Path, form: Form) -> Parts:
    """The folder's every file, sent as it is or packed into one archive."""
    files = {name: (folder / name).read_bytes() for name in SAVED if (folder / name).exists()}
    if form == "folder":
        return [("files", (name, data)) for name, data in files.items()]
    buffer = io.BytesIO()
    if form == "zip":
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in files.items():
                archive.writestr(f"{folder.name}/{name}", data)
    else:
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(f"{folder.name}/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return [("files", (f"adapter.{form}", buffer.getvalue()))]


def save_pretrained_like(folder: Path, base_model: str | None, **shape: int) -> Path:
    make_adapter(folder, base_model=base_model, **shape)  # type: ignore[arg-type]
    (folder / "README.md").write_text("---\nbase_model: x\nlibrary_name: peft\n---\n")
    return folder


@pytest.fixture
async def shaped_registry(request: pytest.FixtureRequest, tmp_path: Path,
                          nats: NatsService) -> AsyncIterator[RegistryHarness]:
    """A registry that knows the shapes of tiny-llama (hidden 128, 2 layers)."""
    config = make_base_config(tmp_path / "tiny-llama.json")
    async for harness in _registry(request, "embedded", tmp_path, nats,
                                   base_model_configs={"tiny-llama": config}):
        yield harness


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("base_model", ["/home/me/runs/base", None])
async def test_path_or_null_and_readme_accepted_unchanged(
    registry: RegistryHarness, tmp_path: Path, form: Form, base_model: str | None
) -> None:
    await registry.create_adapter("bot")
    folder = save_pretrained_like(tmp_path / "out", base_model)
    response = await upload(registry, "bot", parts_of(folder, form))
    assert response.status_code == 201, response.text
    assert sorted(f["name"] for f in response.json()["files"]) == list(SAVED[1:])
    assert len(await stored_blobs(registry)) == 2


async def test_folder_zip_and_tar_give_one_version(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    await embedded_registry.create_adapter("bot")
    folder = save_pretrained_like(tmp_path / "out", None)
    digests = set()
    for form in FORMS:
        response = await upload(embedded_registry, "bot", parts_of(folder, form))
        assert response.status_code in (200, 201), response.text
        digests.add((response.json()["version"], response.json()["digest"]))
    assert len(digests) == 1


async def test_readme_next_to_an_archive_is_ignored_too(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    await embedded_registry.create_adapter("bot")
    folder = save_pretrained_like(tmp_path / "out", None)
    parts = [*parts_of(folder, "zip"), ("files", ("README.md", b"# notes\n"))]
    response = await upload(embedded_registry, "bot", parts)
    assert response.status_code == 201, response.text
    assert len(response.json()["files"]) == 2


@pytest.mark.parametrize("base_model", ["meta-llama/Llama-3.2-1B", "/data/base", None])
async def test_known_shapes_decide_not_the_name(
    shaped_registry: RegistryHarness, tmp_path: Path, base_model: str | None
) -> None:
    await shaped_registry.create_adapter("bot")
    folder = save_pretrained_like(tmp_path / "out", base_model)
    response = await upload(shaped_registry, "bot", parts_of(folder, "tar.gz"))
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("form", FORMS)
async def test_another_shape_is_refused_with_a_fix(
    shaped_registry: RegistryHarness, tmp_path: Path, form: Form
) -> None:
    await shaped_registry.create_adapter("bot")
    # Named after the registered base model, but made for a hidden-64 Llama.
    folder = save_pretrained_like(tmp_path / "out", "tiny-llama", hidden=64, intermediate=128)
    response = await upload(shaped_registry, "bot", parts_of(folder, form))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "shape_mismatch"
    assert "maps 64 -> 64 features but the base model's maps 128 -> 128" in error["message"]
    assert "trained for another model than base model 'tiny-llama'" in error["message"]
    assert error["detail"]["expected_in_features"] == 128


async def test_other_model_name_refused_with_a_fix_when_shapes_are_unknown(
    embedded_registry: RegistryHarness, tmp_path: Path
) -> None:
    await embedded_registry.create_adapter("bot")
    folder = save_pretrained_like(tmp_path / "out", "mistralai/Mistral-7B-v0.1")
    response = await upload(embedded_registry, "bot", parts_of(folder, "folder"))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "base_model_mismatch"
    assert "--base-model mistralai/Mistral-7B-v0.1" in error["message"]


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return ensure_vllm_env(install=True)


@pytest.mark.vllm
@pytest.mark.parametrize("source", ["path", "config"])
async def test_real_save_pretrained_output_is_accepted_unchanged(
    shaped_registry: RegistryHarness, vllm_python: Path, tmp_path: Path,
    source: Literal["path", "config"],
) -> None:
    folder = peft_save_pretrained(vllm_python, tmp_path / "adapter", source=source)
    assert sorted(p.name for p in folder.iterdir()) == list(SAVED)
    expected = str(tmp_path / "adapter-base") if source == "path" else None
    assert base_model_name(folder) == expected
    before = (folder / "adapter_config.json").read_bytes()
    await shaped_registry.create_adapter("bot")
    for form in FORMS:
        response = await upload(shaped_registry, "bot", parts_of(folder, form))
        assert response.status_code in (200, 201), (form, response.text)
        assert response.json()["version"] == 1
    assert (folder / "adapter_config.json").read_bytes() == before
    stored = json.loads((folder / "adapter_config.json").read_text())
    assert stored["base_model_name_or_path"] == expected


@pytest.mark.vllm
async def test_real_save_pretrained_of_another_model_is_refused(
    shaped_registry: RegistryHarness, vllm_python: Path, tmp_path: Path
) -> None:
    folder = peft_save_pretrained(vllm_python, tmp_path / "wide", hidden=256)
    await shaped_registry.create_adapter("bot")
    for form in FORMS:
        response = await upload(shaped_registry, "bot", parts_of(folder, form))
        assert response.status_code == 422, (form, response.text)
        assert response.json()["error"]["code"] == "shape_mismatch"
        assert "maps 256 -> 256 features" in response.json()["error"]["message"]
