"""The local image builder's cache keys: what changes a key, and what does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from devharness import images
from devharness.images import NATS, ROOT, Image, context_files, debian_mirror, recipe_hash


def test_mirror_from_deb822_skips_security(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n")
    assert debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_mirror_from_one_line_format(tmp_path: Path) -> None:
    (tmp_path / "local.list").write_text(
        "# a comment\ndeb [arch=amd64] http://mirror.example/debian bookworm main\n")
    assert debian_mirror(tmp_path) == "http://mirror.example/debian"


def test_context_is_the_dockerfiles_context() -> None:
    names = {str(path.relative_to(ROOT)) for path in context_files()}
    assert "pyproject.toml" in names
    assert any(n.startswith("registry_service/") for n in names)
    assert not any(n.startswith(("tests/", "devharness/", "docs/")) for n in names)
    assert not any("__pycache__" in n for n in names)


def test_recipe_hash_follows_recipe_files_binaries_and_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = tmp_path / "recipes" / "thing"
    recipe.mkdir(parents=True)
    (recipe / "Dockerfile").write_text("FROM base\n")
    binary = tmp_path / "tool"
    binary.write_bytes(b"v1")
    monkeypatch.setattr(images, "RECIPES", tmp_path / "recipes")
    image = Image("thing", "local/thing:1", "thing", {"tool": binary})

    first = recipe_hash(image, "base-1", "http://m")
    assert recipe_hash(image, "base-1", "http://m") == first
    assert recipe_hash(image, "base-2", "http://m") != first
    (recipe / "Dockerfile").write_text("FROM base\nRUN true\n")
    second = recipe_hash(image, "base-1", "http://m")
    assert second != first
    binary.write_bytes(b"v2")
    assert recipe_hash(image, "base-1", "http://m") != second


def test_every_recipe_exists() -> None:
    for image in images.IMAGES:
        if image.recipe:
            assert (images.RECIPES / image.recipe / "Dockerfile").is_file(), image
    assert NATS.binaries
