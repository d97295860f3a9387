"""The README and docs/ point only at files of this repository, and at headings that exist.

A reader of the repository has nothing beside it: a link or a named ``.md`` file must
resolve inside the checkout (from the page's folder or the repository's root), and a
link's ``#anchor`` must be a heading of the page it names (GitHub's slugs).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.doc_blocks import ROOT, doc_files

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_NAMED_MD = re.compile(r"`([^`\s]+\.md)`")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
_FENCED = re.compile(r"^```.*?^```$", re.M | re.S)


def _text(path: Path) -> str:
    """The page without its code blocks (a ``#`` there is a comment, not a heading)."""
    return _FENCED.sub("", path.read_text())


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in _HEADING.findall(_text(path))}


def _resolve(page: Path, target: str) -> Path | None:
    """``target`` from the page's folder, else from the root; None when neither exists."""
    for base in (page.parent, ROOT):
        candidate = (base / target).resolve()
        if candidate.exists():
            return candidate
    return None


def _inside(path: Path) -> bool:
    return path.is_relative_to(ROOT)


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: p.name)
def test_links_resolve_inside_the_repository(page: Path) -> None:
    for target in _LINK.findall(_text(page)):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        found = _resolve(page, file_part) if file_part else page
        assert found is not None and _inside(found), f"{page.name}: {target} is not in the repo"
        if anchor and found.suffix == ".md":
            assert anchor in anchors(found), f"{page.name}: no heading #{anchor} in {found.name}"


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: p.name)
def test_named_pages_are_in_the_repository(page: Path) -> None:
    for name in _NAMED_MD.findall(page.read_text()):
        found = _resolve(page, name)
        assert found is not None and _inside(found), f"{page.name} names {name}: not in the repo"


def test_the_slugs_are_githubs() -> None:
    assert slug("In production: Postgres, S3 and NATS") == "in-production-postgres-s3-and-nats"
    assert slug("Placement: which agents keep an adapter hot") == \
        "placement-which-agents-keep-an-adapter-hot"


_CODE_POINTER = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")
_PACKAGES = ("registry_service", "inference_agent", "loraplane", "loraplane_cli",
             "devharness", "bench")


def test_pointers_from_the_code_name_a_heading() -> None:
    """A comment's ``Why: docs/decisions.md#anchor`` leads to a heading of that page."""
    pointers = [(path, page, anchor) for package in _PACKAGES
                for path in sorted((ROOT / package).rglob("*.py"))
                for page, anchor in _CODE_POINTER.findall(path.read_text())]
    assert pointers, "no pointers found: the pattern no longer matches the code's"
    missing = [f"{path.relative_to(ROOT)}: docs/{page}#{anchor}"
               for path, page, anchor in pointers
               if not (ROOT / "docs" / page).exists()
               or anchor not in anchors(ROOT / "docs" / page)]
    assert missing == []
