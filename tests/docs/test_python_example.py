"""docs/registry.md's Python example runs as written against a real registry.

It is run with nothing defined beforehand: the registry and the token come from where
a user's would, ``LORAPLANE_REGISTRY`` and ``LORAPLANE_TOKEN`` (or ``loraplane login``'s
profile), and its adapter folders are the ones the page makes with
``scripts/make_adapter.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
from pathlib import Path

import pytest

from devharness.http_registry import Served, serve_http
from devharness.services import NatsService
from scripts.make_adapter import main as make_adapter
from tests.docs.doc_blocks import DOCS, blocks

PAGE = DOCS / "registry.md"


def example() -> str:
    found = [b for b in blocks(PAGE) if b.lang == "python"]
    assert len(found) == 1, "docs/registry.md should show one Python example"
    return found[0].code


def run(code: str, folder: Path) -> str:
    printed = io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stdout(printed):
        exec(compile(code, str(PAGE), "exec"), {"__name__": "__main__"})
    return printed.getvalue()


async def test_the_python_example_runs_as_written(
        tmp_path: Path, nats: NatsService, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("LORAPLANE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    make_adapter([str(tmp_path / "my-adapter"), "--seed", "1"])
    make_adapter([str(tmp_path / "my-adapter-v2"), "--seed", "2"])
    served: Served
    async with serve_http("embedded", tmp_path / "data", nats) as served:
        monkeypatch.setenv("LORAPLANE_REGISTRY", served.url)
        monkeypatch.setenv("LORAPLANE_TOKEN", served.admin_token)
        printed = await asyncio.to_thread(run, example(), tmp_path)
    lines = printed.splitlines()
    assert re.fullmatch(r"2 [0-9a-f]{64} True", lines[0]), printed
    assert lines[1:] == ["3 rollback 2 -> 1", "2 promote 1 -> 2", "1 publish None -> 1"], printed
