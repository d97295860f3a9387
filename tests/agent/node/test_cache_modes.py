"""Issue 35, Medium 12: the agent's cache (every adapter it served) is its user's only.

Each test runs under umask 0, where a plain mkdir or open would give 0777 / 0666.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from inference_agent.metrics import AgentMetrics
from inference_agent.node.materialize import Materializer
from inference_agent.node.registry_client import _write_inline
from inference_agent.service import _prepare_dir
from loraplane.events import FileRef
from loraplane.private_files import private_dir
from tests.agent.adapter_refs import ref_from_dir
from tests.modes_support import mode, umask_zero


@pytest.fixture(autouse=True)
def _no_umask() -> Iterator[None]:
    with umask_zero():
        yield


def test_the_cache_dir_is_made_private(tmp_path: Path) -> None:
    _prepare_dir(tmp_path / "new" / "cache")
    assert mode(tmp_path / "new" / "cache") == 0o700
    # A cache left world-readable by an earlier version is tightened at start.
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    _prepare_dir(loose)
    assert mode(loose) == 0o700
    assert mode(private_dir(tmp_path / "again")) == 0o700


async def test_materialized_versions_are_private(tmp_path: Path) -> None:
    source = make_adapter(tmp_path / "src", seed=1)
    source.chmod(0o755)
    for file in source.iterdir():
        file.chmod(0o644)
    mat = Materializer(tmp_path / "cache", max_bytes=10**9, fetch=None, base_shapes=None,
                       max_rank=16, metrics=AgentMetrics())
    final = await mat.add_local(ref_from_dir("bot", 1, source), source)
    assert mode(tmp_path / "cache") == 0o700
    assert mode(final) == 0o700 and mode(final.parent) == 0o700
    files = sorted(final.iterdir())
    assert files and all(mode(f) == 0o600 for f in files), [(f, oct(mode(f))) for f in files]


def test_a_file_carried_by_an_event_is_written_private(tmp_path: Path) -> None:
    content = b'{"r": 8}'
    ref = FileRef(name="adapter_config.json", size=len(content),
                  sha256=hashlib.sha256(content).hexdigest(), url="")
    dest = tmp_path / "adapter_config.json"
    assert _write_inline(ref, content, dest)
    assert mode(dest) == 0o600
